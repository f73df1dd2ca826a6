"""Does the fast profile's verdict hold? Each target of a fast run beside the same target of a
full run on the same machine, as a markdown table.

    cd bench && ../.venv/bin/python compare_profiles.py [FAST_JSON] [FULL_JSON]

(defaults: results/latest.json and results/full/latest.json). Read from each target's
`measured` text: the headline figure (a ratio, or for the peers' hit-rate targets warmroute's
lead in points) and, where the full run pooled several paired runs, their per-run values. A
fast figure inside the full run's per-run range is a draw like the full run's own; outside it,
the fast setting moved the figure, or the fast run met the machine on another day. `verdict`
says whether the PASS/FAIL agrees.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NUM = r"-?\d+(?:\.\d+)?"


def figure(measured: str) -> float | None:
    """The target's headline number: warmroute's lead in points for 'a% vs b%', else the first
    number of the text."""
    m = re.match(rf"\s*({NUM})% vs ({NUM})%", measured)
    if m:
        return round(float(m.group(1)) - float(m.group(2)), 1)
    m = re.search(NUM, measured)
    return float(m.group(0)) if m else None


def per_run(measured: str) -> list[float]:
    """The pooled runs' values: the first parenthesised list of two or more numbers."""
    m = re.search(rf"\(({NUM}(?:, {NUM})+)\)", measured)
    return [float(x) for x in m.group(1).split(", ")] if m else []


def table(fast: dict, full: dict) -> list[str]:
    base = {t["target"]: t for t in full.get("targets", [])}
    L = ["| target | full run | full's runs (min-max) | fast run | fast - full | inside full's range | verdict |",
         "|---|---|---|---|---|---|---|"]
    for t in fast.get("targets", []):
        f = base.get(t["target"])
        a = figure(t["measured"])
        if f is None:
            L.append(f"| {t['target']} | (not in the full run) | | {a} | | | {t['result']} |")
            continue
        b, runs = figure(f["measured"]), per_run(f["measured"])
        lo_hi = f"{min(runs):g}-{max(runs):g} ({len(runs)})" if runs else ""
        inside = "" if not runs or a is None else ("yes" if min(runs) <= a <= max(runs) else "no")
        diff = "" if a is None or b is None else f"{a - b:+.3g}"
        same = "same" if t["result"] == f["result"] else f"**{f['result']} -> {t['result']}**"
        L.append(f"| {t['target']} | {b} | {lo_hi} | {a} | {diff} | {inside} | {same} |")
    missing = [k for k in base if k not in {t["target"] for t in fast.get("targets", [])}]
    for k in missing:
        L.append(f"| {k} | {figure(base[k]['measured'])} | | (missing in the fast run) | | | |")
    return L


def main() -> int:
    fast = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results" / "latest.json"
    full = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "results" / "full" / "latest.json"
    a, b = json.loads(fast.read_text()), json.loads(full.read_text())
    print(f"fast: {fast} ({a.get('profile', 'full')}, {a['started']}, {a['wall_s']:.0f} s); "
          f"full: {full} ({b.get('profile', 'full')}, {b['started']}, {b['wall_s']:.0f} s)\n")
    print("\n".join(table(a, b)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
