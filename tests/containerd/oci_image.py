#!/usr/bin/env python3
"""Pack a directory into a single-layer OCI image archive that `ctr images import` accepts.

Written for node-agent's containerd tests: no registry and no docker are involved. The archive is an OCI image
layout (oci-layout, index.json, blobs/sha256/...) in a tar file. The one layer is an uncompressed tar of the
directory, so its digest is also its diff id. Everything is deterministic: entries sorted, owner root, mtime 0.

usage: oci_image.py --rootfs DIR --ref NAME:TAG --out FILE.tar [--entrypoint JSON] [--cmd JSON] [--env K=V ...]
"""
import argparse
import hashlib
import io
import json
import os
import tarfile


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = 0
    info.gid = 0
    info.uname = "root"
    info.gname = "root"
    info.mtime = 0
    return info


def layer_tar(rootfs: str) -> bytes:
    """A tar of everything below rootfs (not rootfs itself), symlinks kept as symlinks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for top, dirs, files in os.walk(rootfs):
            dirs.sort()
            for entry in sorted(dirs + files):
                path = os.path.join(top, entry)
                tar.add(path, arcname=os.path.relpath(path, rootfs), recursive=False, filter=normalize)
    return buf.getvalue()


def compact(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--ref", required=True, help="image name with tag, e.g. localhost/busybox:local")
    ap.add_argument("--out", required=True)
    ap.add_argument("--entrypoint", default=None, help="JSON list")
    ap.add_argument("--cmd", default=None, help="JSON list")
    ap.add_argument("--env", action="append", default=[])
    args = ap.parse_args()

    layer = layer_tar(args.rootfs)
    layer_digest = sha256(layer)

    runtime_config = {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + args.env,
        "WorkingDir": "/",
    }
    if args.entrypoint:
        runtime_config["Entrypoint"] = json.loads(args.entrypoint)
    if args.cmd:
        runtime_config["Cmd"] = json.loads(args.cmd)
    config = compact({
        "architecture": "amd64",
        "os": "linux",
        "config": runtime_config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "node-agent tests/containerd/oci_image.py"}],
    })
    manifest = compact({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha256(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": len(layer)}],
    })
    tag = args.ref.rsplit(":", 1)[1] if ":" in args.ref.rsplit("/", 1)[-1] else "latest"
    index = compact({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(manifest),
            "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            # containerd names the imported image after this annotation
            "annotations": {"io.containerd.image.name": args.ref, "org.opencontainers.image.ref.name": tag},
        }],
    })

    files = [("oci-layout", compact({"imageLayoutVersion": "1.0.0"})), ("index.json", index)]
    for blob in (layer, config, manifest):
        files.append(("blobs/sha256/" + sha256(blob)[len("sha256:"):], blob))
    with tarfile.open(args.out, mode="w", format=tarfile.GNU_FORMAT) as out:
        for dirname in ("blobs", "blobs/sha256"):
            info = normalize(tarfile.TarInfo(dirname))
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            out.addfile(info)
        for name, data in files:
            info = normalize(tarfile.TarInfo(name))
            info.size = len(data)
            info.mode = 0o644
            out.addfile(info, io.BytesIO(data))
    print(f"{args.ref} -> {args.out} (manifest {sha256(manifest)}, layer {len(layer)} bytes)")


if __name__ == "__main__":
    main()
