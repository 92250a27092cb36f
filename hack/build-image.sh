#!/usr/bin/env bash
# Builds node-agent's container images without a Docker daemon, and pushes them to a registry if asked.
#
# usage: hack/build-image.sh [--push REGISTRY[/PREFIX]] [--auth USER:PASSWORD] [--tag TAG] [--out DIR]
#                            [--plain-http] [--binaries DIR] [IMAGE ...]
#   IMAGE    hollow, node-agent (default: both)
#   --push   push IMAGE as REGISTRY[/PREFIX]/IMAGE:TAG (the chart's default repository is node-agent/hollow, so
#            `--push registry.example.com/node-agent` gives registry.example.com/node-agent/hollow:<version>);
#            plain HTTP for 127.0.0.1/localhost (or --plain-http), HTTPS otherwise; --auth (or OCI_PUSH_AUTH)
#            answers a basic or bearer challenge
#   --tag    default: the workspace version (Cargo.toml), which is the chart's appVersion and default image tag;
#            <version>-dev with --binaries
#   --out    where the OCI image layouts go (DIR/IMAGE: oci-layout, index.json, blobs/sha256/...); default
#            ${NODE_AGENT_CACHE:-~/.cache/node-agent}/images/<source hash> (images/dev with --binaries)
#   --binaries DIR (or NODE_AGENT_IMAGE_BINARIES=DIR)
#            the development image: packs the binaries already built in DIR (e.g. target/debug) instead of
#            building release ones — compiles nothing; what the project's CI installs in its tests
# Prints one line per image: IMAGE REFERENCE DIGEST (the manifest digest, sha256:...).
#
# Two flavours of an image, both with /etc/passwd and /etc/group naming the non-root user 65532 (nonroot) the
# image runs as, /etc/nsswitch.conf, an empty /tmp and the binary at /usr/local/bin/IMAGE as the entrypoint; one
# gzip layer, OCI labels (title, version, revision, created, licenses), an OCI image layout with an index:
# * release (the default, what users install): one statically linked release binary (static glibc: the
#   machine's toolchain has no musl target; profile `image` of Cargo.toml, stripped).
# * development (--binaries): the binary as the test build made it (dev profile: opt-level 1, dynamically
#   linked), stripped of its debug info and build id, with the shared libraries `ldd` names and the dynamic
#   loader at the paths it names. Seconds to pack (about 4 s for hollow), since CI has built the binary already;
#   not for production (less optimised code, the build machine's glibc and its other libraries).
# Deterministic packing: the layer has sorted entries, owner root and mtime 0; the config's `created` is the
# commit's time — the same binaries and commit give the same digest wherever the script runs
# (tests/containerd/oci_image.py does the packing; tests/tests/chart.rs shows it with the development image).
# The release binaries are built with no absolute source path in them, so that two checkouts of one commit
# build the same bytes; checked only by hand (NODE_AGENT_IMAGE_RELEASE=1 in that test: two cold release builds).
#
# Release binaries are cached by a hash of the sources (crates/, proto/, Cargo.toml, Cargo.lock, this script and
# the compiler's version) under ${NODE_AGENT_CACHE:-~/.cache/node-agent}/image-bin/<hash>; the release build
# uses its own target directory (NODE_AGENT_IMAGE_TARGET, default ${NODE_AGENT_CACHE}/cargo-target-image) since
# its flags differ from the test build's. Measured on a shared 2-core machine before the release profile gained fat LTO
# and one codegen unit: cold 11m48s (9m54s CPU); after a change to the project's crates ~7 min CPU (node-agent,
# hollow, cri-*; wall time grows with load); unchanged: ~7 s. LTO adds to both (its link is single-threaded).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
log() { echo "build-image: $*" >&2; }
die() { log "error: $*"; exit 1; }

# shared_libraries BINARY ROOTFS: copies the libraries `ldd` resolves for BINARY, and its dynamic loader, into
# ROOTFS at the paths ldd names (the files, not the symlinks that led to them)
shared_libraries() {
  local libs path
  readelf -d "$1" | grep -q NEEDED || return 0
  libs=$(ldd "$1") || die "ldd $1 failed: $libs"
  if echo "$libs" | grep -q 'not found'; then die "$1 needs libraries this machine lacks: $libs"; fi
  while read -r path; do
    mkdir -p "$2$(dirname "$path")"
    cp "$(readlink -f "$path")" "$2$path"
    chmod 0755 "$2$path"
  done < <(echo "$libs" | sed -n 's/.*=> \(\/[^ ]*\) (0x.*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p')
}

push="" tag="" out="" plain_http=() images=()
auth=${OCI_PUSH_AUTH:-}
binaries=${NODE_AGENT_IMAGE_BINARIES:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --push) push=${2:?--push needs REGISTRY[/PREFIX]}; shift 2 ;;
    --auth) auth=${2:?--auth needs USER:PASSWORD}; shift 2 ;;
    --tag) tag=${2:?--tag needs a tag}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --plain-http) plain_http=(--plain-http); shift ;;
    --binaries) binaries=${2:?--binaries needs a directory}; shift 2 ;;
    hollow|node-agent) images+=("$1"); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[ ${#images[@]} -gt 0 ] || images=(hollow node-agent)
target=x86_64-unknown-linux-gnu

mkdir -p "$cache/image-bin"
# one image build at a time (tests build side by side): the second finds the first's binaries, and no two write
# the same layout
exec 9>"$cache/image-bin/.lock"
flock 9

if [ -n "$binaries" ]; then
  flavour=development
  bins=$(cd "$binaries" 2>/dev/null && pwd) || die "--binaries $binaries: no such directory"
  for image in "${images[@]}"; do
    [ -x "$bins/$image" ] || die "no $image binary in $bins (build it first: cargo build --bin $image)"
  done
else
  flavour=release
  # the sources the binaries are built from, and how
  hash=$(
    cd "$root"
    {
      git ls-files -z -co --exclude-standard -- Cargo.toml Cargo.lock crates proto | sort -z | xargs -0 sha256sum
      sha256sum hack/build-image.sh
      rustc -V
    } | sha256sum | cut -c1-16
  )
  bins="$cache/image-bin/$hash"
  if [ ! -x "$bins/hollow" ] || [ ! -x "$bins/node-agent" ]; then
    command -v cargo >/dev/null || die "cargo not found"
    [ -f /usr/lib/x86_64-linux-gnu/libc.a ] || die "no static glibc (/usr/lib/x86_64-linux-gnu/libc.a): apt-get install libc6-dev"
    image_target=${NODE_AGENT_IMAGE_TARGET:-$cache/cargo-target-image}
    log "building static release binaries (source hash $hash) in $image_target"
    started=$(date +%s)
    # cargo names the workspace's sources by relative paths; the registry's and the build scripts' outputs are
    # remapped, so the binaries do not depend on where the tree is checked out (the flags, which cargo hashes into
    # symbol names, stay the same for every checkout)
    cargo_home=${CARGO_HOME:-$HOME/.cargo}
    # called from a test, the environment holds cargo's variables for that test (CARGO_MANIFEST_DIR,
    # CARGO_PKG_NAME, ...), which build scripts such as ring's name in rerun-if-env-changed: drop them so a build
    # from a test and one from a shell find the same dependencies fresh
    for v in $(compgen -e); do
      case "$v" in
        CARGO_HOME|CARGO_TERM_*|CARGO_NET_*|CARGO_HTTP_*|CARGO_REGISTRIES_*|CARGO_BUILD_JOBS) ;;
        CARGO_*|OUT_DIR|TARGET|HOST|PROFILE|OPT_LEVEL|DEBUG|NUM_JOBS|RUSTC_WORKSPACE_WRAPPER) unset "$v" ;;
      esac
    done
    (cd "$root" && \
      CARGO_TARGET_DIR="$image_target" CARGO_INCREMENTAL=0 \
      RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$image_target=/target" \
      cargo build --locked --profile image --target "$target" -p hollow -p node-agent-bin --bin hollow --bin node-agent >&2)
    tmp=$(mktemp -d "$cache/image-bin/.build.XXXXXX")
    for b in hollow node-agent; do
      cp "$image_target/$target/image/$b" "$tmp/$b"
      if readelf -d "$tmp/$b" 2>/dev/null | grep -q NEEDED; then
        rm -rf "$tmp"; die "$b is not statically linked: $(readelf -d "$image_target/$target/image/$b" | grep NEEDED | tr -s ' ')"
      fi
    done
    chmod 0755 "$tmp"
    rm -rf "$bins"; mv "$tmp" "$bins"
    log "built in $(( $(date +%s) - started ))s: $(du -h "$bins/hollow" | cut -f1) hollow, $(du -h "$bins/node-agent" | cut -f1) node-agent"
    # keep the newest three source hashes
    ls -1dt "$cache/image-bin"/*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
  fi
fi

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$root/Cargo.toml")
if [ -z "$tag" ]; then
  tag=$version
  [ "$flavour" = release ] || tag="$version-dev"
fi
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git -C "$root" status --porcelain -- Cargo.toml Cargo.lock crates proto 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi
epoch=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
if [ -z "$out" ]; then
  out="$cache/images/$hash"
  [ "$flavour" = release ] || out="$cache/images/dev"
fi
mkdir -p "$out"

for image in "${images[@]}"; do
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/tmp"
  if [ "$flavour" = release ]; then
    cp "$bins/$image" "$rootfs/usr/local/bin/$image"
  else
    # debug info and the build id (a hash over it) name the checkout's path; the image needs neither
    strip --strip-all --remove-section=.note.gnu.build-id -o "$rootfs/usr/local/bin/$image" "$bins/$image"
    shared_libraries "$bins/$image" "$rootfs"
  fi
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin\n' > "$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
  printf 'hosts: files dns\n' > "$rootfs/etc/nsswitch.conf"
  find "$rootfs" -type d -exec chmod 0755 {} +
  find "$rootfs/etc" -type f -exec chmod 0644 {} +
  chmod 0755 "$rootfs/usr/local/bin/$image"
  chmod 1777 "$rootfs/tmp"
  case "$image" in
    hollow) description="Thousands of hollow Kubernetes nodes (node-agent against fake runtimes) in one process" ;;
    node-agent) description="node-agent, a Kubernetes node agent (kubelet) in Rust" ;;
  esac
  [ "$flavour" = release ] || description="$description; development image (dev-profile dynamically linked binary)"
  ref="node-agent/$image:$tag"
  args=(--rootfs "$rootfs" --ref "$ref" --layout "$out/$image" --gzip --created "$created"
        --user 65532:65532 --entrypoint "[\"/usr/local/bin/$image\"]"
        --label "org.opencontainers.image.title=$image"
        --label "org.opencontainers.image.description=$description"
        --label "org.opencontainers.image.version=$version"
        --label "org.opencontainers.image.revision=$revision"
        --label "org.opencontainers.image.created=$created"
        --label "org.opencontainers.image.licenses=Apache-2.0")
  rm -rf "${out:?}/$image"
  if [ -n "$push" ]; then
    ref="${push%/}/$image:$tag"
    args+=(--push "$ref" "${plain_http[@]}")
    [ -z "$auth" ] || args+=(--auth "$auth")
  fi
  digest=$(python3 "$root/tests/containerd/oci_image.py" "${args[@]}" | tail -n 1)
  rm -rf "$rootfs"
  trap - EXIT
  echo "$image $ref $digest"
done
