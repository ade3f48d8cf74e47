#!/usr/bin/env python3
"""Static checks of dashboards/ and the alert rules against docs/metrics.md.

- Each dashboard is well-formed Grafana JSON: unique panel ids, panels inside the 24-column grid and
  not overlapping, every panel and target on the ${datasource} variable, every target with an expr
  and a unique refId, every $variable in a query defined by the dashboard or built into Grafana.
- Every panel has a unit and thresholds (fieldConfig.defaults).
- The panels the issue asks for are there (by title), with the job_id/rank variables on training; a
  rank drill-down (a data link setting var-rank from the series) on training, and a link from the
  cluster board to a job's training board (var-job_id from the series).
- A query matches and groups dropless series only by their documented labels (and `instance`):
  `job` is Prometheus' scrape job, never the dropless job id (that is `job_id`).
- Every metric a query or rule names is in docs/metrics.md (or is Prometheus' own `up`), and every
  documented metric is shown on some dashboard or used by some alert rule.
- A panel query on a family documented with a `phase` label keeps the phases apart (groups by
  `phase` or selects one): the GEMM phases are different operations, a quantile over them merged
  describes none of them.
- Every alert rule has a runbook_url naming a section of docs/runbooks.md.
- Every scrape job with an `up{job="..."} == 0` alert also has an `absent(up{job="..."})` alert:
  `== 0` needs a target, and a target that is gone altogether (no pod, a monitor selecting none)
  has no `up` series at all.
- The provisioning files point where dashboards/kustomization.yaml and the docs say.

Usage: check_dashboards.py --source-dir DIR
"""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metrics_doc  # noqa: E402

GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s",
                    "__range_ms", "__from", "__to", "__dashboard"}
REQUIRED_TITLES = {
    "training.json": ["Step time p50 / p99", "TFLOP/s per GPU", "MFU", "Tokens/s", "Loss",
                      "Dispatch / combine latency p50 / p99", "Expert GEMM latency by phase p50 / p99",
                      "Expert load imbalance", "Slowest rank"],
    "cluster.json": ["Workers by state", "Slots busy", "Jobs by state", "Scheduling latency p50 / p99"],
}
# Data links the drill-down needs: (dashboard, what, URL fragment that must appear in some link).
REQUIRED_LINKS = [
    ("training.json", "a rank drill-down link", "var-rank=${__field.labels.rank}"),
    ("cluster.json", "a link to a job's training board", "/d/dropless-training/"),
    ("cluster.json", "a link to a job's training board", "var-job_id=${__field.labels.job_id}"),
]
# Labels Prometheus adds to every scraped series; only `instance` may select dropless series.
TARGET_LABELS = {"instance"}
# Labels whose values are different operations, not shards of one: a panel must not merge them.
SPLIT_LABELS = ("phase",)
PROMQL_NON_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset",
                      "bool", "and", "or", "unless", "le", "inf", "nan"}

failures = []


def fail(msg):
    failures.append(msg)


def metric_names(expr):
    """Metric names a PromQL expression selects (identifiers not followed by '(' nor inside {} / [])."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # string literals
    stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", stripped)       # matchers, ranges
    stripped = re.sub(r"\b\d[0-9.]*(?:[eE][+-]?\d+)?[a-zA-Z]*", " ", stripped)  # numbers, durations
    stripped = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", stripped)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped):
        word, rest = m.group(0), stripped[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_NON_METRICS:
            continue
        names.add(word)
    return names


def check_metric(name, where, documented, used):
    if name == "up":
        return
    family = metrics_doc.family_of(name, documented)
    if family is None:
        fail("%s: metric %s is not in docs/metrics.md" % (where, name))
        return
    if name != family and documented[family].type != "histogram":
        fail("%s: %s is not a histogram series of %s" % (where, name, family))
    if name == family and documented[family].type == "histogram":
        fail("%s: histogram %s must be queried through _bucket/_sum/_count" % (where, name))
    used.add(family)


def check_split_labels(expr, metric, where, documented):
    family = metrics_doc.family_of(metric, documented)
    if family is None:
        return
    for label in SPLIT_LABELS:
        if label not in documented[family].labels:
            continue
        grouped = re.search(r"\bby\s*\([^)]*\b%s\b" % label, expr)
        selected = re.search(r"\b%s\s*=\s*\"" % label, expr)
        if not grouped and not selected:
            fail("%s: query on %s merges its `%s` series; group by %s or select one: %s"
                 % (where, family, label, label, expr))


def check_labels(expr, where, documented):
    """Label names in matchers and by/without/on/ignoring clauses exist on the dropless metrics of expr."""
    families = [metrics_doc.family_of(m, documented) for m in metric_names(expr)]
    families = [f for f in families if f is not None]
    if not families:
        return  # up{job=...} and the like
    allowed = set(TARGET_LABELS) | {"le"}
    for f in families:
        allowed |= documented[f].labels
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = set()
    for m in re.finditer(r"\{([^}]*)\}", stripped):
        names |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(1)))
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", stripped):
        names |= set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", m.group(1)))
    for name in sorted(names - allowed):
        hint = " (the dropless job id is `job_id`; `job` is the scrape job)" if name == "job" else ""
        fail("%s: label %s is not a label of %s%s: %s" % (where, name, ", ".join(sorted(set(families))),
                                                          hint, expr.strip()))


def check_dashboard(path, documented, used):
    name = os.path.basename(path)
    with open(path, encoding="utf-8") as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            fail("%s: not JSON: %s" % (name, e))
            return
    for key in ("uid", "title", "schemaVersion", "panels", "templating"):
        if key not in d:
            fail("%s: no %r" % (name, key))
    variables = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource" or \
            variables["datasource"].get("query") != "prometheus":
        fail("%s: needs a `datasource` variable of type datasource over prometheus" % name)
    for vname, v in variables.items():
        if v.get("type") == "query":
            query = v.get("definition", "")
            if v.get("query", {}).get("query") != query:
                fail("%s: variable %s: query and definition differ" % (name, vname))
            m = re.fullmatch(r"label_values\((.+),\s*([a-zA-Z_]+)\)", query)
            if not m:
                fail("%s: variable %s: want label_values(selector, label), got %r" % (name, vname, query))
            else:
                for metric in metric_names(m.group(1)):
                    check_metric(metric, "%s variable %s" % (name, vname), documented, used)
    if name == "training.json":
        for vname in ("job_id", "rank"):
            if vname not in variables:
                fail("training.json: no `%s` template variable" % vname)
        rank = variables.get("rank", {})
        if not (rank.get("multi") and rank.get("includeAll") and rank.get("allValue") == ".*"):
            fail("training.json: `rank` must be multi-value with All = .*")

    ids, cells = set(), {}
    titles, links = [], []
    for panel in d.get("panels", []):
        where = "%s panel %r" % (name, panel.get("title"))
        titles.append(panel.get("title"))
        if panel.get("id") in ids:
            fail("%s: duplicate id %s" % (where, panel.get("id")))
        ids.add(panel.get("id"))
        g = panel.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "xywh") or g["x"] < 0 or g["x"] + g["w"] > 24:
            fail("%s: gridPos %s outside the 24-column grid" % (where, g))
        else:
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    if (x, y) in cells:
                        fail("%s: overlaps panel %r" % (where, cells[(x, y)]))
                        break
                    cells[(x, y)] = panel.get("title")
        if panel.get("datasource") != {"type": "prometheus", "uid": "${datasource}"}:
            fail("%s: datasource must be the ${datasource} variable" % where)
        if not panel.get("description"):
            fail("%s: no description" % where)
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if not defaults.get("unit"):
            fail("%s: no unit (fieldConfig.defaults.unit)" % where)
        steps = defaults.get("thresholds", {}).get("steps", [])
        if not steps or steps[0].get("value") is not None or \
                any(not isinstance(s.get("value"), (int, float)) for s in steps[1:]):
            fail("%s: no thresholds (fieldConfig.defaults.thresholds: a base step, then values)" % where)
        for link in defaults.get("links", []) + panel.get("links", []):
            links.append(link.get("url", ""))
        targets = panel.get("targets", [])
        if not targets:
            fail("%s: no queries" % where)
        refs = set()
        for t in targets:
            expr = t.get("expr", "")
            if not expr.strip():
                fail("%s: target %s has no expr" % (where, t.get("refId")))
            if t.get("refId") in refs:
                fail("%s: duplicate refId %s" % (where, t.get("refId")))
            refs.add(t.get("refId"))
            if t.get("datasource") != panel.get("datasource"):
                fail("%s: target %s datasource differs from the panel's" % (where, t.get("refId")))
            for var in re.findall(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)", expr):
                if var not in variables and var not in GRAFANA_BUILTINS:
                    fail("%s: query uses undefined variable $%s" % (where, var))
            for metric in metric_names(expr):
                check_metric(metric, where, documented, used)
                check_split_labels(expr, metric, where, documented)
            check_labels(expr, where, documented)
    for title in REQUIRED_TITLES.get(name, []):
        if title not in titles:
            fail("%s: no panel titled %r" % (name, title))
    for dashboard, what, fragment in REQUIRED_LINKS:
        if dashboard == name and not any(fragment in url for url in links):
            fail("%s: %s is missing (no panel data link contains %r)" % (name, what, fragment))


def check_provisioning(source_dir, dashboard_files):
    dash_dir = os.path.join(source_dir, "dashboards")
    with open(os.path.join(dash_dir, "kustomization.yaml"), encoding="utf-8") as f:
        kustomization = f.read()
    for path in dashboard_files:
        if not re.search(r"^\s*-\s*%s\s*$" % re.escape(os.path.basename(path)), kustomization, re.M):
            fail("dashboards/kustomization.yaml: %s is not in the dashboards ConfigMap"
                 % os.path.basename(path))
    with open(os.path.join(dash_dir, "provisioning/dashboards/dropless.yaml"), encoding="utf-8") as f:
        provider = f.read()
    if not re.search(r"^\s*type:\s*file\s*$", provider, re.M) or \
            not re.search(r"^\s*path:\s*/var/lib/grafana/dashboards/dropless\s*$", provider, re.M):
        fail("provisioning/dashboards/dropless.yaml: want a file provider on /var/lib/grafana/dashboards/dropless")
    with open(os.path.join(dash_dir, "provisioning/datasources/dropless.yaml"), encoding="utf-8") as f:
        datasource = f.read()
    if not re.search(r"^\s*type:\s*prometheus\s*$", datasource, re.M):
        fail("provisioning/datasources/dropless.yaml: want a prometheus datasource")


def runbook_anchors(path):
    """GitHub's anchors of the level-2 headings of docs/runbooks.md."""
    with open(path, encoding="utf-8") as f:
        headings = re.findall(r"^##\s+(.+?)\s*$", f.read(), re.M)
    return {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in headings}


def check_runbooks(text, path, anchors):
    """Every alert has a runbook_url naming a section of docs/runbooks.md."""
    for block in re.split(r"^\s*-\s*alert:\s*", text, flags=re.M)[1:]:
        alert = block.split()[0]
        m = re.search(r"^\s*runbook_url:\s*(\S+)\s*$", block, re.M)
        if not m:
            fail("%s: alert %s has no runbook_url annotation" % (path, alert))
            continue
        url = m.group(1).strip("'\"")
        doc, _, anchor = url.partition("#")
        if doc != "docs/runbooks.md" or anchor not in anchors:
            fail("%s: alert %s: runbook_url %s is not a section of docs/runbooks.md (sections: %s)"
                 % (path, alert, url, ", ".join(sorted(anchors))))


def check_rules(path, documented, used, anchors):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    check_runbooks(text, os.path.basename(path), anchors)
    alerts = re.findall(r"^\s*-\s*alert:\s*(\S+)", text, re.M)
    for wanted in ("DroplessWorkerDown", "DroplessJobStuck", "DroplessStepTimeRegression", "DroplessMfuDrop"):
        if wanted not in alerts:
            fail("%s: no alert %s" % (path, wanted))
    # expr: value (one line, or a | block up to the next key)
    exprs = []
    for m in re.finditer(r"^(\s*)expr:\s*(\|[-+]?\s*\n((?:\1\s+.*\n)+)|(.+)\n)", text, re.M):
        expr = m.group(3) if m.group(3) is not None else m.group(4)
        exprs.append(expr)
        where = "%s expr %r" % (os.path.basename(path), expr.strip()[:40])
        for metric in metric_names(expr):
            check_metric(metric, where, documented, used)
        check_labels(expr, where, documented)
    down = {j for e in exprs for j in re.findall(r'\bup\s*\{[^}]*\bjob\s*=\s*"([^"]+)"[^}]*\}\s*==\s*0\b', e)}
    absent = {j for e in exprs for j in re.findall(r'\babsent\s*\(\s*up\s*\{[^}]*\bjob\s*=\s*"([^"]+)"', e)}
    for job in sorted(down - absent):
        fail('%s: up{job="%s"} == 0 fires only while the target exists; add an alert on '
             'absent(up{job="%s"}) for a target that is gone (no pod, a monitor selecting none)'
             % (os.path.basename(path), job, job))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    args = parser.parse_args()
    try:
        documented = metrics_doc.parse(os.path.join(args.source_dir, "docs/metrics.md"))
    except ValueError as e:
        print("FAIL:", e)
        return 1
    used = set()
    files = sorted(glob.glob(os.path.join(args.source_dir, "dashboards/*.json")))
    if sorted(os.path.basename(f) for f in files) != sorted(REQUIRED_TITLES):
        fail("dashboards/: want exactly %s, found %s" % (sorted(REQUIRED_TITLES), [os.path.basename(f) for f in files]))
    for path in files:
        check_dashboard(path, documented, used)
    check_provisioning(args.source_dir, files)
    check_rules(os.path.join(args.source_dir, "deploy/monitoring/alerts.rules.yaml"), documented, used,
                runbook_anchors(os.path.join(args.source_dir, "docs/runbooks.md")))
    for name in sorted(set(documented) - used):
        fail("docs/metrics.md: %s is on no dashboard and in no alert rule" % name)
    for f in failures:
        print("FAIL:", f)
    print("%d dashboards, %d documented metrics, %d failures" % (len(files), len(documented), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
