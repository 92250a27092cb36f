#!/usr/bin/env bash
# The demo: sets up a fresh machine, starts a real control plane on 127.0.0.1 and prints how to reach it.
# Runs until Ctrl-C, then stops everything it started.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash hack/setup.sh
cargo build -q -p testenv
dir=${DEMO_DIR:-/tmp/node-agent-demo}
exec target/debug/testenv up --dir "$dir"
