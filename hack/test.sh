#!/usr/bin/env bash
# The test command: sets up a fresh machine (hack/setup.sh), then runs every test in the workspace — unit
# tests, and integration tests against a real control plane (started per test binary by the testenv crate),
# several test binaries at once — and finally checks that no control-plane process was left behind.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# CI has set up already (NODE_AGENT_SETUP_DONE=1); anyone else gets the same set-up here
[ "${NODE_AGENT_SETUP_DONE:-}" = 1 ] || bash hack/setup.sh

# Real-mode tests start their own private containerd (tests/containerd/setup.sh) and tear it down by PID; they
# need root and fail without it, unless NODE_AGENT_SKIP_REAL_NODE=1 skips them.
if [ $# -eq 0 ]; then
  # every test binary, a few at once (hack/run-tests.py); all run even when one fails
  python3 hack/run-tests.py
else
  # arguments: a plain `cargo test` with them, e.g. `bash hack/test.sh -p hollow --test fleet`
  cargo test "$@"
fi

# Every control plane dies with its test binary; give the kernel a moment, then look for live leftovers.
sleep 2
left=$(ps -eo pid=,stat=,args= | awk '$2 !~ /^Z/' | grep -E 'node-agent-testenv/cp-' | grep -v grep || true)
if [ -n "$left" ]; then
  echo "test: processes left behind by the tests:" >&2
  echo "$left" >&2
  exit 1
fi
echo "test: no control-plane process left behind"
