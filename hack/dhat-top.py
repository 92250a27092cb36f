#!/usr/bin/env python3
"""Top entries of a dhat heap profile (dhat-heap.json, as the hollow binary's `dhat-heap` feature writes it).

Prints the bytes live at the profile's end (the running fleet, when it was told to stop) grouped three ways:
by the first frame in this project's crates, by the first frame outside the allocator and std, and by
program point. Usage: hack/dhat-top.py dhat-heap.json [--nodes N] [--top K]
"""
import argparse
import collections
import json
import re
from pathlib import Path

OURS = ("node_agent::", "hollow::", "cri_fake::", "runtime_api::")
SKIP = ("alloc::", "core::", "dhat::", "std::", "<alloc::", "<core::", "<std::", "__rust", "hashbrown::raw",
        "<dhat::", "bytes::bytes_mut::BytesMut::reserve", "[root]")

# frames named without their crate (`alloc (alloc/src/alloc.rs:95)`): the allocators' and the standard library's
LIBRARY = re.compile(r"\((dhat-[0-9.]+|alloc|core|std)/src/|allocator\.rs:|\((src/)?(raw_vec|vec|boxed|alloc|slice|fmt|"
                     r"collections|convert|sync|string)[/.]")


def frame_name(f):
    # "0x55...: crate::path::fn (file.rs:10:5)" -> "crate::path::fn (file.rs:10)"
    f = re.sub(r"^0x[0-9a-f]+: ", "", f)
    f = re.sub(r"(\.rs:\d+):\d+\)", r"\1)", f)
    f = re.sub(r"/[^ ]*/(src/|benches/)", r"\1", f)
    return f


def our_sources():
    """Paths of this project's Rust sources relative to each crate (`src/pods/manager.rs`) and to crates/
    (`node-agent/src/agent.rs`): how frames name them when symbols carry no crate prefix."""
    root = Path(__file__).resolve().parent.parent / "crates"
    paths = set()
    for f in root.glob("*/**/*.rs"):
        rel = f.relative_to(root)
        paths.add(str(rel))
        paths.add(str(Path(*rel.parts[1:])))
        paths.add(str(Path(*rel.parts[2:])))
    # names every crate has say nothing about whose frame it is; the fleet's global allocator is every
    # allocation's first frame
    return {p for p in paths
            if p.count("/") >= 1 and not p.endswith(("src/lib.rs", "src/main.rs", "mod.rs", "allocator.rs"))}


def is_ours(name, sources):
    if name.startswith(OURS):
        return True
    m = re.search(r"\(([^()]+\.rs):\d+\)$", name)
    return bool(m) and m.group(1) in sources


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--nodes", type=int, default=0)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    d = json.load(open(a.file))
    ftbl = d["ftbl"]
    total = sum(pp["eb"] for pp in d["pps"])
    blocks = sum(pp["ebk"] for pp in d["pps"])
    per = f", {total / a.nodes / 1024:.1f} KiB per node" if a.nodes else ""
    print(f"live at end: {total / 1048576:.1f} MiB in {blocks} blocks{per}")
    sources = our_sources()
    by_ours = collections.Counter()
    by_first = collections.Counter()
    by_pp = []
    for pp in d["pps"]:
        if not pp["eb"]:
            continue
        names = [frame_name(ftbl[i]) for i in pp["fs"]]
        ours = next((n for n in names if is_ours(n, sources)), "(no frame of ours)")
        first = next((n for n in names if not n.startswith(SKIP) and not LIBRARY.search(n)),
                     names[0] if names else "?")
        by_ours[ours] += pp["eb"]
        by_first[first] += pp["eb"]
        by_pp.append((pp["eb"], pp["ebk"], first, ours))

    def show(title, counter):
        print(f"\n{title}")
        for name, b in counter.most_common(a.top):
            pn = f" {b / a.nodes:8.0f} B/node" if a.nodes else ""
            print(f"{b / 1024:10.0f} KiB {100 * b / total:5.1f}%{pn}  {name}")

    show("by first frame of this project", by_ours)
    show("by first frame outside alloc/core/std", by_first)
    print("\nby program point (bytes, blocks, first frame / frame of ours)")
    for eb, ebk, first, ours in sorted(by_pp, reverse=True)[: a.top]:
        print(f"{eb / 1024:10.0f} KiB {ebk:8d}  {first}\n{'':25}{ours}")


if __name__ == "__main__":
    main()
