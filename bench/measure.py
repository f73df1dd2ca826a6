"""What the quality and overhead runs measure with: one bounded load-client run, and a
process's CPU time and memory read from /proc.

Every load run is bounded in time twice (the client's own --max-seconds and a hard
subprocess timeout), so a stuck server cannot hang the benchmark.
"""

from __future__ import annotations

import os
from pathlib import Path

from warmroute_harness import run_loadgen

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (its threads included) from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def loadgen(args: list[str], targets: list[str], backends: list[str], out: Path, max_seconds: float,
            extra: list[str] | None = None) -> dict:
    """`warmroute-loadgen` stopped after `max_seconds`, each request timing out at the same."""
    return run_loadgen(args, targets, backends, out,
                       ["--max-seconds", str(max_seconds), "--timeout-s", str(max_seconds), *(extra or [])],
                       timeout=max_seconds + 60)
