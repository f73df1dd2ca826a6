"""`make release` (deploy/release.py): the same module and arguments give the same bytes, and
every object pins the module the way its platform checks it.

  .venv/bin/python -m pytest -q deploy/test_release.py      (make validate-oci)

Needs dist/warmroute.wasm (make wasm).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
WASM = pathlib.Path(os.environ.get("WARMROUTE_WASM", ROOT / "dist" / "warmroute.wasm"))
IMAGE = "registry.example.com/ml/warmroute:1.2.3"
WASM_URL = "https://models.example.com/warmroute/1.2.3/warmroute.wasm"


def release(wasm: pathlib.Path, out: pathlib.Path, env: dict | None = None) -> str:
    r = subprocess.run([sys.executable, str(HERE / "release.py"), "--wasm", str(wasm), "--out", str(out),
                        "--image", IMAGE, "--wasm-url", WASM_URL,
                        "--istio-args", "--namespace models --service qwen --revision canary"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def tree(d: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def wasm() -> bytes:
    if not WASM.exists():
        pytest.fail(f"{WASM} is missing: run `make wasm` first")
    return WASM.read_bytes()


def test_release_twice_same_bytes(wasm, tmp_path):
    """Two releases of the same module, a second apart, from copies with other timestamps and
    modes, under another umask and time zone: the same files, byte for byte."""
    wa, wb = tmp_path / "a.wasm", tmp_path / "b.wasm"
    wa.write_bytes(wasm)
    wb.write_bytes(wasm)
    os.utime(wb, (1_000_000_000, 1_000_000_000))
    wb.chmod(0o600)
    release(wa, tmp_path / "a")
    time.sleep(1.1)
    old = os.umask(0o077)
    try:
        release(wb, tmp_path / "b", env={**os.environ, "TZ": "Asia/Tokyo", "SOURCE_DATE_EPOCH": "1700000000"})
    finally:
        os.umask(old)
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert sorted(a) == sorted(b)
    assert [name for name in a if a[name] != b[name]] == []
    for d in ("istio", "envoy-gateway"):
        assert any(name.startswith(f"{d}/") for name in a), f"no {d}/ in the release"


def test_release_pins_what_each_platform_checks(wasm, tmp_path):
    out = tmp_path / "dist"
    summary = release(WASM, out)
    files = tree(out)
    assert files["warmroute.wasm"] == wasm
    # SHA256SUMS covers the module, the image tar and every generated object, and holds.
    sums = dict(reversed(line.split("  ", 1)) for line in files["SHA256SUMS"].decode().splitlines())
    want = {n for n in files if n in ("warmroute.wasm", "warmroute-oci.tar") or n.startswith(("istio/", "envoy-gateway/"))}
    assert set(sums) == want
    assert all(hashlib.sha256(files[n]).hexdigest() == h for n, h in sums.items())
    # Istio: oci://<image>@<manifest digest>, the digest the image layout names.
    digest = subprocess.run([sys.executable, str(HERE / "oci" / "oci_artifact.py"), "digest", str(out / "oci")],
                            capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert f"image {IMAGE}@{digest}" in summary
    for name in ("envoyfilter-wasm-gateway.yaml", "envoyfilter-wasm-sidecar.yaml"):
        text = files[f"istio/{name}"].decode()
        assert f'uri: "oci://{IMAGE}@{digest}"' in text, name
        assert re.search(rf'sha256: "?{digest.removeprefix("sha256:")}"?\n', text), name
    assert "namespace: models" in files["istio/destinationrule.yaml"].decode()
    # Envoy Gateway: Envoy fetches the .wasm from the URL and checks the file's own sha256.
    policy = files["envoy-gateway/envoypatchpolicy.yaml"].decode()
    assert f"uri: {WASM_URL}" in policy or f'uri: "{WASM_URL}"' in policy
    # YAML quotes the hex only when it could read as a number: either form, as for Istio above.
    assert re.search(rf'sha256: "?{hashlib.sha256(wasm).hexdigest()}"?\n', policy)
    # Each generated file's banner holds the command that reproduces it.
    assert "--image oci://registry.example.com/ml/warmroute:1.2.3 --digest " + digest in files["istio/gateway.yaml"].decode()
    assert "--wasm-sha256 " + hashlib.sha256(wasm).hexdigest() in files["envoy-gateway/gateway.yaml"].decode()


def test_release_replaces_its_own_outputs_only(wasm, tmp_path):
    out = tmp_path / "dist"
    (out / "istio").mkdir(parents=True)
    (out / "istio" / "virtualservice-mesh.yaml").write_text("# from an earlier header-mode release\n")
    (out / "notes.txt").write_text("mine\n")
    release(WASM, out)
    assert not (out / "istio" / "virtualservice-mesh.yaml").exists()
    assert (out / "notes.txt").read_text() == "mine\n"
