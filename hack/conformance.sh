#!/usr/bin/env bash
# The upstream node conformance suite against node-agent and against the kubelet of the pinned release.
#
#   hack/conformance.sh build     what every run needs, cached (no root needed; hack/setup.sh --binaries calls it):
#                                 the e2e test binary of the [NodeConformance] packages, ginkgo's CLI and the images
#                                 the specs use; prints the test binary's path
#   hack/conformance.sh [run] [--agent node-agent|kubelet|both] [--procs N] [--focus RE] [--out DIR]
#                     [--containerd 1.6|2]
#                                 (root) the focus against each agent in turn (default both; the kubelet of the
#                                 pinned release is built on its first run by hack/build-kubernetes.sh kubelet)
#   hack/conformance.sh --subset  (root) the CI subset (hack/conformance-report.py SUBSET) against node-agent only
#
# Per run: a fresh control plane (testenv up; API server with --allow-privileged=true), a private containerd 1.6
# (tests/containerd/setup.sh, bridge naconf0 on 10.99.0.0/16; --containerd 2: the 2.x that setup.sh builds) with
# the images imported, the agent with one
# KubeletConfiguration for both agents, its node IP 10.254.254.1 added as a /32 on lo for the run (the kubelet
# refuses a loopback node IP); Ginkgo with 10 processes, the focus [NodeConformance] without
# [Serial], [Disruptive], [Flaky], [Feature:, [Alpha], [Slow]. Results in $CONFORMANCE_DIR (default
# /tmp/node-agent-conformance)/<agent>: results.tsv (state, time, spec, failure), report/report.json, junit.xml,
# the agent's and the suite's logs; the totals are printed. TESTENV_BIN and NODE_AGENT_BIN name prebuilt programs
# (else cargo builds them).
#
# The test binary: a Go test main written here into the cache (go.mod with the same replace lines for the staging
# modules as hack/build-kubernetes.sh writes) importing test/e2e/common/{node,storage,network} of k8s.io/kubernetes
# at KUBERNETES_VERSION with the suite's own TestMain pattern, compiled with `go test -c`, into
#   ${NODE_AGENT_CACHE:-~/.cache/node-agent}/conformance/<version>/bin/e2e-common.test
# See docs/conformance.md for the run, its results and what cannot pass on this machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(tr -d '[:space:]' < "$root/KUBERNETES_VERSION")
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
out_dir="$cache/conformance/$version"
# each line with the seconds since the script started: where a run's time goes
log() { echo "conformance: [${SECONDS}s] $*" >&2; }
die() { log "error: $*"; exit 1; }

# --- the Go module the suite is built from -------------------------------------------------------------------
src="$out_dir/src"
bin="$out_dir/bin"
test_bin="$bin/e2e-common.test"

# write_module: go.mod with k8s.io/kubernetes at $version and its staging modules at their published releases
# (as hack/build-kubernetes.sh), the test main, and the programs built beside it (ginkgo's CLI, which runs the
# binary in parallel processes; agnhost and nnp for the images)
write_module() {
  local minor patch staging_version gomod go_line
  minor=${version#v1.}; minor=${minor%%.*}
  patch=${version##*.}
  staging_version="v0.$minor.$patch"
  mkdir -p "$src" "$bin"
  gomod=$(cd "$src" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  [ -f "$gomod" ] || die "no go.mod for k8s.io/kubernetes@$version"
  go_line=$(grep -m1 '^go ' "$gomod")
  {
    echo "module nodeagent.local/conformance"
    echo
    echo "$go_line"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > "$src/go.mod"
  cat > "$src/tools.go" <<'GO'
//go:build tools

package conformance

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/nonewprivs"
)
GO
  # the suite's TestMain and RunSpecs (test/e2e/e2e_test.go, e2e.go) over the common packages only; the
  # per-process set-up keeps what these specs read (the cluster's IP family), not the cluster-wide waits
  cat > "$src/conformance_test.go" <<'GO'
package conformance

import (
	"context"
	"flag"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	commontest "k8s.io/kubernetes/test/e2e/common"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	e2enode "k8s.io/kubernetes/test/e2e/framework/node"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"
	utilnet "k8s.io/utils/net"

	_ "k8s.io/component-base/logs/testinit"
	_ "k8s.io/kubernetes/test/e2e/feature"

	_ "k8s.io/kubernetes/test/e2e/common/network"
	_ "k8s.io/kubernetes/test/e2e/common/node"
	_ "k8s.io/kubernetes/test/e2e/common/storage"

	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/format"
)

var _ = ginkgo.SynchronizedBeforeSuite(func(ctx context.Context) []byte {
	commontest.CurrentSuite = commontest.E2E
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client")
	framework.ExpectNoError(e2enode.WaitForAllNodesSchedulable(ctx, c, framework.NewTimeoutContext().NodeSchedulable))
	return nil
}, func(ctx context.Context, _ []byte) {
	commontest.CurrentSuite = commontest.E2E
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client")
	svc, err := c.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	framework.ExpectNoError(err, "reading the kubernetes Service")
	framework.TestContext.IPFamily = "ipv4"
	if utilnet.IsIPv6String(svc.Spec.ClusterIP) {
		framework.TestContext.IPFamily = "ipv6"
	}
})

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "node conformance (test/e2e/common)", suiteConfig, reporterConfig)
}
GO
  log "go mod tidy (k8s.io/kubernetes@$version and the suite's dependencies)"
  (cd "$src" && go mod tidy >&2)
}

build_go() {
  local progs=(e2e-common.test ginkgo agnhost nnp) p missing=0 started minor ldflags
  for p in "${progs[@]}"; do [ -x "$bin/$p" ] || missing=1; done
  [ "$missing" = 0 ] && return 0
  command -v go >/dev/null || die "go is not installed"
  started=$(date +%s)
  write_module
  minor=${version#v1.}; minor=${minor%%.*}
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  if [ ! -x "$test_bin" ]; then
    log "go test -c: the [NodeConformance] packages (minutes when cold; cached afterwards)"
    # cgo off as in hack/build-kubernetes.sh, so the packages both build come from Go's cache; no vet: the suite is
    # upstream's, compiled to be run
    (cd "$src" && CGO_ENABLED=0 go test -c -vet=off -trimpath -ldflags "$ldflags" -o "$test_bin.tmp" . >&2)
    mv "$test_bin.tmp" "$test_bin"
  fi
  # static programs: they run inside the images, whose rootfs has no C library
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo >&2)
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/agnhost" k8s.io/kubernetes/test/images/agnhost >&2)
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/nnp" k8s.io/kubernetes/test/images/nonewprivs >&2)
  log "Go programs built in $(( $(date +%s) - started ))s"
}

# --- the images the specs use ---------------------------------------------------------------------------------
# Built from source under the exact names and tags of test/utils/image/manifest.go, as OCI archives for
# `ctr images import` (no registry: the specs' images are present, and the pull policy IfNotPresent finds them).
# keyed by the hash of this part of the script (from here to build()): a change to how the images are made
# rebuilds them (seconds)
images_dir="$out_dir/images/$(sed -n '/^# --- the images the specs use/,/^build() {/p' "$root/hack/conformance.sh" | sha256sum | cut -c1-12)"
IMAGES=(
  "registry.k8s.io/e2e-test-images/busybox:1.37.0-1 busybox"
  "registry.k8s.io/e2e-test-images/agnhost:2.63.0 agnhost"
  "registry.k8s.io/e2e-test-images/agnhost:2.55 agnhost"
  "registry.k8s.io/e2e-test-images/kitten:1.8 kitten"
  "registry.k8s.io/e2e-test-images/nautilus:1.8 nautilus"
  "registry.k8s.io/e2e-test-images/nonroot:1.5 nonroot"
  "registry.k8s.io/e2e-test-images/nonewprivs:1.4 nonewprivs"
  "registry.k8s.io/e2e-test-images/nginx:1.15-4 nginx"
  "registry.k8s.io/e2e-test-images/nginx:1.27-0 nginx"
  "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0 glibc-dns-testing"
  "registry.k8s.io/pause:3.10.2 pause"
)

# busybox_rootfs DIR: Debian's static busybox with one link per applet, and the users the images name
busybox_rootfs() {
  local r=$1 applet depth up
  mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,root,tmp,proc,sys,dev,var}
  chmod 1777 "$r/tmp"
  cp /bin/busybox "$r/bin/busybox"
  for applet in $(busybox --list-full); do
    case "$applet" in bin/busybox) continue ;; esac
    depth=$(dirname "$applet" | tr -cd / | wc -c)
    up=$(printf '../%.0s' $(seq 0 "$depth"))
    ln -sfn "${up}bin/busybox" "$r/$applet"
    # upstream's busybox image has every applet in /bin as well (specs call /bin/sysctl)
    [ -e "$r/bin/${applet##*/}" ] || ln -s busybox "$r/bin/${applet##*/}"
  done
  # specs run `/bin/bash -c` in their images; this busybox has no bash applet, its sh takes the same -c scripts
  printf '#!/bin/sh\nexec /bin/sh "$@"\n' > "$r/bin/bash"
  chmod 0755 "$r/bin/bash"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$r/etc/group"
}

# agnhost_rootfs DIR: what test/images/agnhost/Dockerfile puts into its image, on busybox instead of Alpine;
# `curl` (called by the specs inside agnhost containers) is a script over busybox's wget
agnhost_rootfs() {
  local r=$1 m
  m=$(cd "$src" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  busybox_rootfs "$r"
  cp "$bin/agnhost" "$r/agnhost"
  ln -s agnhost "$r/agnhost-2"
  mkdir -p "$r/uploads"
  cp "$m/test/images/agnhost/porter/localhost.crt" "$m/test/images/agnhost/porter/localhost.key" "$r/"
  echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >> "$r/etc/passwd"
  printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >> "$r/etc/group"
  cat > "$r/usr/bin/curl" <<'SH'
#!/bin/sh
# curl's common forms over busybox wget: the URL among the arguments, the overall time limit kept (by `timeout`:
# this busybox's wget crashes or prints nothing with its own -T), other options dropped
url= timeout=
while [ $# -gt 0 ]; do
  case "$1" in
    -m|--max-time) timeout=$2; shift 2 ;;
    --connect-timeout|-o|-H|-X|-d|--data|-w) shift 2 ;;
    -*) shift ;;
    *) url=$1; shift ;;
  esac
done
if [ -n "$timeout" ]; then exec timeout "$timeout" wget -q -O - "$url"; fi
exec wget -q -O - "$url"
SH
  chmod 0755 "$r/usr/bin/curl"
}

build_images() {
  local line ref kind tar r m args
  mkdir -p "$images_dir"
  m=$(cd "$src" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  for line in "${IMAGES[@]}"; do
    ref=${line% *}; kind=${line##* }
    tar="$images_dir/$(echo "$ref" | tr '/:' '__').tar"
    [ -s "$tar" ] && continue
    r=$(mktemp -d)
    args=()
    case "$kind" in
      busybox) busybox_rootfs "$r"; args=(--cmd '["sh"]') ;;
      agnhost) agnhost_rootfs "$r"; args=(--entrypoint '["/agnhost"]' --cmd '["pause"]') ;;
      kitten|nautilus)
        agnhost_rootfs "$r"
        cp "$m/test/images/$kind/html/$kind.jpg" "$m/test/images/$kind/html/data.json" "$r/"
        args=(--entrypoint '["/agnhost"]' --cmd '["test-webserver"]') ;;
      nonroot) busybox_rootfs "$r"; args=(--user 1234 --cmd '["sh"]') ;;
      nonewprivs)
        busybox_rootfs "$r"
        cp "$bin/nnp" "$r/usr/local/bin/nnp"; chmod 4755 "$r/usr/local/bin/nnp"
        args=(--cmd '["nnp"]') ;;
      # upstream's nginx images are Docker Hub's nginx: a stand-in serving HTTP on port 80 with busybox httpd
      nginx)
        busybox_rootfs "$r"; mkdir -p "$r/usr/share/nginx/html"
        echo '<html><body>stand-in for nginx</body></html>' > "$r/usr/share/nginx/html/index.html"
        args=(--cmd '["httpd","-f","-p","80","-h","/usr/share/nginx/html"]') ;;
      # upstream's is Debian with dnsutils; the specs run `hostname` and `hostname -f`, which busybox has
      glibc-dns-testing) busybox_rootfs "$r"; args=(--cmd '["sh"]') ;;
      # the sandbox program of tests/containerd/setup.sh: a shell that sleeps until SIGTERM/SIGINT
      pause)
        mkdir -p "$r/bin"; cp /bin/busybox "$r/bin/busybox"
        args=(--entrypoint '["/bin/busybox","sh","-c","trap \"exit 0\" TERM INT; while :; do /bin/busybox sleep 3600 & wait $!; done"]') ;;
    esac
    python3 "$root/tests/containerd/oci_image.py" --rootfs "$r" --ref "$ref" --out "$tar.tmp" "${args[@]}" \
      >/dev/null 2>"$images_dir/build.log" || die "image $ref: $(cat "$images_dir/build.log")"
    mv "$tar.tmp" "$tar"
    rm -rf "$r"
  done
  # the newest two ways of making them (a run started before a change may still import the older)
  ls -1dt "$out_dir/images"/*/ | tail -n +3 | xargs -r rm -rf
}

build() {
  mkdir -p "$out_dir"
  # one build at a time (runs side by side find the first one's results)
  exec 8>"$out_dir/.lock"
  flock 8
  [ -x /bin/busybox ] && busybox --list-full >/dev/null 2>&1 || die "/bin/busybox is not Debian's busybox-static (hack/setup.sh installs it)"
  build_go
  build_images
  exec 8>&-
}

# --- one run ----------------------------------------------------------------------------------------------------
FOCUS='\[NodeConformance\]'
# the images the CI subset's specs run (as their archives are named): busybox, agnhost for the HTTP hooks, probes
# and pod networking, the pause image the hooked pods run, and glibc-dns-testing for hostnameOverride
SUBSET_IMAGES=(registry.k8s.io_e2e-test-images_busybox_1.37.0-1 registry.k8s.io_e2e-test-images_agnhost_2.63.0
  registry.k8s.io_pause_3.10.2 registry.k8s.io_e2e-test-images_glibc-dns-testing_2.0.0)
SKIP='\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:|\[Alpha\]|\[Slow\]'
# the kernel settings the kubelet sets at start, and the iptables chains it keeps (both put back after each run)
SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
CHAINS=("iptables mangle KUBE-IPTABLES-HINT" "iptables filter KUBE-FIREWALL" "iptables mangle KUBE-KUBELET-CANARY"
  "iptables nat KUBE-KUBELET-CANARY" "iptables filter KUBE-KUBELET-CANARY" "ip6tables mangle KUBE-IPTABLES-HINT"
  "ip6tables mangle KUBE-KUBELET-CANARY" "ip6tables nat KUBE-KUBELET-CANARY" "ip6tables filter KUBE-KUBELET-CANARY")
chain_exists() { "$1" -w 5 -t "$2" -n -L "$3" >/dev/null 2>&1; }
# remove_chain CMD TABLE CHAIN: the chain, and the jumps to it (KUBE-FIREWALL from INPUT and OUTPUT)
remove_chain() {
  local from
  for from in INPUT OUTPUT; do while "$1" -w 5 -t "$2" -D "$from" -j "$3" 2>/dev/null; do :; done; done
  "$1" -w 5 -t "$2" -F "$3" 2>/dev/null; "$1" -w 5 -t "$2" -X "$3" 2>/dev/null
}

# shellcheck source=hack/agent-node.sh
. "$root/hack/agent-node.sh"

# launcher_of FILE: the launcher PID a control plane recorded in its control-plane.json
launcher_of() {
  [ -f "$1" ] || return 0
  python3 -c 'import json, sys; print(next(p for n, p in json.load(open(sys.argv[1]))["pids"] if n == "launcher"))' "$1" 2>/dev/null || true
}

# run_agent AGENT DIR: a fresh control plane, containerd and AGENT (node-agent or kubelet) on node IP $node_ip,
# the focus against them, the report in DIR; everything stopped and removed afterwards
run_agent() {
  # not local: the EXIT trap (stop_all) reads them after a failure has left the function
  agent=$1 dir=$2 node="conformance-$1" agent_bin="" cp_dir="" cri_dir="" up="" agent_pid="" kubectl="" started=""
  saved_sysctls=() absent_chains=()
  case "$agent" in
    node-agent) agent_bin=$node_agent_bin ;;
    kubelet) agent_bin=$kubelet_bin ;;
    *) die "unknown agent $agent (node-agent or kubelet)" ;;
  esac
  log "$agent: removing the previous run's files, reading the node's iptables chains"
  rm -rf "$dir"; mkdir -p "$dir"/{root,pod-logs,report}
  cp_dir="$dir/control-plane"; cri_dir="$dir/cri"
  for s in "${SYSCTLS[@]}"; do saved_sysctls+=("$s=$(cat "/proc/sys/$s" 2>/dev/null)"); done
  for c in "${CHAINS[@]}"; do
    # shellcheck disable=SC2086
    command -v "${c%% *}" >/dev/null && ! chain_exists $c && absent_chains+=("$c")
  done

  stop_all() {
    set +e
    [ -n "${agent_pid:-}" ] && kill -TERM "$agent_pid" 2>/dev/null && { for _ in $(seq 1 300); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done; kill -KILL "$agent_pid" 2>/dev/null; }
    log "$agent: agent stopped"
    # the control plane stops while containerd is removed
    [ -n "${up:-}" ] && kill -TERM "$up" 2>/dev/null
    NA_CRI_DIR=$cri_dir NA_CRI_BRIDGE=$bridge bash "$root/tests/containerd/teardown.sh" >/dev/null 2>&1
    log "$agent: containerd removed"
    [ -n "${up:-}" ] && wait "$up" 2>/dev/null
    log "$agent: control plane stopped"
    awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    for h in /sys/fs/cgroup/*/; do [ -d "$h$cgroup_root" ] && find "$h$cgroup_root" -depth -type d -exec rmdir {} \; 2>/dev/null; done
    for kv in "${saved_sysctls[@]}"; do [ -n "${kv#*=}" ] && echo "${kv#*=}" > "/proc/sys/${kv%%=*}"; done
    # shellcheck disable=SC2086
    for c in "${absent_chains[@]}"; do remove_chain $c; done
    [ -d /var/log/containers ] && find /var/log/containers -maxdepth 1 -type l -lname "$dir/*" -delete
    agent_pid=""; up=""
    set -e
  }
  trap 'stop_all; cleanup_node_ip' EXIT
  trap 'exit 130' INT TERM

  # the control plane starts while containerd starts and takes the images (neither needs the other)
  log "$agent: control plane; beside it containerd $containerd_label (pod subnet $subnet) and ${#images[@]} images"
  "$testenv_bin" up --dir "$cp_dir" >"$dir/control-plane.log" 2>&1 &
  up=$!
  NA_CRI_DIR=$cri_dir NA_CRI_SUBNET=$subnet NA_CRI_BRIDGE=$bridge NA_CRI_CONTAINERD=$containerd \
    bash "$root/tests/containerd/setup.sh" >"$dir/containerd-setup.log" 2>&1 \
    || die "containerd did not start: $(tail -5 "$dir/containerd-setup.log")"
  log "$agent: containerd up; importing the images"
  local imports=() t p
  for t in "${images[@]}"; do
    ctr --address "$cri_dir/containerd.sock" -n k8s.io images import "$t" >"$dir/import-${t##*/}.log" 2>&1 &
    imports+=("$!")
  done
  for p in "${imports[@]}"; do wait "$p" || die "an image import failed (see $dir/import-*.log)"; done
  log "$agent: images imported"
  for _ in $(seq 1 360); do
    [ "$(launcher_of "$cp_dir/control-plane.json")" = "$up" ] && break
    kill -0 "$up" 2>/dev/null || die "the control plane did not start: $(tail -5 "$dir/control-plane.log")"
    sleep 0.5
  done
  [ "$(launcher_of "$cp_dir/control-plane.json")" = "$up" ] || die "the control plane did not come up"
  kubectl="$k8s_bin/kubectl --kubeconfig $cp_dir/admin.kubeconfig"
  log "$agent: control plane up"

  # the agent: one KubeletConfiguration for both (as the kubelet benchmark's), its API on the node IP with a
  # serving certificate for that IP from the cluster CA
  agent_cgroup_root "$cgroup_root"
  agent_config "$dir" "$node" "$node_ip" "$cp_dir" "$cri_dir" "$cgroup_root"
  node_kc=$("$testenv_bin" node-kubeconfig --dir "$cp_dir" --node "$node")
  log "$agent: starting $agent_bin as node $node on $node_ip"
  "$agent_bin" --config "$dir/kubelet-config.yaml" --kubeconfig "$node_kc" --root-dir "$dir/root" \
    --hostname-override "$node" --node-ip "$node_ip" </dev/null >"$dir/$agent.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 1 360); do
    kill -0 "$agent_pid" 2>/dev/null || die "$agent exited: $(tail -20 "$dir/$agent.log")"
    [ "$($kubectl get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && break
    sleep 0.5
  done
  [ "$($kubectl get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] \
    || die "node $node not Ready in 180 s: $(tail -20 "$dir/$agent.log")"

  log "$agent: node Ready; the focus, $procs processes (log: $dir/e2e.log)"
  started=$(date +%s)
  set +e
  (cd "$dir/report" && "$bin/ginkgo" --procs="$procs" --timeout="$suite_timeout" --no-color \
     --focus="$focus" --skip="$SKIP" --json-report=report.json --junit-report=junit.xml --output-dir="$dir/report" \
     "$test_bin" -- --kubeconfig="$cp_dir/admin.kubeconfig" --kubectl-path="$k8s_bin/kubectl" --provider=skeleton \
     --report-dir="$dir/report") >"$dir/e2e.log" 2>&1
  set -e
  echo $(( $(date +%s) - started )) > "$dir/seconds"
  log "$agent: the focus ran in $(cat "$dir/seconds")s; stopping everything"
  stop_all
  log "$agent: stopped"
  trap 'cleanup_node_ip' EXIT
  python3 "$root/hack/conformance-report.py" summary "$agent" "$dir" > "$dir/summary.txt"
}

added_ip=""
cleanup_node_ip() { [ -n "$added_ip" ] && ip addr del "$node_ip/32" dev lo 2>/dev/null; added_ip=""; }

# --- main ---------------------------------------------------------------------------------------------------------
cmd=run
case "${1:-}" in build|run) cmd=$1; shift ;; esac
agents=(node-agent kubelet) procs=10 focus=$FOCUS subset=0 out=${CONFORMANCE_DIR:-/tmp/node-agent-conformance}
containerd=${NA_CRI_CONTAINERD:-1.6}
suite_timeout=3h
node_ip=${CONFORMANCE_NODE_IP:-10.254.254.1}
subnet=${CONFORMANCE_POD_SUBNET:-10.99.0.0/16}
bridge=${CONFORMANCE_BRIDGE:-naconf0} cgroup_root=${CONFORMANCE_CGROUP_ROOT:-node-agent-conformance}
while [ $# -gt 0 ]; do
  case "$1" in
    --agent) case "$2" in both) agents=(node-agent kubelet) ;; *) agents=("$2") ;; esac; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    --containerd) containerd=$2; shift 2 ;;
    --focus) focus=$2; shift 2 ;;
    --subset) subset=1; shift ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

build
if [ "$cmd" = build ]; then echo "$test_bin"; exit 0; fi
log "the suite's programs and images are ready"

[ "$(id -u)" = 0 ] || die "run as root (containerd, the agents' cgroups and the node IP need it)"
if [ "$subset" = 1 ]; then
  # beside a full run if need be: its own directory, node IP, bridge, pod subnet and cgroup root
  focus=$(python3 "$root/hack/conformance-report.py" subset-focus)
  agents=(node-agent) procs=${CONFORMANCE_SUBSET_PROCS:-5}
  out=${CONFORMANCE_DIR:-/tmp/node-agent-conformance-subset}
  node_ip=${CONFORMANCE_NODE_IP:-10.254.254.2} subnet=${CONFORMANCE_POD_SUBNET:-10.98.0.0/16}
  bridge=${CONFORMANCE_BRIDGE:-naconf1} cgroup_root=${CONFORMANCE_CGROUP_ROOT:-node-agent-conformance-subset}
fi
case "$containerd" in
  1.6) containerd_label=1.6 ;;
  2) containerd_label=2.x ;;
  *) die "--containerd: 1.6 or 2, not $containerd" ;;
esac
# the image archives this run imports: all of them, or for the subset only those its specs name
images=()
for t in "$images_dir"/*.tar; do
  [ "$subset" = 1 ] && ! printf '%s\n' "${SUBSET_IMAGES[@]}" | grep -qx "$(basename "$t" .tar)" && continue
  images+=("$t")
done
[ "${#images[@]}" -gt 0 ] || die "no image archives in $images_dir"
k8s_bin=$(bash "$root/hack/build-kubernetes.sh")
for agent in "${agents[@]}"; do
  [ "$agent" = kubelet ] && kubelet_bin="$(bash "$root/hack/build-kubernetes.sh" kubelet)/kubelet"
done
# the programs a test build made (hack/run-tests.py hands them over), else built here
testenv_bin=${TESTENV_BIN:-} node_agent_bin=${NODE_AGENT_BIN:-}
if [ -z "$testenv_bin" ] || [ -z "$node_agent_bin" ]; then
  (cd "$root" && cargo build -q -p testenv -p node-agent-bin --bin testenv --bin node-agent)
  target=${CARGO_TARGET_DIR:-$root/target}
  testenv_bin="$target/debug/testenv" node_agent_bin="$target/debug/node-agent"
fi

# the node IP: the kubelet refuses a loopback one, so a /32 on lo, local to this machine
if ! ip -4 addr show dev lo | grep -q "inet $node_ip/"; then
  ip addr add "$node_ip/32" dev lo
  added_ip=1
fi
trap cleanup_node_ip EXIT
for agent in "${agents[@]}"; do
  run_agent "$agent" "$out/$agent"
done
python3 "$root/hack/conformance-report.py" compare "$out" "${agents[@]}"
# the subset is a test: every spec of it passed, or it fails
[ "$subset" = 0 ] || python3 "$root/hack/conformance-report.py" check-subset "$out/node-agent"
