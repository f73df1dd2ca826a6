"""The one Prometheus text parser on the Python side, for the simulated vLLM's /metrics.

The tests need only totals of a few unlabelled-looking series (queue length, prefix-cache
hits and queries), so labels are dropped and samples of one name are summed; Envoy's own
stats are read from its JSON admin endpoint instead (see envoy.py), never from this format.
"""

from __future__ import annotations


def sums_by_name(text: str) -> dict[str, float]:
    """Metric name → sample values summed over its label sets; comments and bad lines skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except ValueError:
            pass
    return out
