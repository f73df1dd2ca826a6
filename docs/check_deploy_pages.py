#!/usr/bin/env python3
"""Checks the deploy pages' command sequences (docs/deploy/*.md) against what the repository
builds and checks, so a page never tells a newcomer to apply a file that is not there or that
no test looks at.

Run by `make docs` (and so by `make test`). For each ```sh block of a page:

1. its `make release VAR=value ...` (or, for a block naming dist/ files without one, a plain
   `make release`) runs deploy/release.py with those variables over the Makefile's defaults, on
   a stand-in module, into a scratch directory: the generators accept the page's arguments;
2. every dist/... path the block names is one that release wrote;
3. every repository file it names exists, and each YAML among them is one `make validate`
   checks (CHECKED below).

Exits 1 on any failure, printing the page, the block's line and the path.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# The YAML files `make validate` checks: the Istio manifests (deploy/istio/check.sh), the
# standalone Envoy configs and their EDS file (make validate-envoy, deploy/envoy/check.sh, the
# e2e tests), the compose file (deploy/compose/check.sh).
CHECKED = {p.relative_to(ROOT).as_posix() for pattern in ("istio/**/*.yaml", "envoy.yaml", "deploy/envoy/**/*.yaml",
                                                         "deploy/compose/docker-compose.yaml")
           for p in ROOT.glob(pattern)}
RELEASE_VARS = ("IMAGE", "WASM_URL", "GENERATE_ARGS", "EG_GENERATE_ARGS")
DIST = re.compile(r"(?<![\w/.-])dist/[\w./-]*[\w]")
REPO = re.compile(r"(?<![\w/.:-])(?:envoy\.yaml|(?:istio|deploy)/[\w./-]*\.(?:yaml|sh|json|py|mjs))")
# A stand-in for dist/warmroute.wasm: the generators never read the module, and the OCI
# packer needs only the Wasm magic and version.
MODULE = b"\0asm\x01\0\0\0"


def makefile_defaults() -> dict[str, str]:
    text = (ROOT / "Makefile").read_text()
    out = {}
    for var in RELEASE_VARS:
        m = re.search(rf"^{var} \?= (.*)$", text, re.M)
        if not m:
            raise SystemExit(f"Makefile: no default for {var}")
        out[var] = m.group(1).strip()
    return out


def sh_blocks(page: Path):
    """(first line number, text with continuations joined, comments dropped) of each ```sh block."""
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            start, body = i + 2, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            text = "\n".join(body).replace("\\\n", " ")
            yield start, "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        i += 1


def release_vars(block: str, defaults: dict[str, str]) -> dict[str, str] | None:
    for line in block.splitlines():
        words = shlex.split(line)
        if words[:2] == ["make", "release"]:
            given = dict(w.split("=", 1) for w in words[2:] if "=" in w)
            unknown = set(given) - set(RELEASE_VARS)
            if unknown:
                raise ValueError(f"make release sets {', '.join(sorted(unknown))}, which the Makefile does not read")
            return defaults | given
    return None


def release(vars_: dict[str, str], scratch: Path) -> Path:
    out = scratch / f"dist-{len(list(scratch.iterdir()))}"
    module = scratch / "module.wasm"
    module.write_bytes(MODULE)
    r = subprocess.run([sys.executable, str(ROOT / "deploy" / "release.py"), "--wasm", str(module), "--out", str(out),
                        "--image", vars_["IMAGE"], "--wasm-url", vars_["WASM_URL"],
                        "--istio-args", vars_["GENERATE_ARGS"], "--eg-args", vars_["EG_GENERATE_ARGS"]],
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise ValueError(f"make release with {vars_} fails: {r.stderr.strip().splitlines()[-1:]}")
    return out


def main() -> int:
    defaults = makefile_defaults()
    failures, checked = [], 0
    with tempfile.TemporaryDirectory(prefix="warmroute-docs-") as tmp:
        scratch = Path(tmp)
        for page in sorted((DOCS / "deploy").glob("*.md")):
            where = page.relative_to(ROOT)
            for line, block in sh_blocks(page):
                try:
                    dist_paths = DIST.findall(block)
                    vars_ = release_vars(block, defaults)
                    if vars_ is None and dist_paths:
                        vars_ = defaults
                    out = release(vars_, scratch) if vars_ is not None else None
                except ValueError as e:
                    failures.append(f"{where}:{line}: {e}")
                    continue
                for d in dist_paths:
                    checked += 1
                    if not (out / d.removeprefix("dist/")).exists():
                        failures.append(f"{where}:{line}: {d}: make release does not write it")
                for f in REPO.findall(block):
                    checked += 1
                    if not (ROOT / f).exists():
                        failures.append(f"{where}:{line}: {f}: no such file in the repository")
                    elif f.endswith(".yaml") and f not in CHECKED:
                        failures.append(f"{where}:{line}: {f}: not among the files make validate checks")
    for f in failures:
        print(f"FAIL {f}")
    if not checked:
        failures.append("no path found in the deploy pages' sh blocks")
        print("FAIL no path found in the deploy pages' sh blocks")
    if not failures:
        print(f"check_deploy_pages: {checked} paths in the deploy pages' command sequences: every one built or checked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
