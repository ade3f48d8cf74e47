#!/usr/bin/env python3
"""Renders deploy/base, deploy/monitoring and every deploy/overlays/* with `kubectl kustomize`, validates
every object against the Kubernetes schemas (kubernetes-validate, strict), checks the Prometheus
Operator objects (no schema there) by structure, and checks that the pieces agree with each other:
selectors, named ports, probes, volumes, the ConfigMaps' contents against dashboards/ and the rule
file, the PrometheusRule's groups against the rule file, the scrape job names the rules assume, the
NetworkPolicy, and the Dockerfile behind every image. And what a production cluster expects: every
container with readiness and liveness probes (init containers have none), CPU and memory requests and
a memory limit; priority classes with the coordinator above the workers above job pods; no hostIPC; the workers' checkpoints
on a shared (ReadWriteMany) PersistentVolumeClaim.

Usage: check_manifests.py --source-dir DIR --ops-tools DIR
"""
import argparse
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import manifests  # noqa: E402

CHECKPOINT_CLAIM = "dropless-checkpoints"
CHECKPOINT_PATH = "/var/lib/dropless/checkpoints"
# PriorityClass of each pod (by workload name), highest first; job pods get the last.
PRIORITY_ORDER = ["dropless-coordinator", "dropless-worker", "dropless-job"]
CLUSTER_SCOPED = {"Namespace", "PriorityClass"}

failures = []


def fail(where, msg):
    failures.append("%s: %s" % (where, msg))


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# The fields of ServiceMonitor / PodMonitor (monitoring.coreos.com/v1) these manifests may use; the
# operator ignores unknown fields silently, so a typo would cost the scrape.
MONITOR_SCHEMA = {
    "ServiceMonitor": {"spec": {"jobLabel", "selector", "endpoints", "namespaceSelector"},
                       "endpoints": {"port", "path", "interval", "scrapeTimeout", "honorLabels", "scheme"}},
    "PodMonitor": {"spec": {"jobLabel", "selector", "podMetricsEndpoints", "namespaceSelector"},
                   "podMetricsEndpoints": {"port", "path", "interval", "scrapeTimeout", "honorLabels",
                                           "scheme"}},
}
SCRAPE_JOB = {"ServiceMonitor": "dropless-coordinator", "PodMonitor": "dropless-worker"}


def check_monitor(where, obj, objects, cross_check):
    kind = obj["kind"]
    schema = MONITOR_SCHEMA[kind]
    if obj.get("apiVersion") != "monitoring.coreos.com/v1":
        fail(where, "apiVersion must be monitoring.coreos.com/v1")
    spec = obj.get("spec", {})
    for key in set(spec) - schema["spec"]:
        fail(where, "unknown spec field %r" % key)
    endpoints_key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    endpoints = spec.get(endpoints_key, [])
    if not endpoints:
        fail(where, "no %s" % endpoints_key)
    for e in endpoints:
        for key in set(e) - schema[endpoints_key]:
            fail(where, "unknown endpoint field %r" % key)
        if e.get("path", "/metrics") != "/metrics":
            fail(where, "path must be /metrics")
    if any(e.get("honorLabels") for e in endpoints):
        fail(where, "honorLabels must stay off: no dropless series carries a target label (`job` is "
                    "the scrape job; the dropless job id is job_id)")
    if not cross_check:
        return
    selector = spec.get("selector", {}).get("matchLabels", {})
    if kind == "ServiceMonitor":
        targets = [o for o in objects if o["kind"] == "Service"
                   and labels_match(selector, o["metadata"].get("labels", {}))
                   and o["spec"].get("clusterIP") != "None"]
        ports = {p.get("name") for t in targets for p in t["spec"].get("ports", [])}
        job_values = {t["metadata"]["labels"].get(spec.get("jobLabel")) for t in targets}
    else:
        pods = [(o, pod) for o, pod, _ in manifests.containers(objects)
                if labels_match(selector, o["spec"]["template"]["metadata"].get("labels", {}))]
        targets = pods
        ports = {p.get("name") for _, pod in pods for c in pod["containers"] for p in c.get("ports", [])}
        job_values = {o["spec"]["template"]["metadata"]["labels"].get(spec.get("jobLabel")) for o, _ in pods}
    if not targets:
        fail(where, "selector %s matches nothing" % selector)
    if job_values != {SCRAPE_JOB[kind]}:
        fail(where, "scrape job name (label %r) is %s; the rules and dashboards expect %r"
             % (spec.get("jobLabel"), job_values, SCRAPE_JOB[kind]))
    for e in endpoints:
        if e.get("port") not in ports:
            fail(where, "port %r is not a port of the selected objects %s" % (e.get("port"), ports))


def check_prometheus_rule(where, obj, source_dir):
    import yaml
    if obj.get("apiVersion") != "monitoring.coreos.com/v1":
        fail(where, "apiVersion must be monitoring.coreos.com/v1")
    if set(obj.get("spec", {})) != {"groups"}:
        fail(where, "spec must hold exactly `groups`")
    with open(os.path.join(source_dir, "deploy/monitoring/alerts.rules.yaml"), encoding="utf-8") as f:
        want = yaml.safe_load(f)["groups"]
    if obj.get("spec", {}).get("groups") != want:
        fail(where, "spec.groups differ from deploy/monitoring/alerts.rules.yaml")
    for group in obj.get("spec", {}).get("groups", []):
        for rule in group.get("rules", []):
            if "alert" in rule and not rule.get("annotations", {}).get("runbook_url"):
                fail(where, "alert %s has no runbook_url" % rule["alert"])


def check_production(where, name, objects):
    """Probes, resources, priority classes, hostIPC and the checkpoint volume."""
    classes = {o["metadata"]["name"]: o.get("value") for o in objects if o["kind"] == "PriorityClass"}
    values = [classes.get(c) for c in PRIORITY_ORDER]
    if None in values:
        fail(where, "PriorityClasses %s must all be rendered (got %s)" % (PRIORITY_ORDER, sorted(classes)))
    elif values != sorted(values, reverse=True) or len(set(values)) != len(values):
        fail(where, "priorities must fall strictly in the order %s, got %s" % (PRIORITY_ORDER, values))
    claims = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolumeClaim"}
    for obj, pod, c in manifests.containers(objects):
        w = "%s %s/%s" % (where, obj["kind"], obj["metadata"]["name"])
        workload = obj["metadata"]["name"]
        if workload in PRIORITY_ORDER[:2] and pod.get("priorityClassName") != workload:
            fail(w, "priorityClassName must be %s, got %r" % (workload, pod.get("priorityClassName")))
        if pod.get("hostIPC") or pod.get("hostPID") or pod.get("hostNetwork"):
            fail(w, "hostIPC/hostPID/hostNetwork: no backend needs them (a node's ranks share the pod)")
        # An init container runs to its end before the others start: it has no probes.
        for probe in ("readinessProbe", "livenessProbe"):
            if probe not in c and c not in pod.get("initContainers", []):
                fail(w, "no %s" % probe)
        resources = c.get("resources", {})
        for key in ("cpu", "memory"):
            if key not in resources.get("requests", {}):
                fail(w, "no %s request" % key)
        if "memory" not in resources.get("limits", {}):
            fail(w, "no memory limit")
        if workload != "dropless-worker":
            continue
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == CHECKPOINT_PATH]
        claim = volumes.get(mounts[0]["name"], {}).get("persistentVolumeClaim", {}) if mounts else {}
        if claim.get("claimName") != CHECKPOINT_CLAIM:
            fail(w, "checkpoints (%s) must be the PersistentVolumeClaim %s" % (CHECKPOINT_PATH, CHECKPOINT_CLAIM))
        elif CHECKPOINT_CLAIM not in claims:
            fail(w, "PersistentVolumeClaim %s is not rendered" % CHECKPOINT_CLAIM)
        elif name != "overlays/cpu-dev" and \
                "ReadWriteMany" not in claims[CHECKPOINT_CLAIM]["spec"].get("accessModes", []):
            fail(w, "%s must be ReadWriteMany: an attempt rescheduled to another node resumes from it"
                 % CHECKPOINT_CLAIM)


def check_workloads(where, objects):
    by_kind = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(o)
    accounts = {o["metadata"]["name"] for o in by_kind.get("ServiceAccount", [])}
    for obj, pod, c in manifests.containers(objects):
        w = "%s %s/%s" % (where, obj["kind"], obj["metadata"]["name"])
        spec = obj["spec"]
        if not labels_match(spec["selector"]["matchLabels"], spec["template"]["metadata"].get("labels", {})):
            fail(w, "selector does not match the pod template's labels")
        if pod.get("serviceAccountName") not in accounts:
            fail(w, "serviceAccountName %r is not rendered" % pod.get("serviceAccountName"))
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        volumes.update({t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates", [])})
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                fail(w, "volumeMount %r has no volume" % m["name"])
        named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c.get(probe_name)
            if not probe:
                continue
            for kind in ("grpc", "httpGet", "tcpSocket"):
                if kind in probe:
                    port = probe[kind]["port"]
                    if port not in named and port not in named.values():
                        fail(w, "%s port %r is not a container port" % (probe_name, port))
        if obj["kind"] == "StatefulSet" and c not in pod.get("initContainers", []):
            if not spec.get("volumeClaimTemplates"):
                fail(w, "no volumeClaimTemplates (the database needs a persistent volume)")
            # The kubelet's grpc probes speak plaintext: a TLS API port (--tls-cert) is probed
            # with a TCP check of that port, a plaintext one through its health service.
            tls = any(a.startswith("--tls-cert") for a in c.get("args", []))
            for probe_name in ("readinessProbe", "livenessProbe"):
                probe = c.get(probe_name, {})
                if tls and probe.get("tcpSocket", {}).get("port") not in ("grpc", named.get("grpc")):
                    fail(w, "%s must be a tcpSocket probe of the grpc port (it speaks TLS)" % probe_name)
                elif not tls and "grpc" not in probe:
                    fail(w, "%s must be a grpc probe (the health service)" % probe_name)
    for svc in by_kind.get("Service", []):
        w = "%s Service/%s" % (where, svc["metadata"]["name"])
        pods = [(o, c) for o, _, c in manifests.containers(objects)
                if labels_match(svc["spec"].get("selector", {}), o["spec"]["template"]["metadata"]["labels"])]
        if not pods:
            fail(w, "selector matches no pod")
        named = {p["name"] for _, c in pods for p in c.get("ports", [])}
        for p in svc["spec"].get("ports", []):
            if isinstance(p.get("targetPort"), str) and p["targetPort"] not in named:
                fail(w, "targetPort %r is not a container port" % p["targetPort"])
    for np in by_kind.get("NetworkPolicy", []):
        w = "%s NetworkPolicy/%s" % (where, np["metadata"]["name"])
        selected = [(o, c) for o, _, c in manifests.containers(objects)
                    if labels_match(np["spec"]["podSelector"].get("matchLabels", {}),
                                    o["spec"]["template"]["metadata"]["labels"])]
        if not selected:
            fail(w, "podSelector matches no pod")
        named = {p["name"] for _, c in selected for p in c.get("ports", [])}
        for rule in np["spec"].get("ingress", []):
            for p in rule.get("ports", []):
                if isinstance(p["port"], str) and p["port"] not in named:
                    fail(w, "port %r is not a port of the selected pods" % p["port"])
        workers = [o for o, _, _ in manifests.containers(objects) if o["metadata"]["name"] == "dropless-worker"]
        for o in workers:
            wl = o["spec"]["template"]["metadata"]["labels"]
            if not any(labels_match(peer.get("podSelector", {}).get("matchLabels", {}), wl)
                       and "namespaceSelector" not in peer
                       for rule in np["spec"].get("ingress", []) for peer in rule.get("from", [])):
                fail(w, "the worker pods may not reach the coordinator")


def check_configmaps(where, objects, source_dir):
    maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    dashboards = maps.get("dropless-grafana-dashboards")
    if dashboards is None:
        fail(where, "no dropless-grafana-dashboards ConfigMap")
    else:
        files = sorted(glob.glob(os.path.join(source_dir, "dashboards/*.json")))
        if sorted(dashboards["data"]) != sorted(os.path.basename(f) for f in files):
            fail(where, "dashboards ConfigMap holds %s, dashboards/ has %s"
                 % (sorted(dashboards["data"]), [os.path.basename(f) for f in files]))
        for f in files:
            with open(f, encoding="utf-8") as fh:
                if dashboards["data"].get(os.path.basename(f)) != fh.read():
                    fail(where, "dashboards ConfigMap's %s differs from the file" % os.path.basename(f))
    if "dropless-grafana-provisioning" not in maps:
        fail(where, "no dropless-grafana-provisioning ConfigMap")
    rules = maps.get("dropless-prometheus-rules")
    with open(os.path.join(source_dir, "deploy/monitoring/alerts.rules.yaml"), encoding="utf-8") as fh:
        if rules is None or list(rules["data"].values()) != [fh.read()]:
            fail(where, "dropless-prometheus-rules ConfigMap missing or not the rule file")


def check_gpu_and_cpu(where, name, objects):
    for obj, pod, c in manifests.containers(objects):
        if obj["metadata"]["name"] != "dropless-worker":
            continue
        limits = c.get("resources", {}).get("limits", {})
        args = dict(manifests.parse_args(c.get("args", [])))
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if name == "overlays/cpu-dev":
            if any(k.startswith("nvidia.com/") for k in list(limits) + list(c.get("resources", {}).get("requests", {}))):
                fail(where, "the CPU overlay requests GPUs")
            if args.get("gpus") != "none" or not args.get("cpu-slots", "").isdigit():
                fail(where, "the CPU overlay's worker needs --gpus=none and --cpu-slots=N")
        else:
            if int(limits.get("nvidia.com/gpu", 0)) < 1:
                fail(where, "the worker requests no nvidia.com/gpu")
            if env.get("NCCL_NVLS_ENABLE") != "0":
                fail(where, "the GPU worker needs NCCL_NVLS_ENABLE=0")
            if "nvidia.com/gpu.present" not in pod.get("nodeSelector", {}):
                fail(where, "the GPU worker must select GPU nodes")


def check_images(where, objects, stages, source_dir):
    by_title = {s.title: s for s in stages if s.title}
    for obj, pod, c in manifests.containers(objects):
        image = c["image"].rsplit(":", 1)[0] if ":" in c["image"].split("/")[-1] else c["image"]
        stage = by_title.get(image)
        w = "%s %s/%s" % (where, obj["kind"], obj["metadata"]["name"])
        if stage is None:
            fail(w, "no Dockerfile stage builds image %r (LABEL org.opencontainers.image.title)" % image)
            continue
        if not stage.entrypoint:
            fail(w, "%s stage %s has no ENTRYPOINT" % (stage.dockerfile, stage.name))
        ports = {p["containerPort"] for p in c.get("ports", [])}
        # An init container (a copy before the server starts) serves nothing.
        if ports != stage.exposed and c not in pod.get("initContainers", []):
            fail(w, "container ports %s but %s stage %s EXPOSEs %s"
                 % (sorted(ports), stage.dockerfile, stage.name, sorted(stage.exposed)))


def check_dockerfiles(stages, source_dir):
    targets = cmake_targets(source_dir)
    for s in stages:
        for t in s.build_targets:
            if t not in targets:
                fail(s.dockerfile, "builds --target %s, which no CMakeLists.txt defines" % t)
        for src in s.copies:
            if src != "." and not os.path.exists(os.path.join(source_dir, src)):
                fail(s.dockerfile, "COPY source %s does not exist" % src)


def check_cuda_images(source_dir):
    """A Dockerfile that builds with CUDA ships the CUDA engine beside the rank binary: the rank
    dlopens libdropless_engine_cuda.so from its own directory, and without it every cuda job fails."""
    import glob
    for path in sorted(glob.glob(os.path.join(source_dir, "deploy/docker/Dockerfile*"))):
        if path.endswith(".dockerignore"):
            continue
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"\\\n", " ", f.read())
        if "-DDROPLESS_ENABLE_CUDA=ON" not in text:
            continue
        name = os.path.relpath(path, source_dir)
        if not re.search(r"--target\b[^\n]*\bdropless_engine_cuda\b", text):
            fail(name, "builds with CUDA but not --target dropless_engine_cuda")
        copies = [l for l in text.splitlines() if l.strip().upper().startswith("COPY --FROM")]
        if not any("libdropless_engine_cuda.so" in l and "dropless-worker-rank" in l for l in copies):
            fail(name, "its image does not copy libdropless_engine_cuda.so beside dropless-worker-rank")


def cmake_targets(source_dir):
    names = set()
    for root, dirs, files in os.walk(source_dir):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build", "third_party"))]
        if "CMakeLists.txt" in files:
            with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
                names |= set(re.findall(r"add_(?:executable|library)\(\s*([A-Za-z0-9_.+-]+)", f.read()))
    return names


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--ops-tools", required=True)
    args = parser.parse_args()
    manifests.ensure_tools(args.ops_tools)
    import kubernetes_validate
    kubectl = manifests.find_kubectl(args.ops_tools)
    stages = manifests.dockerfile_stages(args.source_dir)
    if not stages:
        fail("deploy/docker", "no Dockerfile")
    check_dockerfiles(stages, args.source_dir)
    check_cuda_images(args.source_dir)
    rendered = 0
    for name, path in manifests.kustomize_dirs(args.source_dir):
        try:
            objects = manifests.render(kubectl, path)
        except RuntimeError as e:
            fail(name, str(e))
            continue
        rendered += len(objects)
        for obj in objects:
            where = "%s %s/%s" % (name, obj.get("kind"), obj.get("metadata", {}).get("name"))
            if obj["kind"] not in CLUSTER_SCOPED and name != "monitoring" and \
                    obj["metadata"].get("namespace") != "dropless":
                fail(where, "not in namespace dropless")
            if obj["kind"] in MONITOR_SCHEMA:
                check_monitor(where, obj, objects, cross_check=name != "monitoring")
                continue
            if obj["kind"] == "PrometheusRule":
                check_prometheus_rule(where, obj, args.source_dir)
                continue
            try:
                kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
            except kubernetes_validate.ValidationError as e:
                fail(where, "schema: %s at %s" % (e.message, ".".join(str(p) for p in e.path)))
            except Exception as e:  # an unknown kind or version
                fail(where, "schema: %s" % e)
        if name == "monitoring":
            continue
        check_workloads(name, objects)
        check_production(name, name, objects)
        check_configmaps(name, objects, args.source_dir)
        check_gpu_and_cpu(name, name, objects)
        check_images(name, objects, stages, args.source_dir)
        print("%s: %d objects" % (name, len(objects)))
    for f in failures:
        print("FAIL:", f)
    print("%d objects rendered and checked, %d failures" % (rendered, len(failures)))
    return 1 if failures or not rendered else 0


if __name__ == "__main__":
    sys.exit(main())
