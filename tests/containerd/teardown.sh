#!/usr/bin/env bash
# Undo tests/containerd/setup.sh: kill every container of this containerd instance (through runc, with this
# instance's runc root), stop containerd by its PID, stop its shims by PID, unmount what it left below the state
# directory, delete its bridge and remove the directory. Leaves no process of the instance behind; exits non-zero
# if one survives.
#
# usage: sudo tests/containerd/teardown.sh     env: NA_CRI_DIR, NA_CRI_BRIDGE (as for setup.sh), NA_CRI_KEEP=1 keeps
#        the state directory (logs) instead of deleting it.
set -uo pipefail

DIR=${NA_CRI_DIR:-/tmp/node-agent-cri}
BRIDGE=${NA_CRI_BRIDGE:-nacri0}
SOCK="$DIR/containerd.sock"
log() { echo "[containerd-teardown] $*" >&2; }

# PIDs of processes whose command line mentions this instance's directory (containerd, its shims).
instance_pids() {
  local p
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$DIR/"; then echo "${p#/proc/}"; fi
  done
}

# wait up to $2 tenths of a second for pid $1 to go away
wait_gone() {
  local i
  for i in $(seq 1 "$2"); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}

# 1. containers: every runc namespace root of this instance
if [ -d "$DIR/runc" ]; then
  for root in "$DIR"/runc/*/; do
    [ -d "$root" ] || continue
    for id in $(runc --root "$root" list -q 2>/dev/null); do
      runc --root "$root" kill --all "$id" KILL 2>/dev/null
    done
    sleep 0.2
    for id in $(runc --root "$root" list -q 2>/dev/null); do
      runc --root "$root" delete --force "$id" 2>/dev/null || log "runc delete $id failed"
    done
  done
fi

# 2. containerd itself, by the PID setup.sh recorded
if [ -f "$DIR/containerd.pid" ]; then
  pid=$(cat "$DIR/containerd.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    wait_gone "$pid" 100 || { log "containerd $pid ignored SIGTERM; killing"; kill -KILL "$pid"; wait_gone "$pid" 50; }
  fi
  rm -f "$DIR/containerd.pid"
fi

# 3. shims (they name this instance's socket on their command line), by PID
for pid in $(instance_pids); do
  kill -TERM "$pid" 2>/dev/null
done
for pid in $(instance_pids); do
  wait_gone "$pid" 30 || kill -KILL "$pid" 2>/dev/null
done

# 4. mounts below the directory (rootfs overlays, shm, netns bind mounts), deepest first
if [ -d "$DIR" ]; then
  awk -v d="$DIR/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
  done
fi

# 5. network and cgroups the tests created
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
for cg in /sys/fs/cgroup/*/na-cri-test /sys/fs/cgroup/unified/na-cri-test; do
  [ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null
done

left=$(instance_pids)
if [ -n "$left" ]; then
  log "processes of $DIR still running: $left"
  exit 1
fi
if [ "${NA_CRI_KEEP:-0}" != 1 ] && [ -d "$DIR" ]; then
  if awk -v d="$DIR/" 'index($2, d) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    log "mounts remain below $DIR; not deleting it"
    exit 1
  fi
  rm -rf "$DIR"
fi
log "done"
