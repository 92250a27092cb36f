#!/usr/bin/env python3
"""What each kind of node asks of the API server, from the API server's own audit log.

usage: traffic-report.py AUDIT_LOG START END NAME=USER_PREFIX:NODES [NAME=USER_PREFIX:NODES ...]

AUDIT_LOG is the kube-apiserver's JSON audit log (a Metadata-level policy that omits the RequestReceived stage).
START and END (RFC 3339) bound the window: a request counts when the API server received it inside the window.
Each NAME=USER_PREFIX:NODES is one column: the requests of every user whose name starts with USER_PREFIX (e.g.
`system:node:traffic-hollow-`), divided by NODES and by the window's minutes. Prints a Markdown table: one row per
verb x resource[/subresource] (requests per node-minute; a watch counts when it opened in the window), then the
watches each column held at END, per node and resource.
"""

import json
import sys
from collections import defaultdict
from datetime import datetime


def parse_time(text):
    # the API server writes microseconds and a Z; Python < 3.11 wants +00:00
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def resource_of(event):
    ref = event.get("objectRef") or {}
    resource = ref.get("resource") or event.get("requestURI", "?").split("?")[0]
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return resource


def main(argv):
    if len(argv) < 5:
        sys.exit(__doc__)
    log_path, start, end = argv[1], parse_time(argv[2]), parse_time(argv[3])
    columns = []
    for spec in argv[4:]:
        name, _, rest = spec.partition("=")
        prefix, _, nodes = rest.rpartition(":")
        if not name or not prefix or not nodes.isdigit() or int(nodes) == 0:
            sys.exit(f"traffic-report: {spec!r} is not NAME=USER_PREFIX:NODES")
        columns.append((name, prefix, int(nodes)))
    minutes = (end - start).total_seconds() / 60.0
    if minutes <= 0:
        sys.exit("traffic-report: END is not after START")

    counts = defaultdict(lambda: defaultdict(int))  # (verb, resource) -> column -> requests in the window
    watches = {}  # auditID -> (column, resource, started, completed)
    lines = 0
    with open(log_path, errors="replace") as log:
        for line in log:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            lines += 1
            user = (event.get("user") or {}).get("username", "")
            column = next((c[0] for c in columns if user.startswith(c[1])), None)
            if column is None:
                continue
            verb, stage = event.get("verb", "?"), event.get("stage")
            received = parse_time(event["requestReceivedTimestamp"])
            resource = resource_of(event)
            if verb == "watch":
                audit_id = event.get("auditID")
                col, res, started, completed = watches.get(audit_id, (column, resource, None, None))
                if stage == "ResponseStarted":
                    started = received
                elif stage == "ResponseComplete":
                    completed = parse_time(event["stageTimestamp"])
                    started = started or received
                watches[audit_id] = (col, res, started, completed)
                continue
            if stage != "ResponseComplete" or not start <= received <= end:
                continue
            counts[(verb, resource)][column] += 1
    if lines == 0:
        sys.exit(f"traffic-report: no audit events in {log_path}")

    held = defaultdict(lambda: defaultdict(int))
    for column, resource, started, completed in watches.values():
        if started is None:
            continue
        if start <= started <= end:
            counts[("watch", resource)][column] += 1
        if started <= end and (completed is None or completed > end):
            held[resource][column] += 1

    names = [c[0] for c in columns]
    nodes = {c[0]: c[2] for c in columns}
    print(f"Window: {start.isoformat()} to {end.isoformat()} ({minutes:.1f} min); nodes: "
          + ", ".join(f"{n} {nodes[n]}" for n in names))
    print()
    print("| requests per node-minute | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    totals = defaultdict(float)
    for verb, resource in sorted(counts, key=lambda k: (k[1], k[0])):
        row = []
        for n in names:
            rate = counts[(verb, resource)].get(n, 0) / nodes[n] / minutes
            totals[n] += rate
            row.append(f"{rate:.2f}" if rate else "–")
        print(f"| {verb} {resource} | " + " | ".join(row) + " |")
    print("| **all** | " + " | ".join(f"**{totals[n]:.2f}**" for n in names) + " |")
    print()
    print("| watches held per node at the window's end | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for resource in sorted(held):
        row = [f"{held[resource].get(n, 0) / nodes[n]:.2f}" if held[resource].get(n) else "–" for n in names]
        print(f"| {resource} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv)
