#!/usr/bin/env python3
"""deploy/monitoring/prometheusrule.yaml, the alert rules as a PrometheusRule for the Prometheus
Operator, is generated from deploy/monitoring/alerts.rules.yaml (the rule file promtool checks and
tests): the rule file's `groups:` block, indented under `spec:`. Text in, text out, so comments and
block scalars stay as written and no YAML library is needed.

Usage: prometheus_rule.py --source-dir DIR (--check | --write | --promtool PATH)
  --check     exit 1 when the PrometheusRule is not what the rule file generates (CTest:
              observability.prometheusrule_matches_rules)
  --write     regenerate it
  --promtool  run `promtool check rules` and the rule unit tests (alerts.test.yaml) on the rules read
              back from the PrometheusRule (CTest: observability.promtool_prometheusrule)
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

RULES = "deploy/monitoring/alerts.rules.yaml"
PROMETHEUS_RULE = "deploy/monitoring/prometheusrule.yaml"
HEADER = """\
# GENERATED from alerts.rules.yaml by tests/unit/observability/prometheus_rule.py --write; edit the
# rule file, not this one (observability.prometheusrule_matches_rules fails when they differ).
# The dropless alert rules for the Prometheus Operator. Your Prometheus must select this object
# (kube-prometheus-stack: add its release label, or set ruleSelector); every alert's runbook_url
# names a section of docs/runbooks.md.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: dropless
  labels:
    app.kubernetes.io/name: dropless
    app.kubernetes.io/component: alert-rules
spec:
"""


def groups_block(rules_text):
    """The lines of the rule file from `groups:` on."""
    lines = rules_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("groups:"):
            return lines[i:]
    raise ValueError("%s: no top-level `groups:`" % RULES)


def render(rules_text):
    return HEADER + "".join(("  " + line if line.strip() else "") + "\n" for line in groups_block(rules_text))


def rules_from(prometheus_rule_text):
    """The inverse: a rule file (for promtool or a Prometheus' rule_files) from the PrometheusRule."""
    lines = prometheus_rule_text.splitlines()
    start = lines.index("spec:") + 1
    return "".join(line[2:] + "\n" for line in lines[start:])


def promtool(source_dir, binary):
    """promtool on what the PrometheusRule holds, in place of the rule file next to the tests."""
    with open(os.path.join(source_dir, PROMETHEUS_RULE), encoding="utf-8") as f:
        rules = rules_from(f.read())
    with tempfile.TemporaryDirectory(prefix="dropless-prometheusrule-") as tmp:
        with open(os.path.join(tmp, os.path.basename(RULES)), "w", encoding="utf-8") as f:
            f.write(rules)
        shutil.copy(os.path.join(source_dir, "deploy/monitoring/alerts.test.yaml"), tmp)
        for cmd in ([binary, "check", "rules", os.path.basename(RULES)],
                    [binary, "test", "rules", "alerts.test.yaml"]):
            print("$", " ".join(cmd), flush=True)
            if subprocess.run(cmd, cwd=tmp).returncode != 0:
                print("FAIL: %s on the rules of %s" % (" ".join(cmd[1:3]), PROMETHEUS_RULE))
                return 1
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--promtool")
    args = parser.parse_args()
    if args.promtool:
        return promtool(args.source_dir, args.promtool)
    with open(os.path.join(args.source_dir, RULES), encoding="utf-8") as f:
        want = render(f.read())
    path = os.path.join(args.source_dir, PROMETHEUS_RULE)
    if args.write:
        with open(path, "w", encoding="utf-8") as f:
            f.write(want)
        print("wrote", PROMETHEUS_RULE)
        return 0
    try:
        with open(path, encoding="utf-8") as f:
            have = f.read()
    except FileNotFoundError:
        have = None
    if have != want:
        print("FAIL: %s is not generated from %s; run %s --source-dir . --write"
              % (PROMETHEUS_RULE, RULES, os.path.relpath(__file__, args.source_dir)))
        return 1
    print("%s matches %s" % (PROMETHEUS_RULE, RULES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
