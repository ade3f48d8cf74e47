#!/usr/bin/env python3
"""The catalog and dashboard checkers fail when the thing they guard is broken: each case copies the
parts of the tree they read, breaks one thing, and expects a non-zero exit naming the problem; the
unbroken copy must pass.

Usage: test_checkers.py --source-dir DIR
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
COPIED = ("docs/metrics.md", "docs/runbooks.md", "dashboards", "deploy/monitoring", "coordinator", "worker")


def copy_tree(source_dir, dest):
    for rel in COPIED:
        src, dst = os.path.join(source_dir, rel), os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.o", "__pycache__"))
        else:
            shutil.copy(src, dst)


def edit(path, fn):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = fn(text)
    if new == text:
        raise AssertionError("mutation changed nothing in %s" % path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)


def edit_dashboard(path, fn):
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    fn(d)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, indent=2)


def drop_row(name):
    return lambda t: re.sub(r"(?m)^\| `%s` \|.*\n" % re.escape(name), "", t)


def first_panel_expr(d, new):
    d["panels"][0]["targets"][0]["expr"] = new


CASES = [
    ("check_metrics_doc.py", "undocumented metric", "docs/metrics.md",
     drop_row("dropless_rank_loss"), "dropless_rank_loss (gauge) is registered but not in docs/metrics.md"),
    ("check_metrics_doc.py", "wrong type", "docs/metrics.md",
     lambda t: t.replace("| `dropless_rank_mfu_ratio` | gauge |", "| `dropless_rank_mfu_ratio` | counter |"),
     "a counter's name ends in _total"),
    ("check_metrics_doc.py", "type differs from the code", "docs/metrics.md",
     lambda t: t.replace("| `dropless_rank_steps_total` | counter |", "| `dropless_rank_steps_total` | gauge |"),
     "dropless_rank_steps_total is a counter in the code, a gauge in docs/metrics.md"),
    ("check_metrics_doc.py", "documented but not registered", "docs/metrics.md",
     lambda t: t + "| `dropless_rank_ghost_seconds` | histogram | seconds | `job_id` | Not in the code. |\n",
     "dropless_rank_ghost_seconds is documented but registered nowhere"),
    ("check_metrics_doc.py", "a label named job", "docs/metrics.md",
     lambda t: t.replace("| `dropless_rank_loss` | gauge | 1 | `job_id`,", "| `dropless_rank_loss` | gauge | 1 | `job`,"),
     "no label may be named `job`"),
    ("check_dashboards.py", "panel on an unknown metric", "dashboards/training.json",
     lambda d: first_panel_expr(d, 'max(dropless_rank_step_total{job_id="$job_id"})'),
     "metric dropless_rank_step_total is not in docs/metrics.md"),
    ("check_dashboards.py", "histogram queried without _bucket", "dashboards/cluster.json",
     lambda d: first_panel_expr(d, "dropless_coordinator_rpc_duration_seconds"),
     "must be queried through _bucket/_sum/_count"),
    ("check_dashboards.py", "undefined variable", "dashboards/training.json",
     lambda d: first_panel_expr(d, 'max(dropless_rank_steps_total{job_id="$jobid"})'),
     "undefined variable $jobid"),
    ("check_dashboards.py", "the dropless job id selected as `job`", "dashboards/training.json",
     lambda d: first_panel_expr(d, 'max(dropless_rank_steps_total{job="$job_id"})'),
     "label job is not a label of dropless_rank_steps_total"),
    ("check_dashboards.py", "grouped by an unknown label", "deploy/monitoring/alerts.rules.yaml",
     lambda t: t.replace("avg by (job_id) (avg_over_time(dropless_rank_mfu_ratio[10m]))",
                         "avg by (job) (avg_over_time(dropless_rank_mfu_ratio[10m]))"),
     "label job is not a label of dropless_rank_mfu_ratio"),
    ("check_dashboards.py", "no job variable", "dashboards/training.json",
     lambda d: d["templating"].update(list=[v for v in d["templating"]["list"] if v["name"] != "job_id"]),
     "no `job_id` template variable"),
    ("check_dashboards.py", "panel without a unit", "dashboards/cluster.json",
     lambda d: d["panels"][2]["fieldConfig"]["defaults"].pop("unit"),
     "no unit"),
    ("check_dashboards.py", "panel without thresholds", "dashboards/training.json",
     lambda d: d["panels"][3]["fieldConfig"]["defaults"].pop("thresholds"),
     "no thresholds"),
    ("check_dashboards.py", "no link from the cluster board to a job's board", "dashboards/cluster.json",
     lambda d: [p["fieldConfig"]["defaults"].pop("links", None) for p in d["panels"]],
     "a link to a job's training board is missing"),
    ("check_dashboards.py", "no rank drill-down", "dashboards/training.json",
     lambda d: [p["fieldConfig"]["defaults"].pop("links", None) for p in d["panels"]],
     "a rank drill-down link is missing"),
    ("check_dashboards.py", "alert without a runbook", "deploy/monitoring/alerts.rules.yaml",
     lambda t: t.replace("          runbook_url: docs/runbooks.md#droplessmfudrop\n", ""),
     "alert DroplessMfuDrop has no runbook_url"),
    ("check_dashboards.py", "runbook section missing", "docs/runbooks.md",
     lambda t: t.replace("## DroplessJobStuck", "## Stuck jobs"),
     "alert DroplessJobStuck: runbook_url docs/runbooks.md#droplessjobstuck is not a section"),
    ("check_dashboards.py", "overlapping panels", "dashboards/cluster.json",
     lambda d: d["panels"][1]["gridPos"].update(x=0, y=0),
     "overlaps panel"),
    ("check_dashboards.py", "required panel missing", "dashboards/training.json",
     lambda d: d.update(panels=[p for p in d["panels"] if p["title"] != "Slowest rank"]),
     "no panel titled 'Slowest rank'"),
    ("check_dashboards.py", "GEMM phases merged", "dashboards/training.json",
     lambda d: [t.update(expr=t["expr"].replace("sum by (phase, le)", "sum by (le)"))
                for p in d["panels"] for t in p.get("targets", [])],
     "merges its `phase` series"),
    ("check_dashboards.py", "alert on an unknown metric", "deploy/monitoring/alerts.rules.yaml",
     lambda t: t.replace("dropless_rank_mfu_ratio[10m]", "dropless_rank_mfu[10m]", 1),
     "metric dropless_rank_mfu is not in docs/metrics.md"),
    ("check_dashboards.py", "down alert without an absent() twin", "deploy/monitoring/alerts.rules.yaml",
     lambda t: t.replace('expr: absent(up{job="dropless-worker"})', 'expr: absent(dropless_worker_up)'),
     'add an alert on absent(up{job="dropless-worker"})'),
    ("check_dashboards.py", "metric nobody shows", "dashboards/cluster.json",
     lambda d: d.update(panels=[p for p in d["panels"] if "lease_expiries" not in json.dumps(p)]),
     "dropless_coordinator_lease_expiries_total is on no dashboard and in no alert rule"),
]


def run(checker, tree):
    r = subprocess.run([sys.executable, os.path.join(HERE, checker), "--source-dir", tree],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="dropless-checkers-") as tmp:
        clean = os.path.join(tmp, "clean")
        copy_tree(args.source_dir, clean)
        for checker in ("check_metrics_doc.py", "check_dashboards.py"):
            rc, out = run(checker, clean)
            if rc != 0:
                print("FAIL: %s fails on the unmodified tree:\n%s" % (checker, out))
                failures += 1
        for i, (checker, what, rel, mutate, expected) in enumerate(CASES):
            tree = os.path.join(tmp, "case-%d" % i)
            copy_tree(args.source_dir, tree)
            path = os.path.join(tree, rel)
            (edit_dashboard if rel.endswith(".json") else edit)(path, mutate)
            rc, out = run(checker, tree)
            if rc == 0 or expected not in out:
                print("FAIL: %s did not catch %s (exit %d, want %r):\n%s" % (checker, what, rc, expected, out))
                failures += 1
    print("%d passed, %d failed" % (len(CASES) + 2 - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
