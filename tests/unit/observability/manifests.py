"""Rendering deploy/ with kustomize and reading what the manifests and Dockerfiles say (shared by the
deployment tests). Needs PyYAML, which the ops-tools venv (scripts/install-ops-tools) has."""
import os
import re
import shutil
import subprocess
import sys

SKIP = 77  # CTest SKIP_RETURN_CODE


def ensure_tools(ops_tools):
    """Re-executes the calling script under the ops-tools venv's python when PyYAML is missing here;
    exits SKIP with a clear message when no venv has it either."""
    try:
        import yaml  # noqa: F401
        import kubernetes_validate  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.path.abspath(os.path.join(ops_tools, "venv"))
    venv_python = os.path.join(venv, "bin", "python3")
    if os.path.exists(venv_python) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        os.execv(venv_python, [venv_python] + sys.argv)
    print("SKIPPED: PyYAML / kubernetes-validate not found (no venv at %s); run scripts/install-ops-tools"
          % ops_tools)
    sys.exit(SKIP)


def find_kubectl(ops_tools):
    for candidate in (os.path.join(ops_tools, "venv", "bin", "kubectl"), shutil.which("kubectl")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    print("SKIPPED: kubectl not found (looked in %s/venv/bin and PATH); run scripts/install-ops-tools"
          % ops_tools)
    sys.exit(SKIP)


def kustomize_dirs(source_dir):
    """deploy/base, deploy/monitoring and every deploy/overlays/*, as (name, path)."""
    deploy = os.path.join(source_dir, "deploy")
    dirs = [("base", os.path.join(deploy, "base")), ("monitoring", os.path.join(deploy, "monitoring"))]
    overlays = os.path.join(deploy, "overlays")
    for name in sorted(os.listdir(overlays)):
        if os.path.exists(os.path.join(overlays, name, "kustomization.yaml")):
            dirs.append(("overlays/" + name, os.path.join(overlays, name)))
    return dirs


def render(kubectl, path):
    """The objects `kubectl kustomize path` renders; raises RuntimeError with kustomize's message."""
    import yaml
    result = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError("kubectl kustomize %s: %s" % (path, result.stderr.strip()))
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def containers(objects):
    """(workload, pod spec, container) for every container of every workload."""
    for obj in objects:
        spec = obj.get("spec", {})
        pod = spec.get("template", {}).get("spec") if obj["kind"] in (
            "Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet") else None
        if obj["kind"] == "Pod":
            pod = spec
        if pod is None:
            continue
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            yield obj, pod, c


def parse_args(args):
    """--name=value / --name value / --flag  ->  [(name, value or None)] in order."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ValueError("argument %r is not a --flag" % a)
        if "=" in a:
            name, value = a[2:].split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            name, value = a[2:], args[i + 1]
            i += 1
        else:
            name, value = a[2:], None
        out.append((name, value))
        i += 1
    return out


def expand_env(value, env):
    """Kubernetes' $(VAR) expansion in args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), value)


class DockerStage:
    def __init__(self, dockerfile, name):
        self.dockerfile, self.name = dockerfile, name
        self.title, self.entrypoint, self.exposed, self.copies = None, None, set(), []
        self.build_targets = []  # cmake --build ... --target NAMES


def dockerfile_stages(source_dir):
    """Every stage of deploy/docker/Dockerfile*, with its image title label, ENTRYPOINT, EXPOSE and COPYs."""
    import glob
    import json
    stages = []
    for path in sorted(glob.glob(os.path.join(source_dir, "deploy/docker/Dockerfile*"))):
        if path.endswith(".dockerignore"):
            continue
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"\\\n", " ", f.read())
        stage = None
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            word, _, rest = line.partition(" ")
            word = word.upper()
            if word == "FROM":
                m = re.search(r"\bAS\s+(\S+)", rest, re.I)
                stage = DockerStage(os.path.relpath(path, source_dir), m.group(1) if m else None)
                stages.append(stage)
            elif stage is None:
                continue
            elif word == "LABEL":
                m = re.search(r'org\.opencontainers\.image\.title="([^"]+)"', rest)
                if m:
                    stage.title = m.group(1)
            elif word == "ENTRYPOINT":
                stage.entrypoint = json.loads(rest)
            elif word == "EXPOSE":
                stage.exposed |= {int(p.split("/")[0]) for p in rest.split()}
            elif word == "RUN":
                for m in re.finditer(r"--target((?:\s+[A-Za-z0-9_.+-]+)+)", rest):
                    stage.build_targets.extend(m.group(1).split())
            elif word == "COPY":
                parts = [p for p in rest.split() if not p.startswith("--")]
                if "--from" not in rest:
                    stage.copies.extend(parts[:-1])
    return stages
