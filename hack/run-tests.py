#!/usr/bin/env python3
"""Runs every test binary of the workspace, several at once.

`cargo test` runs its test binaries one after another; ours mostly wait on a control plane (grace periods,
heartbeats), so running a few side by side, each with more test threads than cores, cuts the wall time without
starving anything. The binaries are built first (`cargo test --no-run`), then run from their package's
directory as cargo would run them. The longest-running binaries (as measured by earlier runs, kept in the
cache directory) start first. The binaries that start a private containerd with bridge networking
(CONTAINERD_BINARIES) run in CONTAINERD_LANES lanes, one binary after another in each, so at most that many real
nodes load the machine at once; each has its own state directory, bridge and pod subnet (NA_CRI_SUBNET, unless
the environment sets one). The `hollow` and `node-agent` programs the same build made are
handed to the tests (HOLLOW_BIN, NODE_AGENT_BIN, TESTENV_BIN, unless the environment sets them). Beside the test
binaries runs the CI subset of the upstream node conformance suite (SCRIPTS: hack/conformance.sh --subset, with its
own containerd, bridge and pod subnet).

The workspace's own crates are compiled through hack/rustc-wrapper.sh (cargo's RUSTC_WORKSPACE_WRAPPER), which
builds the libraries' unit-test harnesses and the benchmarks unoptimised. With NODE_AGENT_LINT=1 it compiles them
with clippy, every warning an error: the lints ride on the one compile the tests need instead of a second pass of
their own.
`--build-only` builds and stops (CI starts the build while the Go-built binaries are made).

Environment: NODE_AGENT_TEST_JOBS (binaries at once, default 4), NODE_AGENT_TEST_THREADS (test threads per
binary, default 8), NODE_AGENT_CACHE (where the timings are kept), NODE_AGENT_LINT (see above).
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# label -> the pod subnet its containerd's bridge uses; these binaries run in CONTAINERD_LANES serial lanes
CONTAINERD_BINARIES = {
    "cri-real/test/conformance": "10.88.0.0/16",
    "e2e/test/real_node": "10.90.0.0/16",
    "e2e/test/real_node_restart": "10.91.0.0/16",
    "e2e/test/real_node_v2": "10.92.0.0/16",
    "e2e/test/real_node_eviction": "10.94.0.0/16",
    "e2e/test/real_node_gc": "10.93.0.0/16",
    "e2e/test/real_node_shutdown": "10.95.0.0/16",
    "e2e/test/real_node_chart": "10.97.0.0/16",
    "e2e/test/real_node_csi": "10.87.0.0/16",
    "e2e/test/real_node_devices": "10.75.0.0/16",
    "e2e/test/real_node_faults": "10.89.0.0/16",
    "e2e/test/real_node_dra": "10.76.0.0/16",
}


# how many real nodes on a private containerd run at once
CONTAINERD_LANES = 2


def package_name_of(package_id):
    """`path+file:///w/crates/hollow#0.1.0` -> hollow; `path+file:///w/tests#e2e@0.1.0` -> e2e."""
    url, _, version = package_id.partition("#")
    if "@" in version:
        return version.split("@")[0]
    return url.rstrip("/").rsplit("/", 1)[-1]


# program binaries the tests start (tests/src/lib.rs builds them itself unless these variables name them)
PROGRAMS = {"hollow": "HOLLOW_BIN", "node-agent": "NODE_AGENT_BIN", "testenv": "TESTENV_BIN"}

# label -> a command run beside the test binaries, as one of them (its exit status is its result): the subset of
# the upstream node conformance suite (hack/conformance.sh --subset), which starts its own control plane,
# containerd (own bridge and pod subnet) and node-agent; a real-node test, so NODE_AGENT_SKIP_REAL_NODE=1 skips it
SCRIPTS = {"conformance/subset": ["bash", "hack/conformance.sh", "--subset"]}


def build(root):
    """Builds the test binaries; returns [(package, target name, kind, executable, manifest dir)] and the
    program binaries the same build made ({environment variable: executable})."""
    cmd = ["cargo", "test", "--workspace", "--all-targets", "--no-run", "--message-format=json-render-diagnostics"]
    env = dict(os.environ)
    # the unit-test harnesses and benchmarks compile unoptimised (hack/rustc-wrapper.sh says why)
    env["RUSTC_WORKSPACE_WRAPPER"] = str(root / "hack" / "rustc-wrapper.sh")
    if os.environ.get("NODE_AGENT_LINT") == "1":
        sysroot = subprocess.run(["rustc", "--print", "sysroot"], stdout=subprocess.PIPE, text=True, check=True)
        driver = Path(sysroot.stdout.strip()) / "bin" / "clippy-driver"
        if not driver.exists():
            sys.exit(f"test: NODE_AGENT_LINT=1 needs clippy ({driver} is missing: rustup component add clippy)")
        env["NODE_AGENT_CLIPPY_DRIVER"] = str(driver)
        # what `cargo clippy -- -D warnings` hands the driver
        env["CLIPPY_ARGS"] = "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
    proc = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"test: building the tests failed ({' '.join(cmd)} exited {proc.returncode})")
    output = proc.stdout
    found = []
    programs = {}
    for line in output.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            # a program built for its package's tests, with the workspace's features: handed to every test, so
            # none builds it again with its own package's features (a second build of the whole library)
            if msg["target"]["kind"] == ["bin"] and msg["target"]["name"] in PROGRAMS:
                programs[PROGRAMS[msg["target"]["name"]]] = msg["executable"]
            continue
        package = msg["package_id"]
        name = msg["target"]["name"]
        kind = msg["target"]["kind"][0]
        manifest_dir = str(Path(msg["manifest_path"]).parent)
        package_name = package_name_of(package)
        found.append((package_name, name, kind, msg["executable"], manifest_dir))
    return found, programs


def main():
    root = Path(__file__).resolve().parent.parent
    jobs = int(os.environ.get("NODE_AGENT_TEST_JOBS", "4"))
    threads = os.environ.get("NODE_AGENT_TEST_THREADS", "8")
    cache = Path(os.environ.get("NODE_AGENT_CACHE", Path.home() / ".cache/node-agent"))
    timings_file = cache / "test-timings.json"
    try:
        timings = json.loads(timings_file.read_text())
    except (OSError, ValueError):
        timings = {}

    binaries, programs = build(root)
    if "--build-only" in sys.argv[1:]:
        print(f"test: built {len(binaries)} test binaries", flush=True)
        return
    for var, exe in sorted(programs.items()):
        if var not in os.environ:
            os.environ[var] = exe
            print(f"test: {var}={exe}", flush=True)
    def label(b):
        return f"{b[0]}/{b[2]}/{b[1]}"

    if os.environ.get("NODE_AGENT_SKIP_REAL_NODE") != "1":
        for name, cmd in SCRIPTS.items():
            package, _, target = name.partition("/")
            binaries.append((package, target, "script", cmd, str(root)))
    def expected(group):
        return sum(timings.get(label(b), 60.0) for b in group)

    groups = {}
    lanes = [[] for _ in range(CONTAINERD_LANES)]
    real_nodes = sorted((b for b in binaries if label(b) in CONTAINERD_BINARIES), key=lambda b: expected([b]),
                        reverse=True)
    for b in real_nodes:
        min(lanes, key=expected).append(b)
    for i, lane in enumerate(lanes):
        if lane:
            groups[f"containerd-{i}"] = lane
    for b in binaries:
        if label(b) not in CONTAINERD_BINARIES:
            groups[label(b)] = [b]

    order = sorted(groups.values(), key=expected, reverse=True)
    cargo = subprocess.run(["bash", "-c", "command -v cargo"], stdout=subprocess.PIPE, text=True).stdout.strip()
    lock = threading.Lock()
    results = []
    logs = Path(os.environ.get("CARGO_TARGET_DIR", root / "target")) / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()

    def run(group):
        for b in group:
            env = dict(os.environ, CARGO_MANIFEST_DIR=b[4], CARGO=cargo or "cargo")
            if label(b) in CONTAINERD_BINARIES:
                env.setdefault("NA_CRI_SUBNET", CONTAINERD_BINARIES[label(b)])
            log_path = logs / (label(b).replace("/", "-") + ".log")
            t0 = time.monotonic()
            with open(log_path, "w") as log:
                cmd = b[3] if b[2] == "script" else [b[3], f"--test-threads={threads}"]
                code = subprocess.run(cmd, cwd=b[4], env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            took = time.monotonic() - t0
            summary = ""
            for line in reversed(log_path.read_text(errors="replace").splitlines()):
                if line.startswith("test result:") or line.startswith("subset:"):
                    summary = line
                    break
            with lock:
                timings[label(b)] = round(took, 1)
                results.append((label(b), code, took, log_path))
                state = "ok" if code == 0 else f"FAILED (exit {code})"
                print(f"test: {label(b)}: {state} in {took:.1f}s, {time.monotonic() - start:.0f}s in; {summary}",
                      flush=True)
                if code != 0:
                    print(log_path.read_text(errors="replace"), flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(run, order))

    try:
        timings_file.parent.mkdir(parents=True, exist_ok=True)
        timings_file.write_text(json.dumps(timings, indent=1, sort_keys=True))
    except OSError:
        pass
    failed = [r for r in results if r[1] != 0]
    print(f"test: {len(results)} test binaries, {len(failed)} failed, {time.monotonic() - start:.0f}s")
    for r in failed:
        print(f"test: FAILED {r[0]} (log: {r[3]})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
