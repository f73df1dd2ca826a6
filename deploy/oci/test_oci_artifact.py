"""The OCI artifact istio-agent pulls: reproducible, accepted by a real registry, and loadable
under Istio's own fetch rules with the digest the generated manifests pin.

  .venv/bin/python -m pytest -q deploy/oci/test_oci_artifact.py      (make validate-oci)

Needs dist/warmroute.wasm (make wasm) and, for the registry round trip, the Debian packages
docker-registry (the reference distribution server) and skopeo: installed with apt-get when
missing (as root; the time it takes is printed). The registry listens on 127.0.0.1 only, on a
free port, with its storage in a temporary directory, and is stopped at the end.

istio_fetch() below is Istio's pull of an oci:// module ported to Python, from istio/istio at
86c9f01 (2026-08): pkg/wasm/convert.go rewriteVMConfig, cache.go getOrFetch/getEntry,
imagefetcher.go PrepareFetch and the three extract*Image functions, with the checks
go-containerregistry makes on the way (remote/fetcher.go: the manifest's digest against the
reference or Docker-Content-Digest; a layer blob against its descriptor's digest).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import oci_artifact  # noqa: E402

WASM = pathlib.Path(os.environ.get("WARMROUTE_WASM", ROOT / "dist" / "warmroute.wasm"))

# go-containerregistry's media types (pkg/v1/types) that imagefetcher.go compares with.
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
WASM_LAYER = "application/vnd.module.wasm.content.layer.v1+wasm"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
# remote.Get's Accept header (go-containerregistry remote/descriptor.go defaultPlatform path).
ACCEPT = ", ".join([DOCKER_MANIFEST, "application/vnd.oci.image.manifest.v1+json", DOCKER_LIST, OCI_INDEX])


class FetchError(Exception):
    pass


class DigestMismatch(FetchError):
    pass


def _get(url: str, accept: str | None = None) -> tuple[bytes, dict]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        raise FetchError(f"GET {url}: HTTP {e.code} {e.read()[:200]!r}") from None


def parse_reference(ref: str) -> tuple[str, str, str, bool]:
    """(registry, repository, tag or digest, by_digest): go-containerregistry name.ParseReference."""
    base, at, digest = ref.partition("@")
    if at and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise FetchError(f"could not parse url in image reference: bad digest {digest!r}")
    tag = "latest"
    head, _, last = base.rpartition("/")
    if head and ":" in last:  # a tag (NewDigest drops one before the digest)
        last, tag = last.split(":", 1)
        base = f"{head}/{last}"
    registry, _, repo = base.partition("/")
    if not repo:
        raise FetchError(f"could not parse url in image reference: {ref!r}")
    return registry, repo, digest if at else tag, bool(at)


def istio_fetch(url: str, sha256: str) -> bytes:
    """What istio-agent does with an EnvoyFilter's vm_config.code.remote {http_uri.uri, sha256}."""
    # convert.go rewriteVMConfig: "nil" is istiod's placeholder for no checksum.
    checksum = "" if sha256 == "nil" else sha256
    u = urllib.parse.urlparse(url)
    if u.scheme != "oci":
        raise FetchError(f"unsupported Wasm module downloading URL scheme: {u.scheme}")
    ref = u.netloc + u.path
    # cache.go getEntry: with no checksum, a digest in the URL is the checksum.
    if not checksum and "@sha256:" in ref:
        checksum = ref.rsplit("@sha256:", 1)[1]
    registry, repo, ident, by_digest = parse_reference(ref)
    # go-containerregistry talks plain HTTP to a loopback registry (name.Registry.Scheme).
    base = f"http://{registry}/v2/{repo}"

    # PrepareFetch: remote.Get, then desc.Image(); the digest is the manifest's.
    manifest_bytes, headers = _get(f"{base}/manifests/{ident}", ACCEPT)
    digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    if by_digest and digest != ident:
        raise FetchError(f"manifest digest: {digest!r} does not match requested digest: {ident!r}")
    if not by_digest and headers.get("docker-content-digest", digest) != digest:
        raise FetchError(f"manifest digest: {digest!r} does not match Docker-Content-Digest")
    manifest = json.loads(manifest_bytes)
    media_type = manifest.get("mediaType") or headers.get("content-type", "")
    if media_type in (OCI_INDEX, DOCKER_LIST):
        # desc.Image() would pick the linux/amd64 child, whose digest is then the one compared.
        raise FetchError("an index: the digest istio-agent checks would be its linux/amd64 child's")
    actual = digest.removeprefix("sha256:")

    # cache.go getOrFetch: the checksum must be the manifest digest.
    if checksum and actual != checksum:
        raise DigestMismatch(f"module downloaded from {url} has checksum {actual}, which does not match: {checksum}")

    def blob(desc: dict) -> bytes:
        data, _ = _get(f"{base}/blobs/{desc['digest']}")
        if "sha256:" + hashlib.sha256(data).hexdigest() != desc["digest"]:
            raise FetchError(f"layer {desc['digest']}: content does not match its digest")
        return data

    layers = manifest.get("layers") or []

    def compat(want_type: str) -> bytes:  # extractDockerImage / extractOCIStandardImage
        if not layers:
            raise FetchError("number of layers must be greater than zero")
        last = layers[-1]
        if last.get("mediaType") != want_type:
            raise FetchError(f"invalid media type {last.get('mediaType')} (expect {want_type})")
        return extract_plugin(blob(last))

    def artifact() -> bytes:  # extractOCIArtifactImage
        if len(layers) != 2:
            raise FetchError(f"number of layers must be 2 but got {len(layers)}")
        for layer in layers:
            if layer.get("mediaType") == WASM_LAYER:
                return blob(layer)
        raise FetchError(f"could not find the layer of type {WASM_LAYER}")

    if media_type == DOCKER_MANIFEST:
        wasm = compat(DOCKER_LAYER)
    else:
        errors = []
        for attempt in (lambda: compat(OCI_LAYER), artifact):
            try:
                wasm = attempt()
                break
            except FetchError as e:
                errors.append(str(e))
        else:
            raise FetchError(f"the given image is in invalid format as an OCI image: {errors}")
    # cache.go isValidWasmBinary
    if len(wasm) < 8 or wasm[:4] != b"\0asm":
        raise FetchError(f"fetched Wasm binary from {url} is invalid")
    return wasm


def extract_plugin(gz: bytes) -> bytes:
    """extractWasmPluginBinary: the first tar entry whose base name is plugin.wasm."""
    try:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(gz)), mode="r:") as tar:
            for member in tar:
                if os.path.basename(member.name) == "plugin.wasm":
                    return tar.extractfile(member).read()
    except (OSError, tarfile.TarError, EOFError) as e:
        raise FetchError(f"failed to parse layer as tar.gz: {e}") from None
    raise FetchError("plugin.wasm not found in the archive")


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def wasm() -> bytes:
    if not WASM.exists():
        pytest.fail(f"{WASM} is missing: run `make wasm` first")
    return WASM.read_bytes()


def module_copy(tmp: pathlib.Path, wasm: bytes) -> pathlib.Path:
    """The module the test compares with, as a file: dist/ may be rebuilt meanwhile."""
    path = tmp / "warmroute.wasm"
    path.write_bytes(wasm)
    return path


def build(wasm_path: pathlib.Path, out: pathlib.Path, env: dict | None = None) -> str:
    """The CLI, as make release runs it: the printed digest."""
    r = subprocess.run([sys.executable, str(HERE / "oci_artifact.py"), "build", str(wasm_path),
                        "--layout", str(out / "oci"), "--tar", str(out / "warmroute-oci.tar")],
                       capture_output=True, text=True, env=env, check=True, timeout=120)
    return r.stdout.strip()


def ensure_packages() -> None:
    missing = [p for p, binary in (("docker-registry", "docker-registry"), ("skopeo", "skopeo"))
               if not shutil.which(binary)]
    if not missing:
        return
    if os.geteuid() != 0:
        pytest.fail(f"missing {missing}: apt-get install -y --no-install-recommends {' '.join(missing)} (as root)")
    # The package's service must not start: it would listen on :5000 on every interface.
    # policy-rc.d is Debian's switch for that; one already there (as in containers) is kept.
    guard = pathlib.Path("/usr/sbin/policy-rc.d")
    added = not guard.exists()
    if added:
        guard.write_text("#!/bin/sh\nexit 101\n")
        guard.chmod(0o755)
    try:
        t0 = time.monotonic()
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                       check=True, env=env, capture_output=True, timeout=600)
        print(f"\ninstalled {' '.join(missing)} with apt-get in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    finally:
        if added:
            guard.unlink()
    # The package enables its service for the next boot too: disable it (systemd and sysvinit).
    if "docker-registry" in missing:
        for cmd in (["systemctl", "disable", "docker-registry.service"], ["update-rc.d", "docker-registry", "disable"]):
            if shutil.which(cmd[0]):
                subprocess.run(cmd, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """The reference distribution server on 127.0.0.1:<free port>; yields host:port."""
    ensure_packages()
    d = tmp_path_factory.mktemp("registry")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (d / "config.yml").write_text(
        "version: 0.1\n"
        "log:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {d / 'store'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: warmroute-test\n"
    )
    log = open(d / "registry.log", "wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(d / "config.yml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                _get(f"http://127.0.0.1:{port}/v2/")
                break
            except (OSError, FetchError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"registry did not start: {(d / 'registry.log').read_text()[-2000:]}")
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def push(layout: pathlib.Path, registry: str, repo_tag: str) -> None:
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                    f"oci:{layout}:latest", f"docker://{registry}/{repo_tag}"],
                   check=True, capture_output=True, text=True, timeout=120)


def push_http(layout: pathlib.Path, registry: str, repo: str, tag: str) -> None:
    """Blobs and manifest as they are, by the distribution API (skopeo would compress an
    uncompressed layer on the way, and the rules would never see it)."""
    index = json.loads((layout / "index.json").read_bytes())
    desc = index["manifests"][0]
    manifest = (layout / "blobs/sha256" / desc["digest"][7:]).read_bytes()
    m = json.loads(manifest)
    for d in [m["config"], *m["layers"]]:
        data = (layout / "blobs/sha256" / d["digest"][7:]).read_bytes()
        req = urllib.request.Request(f"http://{registry}/v2/{repo}/blobs/uploads/", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            loc = urllib.parse.urljoin(f"http://{registry}/", r.headers["Location"])
        sep = "&" if "?" in loc else "?"
        req = urllib.request.Request(f"{loc}{sep}digest={d['digest']}", method="PUT", data=data,
                                     headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(req, timeout=10).close()
    req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{tag}", method="PUT", data=manifest,
                                 headers={"Content-Type": desc["mediaType"]})
    urllib.request.urlopen(req, timeout=10).close()


def generate(tmp: pathlib.Path, image: str, digest: str) -> dict:
    """istio/generate.py's module pin: {file: (uri, sha256)} of the Wasm EnvoyFilters it writes."""
    out = tmp / "generated"
    subprocess.run([sys.executable, str(ROOT / "istio" / "generate.py"), "--namespace", "llm",
                    "--image", image, "--digest", digest, "--out", str(out)], check=True, capture_output=True, timeout=120)
    pins = {}
    for name in ("envoyfilter-wasm-gateway.yaml", "envoyfilter-wasm-sidecar.yaml"):
        text = (out / name).read_text()
        uri = re.findall(r'^ +uri: "?(oci://[^"\n]+)"?$', text, re.M)
        sha = re.findall(r'^ +sha256: "?([0-9a-f]{64})"?$', text, re.M)
        assert len(uri) == 1 and len(sha) == 1, f"{name}: {uri} {sha}"
        pins[name] = (uri[0], sha[0])
    return pins


# --------------------------------------------------------------------------- tests
def test_same_module_same_bytes(wasm, tmp_path):
    """Two builds from the same module, a second apart, from copies with other timestamps,
    modes and umask: byte-identical layouts and tars, one digest."""
    a, b = tmp_path / "a", tmp_path / "b"
    wa, wb = tmp_path / "a.wasm", tmp_path / "b.wasm"
    wa.write_bytes(wasm)
    wb.write_bytes(wasm)
    os.utime(wb, (1_000_000_000, 1_000_000_000))
    wb.chmod(0o600)
    da = build(wa, a)
    time.sleep(1.1)
    old = os.umask(0o077)
    try:
        db = build(wb, b, env={**os.environ, "TZ": "Asia/Tokyo", "SOURCE_DATE_EPOCH": "1700000000"})
    finally:
        os.umask(old)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", da)
    assert da == db
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    # The digest printed is the one the layout names, and every blob hashes to its name.
    assert subprocess.run([sys.executable, str(HERE / "oci_artifact.py"), "digest", str(a / "oci")],
                          capture_output=True, text=True, check=True, timeout=120).stdout.strip() == da
    # What makes it so: no timestamp, owner or file name in the layer.
    manifest = json.loads((a / "oci/blobs/sha256" / da.removeprefix("sha256:")).read_bytes())
    gz = (a / "oci/blobs/sha256" / manifest["layers"][0]["digest"].removeprefix("sha256:")).read_bytes()
    assert gz[3] & 0x08 == 0 and gz[4:8] == b"\0\0\0\0", "gzip header carries a file name or an mtime"
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(gz))) as tar:
        members = tar.getmembers()
    assert [(m.name, m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members] == \
        [("plugin.wasm", 0, 0, 0, "", "", 0o644)]
    with tarfile.open(a / "warmroute-oci.tar") as tar:
        names = tar.getnames()
        assert names == sorted(names) and {m.mtime for m in tar.getmembers()} == {0}


def test_other_module_other_digest(wasm, tmp_path):
    changed = bytearray(wasm)
    changed[-1] ^= 1
    (tmp_path / "x.wasm").write_bytes(bytes(changed))
    (tmp_path / "y.wasm").write_bytes(wasm)
    assert build(tmp_path / "x.wasm", tmp_path / "x") != build(tmp_path / "y.wasm", tmp_path / "y")


def test_not_wasm_refused(tmp_path):
    (tmp_path / "plugin.wasm").write_bytes(b"#!/bin/sh\necho not wasm\n")
    r = subprocess.run([sys.executable, str(HERE / "oci_artifact.py"), "build", str(tmp_path / "plugin.wasm"),
                        "--layout", str(tmp_path / "oci")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "not a WebAssembly module" in r.stderr


def test_dockerfile_builds_the_layout_istio_reads():
    """Dockerfile.wasm, the Docker route to an image: nothing but the module, at /plugin.wasm,
    the file extract_plugin() takes from a Docker-format image's single layer."""
    lines = [line.split() for line in (HERE / "Dockerfile.wasm").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert lines == [["FROM", "scratch"], ["COPY", "dist/warmroute.wasm", "./plugin.wasm"]], lines


def test_istio_pulls_the_module_the_manifests_pin(wasm, registry, tmp_path):
    """Push, generate, pull as istio-agent does: the module comes back byte for byte."""
    digest = build(module_copy(tmp_path, wasm), tmp_path)
    # One layer: what every Istio release's compat-variant rule accepts (older ones required
    # exactly one, newer ones read the last).
    manifest = json.loads((tmp_path / "oci/blobs/sha256" / digest.removeprefix("sha256:")).read_bytes())
    assert [layer["mediaType"] for layer in manifest["layers"]] == [OCI_LAYER]
    push(tmp_path / "oci", registry, "warmroute/filter:0.1.0")
    # The registry serves the manifest bytes we hashed.
    _, headers = _get(f"http://{registry}/v2/warmroute/filter/manifests/0.1.0", ACCEPT)
    assert headers["docker-content-digest"] == digest

    pins = generate(tmp_path, f"oci://{registry}/warmroute/filter:0.1.0", digest)
    for name, (uri, sha) in pins.items():
        assert uri == f"oci://{registry}/warmroute/filter:0.1.0@{digest}", name
        assert sha == digest.removeprefix("sha256:"), name
        assert istio_fetch(uri, sha) == wasm, name
    # The tar form pushes to the same digest.
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                    f"oci-archive:{tmp_path / 'warmroute-oci.tar'}", f"docker://{registry}/warmroute/filter:tar"],
                   check=True, capture_output=True, timeout=120)
    assert _get(f"http://{registry}/v2/warmroute/filter/manifests/tar", ACCEPT)[1]["docker-content-digest"] == digest


def test_istio_refuses_other_digests(wasm, registry, tmp_path):
    digest = build(module_copy(tmp_path, wasm), tmp_path).removeprefix("sha256:")
    push(tmp_path / "oci", registry, "warmroute/refuse:0.1.0")
    tagged = f"oci://{registry}/warmroute/refuse:0.1.0"
    assert istio_fetch(tagged, digest) == wasm
    # The old generator's pin, the .wasm file's own sha256: never the manifest's.
    with pytest.raises(DigestMismatch):
        istio_fetch(tagged, hashlib.sha256(wasm).hexdigest())
    # One digit off, by tag and by digest.
    wrong = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    with pytest.raises(DigestMismatch):
        istio_fetch(tagged, wrong)
    with pytest.raises(DigestMismatch):
        istio_fetch(f"{tagged}@sha256:{digest}", wrong)
    # A uri pinned to a manifest the registry does not have.
    with pytest.raises(FetchError, match="HTTP 404"):
        istio_fetch(f"{tagged}@sha256:{wrong}", wrong)
    # The tag moved to another module: the pinned digest refuses it.
    other = bytearray(wasm)
    other[-1] ^= 1
    (tmp_path / "other.wasm").write_bytes(bytes(other))
    build(tmp_path / "other.wasm", tmp_path / "other")
    push(tmp_path / "other" / "oci", registry, "warmroute/refuse:0.1.0")
    with pytest.raises(DigestMismatch):
        istio_fetch(tagged, digest)
    assert istio_fetch(f"{tagged}@sha256:{digest}", digest) == wasm


def _variant(tmp: pathlib.Path, wasm: bytes, layer_type: str, layer_blob: bytes) -> pathlib.Path:
    """A layout like ours but for its one layer, written for the fetch rules to judge."""
    _, files = oci_artifact.layout_files(wasm)
    index = json.loads(files["index.json"])
    old = json.loads(files[f"blobs/sha256/{index['manifests'][0]['digest'][7:]}"])
    manifest = dict(old, layers=[{"mediaType": layer_type, "digest": "sha256:" + hashlib.sha256(layer_blob).hexdigest(),
                                  "size": len(layer_blob)}])
    config = json.loads(files[f"blobs/sha256/{old['config']['digest'][7:]}"])
    config["rootfs"]["diff_ids"] = ["sha256:" + hashlib.sha256(layer_blob).hexdigest()]
    config_bytes = json.dumps(config).encode()
    manifest["config"] = {**old["config"], "digest": "sha256:" + hashlib.sha256(config_bytes).hexdigest(),
                          "size": len(config_bytes)}
    manifest_bytes = json.dumps(manifest).encode()
    index["manifests"][0].update(digest="sha256:" + hashlib.sha256(manifest_bytes).hexdigest(), size=len(manifest_bytes))
    out = tmp / "variant"
    oci_artifact.write_layout({"oci-layout": files["oci-layout"], "index.json": json.dumps(index).encode(),
                               **{f"blobs/sha256/{hashlib.sha256(b).hexdigest()}": b
                                  for b in (layer_blob, config_bytes, manifest_bytes)}}, str(out))
    return out


@pytest.mark.parametrize("case", ["uncompressed tar layer", "tar.gz without plugin.wasm", "raw wasm as the only layer"])
def test_layer_rules_refuse_other_layouts(wasm, registry, tmp_path, case):
    """The ported rules are not lax: layouts Istio refuses are refused here too."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("plugin.wasm" if case == "uncompressed tar layer" else "filter.wasm")
        info.size = len(wasm)
        tar.addfile(info, io.BytesIO(wasm))
    layer_type, blob = {
        "uncompressed tar layer": ("application/vnd.oci.image.layer.v1.tar", raw.getvalue()),
        "tar.gz without plugin.wasm": (OCI_LAYER, gzip.compress(raw.getvalue(), mtime=0)),
        "raw wasm as the only layer": (WASM_LAYER, wasm),
    }[case]
    layout = _variant(tmp_path, wasm, layer_type, blob)
    repo = "warmroute/variant-" + re.sub(r"[^a-z]+", "-", case).strip("-")
    push_http(layout, registry, repo, "1")
    served = json.loads(_get(f"http://{registry}/v2/{repo}/manifests/1", ACCEPT)[0])
    assert [layer["mediaType"] for layer in served["layers"]] == [layer_type]
    with pytest.raises(FetchError, match="invalid format as an OCI image"):
        istio_fetch(f"oci://{registry}/{repo}:1", "")
