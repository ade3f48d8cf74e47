"""Real dropless processes (and Prometheus) on loopback for the observability tests: start, wait,
stop. Python 3 standard library only."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

SKIP = 77  # CTest SKIP_RETURN_CODE


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_until(what, fn, timeout, interval=0.2):
    """Polls fn until it returns a truthy value; raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = fn()
            if value:
                return value
            last = value
        except (OSError, ValueError, urllib.error.URLError) as e:
            last = e
        except RuntimeError as e:
            if "exited with" in str(e):
                raise
            last = e
        if time.monotonic() >= deadline:
            raise TimeoutError("%s: not within %.0f s (last: %r)" % (what, timeout, last))
        time.sleep(interval)


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8")


def descendants(pid):
    """Every process below pid, children first found by /proc/*/stat parent links."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    stat = f.read()
                parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                pass
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, parent in parents.items() if parent == p]
        out.extend(kids)
        frontier.extend(kids)
    return out


class Processes:
    """Child processes with their output in log files under a directory; stop() ends each one and
    everything it started (rank processes), by pid."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.procs = {}

    def start(self, name, argv, env=None):
        log = open(os.path.join(self.log_dir, name + ".log"), "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, **(env or {})))
        log.close()
        self.procs[name] = proc
        return proc

    def alive(self, name):
        return self.procs[name].poll() is None

    def log(self, name, tail=4000):
        with open(os.path.join(self.log_dir, name + ".log"), "rb") as f:
            return f.read().decode("utf-8", "replace")[-tail:]

    def kill(self, name, sig=signal.SIGKILL):
        """Kills the process and its descendants at once, like a node going away."""
        proc = self.procs[name]
        if proc.poll() is not None:
            return
        for pid in [proc.pid] + descendants(proc.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)

    def stop(self):
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is not None:
                continue
            below = descendants(proc.pid)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            for pid in below:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


class Cli:
    # security: the CLI's flags for the coordinator's TLS and token; default plaintext (--insecure).
    def __init__(self, binary, coordinator, security=("--insecure",)):
        self.binary, self.coordinator, self.security = binary, coordinator, list(security)

    def run(self, *args, timeout=30):
        r = subprocess.run([self.binary] + self.security + ["--coordinator", self.coordinator] + list(args),
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError("dropless %s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr.strip()))
        return r.stdout

    def json(self, *args):
        return json.loads(self.run(*(list(args) + ["-o", "json"])))


def parse_exposition(text):
    """Prometheus text format -> {family: {"type": t, "labels": set of label names, "samples": n}}."""
    families, sample_family = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, mtype = line.split(None, 3)
            families[name] = {"type": mtype.strip(), "labels": set(), "samples": 0}
            continue
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        family = name
        if family not in families:
            for suffix in ("_bucket", "_sum", "_count", "_total"):
                if name.endswith(suffix) and name[: -len(suffix)] in families:
                    family = name[: -len(suffix)]
                    break
        if family not in families:
            families[family] = {"type": "untyped", "labels": set(), "samples": 0}
        labels = set()
        if "{" in line:
            body = line[line.index("{") + 1: line.rindex("}")]
            labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"', body))
        labels.discard("le")
        families[family]["labels"] |= labels
        families[family]["samples"] += 1
        sample_family[name] = family
    return families


def grpc_health_check(port, service="", timeout=5):
    """grpc.health.v1.Health/Check over plaintext HTTP/2, as the kubelet's grpc probe makes it.
    Returns the status (1 = SERVING); raises RuntimeError when no answer comes."""
    import struct

    def frame(ftype, flags, stream, payload=b""):
        return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload

    def literal(name, value):  # HPACK literal header field without indexing, new name, no Huffman
        name, value = name.encode(), value.encode()
        assert len(name) < 127 and len(value) < 127
        return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value

    headers = b"".join(literal(k, v) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", "/grpc.health.v1.Health/Check"),
        (":authority", "127.0.0.1:%d" % port), ("content-type", "application/grpc"), ("te", "trailers")))
    request = (b"\x0a" + bytes([len(service)]) + service.encode()) if service else b""
    message = b"\x00" + struct.pack(">I", len(request)) + request
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) + frame(1, 0x4, 1, headers)
                  + frame(0, 0x1, 1, message))
        buf, data = b"", b""
        while True:
            while len(buf) < 9 or len(buf) < 9 + int.from_bytes(buf[:3], "big"):
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError("connection closed before the health answer")
                buf += chunk
            length = int.from_bytes(buf[:3], "big")
            ftype, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            payload, buf = buf[9:9 + length], buf[9 + length:]
            if ftype == 4 and not flags & 0x1:
                s.sendall(frame(4, 0x1, 0))  # SETTINGS ack
            elif ftype == 6 and not flags & 0x1:
                s.sendall(frame(6, 0x1, 0, payload))  # PING ack
            elif ftype == 7:
                raise RuntimeError("GOAWAY from the server")
            elif ftype == 3 and stream == 1:
                raise RuntimeError("stream reset by the server")
            elif ftype == 0 and stream == 1:
                data += payload
            if stream == 1 and ftype in (0, 1) and flags & 0x1:
                break
    # One gRPC message: flag, length, HealthCheckResponse{status (field 1, varint)}.
    if len(data) < 5:
        raise RuntimeError("no health response message (grpc-status in trailers only)")
    body = data[5:5 + int.from_bytes(data[1:5], "big")]
    return body[1] if body[:1] == b"\x08" else 0
