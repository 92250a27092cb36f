#!/usr/bin/env bash
# The compiler wrapper hack/run-tests.py gives cargo for the workspace's own crates (RUSTC_WORKSPACE_WRAPPER).
#
# The dev profile optimises the libraries the hollow tests run thousands of agents on (opt-level 1; node-agent's
# own library is the exception, see Cargo.toml). Two kinds of target gain nothing from that and cost the most to
# optimise: test targets — a library's unit-test harness (the library compiled a second time, with its tests)
# and the integration tests (each instantiates the generic code of kube, serde and tokio it calls), whose own
# code waits on fleets, control planes and nodes — and the benchmarks (in the test run they only build and print
# how to run them). Cargo has no per-target profile, so this wrapper appends `-C opt-level=0` (rustc takes the
# last value) to exactly those compiles. The libraries the tests link and the programs they start stay as the
# profile says.
#
# With NODE_AGENT_CLIPPY_DRIVER set (run-tests.py's NODE_AGENT_LINT=1) the compile goes through clippy, so the
# lints ride on it. Cargo does not fingerprint this script's rules: after changing them, `touch` the crates'
# sources (or remove the target directory) so the affected targets are compiled again.
set -euo pipefail
rustc=$1
shift
is_test=0
kind=""
for arg in "$@"; do
  case "$arg" in
    --test) is_test=1 ;;
    */src/lib.rs | src/lib.rs) kind=lib ;;
    */benches/*.rs | benches/*.rs) kind=bench ;;
  esac
done
extra=()
if [ "$is_test" = 1 ] || [ "$kind" = bench ]; then
  extra=(-C opt-level=0)
fi
if [ -n "${NODE_AGENT_CLIPPY_DRIVER:-}" ]; then
  exec "$NODE_AGENT_CLIPPY_DRIVER" "$rustc" "$@" "${extra[@]}"
fi
exec "$rustc" "$@" "${extra[@]}"
