#!/usr/bin/env python3
"""Reads the Ginkgo JSON reports of hack/conformance.sh into per-spec results.

  conformance-report.py summary AGENT DIR     DIR/report/report.json -> DIR/results.tsv (state, spec, reason) and
                                              the totals on stdout
  conformance-report.py compare OUT AGENT...  the totals side by side and the specs whose state differs
  conformance-report.py failures DIR          every spec that did not pass, with its failure message
  conformance-report.py subset-focus          the CI subset (SUBSET below) as one Ginkgo focus expression

A spec's state is Ginkgo's: passed, failed, skipped, or timedout/interrupted/aborted/panicked (counted as failed);
specs the suite never reached before its time limit are `interrupted` or absent (counted as not run).
"""
import json
import re
import sys
from pathlib import Path

# The CI subset: one spec per theme, each passing on node-agent and quick (names as Ginkgo prints them, without
# the container texts' tags; matched as substrings of the full text).
SUBSET = [
    "Pods should get a host IP",
    "Pods should be submitted and removed",
    "Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart exec hook properly",
    "Probing container should be restarted with a exec \"cat /tmp/health\" liveness probe",
    "InitContainer [NodeConformance] should invoke init containers on a RestartNever pod",
    "Downward API should provide pod name, namespace and IP address as env vars",
    "ConfigMap should be consumable from pods in volume",
    "Secrets should be consumable from pods in volume",
    "Projected combined should project all components that make up the projection API",
    "EmptyDir volumes should support (root,0644,tmpfs)",
    "HostPath should support subPath",
    "Security Context When creating a container with runAsUser should run the container with uid 65534",
    "Kubelet when scheduling a busybox command in a pod should print the output to logs",
    "Variable Expansion should allow composing env vars into new env vars",
    "Networking Granular Checks: Pods should function for intra-pod communication: http",
]

FAILED = {"failed", "timedout", "interrupted", "aborted", "panicked"}


def spec_name(r):
    return " ".join(t for t in r.get("ContainerHierarchyTexts") or [] if t) + " " + r.get("LeafNodeText", "")


def reason(r):
    f = r.get("Failure") or {}
    msg = (f.get("Message") or "").strip()
    lines = [l.strip() for l in msg.splitlines() if l.strip()]
    return " | ".join(lines[:4])[:600]


def load(dir_):
    path = Path(dir_) / "report" / "report.json"
    if not path.exists():
        return []
    out = []
    for suite in json.loads(path.read_text()):
        for r in suite.get("SpecReports") or []:
            if r.get("LeafNodeType") != "It":
                continue
            out.append((r.get("State", "?"), spec_name(r).strip(), reason(r), r.get("RunTime", 0) / 1e9))
    return out


def totals(results):
    t = {"passed": 0, "failed": 0, "skipped": 0}
    for state, _, _, _ in results:
        if state == "passed":
            t["passed"] += 1
        elif state in FAILED:
            t["failed"] += 1
        else:
            t["skipped"] += 1
    return t


def summary(agent, dir_):
    results = load(dir_)
    with open(Path(dir_) / "results.tsv", "w") as f:
        for state, name, why, took in sorted(results, key=lambda x: x[1]):
            f.write(f"{state}\t{took:.0f}s\t{name}\t{why}\n")
    t = totals(results)
    try:
        seconds = int((Path(dir_) / "seconds").read_text())
    except (OSError, ValueError):
        seconds = 0
    ran = t["passed"] + t["failed"]
    print(f"{agent}: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped or not run "
          f"({ran} ran) in {seconds // 60}m{seconds % 60:02d}s")


def compare(out, agents):
    by = {a: {name: state for state, name, _, _ in load(Path(out) / a)} for a in agents}
    for a in agents:
        summary(a, Path(out) / a)
    if len(agents) == 2:
        a, b = agents
        names = sorted(set(by[a]) | set(by[b]))
        for n in names:
            sa, sb = by[a].get(n, "absent"), by[b].get(n, "absent")
            if (sa == "passed") != (sb == "passed"):
                print(f"differs: {a} {sa}, {b} {sb}: {n}")


def failures(dir_):
    for state, name, why, took in sorted(load(dir_), key=lambda x: x[1]):
        if state in FAILED:
            print(f"{state} ({took:.0f}s): {name}\n    {why}\n")


def subset_focus():
    print("|".join(re.escape(s) for s in SUBSET))


def main():
    args = sys.argv[1:]
    if args[:1] == ["summary"] and len(args) == 3:
        summary(args[1], args[2])
    elif args[:1] == ["compare"] and len(args) >= 3:
        compare(args[1], args[2:])
    elif args[:1] == ["failures"] and len(args) == 2:
        failures(args[1])
    elif args == ["subset-focus"]:
        subset_focus()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
