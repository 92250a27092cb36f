#!/usr/bin/env bash
# The demo: sets up a fresh machine, starts a real control plane on 127.0.0.1, a hollow fleet of 5 nodes on it
# and a Deployment of 20 pods; prints what kubectl sees. Runs until Ctrl-C, then stops everything it started.
# Safe to run again after an earlier run was interrupted: what that run left in $DEMO_DIR is stopped and removed
# first.
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
trap cleanup EXIT
trap 'exit 130' INT TERM

# The launcher PID recorded in a control plane's control-plane.json (empty when there is none).
launcher_of() {
  [ -f "$1" ] || return 0
  python3 -c 'import json, sys; print(next(p for n, p in json.load(open(sys.argv[1]))["pids"] if n == "launcher"))' \
    "$1" 2>/dev/null || true
}

# Whether PID is alive and its command line names WORD and this demo's directory: a recorded PID may since have
# been given to an unrelated process, which must not be signalled.
runs_here() {
  local pid=$1 word=$2 cmd
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ "$cmd" == *"$word"* && "$cmd" == *"$dir"* ]]
}

# What an earlier run left: its fleet (demo-fleet.pid), its control plane (testenv up records its launcher in
# control-plane.json; testenv down signals it and waits for every component to go), and their files. testenv up
# empties the directory itself, but only once it runs: the old control-plane.json must be gone before then, or
# the wait below would take it for this run's and start the fleet on the old certificates.
old_fleet=$(cat "$dir/demo-fleet.pid" 2>/dev/null || true)
if runs_here "$old_fleet" hollow; then
  echo "demo: stopping the fleet of an earlier run (pid $old_fleet)"
  kill "$old_fleet" 2>/dev/null || true
  for _ in $(seq 1 30); do [ -e "/proc/$old_fleet" ] || break; sleep 1; done
fi
if runs_here "$(launcher_of "$dir/control-plane.json")" testenv; then
  echo "demo: stopping the control plane of an earlier run"
  "$bin/testenv" down --dir "$dir" >/dev/null || { echo "demo: the earlier control plane did not stop" >&2; exit 1; }
fi
rm -f "$dir/control-plane.json" "$dir/demo-fleet.pid"

"$bin/testenv" up --dir "$dir" &
up=$!
pids+=("$up")
# the control plane is up when control-plane.json names this run's launcher
for _ in $(seq 1 120); do
  [ "$(launcher_of "$dir/control-plane.json")" = "$up" ] && break
  kill -0 "$up" 2>/dev/null || { echo "demo: the control plane did not start (see above)" >&2; exit 1; }
  sleep 1
done
[ "$(launcher_of "$dir/control-plane.json")" = "$up" ] || { echo "demo: the control plane did not come up" >&2; exit 1; }

RUST_LOG=warn "$bin/hollow" run --nodes 5 --name-template demo-node-{index} \
  --kubeconfig "$dir/admin.kubeconfig" --metrics-address 127.0.0.1:10260 --delete-nodes-on-exit &
pids+=($!)
echo $! >"$dir/demo-fleet.pid"
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
