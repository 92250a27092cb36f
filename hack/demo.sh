#!/usr/bin/env bash
# The demo: sets up a fresh machine, starts a real control plane on 127.0.0.1, a hollow fleet of 5 nodes on it
# and a Deployment of 20 pods; prints what kubectl sees. Runs until Ctrl-C, then stops everything it started.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash hack/setup.sh
cargo build -q -p testenv -p hollow
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
dir=${DEMO_DIR:-/tmp/node-agent-demo}
kubectl="$(bash hack/build-kubernetes.sh)/kubectl --kubeconfig $dir/admin.kubeconfig"

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

"$bin/testenv" down --dir "$dir" >/dev/null 2>&1 || true
"$bin/testenv" up --dir "$dir" &
pids+=($!)
for _ in $(seq 1 120); do [ -f "$dir/control-plane.json" ] && break; sleep 1; done
[ -f "$dir/control-plane.json" ] || { echo "demo: the control plane did not come up" >&2; exit 1; }

RUST_LOG=warn "$bin/hollow" run --nodes 5 --name-template demo-node-{index} \
  --kubeconfig "$dir/admin.kubeconfig" --metrics-address 127.0.0.1:10260 --delete-nodes-on-exit &
pids+=($!)
for _ in $(seq 1 60); do
  [ "$($kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready ')" = 5 ] && break; sleep 1
done
$kubectl create deployment demo --image=registry.example/demo:1 --replicas=20 >/dev/null
for _ in $(seq 1 60); do
  [ "$($kubectl get pods -l app=demo --no-headers 2>/dev/null | grep -c Running)" = 20 ] && break; sleep 1
done
echo; $kubectl get nodes -o wide; echo; $kubectl get pods -l app=demo -o wide; echo
sleep 6  # the fleet gauges refresh every 5 s
curl -s 127.0.0.1:10260/metrics | grep -E '^kubelet_pod_start_sli_duration_seconds_(count|sum)|^hollow_' || true
echo
echo "demo: running. KUBECONFIG=$dir/admin.kubeconfig; fleet metrics at http://127.0.0.1:10260/metrics"
echo "demo: Ctrl-C stops the fleet and the control plane."
wait
