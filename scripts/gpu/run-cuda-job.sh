#!/usr/bin/env bash
# The product on a GPU machine: a coordinator and a worker daemon (GPUs found by itself) on
# loopback, a cuda job submitted with the CLI, watched live, the worker's /metrics read while it
# runs and the stored step metrics printed at the end. Runs from a bundle made on the build
# machine with ../shared/tools/device-bundle (bin/ holds dropless-coordinator, dropless-worker,
# dropless-worker-rank, dropless and libdropless_engine_cuda.so; lib/ their libraries). TLS,
# mutual TLS and a user token as in scripts/demo when openssl is there (scripts/dev-certs), else
# plaintext with --insecure (said so on stdout).
#   usage: scripts/gpu/run-cuda-job.sh BUNDLE_DIR JOB_YAML [OUT_DIR]
set -euo pipefail
bundle=$(cd "$1" && pwd)
job=$2
out=${3:-$(mktemp -d /tmp/dropless-gpu-job.XXXXXX)}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
bin=$bundle/bin

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 1 200); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done
  echo "port $1 never opened" >&2; return 1
}
grpc=$(free_port); cmetrics=$(free_port); wmetrics=$(free_port)
export DROPLESS_COORDINATOR=127.0.0.1:$grpc
here=$(cd "$(dirname "$0")/../.." && pwd)
if command -v openssl >/dev/null; then
  certs=$out/certs
  bash "$here/scripts/dev-certs" "$certs" gpu-node-0 >/dev/null
  export DROPLESS_TLS_CA=$certs/ca.pem DROPLESS_TOKEN_FILE=$certs/tokens/alice.token
  coordinator_security=(--tls-cert "$certs/coordinator.pem" --tls-key "$certs/coordinator.key"
                        --worker-ca "$certs/ca.pem" --tokens-file "$certs/tokens.yaml")
  worker_security=(--tls-ca "$certs/ca.pem" --tls-cert "$certs/workers/gpu-node-0.pem"
                   --tls-key "$certs/workers/gpu-node-0.key")
  echo "==> TLS, mutual TLS and user alice's token (scripts/dev-certs in $certs)"
else
  export DROPLESS_INSECURE=1
  coordinator_security=(--insecure)
  worker_security=(--insecure)
  echo "==> no openssl here: plaintext (--insecure)"
fi
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

"$bin/dropless-coordinator" --listen "127.0.0.1:$grpc" --db "$out/dropless.db" \
  --metrics-port "$cmetrics" --metrics-address 127.0.0.1 "${coordinator_security[@]}" \
  >"$out/coordinator.log" 2>&1 &
pids+=($!)
wait_port "$grpc"
"$bin/dropless-worker" --coordinator "$DROPLESS_COORDINATOR" --node gpu-node-0 \
  --metrics-port "$wmetrics" --metrics-address 127.0.0.1 --work-dir "$out/worker" \
  "${worker_security[@]}" >"$out/worker.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  "$bin/dropless" get workers -o json 2>/dev/null | grep -q '"READY"' && break
  sleep 0.1
done
"$bin/dropless" get workers

id=$("$bin/dropless" submit -f "$job")
echo "==> submitted $job as $id"
"$bin/dropless" watch "$id" -o json >"$out/watch.json" 2>/dev/null &
watcher=$!
# /metrics of the worker while the job runs: the last sample with the rank's gauges (they go when
# its process ends).
( while kill -0 "$watcher" 2>/dev/null; do
    if curl -s "http://127.0.0.1:$wmetrics/metrics" >"$out/metrics.tmp" &&
       grep -q '^dropless_rank_mfu_ratio' "$out/metrics.tmp"; then
      mv "$out/metrics.tmp" "$out/worker-metrics.txt"
    fi
    sleep 1
  done ) &
status=0
"$bin/dropless" watch "$id" || status=$?
wait "$watcher" || true
"$bin/dropless" describe job "$id" | tail -20
"$bin/dropless" metrics "$id" --limit 5 || true
echo "==> worker /metrics (last sample while running)"
grep -E '^dropless_rank_' "$out/worker-metrics.txt" | grep -v '_bucket' | head -30 || true
tail -5 "$out/worker.log"
exit $status
