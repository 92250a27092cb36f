#!/usr/bin/env bash
# What a node asks of the API server, read from the API server's own audit log: the upstream kubelet, node-agent on
# a real containerd and a hollow node, side by side on one control plane with the same pods; then, with
# TRAFFIC_FLEET=N, a hollow fleet of N nodes with one such pod each.
#
#   sudo hack/traffic.sh [--minutes M] [--fleet N] [--out DIR]
#
# One control plane (testenv up; the API server writes a Metadata-level audit log), then three nodes on it:
#   traffic-kubelet      the kubelet of the pinned release (hack/build-kubernetes.sh kubelet) on containerd 1.6
#   traffic-node-agent   node-agent on another containerd 1.6
#   traffic-hollow-0     one hollow node (`hollow run --nodes 1`, its own client certificate)
# each with the same KubeletConfiguration where it applies and the same pod: a ConfigMap and a Secret volume, the
# service account's projected token, the service-link environment of a Service in its namespace. The nodes' IPs
# are /32s on lo (the kubelet refuses a loopback node IP). After every pod is Running and a minute has passed, the
# window of M minutes (default 10; the kubelet's reflectors relist every 5-10 minutes) is read from the audit log
# by hack/traffic-report.py: requests per node-minute by verb and resource, and the watches held at its end.
# With --fleet N (0: none, the default) a hollow fleet of N nodes (own certificates), one pod each, is measured the
# same way afterwards. Everything is stopped and removed at the end; the tables are printed and kept in DIR
# (default /tmp/node-agent-traffic). TESTENV_BIN, NODE_AGENT_BIN and HOLLOW_BIN name prebuilt programs (else
# cargo builds them). docs/benchmarks.md ("API traffic per node") has the figures and what they show.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "traffic: $*" >&2; }
die() { log "error: $*"; exit 1; }

minutes=10 fleet=0 out=/tmp/node-agent-traffic
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --fleet) fleet=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case "$minutes$fleet" in *[!0-9]*) die "--minutes and --fleet take whole numbers" ;; esac
[ "$minutes" -gt 0 ] || die "--minutes must be at least 1"
[ "$(id -u)" = 0 ] || die "run as root (containerd, the agents' cgroups and the node IPs need it)"

k8s_bin=$(bash "$root/hack/build-kubernetes.sh")
kubelet_bin="$(bash "$root/hack/build-kubernetes.sh" kubelet)/kubelet"
testenv_bin=${TESTENV_BIN:-} node_agent_bin=${NODE_AGENT_BIN:-} hollow_bin=${HOLLOW_BIN:-}
if [ -z "$testenv_bin" ] || [ -z "$node_agent_bin" ] || [ -z "$hollow_bin" ]; then
  (cd "$root" && cargo build -q -p testenv -p node-agent-bin -p hollow --bin testenv --bin node-agent --bin hollow)
  target=${CARGO_TARGET_DIR:-$root/target}
  testenv_bin="$target/debug/testenv" node_agent_bin="$target/debug/node-agent" hollow_bin="$target/debug/hollow"
fi

# the two containerds' pod subnets (TRAFFIC_SUBNETS="A B" to run beside other nodes on this machine)
read -r -a TRAFFIC_SUBNETS <<<"${TRAFFIC_SUBNETS:-10.79.0.0/16 10.80.0.0/16}"
[ "${#TRAFFIC_SUBNETS[@]}" = 2 ] || die "TRAFFIC_SUBNETS names two subnets"

rm -rf "$out"; mkdir -p "$out"
cp_dir="$out/control-plane" audit="$out/audit.log"
pids=() cri_dirs=() bridges=() ips=() cgroup_roots=()

stop_all() {
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  for i in "${!cri_dirs[@]}"; do
    NA_CRI_DIR=${cri_dirs[$i]} NA_CRI_BRIDGE=${bridges[$i]} bash "$root/tests/containerd/teardown.sh" >/dev/null 2>&1
  done
  [ -n "${up:-}" ] && kill -TERM "$up" 2>/dev/null && wait "$up" 2>/dev/null
  awk -v d="$out/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r \
    | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
  for r in "${cgroup_roots[@]}"; do
    for h in /sys/fs/cgroup/*/; do [ -d "$h$r" ] && find "$h$r" -depth -type d -exec rmdir {} \; 2>/dev/null; done
  done
  for ip in "${ips[@]}"; do ip addr del "$ip/32" dev lo 2>/dev/null; done
  [ -d /var/log/containers ] && find /var/log/containers -maxdepth 1 -type l -lname "$out/*" -delete
  set -e
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# --- the control plane, with the audit log --------------------------------------------------------------------
cat > "$out/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
POLICY
log "control plane (audit log $audit)"
"$testenv_bin" up --dir "$cp_dir" --apiserver-arg="--audit-policy-file=$out/audit-policy.yaml" \
  --apiserver-arg="--audit-log-path=$audit" --apiserver-arg=--audit-log-maxsize=0 >"$out/control-plane.log" 2>&1 &
up=$!
for _ in $(seq 1 180); do
  [ -f "$cp_dir/admin.kubeconfig" ] && [ -f "$cp_dir/control-plane.json" ] && break
  kill -0 "$up" 2>/dev/null || die "the control plane did not start: $(tail -5 "$out/control-plane.log")"
  sleep 1
done
kubectl="$k8s_bin/kubectl --kubeconfig $cp_dir/admin.kubeconfig"
for _ in $(seq 1 60); do $kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 1; done
$kubectl get --raw /readyz >/dev/null || die "the API server is not ready"

# shellcheck source=hack/agent-node.sh
. "$root/hack/agent-node.sh"

# start_real AGENT BINARY NODE_IP SUBNET BRIDGE: a containerd of its own and AGENT on it as node traffic-AGENT
start_real() {
  local agent=$1 binary=$2 node_ip=$3 subnet=$4 bridge=$5 node="traffic-$1" dir="$out/$1"
  local cri_dir="$dir/cri" cgroup_root="node-agent-traffic-$1" node_kc
  mkdir -p "$dir/root" "$dir/pod-logs"
  cri_dirs+=("$cri_dir"); bridges+=("$bridge"); cgroup_roots+=("$cgroup_root")
  ip -4 addr show dev lo | grep -q "inet $node_ip/" || { ip addr add "$node_ip/32" dev lo; ips+=("$node_ip"); }
  log "$agent: containerd 1.6 (bridge $bridge, pod subnet $subnet)"
  NA_CRI_DIR=$cri_dir NA_CRI_SUBNET=$subnet NA_CRI_BRIDGE=$bridge bash "$root/tests/containerd/setup.sh" \
    >"$dir/containerd-setup.log" 2>&1 || die "containerd did not start: $(tail -5 "$dir/containerd-setup.log")"
  agent_cgroup_root "$cgroup_root"
  agent_config "$dir" "$node" "$node_ip" "$cp_dir" "$cri_dir" "$cgroup_root"
  node_kc=$("$testenv_bin" node-kubeconfig --dir "$cp_dir" --node "$node")
  log "$agent: node $node on $node_ip"
  "$binary" --config "$dir/kubelet-config.yaml" --kubeconfig "$node_kc" --root-dir "$dir/root" \
    --hostname-override "$node" --node-ip "$node_ip" </dev/null >"$dir/agent.log" 2>&1 &
  pids+=($!)
}

# start_hollow N TEMPLATE METRICS_PORT KUBELET_PORT: a hollow fleet of N nodes, each with its own certificate
start_hollow() {
  local dir="$out/hollow-$2"
  mkdir -p "$dir"
  log "hollow: $1 node(s) named $2"
  "$hollow_bin" run --nodes "$1" --kubeconfig "$cp_dir/admin.kubeconfig" --name-template "$2" \
    --node-credentials per-node --node-ca-cert "$cp_dir/pki/ca.crt" --node-ca-key "$cp_dir/pki/ca.key" \
    --metrics-address "127.0.0.1:$3" --kubelet-port "$4" --delete-nodes-on-exit >"$dir/hollow.log" 2>&1 &
  pids+=($!)
}

# wait_ready COUNT SELECTOR_PREFIX SECONDS: COUNT nodes whose names start with the prefix are Ready
wait_ready() {
  local n
  for _ in $(seq 1 "$3"); do
    n=$($kubectl get nodes --no-headers 2>/dev/null | awk -v p="$2" 'index($1, p) == 1 && $2 == "Ready"' | wc -l)
    [ "$n" -ge "$1" ] && return 0
    sleep 1
  done
  die "$n of $1 nodes named $2* Ready after $3 s (logs in $out)"
}

# pods NAMESPACE NODE...: one pod per node, pinned, with a ConfigMap and a Secret volume, the projected service
# account token and the service-link environment
pods() {
  local ns=$1; shift
  $kubectl create namespace "$ns" >/dev/null
  for _ in $(seq 1 30); do $kubectl -n "$ns" get serviceaccount default >/dev/null 2>&1 && break; sleep 1; done
  $kubectl -n "$ns" create configmap settings --from-literal=mode=traffic >/dev/null
  $kubectl -n "$ns" create secret generic credentials --from-literal=token=traffic >/dev/null
  $kubectl -n "$ns" create service clusterip backend --tcp=80:8080 >/dev/null
  python3 - "$ns" "$@" > "$out/pods-$ns.json" <<'PY'
import json, sys
ns, nodes = sys.argv[1], sys.argv[2:]
items = [{
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": f"work-{node}", "namespace": ns},
    "spec": {
        "nodeName": node,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "localhost/busybox:local", "imagePullPolicy": "IfNotPresent",
                        "command": ["sleep", "86400"],
                        "volumeMounts": [{"name": "settings", "mountPath": "/settings"},
                                         {"name": "credentials", "mountPath": "/credentials"}]}],
        "volumes": [{"name": "settings", "configMap": {"name": "settings"}},
                    {"name": "credentials", "secret": {"secretName": "credentials"}}],
    },
} for node in nodes]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
  $kubectl apply -f "$out/pods-$ns.json" >/dev/null
}

# wait_running NAMESPACE COUNT SECONDS
wait_running() {
  local n
  for _ in $(seq 1 "$3"); do
    n=$($kubectl -n "$1" get pods --no-headers 2>/dev/null | awk '$3 == "Running"' | wc -l)
    [ "$n" -ge "$2" ] && return 0
    sleep 2
  done
  die "$n of $2 pods Running in $1 after $3 s"
}

# window LABEL COLUMN...: wait a minute, then M minutes; the report over them
window() {
  local label=$1 start end; shift
  sleep 60
  start=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)
  log "$label: measuring $minutes min from $start"
  sleep $((minutes * 60))
  end=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)
  sleep 2
  python3 "$root/hack/traffic-report.py" "$audit" "$start" "$end" "$@" | tee "$out/$label.md"
}

start_real kubelet "$kubelet_bin" 10.254.254.4 "${TRAFFIC_SUBNETS[0]}" natraffic0
start_real node-agent "$node_agent_bin" 10.254.254.5 "${TRAFFIC_SUBNETS[1]}" natraffic1
start_hollow 1 traffic-hollow-{index} "$(free_port)" 20250
wait_ready 3 traffic- 180
pods traffic traffic-kubelet traffic-node-agent traffic-hollow-0
wait_running traffic 3 180
window nodes "kubelet=system:node:traffic-kubelet:1" "node-agent=system:node:traffic-node-agent:1" \
  "hollow=system:node:traffic-hollow-:1"

if [ "$fleet" -gt 0 ]; then
  start_hollow "$fleet" fleet-{index} "$(free_port)" 30000
  wait_ready "$fleet" fleet- 600
  mapfile -t fleet_nodes < <(seq 0 $((fleet - 1)) | sed 's/^/fleet-/')
  pods fleet "${fleet_nodes[@]}"
  wait_running fleet "$fleet" 900
  window fleet "hollow fleet=system:node:fleet-:$fleet" "kubelet=system:node:traffic-kubelet:1"
fi
log "tables in $out/*.md"
