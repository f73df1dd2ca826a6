"""Runs the load client (`warmroute-loadgen`) and returns its JSON report.

The demo and the bench drive their workloads through the same Rust client, which times
requests and computes the fleet hit rate itself; this only builds its command line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .repo import LOADGEN_BIN


def run_loadgen(args: list[str], targets: list[str], backends: list[str], out: Path,
                extra: list[str] | None = None, timeout: float | None = None) -> dict:
    """`warmroute-loadgen <args>` against `targets` (gateway URLs), reading the hit rate from
    `backends` (replica URLs); the report is written to `out` and returned."""
    cmd = [str(LOADGEN_BIN), *args, "--json", str(out), "--quiet"]
    for t in targets:
        cmd += ["--target", t]
    for b in backends:
        cmd += ["--backend", b]
    cmd += extra or []
    subprocess.run(cmd, check=True, timeout=timeout)
    return json.loads(out.read_text())
