#!/usr/bin/env python3
"""docs/metrics.md against the code: every metric family the coordinator and worker sources register
(prometheus-cpp Build{Counter,Gauge,Histogram,Summary}().Name("...")) is documented with the same
type, and every documented metric is registered. A dropless metric name written any other way in
the sources fails too, since its type could not be checked.

Usage: check_metrics_doc.py --source-dir DIR
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metrics_doc  # noqa: E402

SOURCE_DIRS = ("coordinator", "worker")
REGISTER = re.compile(r'Build(Counter|Gauge|Histogram|Summary)\(\)\s*\.Name\(\s*"([^"]+)"\s*\)')
NAME_LITERAL = re.compile(r'"(dropless_(?:coordinator|worker|rank)_[a-z0-9_]*)"')


def registered(source_dir):
    """name -> (type, 'file:line'); plus a list of problems."""
    found, problems = {}, []
    for top in SOURCE_DIRS:
        for root, _, files in os.walk(os.path.join(source_dir, top)):
            for name in sorted(files):
                if not name.endswith((".cc", ".h", ".cpp", ".hpp")):
                    continue
                path = os.path.join(root, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                rel = os.path.relpath(path, source_dir)
                spans = []
                for m in REGISTER.finditer(text):
                    line = text.count("\n", 0, m.start()) + 1
                    metric, mtype = m.group(2), m.group(1).lower()
                    where = "%s:%d" % (rel, line)
                    if metric in found and found[metric][0] != mtype:
                        problems.append("%s: %s registered as %s here and as %s at %s"
                                        % (where, metric, mtype, found[metric][0], found[metric][1]))
                    found.setdefault(metric, (mtype, where))
                    spans.append((m.start(2), m.end(2)))
                for m in NAME_LITERAL.finditer(text):
                    if not any(a <= m.start(1) < b for a, b in spans):
                        line = text.count("\n", 0, m.start()) + 1
                        problems.append("%s:%d: metric-like name %s is not registered through "
                                        "Build<Type>().Name(\"...\"); the catalog check cannot see its type"
                                        % (rel, line, m.group(1)))
    return found, problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    args = parser.parse_args()
    try:
        documented = metrics_doc.parse(os.path.join(args.source_dir, "docs/metrics.md"))
    except ValueError as e:
        print("FAIL:", e)
        return 1
    found, problems = registered(args.source_dir)
    if not found:
        problems.append("no metric registrations found under %s" % ", ".join(SOURCE_DIRS))
    for name, (mtype, where) in sorted(found.items()):
        if name not in documented:
            problems.append("%s: %s (%s) is registered but not in docs/metrics.md" % (where, name, mtype))
        elif documented[name].type != mtype:
            problems.append("%s: %s is a %s in the code, a %s in docs/metrics.md:%d"
                            % (where, name, mtype, documented[name].type, documented[name].line))
    for name, m in sorted(documented.items()):
        if name not in found:
            problems.append("docs/metrics.md:%d: %s is documented but registered nowhere in %s"
                            % (m.line, name, ", ".join(SOURCE_DIRS)))
    for p in problems:
        print("FAIL:", p)
    print("%d registered, %d documented, %d problems" % (len(found), len(documented), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
