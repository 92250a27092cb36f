#!/usr/bin/env bash
# Start a private containerd (Debian's 1.6 packages, or 2.x built by hack/build-containerd.sh with
# NA_CRI_CONTAINERD=2) serving CRI v1 on a unix socket, for node-agent's real-runtime tests.
# Loopback/local only: images are built here from busybox-static and imported, and registries
# on 127.0.0.1 (tests/containerd/registry.sh) are reached over plain HTTP through hosts.toml files below
# $NA_CRI_DIR/certs.d (containerd's registry config_path); bridge CNI inside the pods' own network namespaces.
#
# usage: sudo tests/containerd/setup.sh            (run as root; prints the socket at the end)
# env:   NA_CRI_DIR     state directory, default /tmp/node-agent-cri (everything lives below it)
#        NA_CRI_SUBNET  pod subnet of the bridge network, default 10.88.0.0/16
#        NA_CRI_BRIDGE  bridge device name, default nacri0
#        NA_CRI_SKIP_APT=1  never call apt-get (fail if a package is missing)
#        NA_CRI_CONTAINERD=2  containerd 2.x (built from the Go module proxy, cached) instead of Debian's 1.6; its
#                       config is this script's version-2 config migrated by `containerd config migrate`
#                       (CDI spec files are read from $NA_CRI_DIR/cdi only)
#        NA_CRI_REGISTRIES  space-separated HOST:PORT of registries to pull from over plain HTTP (more can be added
#                       later: registry.sh start writes their hosts.toml when NA_CRI_DIR is set)
#        NA_CRI_SYSTEMD_CGROUP=1  runc makes the containers' cgroups through systemd (SystemdCgroup = true; the
#                       kubelet's cgroupDriver: systemd)
#        NA_CRI_OOM_SCORE_ADJ=free  containers get the oom_score_adj asked for, not clamped to containerd's own
#                       (on a machine where containerd may lower scores)
#        NA_CRI_POD_CIDR_FROM_NODE=1  no CNI network until the CRI client hands containerd a pod CIDR
#                       (UpdateRuntimeConfig, as a kubelet does with its Node's spec.podCIDR): the bridge conflist is
#                       then written from a template with that CIDR, and NetworkReady stays false until it is;
#                       NA_CRI_SUBNET is then unused by containerd
# After success: $NA_CRI_DIR/env holds `export NODE_AGENT_CONTAINERD_SOCKET=...`; images localhost/busybox:local
# and localhost/pause:local (the sandbox image). Undo with tests/containerd/teardown.sh (same env).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${NA_CRI_DIR:-/tmp/node-agent-cri}
SUBNET=${NA_CRI_SUBNET:-10.88.0.0/16}
BRIDGE=${NA_CRI_BRIDGE:-nacri0}
SOCK="$DIR/containerd.sock"

log() { echo "[containerd-setup] $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (containerd, runc and CNI need it)"

# --- packages -------------------------------------------------------------------------------------------------
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v ip >/dev/null || need+=(iproute2)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  [ "${NA_CRI_SKIP_APT:-0}" = 1 ] && die "missing packages: ${need[*]}"
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq containerd runc containernetworking-plugins busybox-static iproute2 python3 >/dev/null
fi
busybox --list-full >/dev/null 2>&1 || die "/bin/busybox is not a full busybox (install busybox-static)"

if [ -f "$DIR/containerd.pid" ] && kill -0 "$(cat "$DIR/containerd.pid")" 2>/dev/null; then
  die "a containerd from $DIR is already running (pid $(cat "$DIR/containerd.pid")); run teardown.sh first"
fi
mkdir -p "$DIR"/{root,state,runc,cni-net.d,cni-ipam,images,pods,logs,certs.d}
for registry in ${NA_CRI_REGISTRIES:-}; do
  case "$registry" in *[!A-Za-z0-9.:-]*|"") die "NA_CRI_REGISTRIES: $registry is not HOST:PORT" ;; esac
  mkdir -p "$DIR/certs.d/$registry"
  printf 'server = "http://%s"\n[host."http://%s"]\n  capabilities = ["pull", "resolve"]\n' \
    "$registry" "$registry" > "$DIR/certs.d/$registry/hosts.toml"
done

# --- configuration --------------------------------------------------------------------------------------------
if [ "${NA_CRI_POD_CIDR_FROM_NODE:-0}" = 1 ]; then
  # containerd writes the conflist into conf_dir from this template when it is handed a pod CIDR
  CNI_CONF="$DIR/cni-template.conflist"
  CNI_TEMPLATE="conf_template = \"$CNI_CONF\""
  POD_SUBNET='{{.PodCIDR}}'
else
  CNI_CONF="$DIR/cni-net.d/10-node-agent.conflist"
  CNI_TEMPLATE=""
  POD_SUBNET=$SUBNET
fi
CONTAINERD=containerd
if [ "${NA_CRI_CONTAINERD:-1.6}" = 2 ]; then
  bin_dir=$(bash "$HERE/../../hack/build-containerd.sh")
  CONTAINERD="$bin_dir/containerd"
  # its own shim first on the PATH: containerd finds containerd-shim-runc-v2 there
  export PATH="$bin_dir:$PATH"
fi
SYSTEMD_CGROUP=false
[ "${NA_CRI_SYSTEMD_CGROUP:-0}" = 1 ] && SYSTEMD_CGROUP=true
RESTRICT_OOM=true
[ "${NA_CRI_OOM_SCORE_ADJ:-}" = free ] && RESTRICT_OOM=false
cat > "$DIR/config.toml" <<CONF
version = 2
root = "$DIR/root"
state = "$DIR/state"
# nothing listens on TCP: the debug/metrics endpoints stay off
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:local"
  enable_selinux = false
  disable_apparmor = true
  # these machines lack CAP_SYS_RESOURCE: runc cannot set a negative oom_score_adj, so clamp to ours
  restrict_oom_score_adj = $RESTRICT_OOM
  # the containers' huge pages limits (CRI hugepage_limits) reach runc where the hugetlb controller is there
  disable_hugetlb_controller = false
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = $SYSTEMD_CGROUP
        Root = "$DIR/runc"
  # one directory per registry host (HOST:PORT/hosts.toml), read at each pull
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$DIR/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni-net.d"
    max_conf_num = 1
    $CNI_TEMPLATE
CONF

cat > "$CNI_CONF" <<CONF
{
  "cniVersion": "1.0.0",
  "name": "node-agent-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_SUBNET" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$DIR/cni-ipam"
      }
    },
    { "type": "loopback" }
  ]
}
CONF

if [ "$CONTAINERD" != containerd ]; then
  # containerd 2.x: the same settings in its own (version 3) layout
  mv "$DIR/config.toml" "$DIR/config-v2.toml"
  "$CONTAINERD" --config "$DIR/config-v2.toml" config migrate > "$DIR/config.toml" 2>"$DIR/logs/migrate.log" \
    || die "containerd config migrate failed; see $DIR/logs/migrate.log"
  # nothing machine-wide: no imported drop-ins, and NRI (whose socket is the machine's) off
  sed -i -e "s|^imports = .*|imports = []|" \
    -e "/^  \[plugins.'io.containerd.nri.v1.nri'\]/,/^\$/ s/disable = false/disable = true/" "$DIR/config.toml"
  grep -q "^imports = \[\]" "$DIR/config.toml" || die "could not clear the migrated config's imports"
  # CDI specs (written by DRA drivers) are read from this node's own directory, not the machine's
  mkdir -p "$DIR/cdi"
  sed -i -e "s|^    cdi_spec_dirs = .*|    cdi_spec_dirs = ['$DIR/cdi']|" "$DIR/config.toml"
  grep -q "^    cdi_spec_dirs = \['$DIR/cdi'\]" "$DIR/config.toml" || die "could not set the migrated config's cdi_spec_dirs"
fi

# --- images ---------------------------------------------------------------------------------------------------
# busybox: the static busybox binary with one symlink per applet.
ROOTFS="$DIR/images/busybox-rootfs"
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"/{bin,sbin,usr/bin,usr/sbin,etc,root,tmp,proc,sys,dev,var}
chmod 1777 "$ROOTFS/tmp"
cp /bin/busybox "$ROOTFS/bin/busybox"
# one process for all the links (a process per applet is slow where processes are, e.g. in an emulated guest)
busybox --list-full | python3 -c '
import os, sys
root = sys.argv[1]
for applet in sys.stdin.read().split():
    if applet == "bin/busybox":
        continue
    link = os.path.join(root, applet)
    up = "../" * max(1, applet.count("/"))
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(up + "bin/busybox", link)
' "$ROOTFS"
echo 'root:x:0:0:root:/root:/bin/sh' > "$ROOTFS/etc/passwd"
echo 'nobody:x:65534:65534:nobody:/:/bin/false' >> "$ROOTFS/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$ROOTFS/etc/group"
python3 "$HERE/oci_image.py" --rootfs "$ROOTFS" --ref localhost/busybox:local \
  --out "$DIR/images/busybox.tar" --cmd '["sh"]' >&2

# pause: only busybox; a shell that sleeps until SIGTERM/SIGINT and then exits 0 (no compiler needed).
PAUSE="$DIR/images/pause-rootfs"
rm -rf "$PAUSE"
mkdir -p "$PAUSE/bin"
cp /bin/busybox "$PAUSE/bin/busybox"
python3 "$HERE/oci_image.py" --rootfs "$PAUSE" --ref localhost/pause:local --out "$DIR/images/pause.tar" \
  --entrypoint '["/bin/busybox","sh","-c","trap \"exit 0\" TERM INT; while :; do /bin/busybox sleep 3600 & wait $!; done"]' >&2

# --- containerd -----------------------------------------------------------------------------------------------
rm -f "$SOCK" "$SOCK.ttrpc"
"$CONTAINERD" --config "$DIR/config.toml" </dev/null >"$DIR/logs/containerd.log" 2>&1 &
echo $! > "$DIR/containerd.pid"
log "containerd pid $(cat "$DIR/containerd.pid")"
CTR=(ctr --address "$SOCK")
for _ in $(seq 1 300); do
  "${CTR[@]}" version >/dev/null 2>&1 && break
  kill -0 "$(cat "$DIR/containerd.pid")" 2>/dev/null || die "containerd exited; see $DIR/logs/containerd.log"
  sleep 0.1
done
"${CTR[@]}" version >/dev/null 2>&1 || die "containerd did not answer on $SOCK"
"${CTR[@]}" plugins ls | awk '$2 == "cri" && $4 == "ok" { ok = 1 } END { exit !ok }' \
  || die "the CRI plugin did not start; see $DIR/logs/containerd.log"
for img in pause busybox; do
  "${CTR[@]}" -n k8s.io images import "$DIR/images/$img.tar" >&2
done

echo "export NODE_AGENT_CONTAINERD_SOCKET=$SOCK" > "$DIR/env"
log "ready: CRI endpoint unix://$SOCK (source $DIR/env)"
echo "$SOCK"
