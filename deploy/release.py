#!/usr/bin/env python3
"""The release (make release): the module, its OCI image for Istio, the Istio objects pinned to
the image's manifest digest, the Envoy Gateway objects pinned to the module's sha256, and
SHA256SUMS over them. The same module and arguments give the same bytes (deploy/test_release.py
builds it twice and compares).

  python3 deploy/release.py --wasm dist/warmroute.wasm --out dist \\
      --image ghcr.io/you/warmroute:0.1.0 \\
      --wasm-url https://models.example.com/warmroute/0.1.0/warmroute.wasm \\
      [--istio-args "--namespace llm --service vllm"] [--eg-args "--namespace llm --service vllm"]

Writes into --out: warmroute.wasm, oci/ and warmroute-oci.tar (deploy/oci/oci_artifact.py),
istio/ (istio/generate.py --image oci://<image> --digest <manifest digest>), envoy-gateway/
(deploy/envoy-gateway/generate.py --wasm-url <url> --wasm-sha256 <the module's sha256>: Envoy
Gateway's Envoy fetches the .wasm itself, so it checks the file's hash, not an image's), and
SHA256SUMS. Earlier release outputs there are replaced; nothing else in --out is touched.

Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "oci"))
import oci_artifact  # noqa: E402

ISTIO_APPLY = ("gateway.yaml", "httproute.yaml", "destinationrule.yaml", "virtualservice.yaml",
               "envoyfilter-routing-gateway.yaml", "envoyfilter-wasm-gateway.yaml", "stats-tags-gateway.yaml", "peers.yaml")
EG_APPLY = ("gatewayclass.yaml", "envoyproxy.yaml", "gateway.yaml", "httproute.yaml", "envoypatchpolicy.yaml", "peers.yaml")
# With --peer-port, beside the objects: a NetworkPolicy for clusters that enforce them, to apply
# only where no other policy selects the gateway's pods (docs/deploy: several gateway replicas).
OPTIONAL = ("networkpolicy-peers.yaml",)


def generate(script: str, args: list[str], out: str) -> None:
    # The generators' own report goes to stderr: stdout is the release's summary.
    r = subprocess.run([sys.executable, os.path.join(ROOT, script), *args, "--out", out],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(r.stdout + r.stderr)
    if r.returncode:
        raise SystemExit(f"release: {script} failed")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wasm", default=os.path.join(ROOT, "dist", "warmroute.wasm"))
    p.add_argument("--out", default=os.path.join(ROOT, "dist"))
    p.add_argument("--image", required=True, help="<registry>/<repository>:<tag> the OCI image is pushed to")
    p.add_argument("--wasm-url", required=True, help="http(s) URL the .wasm is served from, for Envoy Gateway")
    p.add_argument("--istio-args", default="--namespace llm --service vllm", help="more istio/generate.py arguments")
    p.add_argument("--eg-args", default="--namespace llm --service vllm", help="more deploy/envoy-gateway/generate.py arguments")
    args = p.parse_args(argv)

    with open(args.wasm, "rb") as f:
        wasm = f.read()
    try:
        digest, files = oci_artifact.layout_files(wasm)
    except ValueError as e:
        p.error(f"{args.wasm}: {e}")
    out = args.out
    os.makedirs(out, exist_ok=True)
    for d in ("oci", "istio", "envoy-gateway"):
        shutil.rmtree(os.path.join(out, d), ignore_errors=True)
    for f in ("warmroute-oci.tar", "SHA256SUMS"):
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    module = os.path.join(out, "warmroute.wasm")
    if not (os.path.exists(module) and os.path.samefile(module, args.wasm)):
        with open(module, "wb") as f:
            f.write(wasm)
    oci_artifact.write_layout(files, os.path.join(out, "oci"))
    with open(os.path.join(out, "warmroute-oci.tar"), "wb") as f:
        f.write(oci_artifact.layout_tar(files))
    generate("istio/generate.py", [*shlex.split(args.istio_args), "--image", f"oci://{args.image}", "--digest", digest],
             os.path.join(out, "istio"))
    generate("deploy/envoy-gateway/generate.py",
             [*shlex.split(args.eg_args), "--wasm-url", args.wasm_url, "--wasm-sha256", hashlib.sha256(wasm).hexdigest()],
             os.path.join(out, "envoy-gateway"))

    summed = ["warmroute.wasm", "warmroute-oci.tar"] + sorted(
        f"{d}/{name}" for d in ("istio", "envoy-gateway") for name in os.listdir(os.path.join(out, d)))
    lines = []
    for rel in summed:
        with open(os.path.join(out, rel), "rb") as f:
            lines.append(f"{hashlib.sha256(f.read()).hexdigest()}  {rel}\n")
    with open(os.path.join(out, "SHA256SUMS"), "w", encoding="utf-8", newline="\n") as f:
        f.writelines(lines)

    shown = os.path.relpath(out)

    def apply(d: str, names) -> str:
        return " ".join(f"-f {shown}/{d}/{n}" for n in names if os.path.exists(os.path.join(out, d, n)))
    print(f"image {args.image}@{digest}")
    print(f"push:  skopeo copy oci:{shown}/oci:latest docker://{args.image}")
    print(f"       and serve {shown}/warmroute.wasm at {args.wasm_url} (Envoy Gateway)")
    print(f"Istio:         kubectl apply {apply('istio', ISTIO_APPLY)}")
    print(f"Envoy Gateway: kubectl apply {apply('envoy-gateway', EG_APPLY)}")
    optional = " ".join(apply(d, OPTIONAL) for d in ("istio", "envoy-gateway")).strip()
    if optional:
        print(f"optional:      kubectl apply {optional} (the peer port from the gateway's pods only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
