#!/usr/bin/env python3
"""Lets a fresh checkout reuse the compiled crates of the last successful CI build at the same path.

Cargo decides whether a workspace crate is up to date by file times: a source newer than the crate's last
compile means compiling it again. A fresh clone gives every file the clone's time, so without help every
workspace crate compiles again on every run, even when only a test changed. This script keeps, per checkout
path, the git blob id of every tracked file as the last successful build saw it:

  restore   before the build: every tracked file whose content is what that build compiled gets a time long
            past, so cargo finds its compiled crate fresh; a changed file keeps the clone's time and is compiled
            again with everything that depends on it. The record is removed first, so a build that stops
            half-way leaves none and the next run compiles everything.
  record    after a successful build: writes the record for this checkout.

Compiled crates are tied to their checkout's path (cargo hashes it into them), hence one record per path. Only
.ci/run may build in a checkout that uses this; a checkout with local changes is left alone.

Usage: source-times.py restore|record   (NODE_AGENT_CACHE: where the records are kept)
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

# 2001-09-09: older than any compile the record can stand for
LONG_AGO = 1_000_000_000


def tracked(root):
    """{path: blob id} of the checkout's tracked files, or None when it has local changes or is no git
    checkout."""
    try:
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
        if status.strip():
            return None
        out = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=root, stdout=subprocess.PIPE, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = {}
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        mode, blob, _stage = meta.split()
        if mode != "160000":
            files[path] = blob
    return files


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("restore", "record"):
        sys.exit(__doc__.strip().splitlines()[-1])
    root = Path(__file__).resolve().parent.parent
    cache = Path(os.environ.get("NODE_AGENT_CACHE", Path.home() / ".cache/node-agent"))
    records = cache / "source-records"
    record = records / (hashlib.sha256(str(root).encode()).hexdigest()[:16] + ".json")
    files = tracked(root)
    if files is None:
        print(f"source-times: {root} has local changes or is no git checkout; file times left as they are")
        return
    if sys.argv[1] == "record":
        records.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"root": str(root), "files": files}))
        tmp.replace(record)
        print(f"source-times: recorded {len(files)} files for {root}")
        return
    try:
        seen = json.loads(record.read_text())
    except (OSError, ValueError):
        print(f"source-times: no record of an earlier build at {root}; everything compiles")
        return
    record.unlink()
    if seen.get("root") != str(root):
        print(f"source-times: the record names {seen.get('root')}, not {root}; everything compiles")
        return
    before = seen.get("files", {})
    same = [p for p, blob in files.items() if before.get(p) == blob]
    for path in same:
        os.utime(root / path, (LONG_AGO, LONG_AGO), follow_symlinks=False)
    print(f"source-times: {len(same)} of {len(files)} files as the last build at {root} saw them; "
          f"{len(files) - len(same)} changed")


if __name__ == "__main__":
    main()
