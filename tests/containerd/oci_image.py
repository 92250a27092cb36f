#!/usr/bin/env python3
"""Build a single-layer OCI image from a directory; write it as an archive, an OCI layout, or push it to a registry.

Written for node-agent (its containerd tests and its release images): no Docker daemon is involved. The one layer
is a tar of the directory (gzip-compressed with --gzip). Everything is reproducible: entries sorted, owner root,
mtime 0, gzip without timestamp or name, JSON with sorted keys, a fixed `created` time (--created, default the
epoch) — the same directory and flags give the same digests.

Outputs (any number of them):
  --out FILE.tar     an OCI image layout in a tar file, as `ctr images import` takes it
  --layout DIR       the same OCI image layout as a directory (oci-layout, index.json, blobs/sha256/...)
  --push REF         upload blobs and manifest to REF=HOST[:PORT]/REPO:TAG over the OCI distribution API
                     (blob upload POST+PUT, manifest PUT). Plain HTTP for 127.0.0.1/localhost (or --plain-http),
                     HTTPS otherwise. --auth USER:PASSWORD (or OCI_PUSH_AUTH in the environment) answers a basic
                     challenge, or gets a bearer token from the registry's token service.
The manifest digest is printed on stdout as the last line (sha256:...).

usage: oci_image.py --rootfs DIR --ref NAME:TAG [--out FILE.tar] [--layout DIR] [--push REF] [--entrypoint JSON]
                    [--cmd JSON] [--env K=V ...] [--user UID[:GID]] [--label K=V ...] [--workdir DIR]
                    [--arch amd64] [--gzip] [--created RFC3339]
"""
import argparse
import base64
import gzip
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"


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


def pairs(items, what):
    out = {}
    for item in items:
        if "=" not in item:
            sys.exit(f"oci_image.py: {what} {item!r} is not KEY=VALUE")
        k, v = item.split("=", 1)
        out[k] = v
    return out


class Image:
    """The blobs of one image: layer, config and manifest, plus the index that names it."""

    def __init__(self, args):
        diff = layer_tar(args.rootfs)
        if args.gzip:
            self.layer = gzip.compress(diff, compresslevel=9, mtime=0)
            layer_type = "application/vnd.oci.image.layer.v1.tar+gzip"
        else:
            self.layer = diff
            layer_type = "application/vnd.oci.image.layer.v1.tar"
        runtime_config = {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + args.env,
            "WorkingDir": args.workdir,
        }
        if args.entrypoint:
            runtime_config["Entrypoint"] = json.loads(args.entrypoint)
        if args.cmd:
            runtime_config["Cmd"] = json.loads(args.cmd)
        if args.user:
            runtime_config["User"] = args.user
        labels = pairs(args.label, "--label")
        if labels:
            runtime_config["Labels"] = labels
        self.config = compact({
            "architecture": args.arch,
            "os": "linux",
            "created": args.created,
            "config": runtime_config,
            "rootfs": {"type": "layers", "diff_ids": [sha256(diff)]},
            "history": [{"created": args.created, "created_by": "node-agent tests/containerd/oci_image.py"}],
        })
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": sha256(self.config), "size": len(self.config)},
            "layers": [{"mediaType": layer_type, "digest": sha256(self.layer), "size": len(self.layer)}],
        }
        if labels:
            manifest["annotations"] = labels
        self.manifest = compact(manifest)
        self.digest = sha256(self.manifest)
        tag = args.ref.rsplit(":", 1)[1] if ":" in args.ref.rsplit("/", 1)[-1] else "latest"
        self.index = compact({
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [{
                "mediaType": MANIFEST,
                "digest": self.digest,
                "size": len(self.manifest),
                "platform": {"architecture": args.arch, "os": "linux"},
                # containerd names the imported image after this annotation
                "annotations": {"io.containerd.image.name": args.ref, "org.opencontainers.image.ref.name": tag},
            }],
        })

    def blobs(self):
        return [self.layer, self.config, self.manifest]

    def layout_files(self):
        files = [("oci-layout", compact({"imageLayoutVersion": "1.0.0"})), ("index.json", self.index)]
        for blob in self.blobs():
            files.append(("blobs/sha256/" + sha256(blob)[len("sha256:"):], blob))
        return files


def write_archive(image: Image, out: str) -> None:
    with tarfile.open(out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for dirname in ("blobs", "blobs/sha256"):
            info = normalize(tarfile.TarInfo(dirname))
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for name, data in image.layout_files():
            info = normalize(tarfile.TarInfo(name))
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


def write_layout(image: Image, out: str) -> None:
    os.makedirs(os.path.join(out, "blobs", "sha256"), exist_ok=True)
    for name, data in image.layout_files():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


class Registry:
    """Just enough of the OCI distribution API to push: HEAD/POST/PUT with basic or bearer authentication."""

    def __init__(self, host: str, repo: str, plain_http: bool, auth):
        self.base = ("http" if plain_http else "https") + "://" + host
        self.repo = repo
        self.auth = auth
        self.header = None  # the Authorization header once a challenge was answered

    def request(self, method, url, data=None, headers=None, retry=True):
        req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
        if self.header:
            req.add_header("Authorization", self.header)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            body = e.read()
            if e.code == 401 and retry and self.answer(e.headers.get("WWW-Authenticate", "")):
                return self.request(method, url, data, headers, retry=False)
            if e.code == 404 and method == "HEAD":
                return 404, e.headers, b""
            detail = body.decode(errors="replace").strip()
            sys.exit(f"oci_image.py: {method} {url}: HTTP {e.code} {e.reason}: {detail}")
        except urllib.error.URLError as e:
            sys.exit(f"oci_image.py: {method} {url}: {e.reason}")

    def answer(self, challenge: str) -> bool:
        """Sets the Authorization header for a 401 challenge; False when there is nothing to answer with."""
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.auth:
                sys.exit(f"oci_image.py: {self.base} wants basic authentication: pass --auth USER:PASSWORD")
            self.header = "Basic " + base64.b64encode(self.auth.encode()).decode()
            return True
        if scheme.lower() == "bearer":
            fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
            query = {k: v for k, v in fields.items() if k in ("service", "scope")}
            query.setdefault("scope", f"repository:{self.repo}:pull,push")
            url = fields["realm"] + "?" + urllib.parse.urlencode(query)
            req = urllib.request.Request(url)
            if self.auth:
                req.add_header("Authorization", "Basic " + base64.b64encode(self.auth.encode()).decode())
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    token = json.loads(resp.read())
            except urllib.error.HTTPError as e:
                sys.exit(f"oci_image.py: token request {url}: HTTP {e.code} {e.reason}")
            self.header = "Bearer " + (token.get("token") or token.get("access_token") or "")
            return True
        return False

    def push_blob(self, blob: bytes) -> None:
        digest = sha256(blob)
        status, _, _ = self.request("HEAD", f"{self.base}/v2/{self.repo}/blobs/{digest}")
        if status == 200:
            return
        _, headers, _ = self.request("POST", f"{self.base}/v2/{self.repo}/blobs/uploads/", data=b"")
        location = urllib.parse.urljoin(self.base + "/", headers["Location"])
        sep = "&" if "?" in location else "?"
        self.request("PUT", f"{location}{sep}digest={urllib.parse.quote(digest)}", data=blob,
                     headers={"Content-Type": "application/octet-stream"})

    def push_manifest(self, manifest: bytes, tag: str) -> None:
        self.request("PUT", f"{self.base}/v2/{self.repo}/manifests/{tag}", data=manifest,
                     headers={"Content-Type": MANIFEST})


def push(image: Image, ref: str, plain_http: bool, auth) -> None:
    host, _, rest = ref.partition("/")
    if not rest or not re.search(r"[.:]|^localhost$", host):
        sys.exit(f"oci_image.py: --push {ref!r} must start with a registry host (HOST[:PORT]/REPO:TAG)")
    repo, tag = (rest.rsplit(":", 1) if ":" in rest else (rest, "latest"))
    loopback = host.split(":")[0] in ("127.0.0.1", "localhost", "[::1]")
    registry = Registry(host, repo, plain_http or loopback, auth)
    if auth:
        # answer the registry's challenge before the first upload, so no body is sent twice
        registry.request("GET", f"{registry.base}/v2/")
    for blob in (image.layer, image.config):
        registry.push_blob(blob)
    registry.push_manifest(image.manifest, tag)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rootfs", required=True)
    ap.add_argument("--ref", required=True, help="image name with tag, e.g. localhost/busybox:local")
    ap.add_argument("--out", help="write an OCI layout tar file (for ctr images import)")
    ap.add_argument("--layout", help="write an OCI layout directory")
    ap.add_argument("--push", help="push to HOST[:PORT]/REPO:TAG")
    ap.add_argument("--auth", default=os.environ.get("OCI_PUSH_AUTH"), help="USER:PASSWORD for --push")
    ap.add_argument("--plain-http", action="store_true", help="push over HTTP (default only for loopback)")
    ap.add_argument("--entrypoint", default=None, help="JSON list")
    ap.add_argument("--cmd", default=None, help="JSON list")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--user", default=None, help="UID[:GID] the container runs as")
    ap.add_argument("--label", action="append", default=[], help="KEY=VALUE, config label and manifest annotation")
    ap.add_argument("--workdir", default="/")
    ap.add_argument("--arch", default="amd64")
    ap.add_argument("--gzip", action="store_true", help="gzip the layer (no timestamp)")
    ap.add_argument("--created", default="1970-01-01T00:00:00Z")
    args = ap.parse_args()
    if not (args.out or args.layout or args.push):
        ap.error("name at least one output: --out, --layout or --push")

    image = Image(args)
    if args.out:
        write_archive(image, args.out)
    if args.layout:
        write_layout(image, args.layout)
    if args.push:
        push(image, args.push, args.plain_http, args.auth)
    targets = ", ".join(t for t in (args.out, args.layout, args.push) if t)
    print(f"{args.ref} -> {targets} (layer {len(image.layer)} bytes)", file=sys.stderr)
    print(image.digest)


if __name__ == "__main__":
    main()
