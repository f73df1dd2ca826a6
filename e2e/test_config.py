"""Configuration through the real Envoy: a bad filter config is rejected at load with the field named."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from warmroute_harness import ROOT, Envoy, Sim, envoy_binary


def validate(overrides: dict) -> subprocess.CompletedProcess:
    sims = [Sim(f"sim-{i}", 18001 + i) for i in range(3)]
    cfg = Envoy(sims, filter_overrides=overrides).render()
    path = Path(tempfile.mkdtemp()) / "envoy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "info"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def oldest_envoy() -> str:
    """The oldest Envoy `make e2e-oldest-envoy` runs the suite's version checks on, as major.minor."""
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("OLDEST_ENVOY "))
    return ".".join(line.split(":=")[1].strip().split(".")[:2])


def test_the_shipped_config_loads():
    r = validate({})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warmroute: 3 backends, strategy cache_aware" in r.stdout + r.stderr
    # The minimum the log names is the one make test checks, so neither drifts alone.
    assert f"needs Envoy {oldest_envoy()} or later" in r.stdout + r.stderr


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"strategy": "fastest"}, "strategy"),
        ({"stratgy": "random"}, "stratgy"),
        ({"backends": [{"name": "a", "address": "not-an-address"}]}, "backends[0].address"),
        ({"metrics": {"period_ms": 100, "timeout_ms": 500}}, "metrics.timeout_ms"),
        ({"balance": {"eps": -1}}, "balance.eps"),
    ],
)
def test_a_bad_config_is_rejected_at_load_naming_the_field(overrides, field):
    r = validate(overrides)
    out = r.stdout + r.stderr
    assert r.returncode != 0, "Envoy accepted a bad warmroute config"
    assert f"warmroute: invalid configuration: {field}" in out, out[-3000:]
