"""What the quality and overhead runs measure with: one bounded load-client run, and a
process's CPU time and memory read from /proc.

Every load run is bounded in time twice (the client's own --max-seconds and a hard
subprocess timeout), so a stuck server cannot hang the benchmark.
"""

from __future__ import annotations

from pathlib import Path

from warmroute_harness import run_loadgen


def proc_cpu_s(pid: int) -> float:
    """CPU time of a process's live threads, in seconds, with nanosecond resolution: the sum of
    /proc/<pid>/task/*/schedstat's first field (time on a CPU).

    /proc/<pid>/stat counts in clock ticks (10 ms): over a round of 1000 requests at ~40 us each
    that is a 25% step, which made the cost ratios jump between 1.0, 1.25 and 1.5. A thread
    that exits takes its time with it; Envoy's threads live as long as the process. Raises
    when no thread could be read (the process is gone, or the kernel keeps no schedstat), so a
    missing figure never reads as zero CPU."""
    total, read = 0, 0
    for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(f.read_text().split()[0])
            read += 1
        except (OSError, ValueError, IndexError):  # the thread ended between listing and reading
            pass
    if not read:
        raise RuntimeError(f"no CPU time readable for pid {pid} (/proc/{pid}/task/*/schedstat)")
    return total / 1e9


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
