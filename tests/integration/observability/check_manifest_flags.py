#!/usr/bin/env python3
"""The flags, ports and paths the Kubernetes manifests pass to the binaries are ones the binaries
accept and serve on. For every container of base and every overlay (rendered with kubectl kustomize):

  - the binary is the image's ENTRYPOINT (deploy/docker) and every --flag is one its --helpfull lists;
  - --listen / --worker-listen / --metrics-port are the container's grpc / worker-grpc / metrics
    ports (and the probes' and Services');
  - absolute paths (--db, --work-dir, ...) lie on a volume mount (the root filesystem is read-only),
    the coordinator's database on its PersistentVolumeClaim;
  - the worker's --coordinator names the coordinator Service's worker-grpc port (its grpc port
    when the coordinator has no --worker-listen);
  - the binary really starts with those arguments (ports moved to free loopback ports, mount paths to
    temporary folders, the Secrets' files made by scripts/dev-certs with the modes the kubelet gives
    them (defaultMode, plus group read under an fsGroup), an init container's `install` of a file
    done likewise, $(VARS) expanded as the kubelet would): the coordinator serves its API (TLS,
    tokens; it refuses a tokens file others may read) and
    /metrics and answers its grpc probes' health checks SERVING, and the worker registers with it as
    READY and serves /metrics.

Usage: check_manifest_flags.py --bin-dir DIR --source-dir DIR --ops-tools DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "unit", "observability"))
import cluster  # noqa: E402
import manifests  # noqa: E402

FIELD_VALUES = {"spec.nodeName": "k8s-node-a", "status.podIP": "127.0.0.1"}
failures = []


def fail(where, msg):
    failures.append("%s: %s" % (where, msg))
    print("FAIL: %s: %s" % (where, msg), flush=True)


def helpfull_flags(binary):
    r = subprocess.run([binary, "--helpfull"], capture_output=True, text=True, timeout=30)
    names = set(re.findall(r"^\s+--([A-Za-z0-9_]+)\b", r.stdout + r.stderr, re.M))
    if not names:
        raise RuntimeError("%s --helpfull listed no flags (exit %d)" % (binary, r.returncode))
    return names


def container_env(c):
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = FIELD_VALUES.get(e["valueFrom"]["fieldRef"]["fieldPath"], "x")
    return env


def port_of(value):
    return int(value.rsplit(":", 1)[1]) if ":" in value else int(value)


def check_static(where, obj, c, flags, objects):
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    served = {}
    if "listen" in flags:
        served["grpc"] = port_of(flags["listen"])
    if "worker-listen" in flags:
        served["worker-grpc"] = port_of(flags["worker-listen"])
    if "metrics-port" in flags:
        served["metrics"] = int(flags["metrics-port"])
    if served != ports:
        fail(where, "the flags serve %s, the container declares ports %s" % (served, ports))
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(probe_name, {})
        for kind in ("grpc", "httpGet", "tcpSocket"):
            if kind in probe:
                p = probe[kind]["port"]
                p = ports.get(p, p)
                want = served.get("grpc") if kind == "grpc" else None
                if p not in served.values() or (want is not None and p != want):
                    fail(where, "%s %s port %s is not what the flags serve (%s)" % (probe_name, kind, p, served))
    mounts = c.get("volumeMounts", [])
    claims = {t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", [])}
    for name, value in flags.items():
        if not value or not value.startswith("/"):
            continue
        mount = max((m for m in mounts if value == m["mountPath"] or value.startswith(m["mountPath"].rstrip("/") + "/")),
                    key=lambda m: len(m["mountPath"]), default=None)
        if mount is None:
            fail(where, "--%s=%s is on no volume mount (the root filesystem is read-only)" % (name, value))
        elif name == "db" and mount["name"] not in claims:
            fail(where, "--db=%s is not on the PersistentVolumeClaim (%s)" % (value, sorted(claims)))
    if "coordinator" in flags:
        host, port = flags["coordinator"].rsplit(":", 1)
        host = host.split(".")[0]
        svc = [s for s in objects if s["kind"] == "Service" and s["metadata"]["name"] == host]
        if not svc:
            fail(where, "--coordinator=%s names no Service" % flags["coordinator"])
        else:
            names = {p.get("name") for p in svc[0]["spec"]["ports"]}
            want = "worker-grpc" if "worker-grpc" in names else "grpc"
            if not any(p["port"] == int(port) and p.get("name") == want for p in svc[0]["spec"]["ports"]):
                fail(where, "--coordinator=%s is not the Service's %s port" % (flags["coordinator"], want))


def provision_secrets(tmp, source_dir):
    """The Secrets' files, made by scripts/dev-certs in tmp/dev-certs. Returns the CLI's flags."""
    certs = os.path.join(tmp, "dev-certs")
    subprocess.run(["bash", os.path.join(source_dir, "scripts", "dev-certs"), certs,
                    FIELD_VALUES["spec.nodeName"]], check=True, capture_output=True, timeout=60)
    return ["--tls-ca", os.path.join(certs, "ca.pem"),
            "--token-file", os.path.join(certs, "tokens", "admin.token")]


def install_file(source, target, mode):
    """Copies source to target with mode, as `install -m MODE` does: a target left read-only by an
    earlier container of the run is replaced."""
    if os.path.exists(target):
        os.chmod(target, 0o600)
    shutil.copyfile(source, target)
    os.chmod(target, mode)


def mount_secrets(pod, tmp):
    """The pod's Secret volumes as the kubelet writes them, in the folders relocate() maps them to
    (their volume names): the files of provision_secrets() with the volume's defaultMode (0644
    when unset), plus group read when the pod has an fsGroup (the kubelet adds it whatever the
    mode, kubernetes/kubernetes#57923)."""
    certs = os.path.join(tmp, "dev-certs")
    node = FIELD_VALUES["spec.nodeName"]
    files = {
        "dropless-coordinator-tls": {"tls.crt": "coordinator.pem", "tls.key": "coordinator.key",
                                     "ca.crt": "ca.pem"},
        "dropless-tokens": {"tokens.yaml": "tokens.yaml"},
        "dropless-worker-tls": {"ca.crt": "ca.pem", node + ".crt": "workers/%s.pem" % node,
                                node + ".key": "workers/%s.key" % node},
    }
    fs_group = pod.get("securityContext", {}).get("fsGroup") is not None
    for volume in pod.get("volumes", []):
        secret = volume.get("secret")
        if secret is None or secret.get("secretName") not in files:
            continue
        mode = secret.get("defaultMode", 0o644) | (0o440 if fs_group else 0)
        folder = os.path.join(tmp, volume["name"])
        os.makedirs(folder, exist_ok=True)
        for name, source in files[secret["secretName"]].items():
            install_file(os.path.join(certs, source), os.path.join(folder, name), mode)


def run_install(where, c, tmp):
    """An init container that runs `install -m MODE SRC DST` (the coordinator's copy of its tokens
    file): the same copy, between the folders its mounts are relocated to."""
    command = c.get("command", [])
    if len(command) != 5 or command[1] != "-m":
        fail(where, "only `install -m MODE SRC DST` init containers are understood: %s" % command)
        return
    paths = relocate({"src": command[3], "dst": command[4]}, c.get("volumeMounts", []), tmp, {})
    for name, path in paths.items():
        if path == command[3 if name == "src" else 4]:
            fail(where, "%s %s is on no volume mount" % (name, path))
            return
    install_file(paths["src"], paths["dst"], int(command[2], 8))


def relocate(flags, mounts, tmp, ports):
    """The same arguments for a run on this machine: ports -> free loopback ports, paths on mounts ->
    temporary folders, 0.0.0.0 -> 127.0.0.1."""
    out = {}
    for name, value in flags.items():
        if value is None:
            out[name] = value
            continue
        if name == "listen":
            ports["grpc"] = cluster.free_port()
            value = "127.0.0.1:%d" % ports["grpc"]
        elif name == "worker-listen":
            ports["worker-grpc"] = cluster.free_port()
            value = "127.0.0.1:%d" % ports["worker-grpc"]
        elif name == "metrics-port":
            ports["metrics"] = cluster.free_port()
            value = str(ports["metrics"])
        elif name in ("metrics-address",) and value == "0.0.0.0":
            value = "127.0.0.1"
        elif name == "coordinator":
            value = "127.0.0.1:%d" % ports["coordinator"]
        elif value.startswith("/"):
            for m in sorted(mounts, key=lambda m: -len(m["mountPath"])):
                if value == m["mountPath"] or value.startswith(m["mountPath"].rstrip("/") + "/"):
                    value = os.path.join(tmp, m["name"]) + value[len(m["mountPath"]):]
                    os.makedirs(os.path.join(tmp, m["name"]), exist_ok=True)
                    break
        out[name] = value
    return out


def run_for_real(where, binary, flags, c, tmp, state, cli_binary):
    mounts = c.get("volumeMounts", [])
    ports = {"coordinator": state.get("coordinator_port")}
    if "coordinator" in flags and not ports["coordinator"]:
        fail(where, "not started: no coordinator of this rendering came up to register with")
        return
    args = relocate(flags, mounts, tmp, ports)
    argv = [binary] + ["--%s=%s" % (k, v) if v is not None else "--" + k for k, v in args.items()]
    procs = state["procs"]
    name = "%s-%d" % (os.path.basename(binary), len(procs.procs))
    procs.start(name, argv)

    def up(check):
        def probe():
            if not procs.alive(name):
                raise RuntimeError("exited with %s" % procs.procs[name].returncode)
            return check()
        return probe
    try:
        if "grpc" in ports:
            cluster.wait_until("%s gRPC port" % name, up(lambda: cluster.port_open(ports["grpc"])), 20)
            cli = cluster.Cli(cli_binary, "127.0.0.1:%d" % ports["grpc"], state["cli_security"])
            cli.json("get", "workers")  # the API answers
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(probe_name, {}).get("grpc")
                if probe is not None:  # the kubelet's probe, on the port --listen serves
                    try:
                        status = cluster.grpc_health_check(ports["grpc"], probe.get("service", ""))
                    except (OSError, RuntimeError) as e:
                        status = "nothing (%s)" % e
                    if status != 1:
                        fail(where, "%s: grpc.health.v1.Health/Check answers %s, not SERVING"
                             % (probe_name, status))
            # Workers dial the worker listener when there is one.
            state["coordinator_port"] = ports.get("worker-grpc", ports["grpc"])
            state["cli"] = cli
        if "metrics" in ports:
            cluster.wait_until("%s /metrics" % name, up(lambda: "# TYPE" in cluster.http_get(
                "http://127.0.0.1:%d/metrics" % ports["metrics"])), 20)
        if "node" in args and state.get("cli"):
            cluster.wait_until("worker %s READY" % args["node"], up(lambda: any(
                w["node"] == args["node"] and w["state"] == "READY"
                for w in state["cli"].json("get", "workers")["workers"])), 30)
        if not procs.alive(name):
            raise RuntimeError("exited")
    except (TimeoutError, RuntimeError) as e:
        fail(where, "%s did not come up with the manifest's arguments %s: %s\n%s"
             % (os.path.basename(binary), argv[1:], e, procs.log(name, 1500)))
    finally:
        if "grpc" not in ports:
            procs.kill(name, sig=15)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--ops-tools", required=True)
    args = parser.parse_args()
    manifests.ensure_tools(args.ops_tools)
    kubectl = manifests.find_kubectl(args.ops_tools)
    entrypoints = {s.title: s.entrypoint for s in manifests.dockerfile_stages(args.source_dir) if s.title}
    help_cache = {}
    checked = 0
    for name, path in manifests.kustomize_dirs(args.source_dir):
        if name == "monitoring":
            continue
        objects = manifests.render(kubectl, path)
        # Coordinators first: the workers of the same rendering register with the one started here.
        workloads = sorted(manifests.containers(objects), key=lambda t: t[0]["kind"] != "StatefulSet")
        with tempfile.TemporaryDirectory(prefix="dropless-manifest-flags-") as tmp:
            state = {"procs": cluster.Processes(tmp),
                     "cli_security": provision_secrets(tmp, args.source_dir)}
            try:
                for obj, pod, c in workloads:
                    where = "%s %s/%s" % (name, obj["kind"], obj["metadata"]["name"])
                    mount_secrets(pod, tmp)
                    if (c.get("command") or [""])[0] == "install":
                        run_install("%s init container %s" % (where, c["name"]), c, tmp)
                        checked += 1
                        continue
                    image = c["image"].rsplit(":", 1)[0]
                    command = c.get("command") or entrypoints.get(image)
                    if not command:
                        fail(where, "no command and no Dockerfile ENTRYPOINT for image %s" % image)
                        continue
                    binary = os.path.join(args.bin_dir, os.path.basename(command[-1]))
                    if not os.access(binary, os.X_OK):
                        fail(where, "the image runs %s, which this build has not made (%s)" % (command[-1], binary))
                        continue
                    if binary not in help_cache:
                        help_cache[binary] = helpfull_flags(binary)
                    env = container_env(c)
                    try:
                        parsed = manifests.parse_args([manifests.expand_env(a, env) for a in c.get("args", [])])
                    except ValueError as e:
                        fail(where, str(e))
                        continue
                    flags = dict(parsed)
                    for flag, value in parsed:
                        if "$(" in (value or ""):
                            fail(where, "--%s=%s uses a variable the container's env does not define" % (flag, value))
                        if flag.replace("-", "_") not in help_cache[binary]:
                            fail(where, "%s does not accept --%s (not in its --helpfull)" % (os.path.basename(binary), flag))
                    check_static(where, obj, c, flags, objects)
                    run_for_real(where, binary, flags, c, tmp, state,
                                 os.path.join(args.bin_dir, "dropless"))
                    checked += 1
            finally:
                state["procs"].stop()
    print("%d containers checked, %d failures" % (checked, len(failures)))
    return 1 if failures or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
