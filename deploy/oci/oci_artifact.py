#!/usr/bin/env python3
"""Package dist/warmroute.wasm as the OCI image istio-agent pulls, without Docker.

  python3 deploy/oci/oci_artifact.py build dist/warmroute.wasm --layout dist/oci [--tar dist/warmroute-oci.tar]
      writes an OCI image layout (and optionally the same layout as one tar file) and prints the
      image's manifest digest, sha256:<hex>: the digest istio-agent compares an oci:// module with
  python3 deploy/oci/oci_artifact.py digest dist/oci
      prints the manifest digest of a layout this tool wrote, after checking every blob's digest

Push it with any OCI client, e.g.
  skopeo copy oci:dist/oci:latest docker://ghcr.io/you/warmroute:0.1.0
  skopeo copy oci-archive:dist/warmroute-oci.tar docker://ghcr.io/you/warmroute:0.1.0
and generate the Istio objects with istio/generate.py --image oci://ghcr.io/you/warmroute:0.1.0
--digest <the printed digest>.

The image is Istio's "compat" variant with OCI media types (pkg/wasm/imagefetcher.go,
extractOCIStandardImage): an OCI image manifest whose one layer, of media type
application/vnd.oci.image.layer.v1.tar+gzip, is a tar.gz holding plugin.wasm. Every Istio release
with the OCI fetcher accepts it: older ones required exactly one layer, newer ones read the last,
and this image has one. It is also what `docker build -f deploy/oci/Dockerfile.wasm` gives (in
Docker's media types), so a registry, a scanner or skopeo treats it as an ordinary image. The other variant, a
raw-Wasm layer of type application/vnd.module.wasm.content.layer.v1+wasm, is accepted by
istio-agent only with exactly two layers (extractOCIArtifactImage), a rule of Istio's alone.

istio-agent compares the sha256 of an oci:// module with the image's manifest digest (the sha256
of the manifest's bytes as the registry serves them; cache.go, PrepareFetch's actualDigest), never
with the .wasm file's own hash: pinning the file's hash makes every pull fail the check.

Reproducible: the same .wasm gives the same bytes, hence the same digest, on every run and machine
with the same zlib (tar entry with mtime 0, uid/gid 0, no user names; gzip mtime 0 and no file
name; JSON with fixed key order; the layout tar with sorted entries and fixed metadata).

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
# The file istio-agent looks for in the layer (extractWasmPluginBinary: by base name).
PLUGIN_FILE = "plugin.wasm"
WASM_MAGIC = b"\0asm"
# The tag the layout's index gives the image (org.opencontainers.image.ref.name): skopeo's
# oci:DIR:latest. The registry tag is chosen at push time.
LAYOUT_REF = "latest"


def _json(obj) -> bytes:
    # Key order is the dicts' (fixed below); no whitespace: the bytes are what gets hashed.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode()


def _descriptor(media_type: str, blob: bytes) -> dict:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}


def _tar_member(name: str, size: int, mode: int, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = mode
    info.type = kind
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def layer(wasm: bytes) -> bytes:
    """tar.gz holding only plugin.wasm, byte-identical for the same module."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(_tar_member(PLUGIN_FILE, len(wasm), 0o644), io.BytesIO(wasm))
    # gzip.compress writes no file name and the given mtime; level 9 as `gzip -9`.
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def image(wasm: bytes) -> tuple[bytes, dict[str, bytes]]:
    """(manifest bytes, every blob by hex digest) of the image carrying `wasm`."""
    if wasm[:4] != WASM_MAGIC or len(wasm) < 8:
        raise ValueError("not a WebAssembly module (istio-agent refuses a binary without the \\0asm header)")
    gz = layer(wasm)
    diff_id = "sha256:" + hashlib.sha256(gzip.decompress(gz)).hexdigest()
    # GOOS/GOARCH-style platform of a WASI module; rootfs.diff_ids lets image tools that unpack
    # layers (skopeo, containerd) check the layer.
    config = _json({
        "architecture": "wasm",
        "os": "wasip1",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    })
    manifest = _json({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": _descriptor(CONFIG_TYPE, config),
        "layers": [_descriptor(LAYER_TYPE, gz)],
        "annotations": {
            "org.opencontainers.image.title": "warmroute",
            "org.opencontainers.image.description": "warmroute proxy-wasm filter: /plugin.wasm (Istio compat variant)",
        },
    })
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (gz, config, manifest)}
    return manifest, blobs


def layout_files(wasm: bytes) -> tuple[str, dict[str, bytes]]:
    """(manifest digest, {relative path: bytes}) of the OCI image layout."""
    manifest, blobs = image(wasm)
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    desc = _descriptor(MANIFEST_TYPE, manifest)
    desc["annotations"] = {"org.opencontainers.image.ref.name": LAYOUT_REF}
    files = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": _json({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [desc]}),
    }
    for hexd, blob in blobs.items():
        files[f"blobs/sha256/{hexd}"] = blob
    return digest, files


def write_layout(files: dict[str, bytes], out: str) -> None:
    if os.path.isdir(out):
        # Only a layout this tool wrote is replaced; anything else there is refused.
        stray = [f for f in os.listdir(out) if f not in ("oci-layout", "index.json", "blobs")]
        if stray:
            raise SystemExit(f"oci_artifact: {out} holds {stray[:3]}: not an OCI layout, not replacing it")
        for root, dirs, names in os.walk(out, topdown=False):
            for n in names:
                os.remove(os.path.join(root, n))
            for d in dirs:
                os.rmdir(os.path.join(root, d))
    for rel, data in sorted(files.items()):
        path = os.path.join(out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def layout_tar(files: dict[str, bytes]) -> bytes:
    """The layout as one tar (skopeo's oci-archive:), sorted entries, fixed metadata."""
    dirs = sorted({os.path.dirname(p) for p in files if os.path.dirname(p)} | {"blobs"})
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for d in dirs:
            tar.addfile(_tar_member(d + "/", 0, 0o755, tarfile.DIRTYPE))
        for rel in sorted(files):
            tar.addfile(_tar_member(rel, len(files[rel]), 0o644), io.BytesIO(files[rel]))
    return raw.getvalue()


def read_layout(path: str) -> str:
    """Manifest digest of the layout's one image, after checking every blob against its name."""
    with open(os.path.join(path, "index.json"), "rb") as f:
        index = json.load(f)
    manifests = index.get("manifests", [])
    if len(manifests) != 1 or manifests[0].get("mediaType") != MANIFEST_TYPE:
        raise SystemExit(f"oci_artifact: {path}/index.json must name exactly one {MANIFEST_TYPE}")
    blobdir = os.path.join(path, "blobs", "sha256")
    for name in sorted(os.listdir(blobdir)):
        with open(os.path.join(blobdir, name), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != name:
                raise SystemExit(f"oci_artifact: blob {name} does not hash to its name")
    digest = manifests[0]["digest"]
    if not os.path.exists(os.path.join(blobdir, digest.removeprefix("sha256:"))):
        raise SystemExit(f"oci_artifact: index.json names {digest}, which is not in blobs/")
    return digest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the OCI layout for a .wasm and print its manifest digest")
    b.add_argument("wasm", help="the module, e.g. dist/warmroute.wasm")
    b.add_argument("--layout", required=True, help="OCI image layout directory to (re)write, e.g. dist/oci")
    b.add_argument("--tar", help="also write the layout as one tar (skopeo oci-archive:), e.g. dist/warmroute-oci.tar")
    d = sub.add_parser("digest", help="print the manifest digest of a layout")
    d.add_argument("layout")
    args = p.parse_args(argv)

    if args.cmd == "digest":
        print(read_layout(args.layout))
        return 0
    with open(args.wasm, "rb") as f:
        wasm = f.read()
    try:
        digest, files = layout_files(wasm)
    except ValueError as e:
        p.error(f"{args.wasm}: {e}")
    write_layout(files, args.layout)
    if args.tar:
        with open(args.tar, "wb") as f:
            f.write(layout_tar(files))
    print(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
