#!/usr/bin/env bash
# Builds the guest of the VM tests: a Debian bookworm system from Debian's packages (systemd as PID 1, containerd,
# runc, the CNI plugins, busybox-static and python3 for tests/containerd/setup.sh, qemu-guest-agent through which
# the tests run commands, the kernel with its modules), as an ext4 disk image plus the kernel and initrd that boot
# it, into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/vm/<key>/{rootfs.img,vmlinuz,initrd.img}
# where <key> is taken from this script's content, so an edit here builds a new guest. Needs root (mmdebstrap in
# its root mode) and Debian's mirror; installs mmdebstrap and qemu with apt when missing.
# Idempotent: does nothing when the image is already there; concurrent callers wait for one build (a lock file in
# the cache). Prints the directory on stdout.
#
# In the guest: the tests' share (9p, tag `host`) is mounted read-only at /mnt/host; the network is QEMU's user
# network by DHCP (the host's loopback is 10.0.2.2); root has no password on the serial console.
set -euo pipefail
self="${BASH_SOURCE[0]}"
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
key=$(sha256sum "$self" | cut -c1-16)
dir="$cache/vm/$key"
built() { [ -f "$dir/rootfs.img" ] && [ -f "$dir/vmlinuz" ] && [ -f "$dir/initrd.img" ]; }
if built; then echo "$dir"; exit 0; fi
log() { echo "[build-vm-image] $*" >&2; }
[ "$(id -u)" = 0 ] || { log "must run as root (mmdebstrap builds the guest in a chroot)"; exit 1; }
mkdir -p "$cache/vm"
exec 9>"$cache/vm/.lock"
flock 9
if built; then echo "$dir"; exit 0; fi

need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v qemu-img >/dev/null || need+=(qemu-utils)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$dir"
# everything goes to a scratch directory first so an interrupted build never leaves a half-made image in place
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
root="$tmp/root"
packages=(
  systemd-sysv udev dbus kmod initramfs-tools linux-image-amd64 qemu-guest-agent
  containerd runc containernetworking-plugins busybox-static iproute2 python3 util-linux procps
)
# units a test guest has no use for, each a few seconds of an emulated boot: timers of a long-lived machine, logins
# on terminals, utmp, binfmt, debug and trace file systems, modules nothing here loads
masked=(
  apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer
  systemd-tmpfiles-clean.timer getty@tty1.service systemd-update-utmp.service systemd-update-utmp-runlevel.service
  systemd-binfmt.service proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount sys-kernel-debug.mount
  sys-kernel-tracing.mount systemd-pstore.service modprobe@drm.service modprobe@fuse.service
  modprobe@efi_pstore.service modprobe@loop.service modprobe@dm_mod.service
)
started=$(date +%s)
log "mmdebstrap bookworm (${packages[*]})"
mmdebstrap --mode=root --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='echo node-vm > "$1/etc/hostname"' \
  --customize-hook='printf "127.0.0.1 localhost\n127.0.1.1 node-vm\n" > "$1/etc/hosts"' \
  --customize-hook='printf "/dev/vda / ext4 rw,errors=remount-ro 0 1\nhost /mnt/host 9p trans=virtio,version=9p2000.L,ro,nofail,x-systemd.device-timeout=5s 0 0\n" > "$1/etc/fstab"' \
  --customize-hook='mkdir -p "$1/mnt/host"' \
  --customize-hook='printf "9p\n9pnet_virtio\noverlay\nbr_netfilter\n" > "$1/etc/modules-load.d/node-vm.conf"' \
  --customize-hook='printf "[Match]\nName=en*\n\n[Network]\nDHCP=ipv4\n" > "$1/etc/systemd/network/10-user.network"' \
  --customize-hook='chroot "$1" systemctl enable systemd-networkd' \
  --customize-hook='chroot "$1" systemctl disable containerd || true' \
  --customize-hook='chroot "$1" passwd -d root' \
  --customize-hook='printf "net.ipv4.ip_forward = 1\n" > "$1/etc/sysctl.d/90-node-vm.conf"' \
  --customize-hook='cp -L "$1/vmlinuz" '"$tmp"'/vmlinuz' \
  --customize-hook='mkdir -p "$1/etc/systemd/journald.conf.d" && printf "[Journal]\nStorage=volatile\n" > "$1/etc/systemd/journald.conf.d/node-vm.conf"' \
  --customize-hook='chroot "$1" systemctl mask '"${masked[*]}" \
  --customize-hook='rm -rf "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*' \
  bookworm "$root" http://deb.debian.org/debian >&2
# The initrd: busybox and the modules that reach the root disk, loaded by a short script that then hands over to
# systemd. Debian's own initrd carries most of the kernel's drivers and runs udev to find the disk, which takes
# longer than the rest of the boot under emulation.
kver=$(ls "$root/lib/modules")
initrd="$root/tmp/initrd"
mkdir -p "$initrd"/{bin,dev,proc,sys,newroot,modules}
cp "$root/bin/busybox" "$initrd/bin/busybox"
modules=()
for m in virtio_pci virtio_blk ext4; do
  while read -r cmd path _; do
    [ "$cmd" = insmod ] || continue
    name=$(basename "$path")
    [ -f "$initrd/modules/$name" ] && continue
    cp "$root$path" "$initrd/modules/$name"
    modules+=("$name")
  done < <(chroot "$root" modprobe -S "$kver" --show-depends "$m")
done
cat > "$initrd/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in ${modules[*]}; do insmod /modules/\$m || echo "initrd: insmod \$m failed"; done
i=0
while [ ! -b /dev/vda ] && [ \$i -lt 300 ]; do sleep 0.1; i=\$((i + 1)); done
# on failure init exits: the kernel panics and (panic=-1, -no-reboot) QEMU exits, the console saying why
mount -o rw /dev/vda /newroot || { echo "initrd: cannot mount /dev/vda"; exit 1; }
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
INIT
chmod 755 "$initrd/init"
chroot "$root" sh -c 'cd /tmp/initrd && find . | busybox cpio -o -H newc 2>/dev/null' > "$tmp/initrd.img"
rm -rf "$initrd"
log "initrd: ${modules[*]}"
log "rootfs: $(du -sh "$root" | cut -f1)"
# the disk: the tree as an ext4 filesystem, with room for containerd's images and the pods
size_mb=$(( $(du -sm "$root" | cut -f1) + 2048 ))
truncate -s "${size_mb}M" "$tmp/rootfs.img"
mkfs.ext4 -q -F -L root -d "$root" "$tmp/rootfs.img"
rm -rf "$root"
mv "$tmp/vmlinuz" "$tmp/initrd.img" "$dir/"
mv "$tmp/rootfs.img" "$dir/rootfs.img"
log "built in $(( $(date +%s) - started )) s: $(du -h --apparent-size "$dir/rootfs.img" | cut -f1) image ($(du -h "$dir/rootfs.img" | cut -f1) used), kernel and initrd $(du -ch "$dir/vmlinuz" "$dir/initrd.img" | tail -1 | cut -f1)"
echo "$dir"
