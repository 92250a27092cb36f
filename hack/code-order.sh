#!/usr/bin/env bash
# Writes crates/hollow/code-order.txt, the order in which the release build links the fleet's functions (see
# crates/hollow/build.rs): those a fleet ran first, side by side. Run it again when the fleet's code has moved on
# (the density benchmark's "binary's pages" column grows back). Takes ~40 min on two cores with the release profile.
#
#   1. an instrumented build (-Cprofile-generate) runs the density benchmark twice: idle nodes, then nodes with pods;
#   2. a release build names the functions that ran (profile dumps from llvm-profdata) as the linker sees them;
#   3. the ordered build runs once more under `perf record -e page-faults`: code the profile cannot see (the
#      standard library, jemalloc, ring's C) is found by the pages it faults, and added; the list is written again.
#
# Needs: the llvm-tools rustup component (for llvm-profdata), perf, and what the density benchmark needs.
# CODE_ORDER_NODES (1000) nodes per run; CODE_ORDER_WORK (~/.cache/node-agent/code-order) for the runs' files;
# CODE_ORDER_QUICK=1 builds the instrumented binary without link-time optimisation (minutes, not ~20): its symbols
# are hashed differently, so names are matched by path and every instance of a generic function that ran is listed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${CODE_ORDER_WORK:-$HOME/.cache/node-agent/code-order}
nodes=${CODE_ORDER_NODES:-1000}
target=${CARGO_TARGET_DIR:-$root/target}
profdata=$(ls "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -1)
[ -x "$profdata" ] || { echo "code-order: llvm-profdata not found: rustup component add llvm-tools" >&2; exit 1; }
command -v perf >/dev/null || { echo "code-order: perf not found (Debian: apt-get install linux-perf)" >&2; exit 1; }
mkdir -p "$work"
rm -f "$work"/*.profraw "$work"/faults.list
cd "$root"

density() { # density BIN PODS_PER_NODE: one density run of the fleet binary BIN
    DENSITY_HOLLOW_BIN=$1 DENSITY_FLEETS=hollow DENSITY_NODES=$nodes DENSITY_PODS_PER_NODE=$2 \
        DENSITY_PODS_MAX_NODES=$nodes DENSITY_IDLE_SECS=30 cargo bench -p hollow --bench density
}

echo "code-order: 1. instrumented build and runs" >&2
quick=()
[ "${CODE_ORDER_QUICK:-}" = 1 ] && quick=(CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16)
env "${quick[@]}" CARGO_TARGET_DIR="$work/target-instrumented" \
    RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$work/build-scripts" HOLLOW_CODE_ORDER=off \
    cargo build --release -p hollow --bin hollow
for run in idle:0 pods:2; do
    LLVM_PROFILE_FILE=$work/${run%:*}-%p.profraw density "$work/target-instrumented/release/hollow" "${run#*:}"
    "$profdata" merge -o "$work/${run%:*}.profdata" "$work/${run%:*}"-*.profraw
    "$profdata" show --all-functions --counts "$work/${run%:*}.profdata" > "$work/${run%:*}.txt"
done

echo "code-order: 2. the functions that ran, as the release build names them" >&2
cargo build --release -p hollow --bin hollow
cp "$target/release/hollow" "$work/hollow"
python3 hack/code-order.py write "$work/hollow" crates/hollow/code-order.txt "$work/idle.txt" "$work/pods.txt"

echo "code-order: 3. the ordered build's page faults" >&2
cargo build --release -p hollow --bin hollow
cp "$target/release/hollow" "$work/hollow"
printf '#!/bin/sh\nexec perf record -q -e page-faults -c 1 -d -o %s/faults.data -- %s/hollow "$@"\n' "$work" "$work" \
    > "$work/hollow-perf"
chmod +x "$work/hollow-perf"
density "$work/hollow-perf" 0
python3 hack/code-order.py faults "$work/hollow" crates/hollow/code-order.txt "$work/faults.data" "$work/faults.list"
python3 hack/code-order.py write "$work/hollow" crates/hollow/code-order.txt \
    "$work/idle.txt" "$work/faults.list" "$work/pods.txt"
echo "code-order: crates/hollow/code-order.txt written; the next release build links by it" >&2
