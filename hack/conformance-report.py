#!/usr/bin/env python3
"""Reads the Ginkgo JSON reports of hack/conformance.sh into per-spec results.

  conformance-report.py summary AGENT DIR     DIR/report/report.json -> DIR/results.tsv (state, spec, reason) and
                                              the totals on stdout
  conformance-report.py compare OUT AGENT...  the totals side by side and the specs whose state differs
  conformance-report.py failures DIR...       every spec that did not pass, with why (with several DIRs, a spec's
                                              result in a later one replaces the earlier: a full run, then reruns)
  conformance-report.py merge AGENT DIR...    the totals over DIRs in that way, and OUT=DIR[0]/merged.tsv
  conformance-report.py subset-focus          the CI subset (SUBSET below) as one Ginkgo focus expression
  conformance-report.py check-subset DIR      exits 1 unless every spec of SUBSET passed in DIR's report

A spec's state is Ginkgo's: passed, failed, skipped, or timedout/interrupted/aborted/panicked (counted as failed);
specs the suite never reached before its time limit are `interrupted` or absent (counted as not run).
"""
import json
import re
import sys
from pathlib import Path

# The CI subset: one spec per theme (pods, logs, hooks, probes, init and sidecar containers, downward API and
# expansion, configMap/secret/projected/emptyDir/hostPath volumes, security context, /etc/hosts, RuntimeClass, the
# node lease, pod networking, hostnameOverride, a termination message from a log without a final newline), each passing on node-agent and quick; full spec texts as Ginkgo prints them.
SUBSET = [
    "[sig-node] Pods should get a host IP [NodeConformance] [Conformance]",
    "[sig-node] Pods should support retrieving logs from the container over websockets [NodeConformance] [Conformance]",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart http hook "
    "properly [NodeConformance] [Conformance]",
    "[sig-node] Probing container should be restarted with a /healthz http liveness probe [NodeConformance] "
    "[Conformance]",
    "[sig-node] InitContainer [NodeConformance] should not start app containers and fail the pod if init containers "
    "fail on a RestartNever pod [Conformance]",
    "[sig-node] [NodeConformance] [FeatureGate:SidecarContainers] Restartable Init Container Lifecycle Hook when "
    "create a pod with lifecycle hook should execute poststart exec hook properly",
    "[sig-node] Downward API should provide pod name, namespace and IP address as env vars [NodeConformance] "
    "[Conformance]",
    "[sig-node] Variable Expansion should allow substituting values in a container's command [NodeConformance] "
    "[Conformance]",
    "[sig-storage] ConfigMap should be consumable from pods in volume with mappings [NodeConformance] [Conformance]",
    "[sig-storage] Secrets should be consumable from pods in volume [NodeConformance] [Conformance]",
    "[sig-storage] Projected configMap should be consumable from pods in volume [NodeConformance] [Conformance]",
    "[sig-storage] EmptyDir volumes should support (root,0644,tmpfs) [LinuxOnly] [NodeConformance] [Conformance]",
    "[sig-storage] HostPath should support subPath [NodeConformance]",
    "[sig-node] Security Context When creating a container with runAsUser should run the container with uid 65534 "
    "[LinuxOnly] [NodeConformance] [Conformance]",
    "[sig-node] Kubelet when scheduling a read only busybox container should not write to root filesystem "
    "[LinuxOnly] [NodeConformance] [Conformance]",
    "[sig-node] KubeletManagedEtcHosts should test kubelet managed /etc/hosts file [NodeConformance] [Conformance]",
    "[sig-node] RuntimeClass should schedule a Pod requesting a RuntimeClass without PodOverhead [NodeConformance] "
    "[Conformance]",
    "[sig-node] NodeLease [NodeConformance] NodeLease the kubelet should create and update a lease in the "
    "kube-node-lease namespace",
    "[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http "
    "[NodeConformance] [Conformance]",
    "[sig-node] Override hostname of Pod [NodeConformance] [FeatureGate:HostnameOverride] [Beta] a pod with only "
    "hostnameOverride field will have hostnameOverride as hostname",
    "[sig-node] Container Runtime blackbox test on terminated container should report termination message from log "
    "output if TerminationMessagePolicy FallbackToLogsOnError is set [NodeConformance] [Conformance]",
]

FAILED = {"failed", "timedout", "interrupted", "aborted", "panicked"}


def spec_name(r):
    return " ".join(t for t in r.get("ContainerHierarchyTexts") or [] if t) + " " + r.get("LeafNodeText", "")


def reason(r):
    """The failure's first line, then what the pod dump in it says of its containers (waiting reasons and their
    messages): a timed-out wait for a pod says why only there."""
    f = r.get("Failure") or {}
    msg = (f.get("Message") or "").strip()
    lines = [l.strip() for l in msg.splitlines() if l.strip()]
    out = lines[:1]
    seen = set()
    for i, l in enumerate(lines):
        if l.startswith("reason:") or (l.startswith("message:") and i > 0 and lines[i - 1].startswith("reason:")):
            value = l.split(":", 1)[1].strip().strip('"')
            if value and value not in seen and value not in ("Ready", "PodCompleted"):
                seen.add(value)
                out.append(value[:200])
    if len(out) == 1:
        out += lines[1:4]
    return " | ".join(out)[:700]


EVENT = re.compile(r"event for [^:]+: \{kubelet [^}]*\} (\w+): (.*)$")
ROUTINE = {"Pulled", "Created", "Started", "Scheduled", "Killing", "Pulling", "SandboxChanged"}


def events(r):
    """The distinct events the node posted for the spec's pods other than the routine ones, from the framework's
    dump after a failure."""
    out = []
    for line in (r.get("CapturedGinkgoWriterOutput") or "").splitlines():
        m = EVENT.search(line)
        if m and m.group(1) not in ROUTINE:
            e = f"{m.group(1)}: {m.group(2)[:300]}"
            if e not in out:
                out.append(e)
    return out


def load_reports(dir_):
    path = Path(dir_) / "report" / "report.json"
    if not path.exists():
        return []
    return [r for suite in json.loads(path.read_text()) for r in suite.get("SpecReports") or []
            if r.get("LeafNodeType") == "It"]


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


def merged_reports(dirs):
    by = {}
    for d in dirs:
        for r in load_reports(d):
            if r.get("State") != "skipped" or spec_name(r) not in by:
                by[spec_name(r)] = r
    return list(by.values())


def merge(agent, dirs):
    reports = merged_reports(dirs)
    results = [(r.get("State", "?"), spec_name(r).strip(), reason(r), r.get("RunTime", 0) / 1e9) for r in reports]
    with open(Path(dirs[0]) / "merged.tsv", "w") as f:
        for state, name, why, took in sorted(results, key=lambda x: x[1]):
            f.write(f"{state}\t{took:.0f}s\t{name}\t{why}\n")
    t = totals(results)
    print(f"{agent}: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped "
          f"(a full run, then the specs of {len(dirs) - 1} rerun(s))")


def failures(dirs):
    for r in sorted(merged_reports(dirs), key=spec_name):
        if r.get("State") in FAILED:
            print(f"* {spec_name(r).strip()} ({r['State']}, {r.get('RunTime', 0) / 1e9:.0f}s)\n    {reason(r)}")
            for e in events(r)[:6]:
                print(f"    event {e}")
            print()


def subset_focus():
    print("|".join(re.escape(s) for s in SUBSET))


def check_subset(dir_):
    results = load(dir_)
    bad = []
    for want in SUBSET:
        found = [(state, name) for state, name, _, _ in results if name == want and state != "skipped"]
        if len(found) != 1 or found[0][0] != "passed":
            bad.append(f"{want}: {found or 'no such spec ran'}")
    for b in bad:
        print(f"subset: FAILED {b}")
    print(f"subset: {len(SUBSET) - len(bad)} of {len(SUBSET)} specs passed")
    sys.exit(1 if bad else 0)


def main():
    args = sys.argv[1:]
    if args[:1] == ["summary"] and len(args) == 3:
        summary(args[1], args[2])
    elif args[:1] == ["compare"] and len(args) >= 3:
        compare(args[1], args[2:])
    elif args[:1] == ["failures"] and len(args) >= 2:
        failures(args[1:])
    elif args[:1] == ["merge"] and len(args) >= 3:
        merge(args[1], args[2:])
    elif args[:1] == ["check-subset"] and len(args) == 2:
        check_subset(args[1])
    elif args == ["subset-focus"]:
        subset_focus()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
