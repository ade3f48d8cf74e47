#!/usr/bin/env python3
"""End to end: a real Prometheus (Debian's binary, loopback, temporary storage, 1 s scrapes) scrapes a
real coordinator and two real workers while they run CPU jobs, then

  1. the metric families the processes expose match docs/metrics.md (name, type, label names);
  2. every dashboard variable query finds the running job and its ranks, and every panel query of
     dashboards/*.json, with the variables substituted as Grafana would, returns at least one finite
     value: over the run for graphs (a range query), at the end for stat panels (an instant query);
  3. every alert rule, as the PrometheusRule deploy/monitoring/prometheusrule.yaml holds it (generated
     from alerts.rules.yaml), loaded by this Prometheus, evaluates with health "ok", and every metric
     it names exists;
  4. each rank exposes its expert GEMM histogram once per phase (forward, dgrad, wgrad), every
     phase observed once per step, and the dashboard's GEMM queries return a series per phase;
  5. killing a worker (daemon and ranks, like a lost node) makes the DroplessWorkerDown expression
     return that worker, the alert go pending, and DroplessWorkerLost's expression return data.

Skips (exit 77, "SKIPPED: ...") only when no prometheus binary is found.
Usage: live_prometheus.py --bin-dir DIR --source-dir DIR [--prometheus PATH] [--keep]
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "unit", "observability"))
import cluster  # noqa: E402
import metrics_doc  # noqa: E402
import prometheus_rule  # noqa: E402
from check_dashboards import metric_names  # noqa: E402

SCRAPE_INTERVAL_S = 1
# Grafana's $__rate_interval for a short range: max($__interval + scrape, 4 * scrape).
RATE_INTERVAL = "%ds" % (4 * SCRAPE_INTERVAL_S)
LONG_JOB_STEPS = 1000000  # cancelled by the test long before it ends
MIN_LONG_JOB_SECONDS = 12  # of scraped rank data before the panels are evaluated
GEMM_FAMILY = "dropless_rank_expert_gemm_duration_seconds"
GEMM_PHASES = {"forward", "dgrad", "wgrad"}


class Checks:
    def __init__(self):
        self.passed, self.failed = 0, []

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed.append(what)
            print("FAIL:", what, flush=True)
        return cond


class Prometheus:
    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port

    def api(self, path, **params):
        url = "%s/api/v1/%s?%s" % (self.base, path, urllib.parse.urlencode(params, doseq=True))
        body = json.loads(cluster.http_get(url, timeout=20))
        if body.get("status") != "success":
            raise RuntimeError("%s: %s" % (path, body))
        return body["data"]

    def query(self, expr, at=None):
        if at is None:
            return self.api("query", query=expr)
        return self.api("query", query=expr, time="%.3f" % at)

    def query_range(self, expr, start, end, step=1):
        return self.api("query_range", query=expr, start="%.3f" % start, end="%.3f" % end, step=step)


def finite_values(data):
    """Finite sample values of a query / query_range result."""
    out = []
    for series in data.get("result", []):
        points = series.get("values") or ([series["value"]] if "value" in series else [])
        out.extend(float(v) for _, v in points if math.isfinite(float(v)))
    return out


def substitute(expr, variables):
    def repl(m):
        name = m.group(1) or m.group(2)
        return variables.get(name, m.group(0))
    return re.sub(r"\$\{([a-zA-Z_][a-zA-Z0-9_]*)\}|\$([a-zA-Z_][a-zA-Z0-9_]*)", repl, expr)


def start_control_plane(procs, bins, tmp, ports):
    coordinator = "127.0.0.1:%d" % ports["grpc"]
    procs.start("coordinator", [
        bins["dropless-coordinator"], "--insecure", "--listen", coordinator, "--db", os.path.join(tmp, "dropless.db"),
        "--metrics-port", str(ports["coordinator"]), "--metrics-address", "127.0.0.1",
        "--heartbeat-interval-ms", "200", "--lease-timeout-ms", "2000"])
    cluster.wait_until("coordinator gRPC port", lambda: cluster.port_open(ports["grpc"]), 30)
    cluster.wait_until("coordinator /metrics", lambda: cluster.port_open(ports["coordinator"]), 30)
    for i in (0, 1):
        procs.start("worker-%d" % i, [
            bins["dropless-worker"], "--insecure", "--coordinator", coordinator, "--node", "obs-node-%d" % i,
            "--advertise-address", "127.0.0.1", "--cpu-slots", "1", "--gpus", "none",
            "--metrics-port", str(ports["worker-%d" % i]), "--metrics-address", "127.0.0.1",
            "--work-dir", os.path.join(tmp, "worker-%d" % i)])
    cli = cluster.Cli(bins["dropless"], coordinator)
    cluster.wait_until("two READY workers", lambda: sum(
        1 for w in cli.json("get", "workers")["workers"] if w["state"] == "READY") == 2, 60)
    return cli


def start_prometheus(procs, binary, source_dir, tmp, ports):
    # The rules as the Prometheus Operator would load them from the PrometheusRule.
    rules = os.path.join(tmp, "dropless-prometheusrule.rules.yaml")
    with open(os.path.join(source_dir, prometheus_rule.PROMETHEUS_RULE)) as f, open(rules, "w") as out:
        out.write(prometheus_rule.rules_from(f.read()))
    config = {
        "global": {"scrape_interval": "%ds" % SCRAPE_INTERVAL_S, "scrape_timeout": "%ds" % SCRAPE_INTERVAL_S,
                   "evaluation_interval": "%ds" % SCRAPE_INTERVAL_S},
        "rule_files": [rules],
        "scrape_configs": [
            {"job_name": "dropless-coordinator",
             "static_configs": [{"targets": ["127.0.0.1:%d" % ports["coordinator"]]}]},
            # No honor_labels: the dropless job id is job_id, `job` stays the scrape job.
            {"job_name": "dropless-worker",
             "static_configs": [{"targets": ["127.0.0.1:%d" % ports["worker-0"],
                                             "127.0.0.1:%d" % ports["worker-1"]]}]},
        ],
    }
    path = os.path.join(tmp, "prometheus.yml")
    with open(path, "w") as f:
        json.dump(config, f, indent=1)  # JSON is YAML
    procs.start("prometheus", [
        binary, "--config.file=" + path, "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
        "--web.listen-address=127.0.0.1:%d" % ports["prometheus"], "--log.level=warn"])
    prom = Prometheus(ports["prometheus"])
    cluster.wait_until("prometheus ready", lambda: "Ready" in cluster.http_get(prom.base + "/-/ready"), 60)
    cluster.wait_until("all three targets up", lambda: len(
        [r for r in prom.query("up == 1")["result"]]) == 3, 60)
    return prom


def check_families(checks, documented, ports):
    seen = {}
    for target in ("coordinator", "worker-0", "worker-1"):
        text = cluster.http_get("http://127.0.0.1:%d/metrics" % ports[target])
        for name, fam in cluster.parse_exposition(text).items():
            if not name.startswith("dropless_"):
                continue
            entry = seen.setdefault(name, {"type": fam["type"], "labels": set(), "samples": 0})
            entry["labels"] |= fam["labels"]
            entry["samples"] += fam["samples"]
    for name, m in sorted(documented.items()):
        fam = seen.get(name)
        if not checks.ok(fam is not None and fam["samples"] > 0,
                         "docs/metrics.md lists %s but no running process exposes it" % name):
            continue
        checks.ok(fam["type"] == m.type, "%s: exposed as %s, documented as %s" % (name, fam["type"], m.type))
        checks.ok(fam["labels"] == m.labels, "%s: exposed with labels %s, documented with %s"
                  % (name, sorted(fam["labels"]), sorted(m.labels)))
    for name in sorted(set(seen) - set(documented)):
        checks.ok(False, "%s is exposed but not in docs/metrics.md" % name)
    print("families: %d dropless families exposed, %d documented" % (len(seen), len(documented)), flush=True)


def check_dashboards(checks, prom, source_dir, job_id, start):
    end = time.time()
    for path in sorted(glob.glob(os.path.join(source_dir, "dashboards/*.json"))):
        with open(path) as f:
            dash = json.load(f)
        name = os.path.basename(path)
        variables = {"__rate_interval": RATE_INTERVAL, "__interval": "%ds" % SCRAPE_INTERVAL_S}
        rank_values = []
        for v in dash["templating"]["list"]:
            if v["type"] != "query":
                continue
            query = substitute(v["definition"], dict(variables, job_id=job_id))
            m = re.fullmatch(r"label_values\((.+),\s*([a-zA-Z_]+)\)", query)
            values = prom.api("label/%s/values" % m.group(2), **{"match[]": m.group(1),
                                                                  "start": "%.3f" % start, "end": "%.3f" % end})
            if v["name"] == "job_id":
                checks.ok(job_id in values, "%s variable job_id: %s does not list the running job %s"
                          % (name, query, job_id))
            if v["name"] == "rank":
                rank_values = values
                checks.ok(sorted(values) == ["0", "1"], "%s variable rank: %s gives %s, want ranks 0 and 1"
                          % (name, query, values))
        # All ranks (allValue .*) and one rank, as a user would pick them.
        selections = [{"job_id": job_id, "rank": ".*"}]
        if rank_values:
            selections.append({"job_id": job_id, "rank": rank_values[0]})
        panels = 0
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                for selection in selections if "$rank" in target["expr"] else selections[:1]:
                    expr = substitute(target["expr"], dict(variables, **selection))
                    what = "%s panel %r query %s (rank=%s)" % (name, panel["title"], target["refId"],
                                                                selection["rank"])
                    try:
                        # Stat panels ask for the value now (instant), graphs for the whole range.
                        data = (prom.query(expr, at=end) if target.get("instant")
                                else prom.query_range(expr, start, end))
                    except RuntimeError as e:
                        checks.ok(False, "%s: %s: %s" % (what, expr, e))
                        continue
                    checks.ok(finite_values(data), "%s returned no finite value: %s" % (what, expr))
                    if GEMM_FAMILY in expr and re.search(r"\bby\s*\([^)]*\bphase\b", expr):
                        # Grouped by phase: a line for each of the three.
                        phases = {series["metric"].get("phase", "") for series in data["result"]
                                  if finite_values({"result": [series]})}
                        checks.ok(phases == GEMM_PHASES, "%s: finite series for phases %s, want %s"
                                  % (what, sorted(phases), sorted(GEMM_PHASES)))
            panels += 1
        print("%s: %d panels evaluated" % (name, panels), flush=True)


def check_gemm_phases(checks, prom, job_id):
    """Each rank of the job has one GEMM histogram per phase, and every step observed all three."""
    result = prom.query('%s_count{job_id="%s"}' % (GEMM_FAMILY, job_id))["result"]
    by_rank = {}
    for series in result:
        labels = series["metric"]
        by_rank.setdefault(labels.get("rank"), {})[labels.get("phase")] = float(series["value"][1])
    checks.ok(sorted(by_rank) == ["0", "1"], "%s_count of job %s: ranks %s, want 0 and 1"
              % (GEMM_FAMILY, job_id, sorted(by_rank)))
    for rank, counts in sorted(by_rank.items()):
        checks.ok(set(counts) == GEMM_PHASES, "%s_count rank %s: phases %s, want %s"
                  % (GEMM_FAMILY, rank, sorted(counts), sorted(GEMM_PHASES)))
        # The three phases of a step are observed together (one scrape never splits them).
        checks.ok(len(set(counts.values())) == 1 and min(counts.values()) > 0,
                  "%s_count rank %s: per-phase step counts %s, want equal and > 0"
                  % (GEMM_FAMILY, rank, counts))
    for phase in sorted(GEMM_PHASES):
        sums = finite_values(prom.query('%s_sum{job_id="%s",phase="%s"}' % (GEMM_FAMILY, job_id, phase)))
        checks.ok(len(sums) == 2 and all(v > 0 for v in sums),
                  "%s_sum phase %s: %s, want a positive value per rank" % (GEMM_FAMILY, phase, sums))
    print("gemm phases: %s on ranks %s" % (sorted(GEMM_PHASES), sorted(by_rank)), flush=True)


def check_rules(checks, prom):
    def all_evaluated():
        groups = prom.api("rules", type="alert")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if not rules:
            raise RuntimeError("Prometheus loaded no alert rules")
        return rules if all(r.get("health") in ("ok", "err") for r in rules) else None
    rules = cluster.wait_until("every alert rule evaluated", all_evaluated, 30)
    names = {r["name"] for r in rules}
    checks.ok({"DroplessWorkerDown", "DroplessJobStuck", "DroplessStepTimeRegression", "DroplessMfuDrop"} <= names,
              "the rules Prometheus loaded lack some of the required alerts: %s" % sorted(names))
    for r in rules:
        checks.ok(r["health"] == "ok", "alert %s: health %s: %s" % (r["name"], r["health"], r.get("lastError")))
        try:
            prom.query(r["query"])
        except RuntimeError as e:
            checks.ok(False, "alert %s: query fails: %s" % (r["name"], e))
        for metric in sorted(metric_names(r["query"])):
            exists = prom.query("count(%s)" % metric)["result"]
            checks.ok(exists, "alert %s uses %s, which no target exposes" % (r["name"], metric))
    print("rules: %d alert rules evaluated" % len(rules), flush=True)
    return {r["name"]: r for r in rules}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--prometheus", default="")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    args.source_dir = os.path.abspath(args.source_dir)

    prometheus = args.prometheus or shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.access(prometheus, os.X_OK):
        print("SKIPPED: no prometheus binary (looked for %s); run scripts/install-ops-tools" % prometheus)
        return cluster.SKIP
    bins = {b: os.path.join(args.bin_dir, b) for b in ("dropless-coordinator", "dropless-worker", "dropless")}
    for b, path in bins.items():
        if not os.access(path, os.X_OK):
            print("FAIL: %s not built (%s)" % (b, path))
            return 1
    documented = metrics_doc.parse(os.path.join(args.source_dir, "docs/metrics.md"))

    tmp = tempfile.mkdtemp(prefix="dropless-observability-")
    ports = {k: cluster.free_port() for k in ("grpc", "coordinator", "worker-0", "worker-1", "prometheus")}
    procs = cluster.Processes(tmp)
    checks = Checks()
    try:
        cli = start_control_plane(procs, bins, tmp, ports)
        prom = start_prometheus(procs, prometheus, args.source_dir, tmp, ports)
        start = time.time() - 5

        # A short job first (finished-job counters, rank exits), then a long one to watch.
        short_id = cli.run("submit", "-f", os.path.join(args.source_dir, "configs/jobs/tiny-cpu.yaml")).strip()
        cluster.wait_until("job %s SUCCEEDED" % short_id,
                           lambda: cli.json("get", "job", short_id)["state"] == "SUCCEEDED", 180, 0.5)
        with open(os.path.join(args.source_dir, "configs/jobs/tiny-cpu.yaml")) as f:
            spec = f.read()
        spec, n = re.subn(r"(?m)^steps:\s*\d+\s*$", "steps: %d" % LONG_JOB_STEPS, spec)
        if n != 1:
            raise RuntimeError("configs/jobs/tiny-cpu.yaml has no top-level `steps:` line")
        long_spec = os.path.join(tmp, "long-cpu.yaml")
        with open(long_spec, "w") as f:
            f.write(spec)
        job_id = cli.run("submit", "-f", long_spec, "--name", "observability-live").strip()
        cluster.wait_until("job %s ranks in Prometheus" % job_id, lambda: len(prom.query(
            'dropless_rank_steps_total{job_id="%s"}' % job_id)["result"]) == 2, 120, 0.5)
        # A user polls the job meanwhile, so the coordinator serves RPCs all along, as it would.
        first_seen = time.time()
        while time.time() - first_seen < MIN_LONG_JOB_SECONDS:
            state = cli.json("get", "job", job_id)["state"]
            if not checks.ok(state == "RUNNING", "job %s is %s, not RUNNING" % (job_id, state)):
                raise RuntimeError("the long job stopped running")
            time.sleep(0.5)

        check_families(checks, documented, ports)
        # Scraped without honor_labels: `job` is the scrape job on the rank series too, the dropless
        # job id is job_id, and nothing was renamed exported_job.
        ranks = prom.query('dropless_rank_steps_total{job="dropless-worker",job_id="%s"}' % job_id)["result"]
        checks.ok(len(ranks) == 2, "rank series of %s with job=dropless-worker: %d, want 2" % (job_id, len(ranks)))
        renamed = prom.query('count({exported_job!=""})')["result"]
        checks.ok(not renamed, "series with exported_job (a target label collision): %s" % renamed)
        check_dashboards(checks, prom, args.source_dir, job_id, start)
        check_gemm_phases(checks, prom, job_id)
        rules = check_rules(checks, prom)

        # A node goes away: the worker daemon and its ranks die at once.
        procs.kill("worker-1")
        down = rules["DroplessWorkerDown"]["query"]
        target = "127.0.0.1:%d" % ports["worker-1"]
        try:
            cluster.wait_until("%s returns the killed worker" % down, lambda: any(
                s["metric"].get("instance") == target for s in prom.query(down)["result"]), 30)
            checks.ok(True, "worker down")
        except TimeoutError as e:
            checks.ok(False, str(e))
        try:
            cluster.wait_until("DroplessWorkerDown pending", lambda: any(
                a["labels"]["alertname"] == "DroplessWorkerDown" and a["labels"].get("instance") == target
                and a["state"] in ("pending", "firing") for a in prom.api("alerts")["alerts"]), 30)
            checks.ok(True, "worker down alert pending")
        except TimeoutError as e:
            checks.ok(False, str(e))
        lost = rules["DroplessWorkerLost"]["query"]
        try:
            cluster.wait_until("%s returns data" % lost, lambda: prom.query(lost)["result"], 30)
            checks.ok(True, "worker lost")
        except TimeoutError as e:
            checks.ok(False, str(e))
    except (TimeoutError, RuntimeError) as e:
        checks.ok(False, "setup: %s" % e)
        for name, proc in procs.procs.items():
            state = "running" if proc.poll() is None else "exited with %s" % proc.returncode
            print("---- %s (%s), log tail ----\n%s" % (name, state, procs.log(name, 2000)))
    finally:
        procs.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("kept", tmp)
    print("%d passed, %d failed" % (checks.passed, len(checks.failed)))
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
