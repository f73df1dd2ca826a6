"""Routing quality: a workload through one router on a fresh fleet, as one result row.

Each run starts its own sims (so caches start cold) and gateways, drives the workload with
`warmroute-loadgen`, and keeps the client's report (hit rate, latencies, shares) together
with the gateways' CPU time and warmroute's decision counters. The sections of the
benchmark (per workload, 8 replicas, 3 gateways, target re-runs) are methods of `Bench`.
"""

from __future__ import annotations

import time
from pathlib import Path

from measure import loadgen, proc_cpu_s
from scenarios import (EVICTION_GATEWAYS, EVICTION_ROUNDS, EXTRA_ROUTERS, PEER_ROUTERS, QUICK_ROUTERS, RERUN_PAIRS, RERUNS,
                       ROUTERS, TIME_SCALE, WORKLOADS, sim_args)
from peers import PeerRouter
from warmroute_harness import Envoy, Fleet


def counters(envoys: list[Envoy], prefixes: tuple[str, ...] = ("decision.", "feedback.", "redecided", "peers.")) -> dict[str, int]:
    """warmroute's counters under `wasmcustom.warmroute.<prefix>` summed over gateways, named
    without `wasmcustom.warmroute.` (decisions without `decision.` too: the report's keys)."""
    out: dict[str, int] = {}
    for i, e in enumerate(envoys):
        # The filter adds to its counters at each tick: wait for one, once for all gateways.
        for k, v in (e.stats() if i else e.settled_stats()).items():
            name = k.removeprefix("wasmcustom.warmroute.")
            if name != k and name.startswith(prefixes):
                try:
                    key = name.removeprefix("decision.")
                    out[key] = out.get(key, 0) + int(v)
                except ValueError:
                    pass
    return {k: v for k, v in sorted(out.items()) if v}


def row_from(report: dict, **meta) -> dict:
    """A result row: the run's description (`meta`) and the client report's figures."""
    keep = ["hit_rate", "usage_hit_rate", "ttft_ms", "e2e_ms", "step_ms", "runtime_s", "errors", "aborted",
            "skipped", "requests", "ok", "share", "per_target", "client_cpu_s", "client_cpu_util",
            "throughput_rps", "error_samples"]
    return {**meta, **{k: report.get(k) for k in keep}}


def row_key(r: dict) -> tuple:
    """What makes a row the same measurement as another: a run that measures it again replaces it."""
    return (r["workload"], r["router"], r["replicas"], r["gateways"], r.get("kv_capacity_tokens"))


class Bench:
    """One benchmark invocation: quick or full, its log folder, and the rows measured so far
    (the overhead sections read `quick` and `logdir` too)."""

    def __init__(self, quick: bool, logdir: Path):
        self.quick = quick
        self.logdir = logdir
        self.rows: list[dict] = []
        # Rows of the target re-runs, one list per re-run (see `reruns`).
        self.reruns: list[list[dict]] = []
        self.extra: dict = {}
        self.n = 0
        # Each main row's per-request records, by `row_key`: a section that reuses a main row
        # (the fast profile's tail and scale-out) reads its requests from there.
        self.records: dict[tuple, Path] = {}

    def wl(self, name: str, scale_agents: float = 1.0) -> tuple[list[str], int]:
        w = WORKLOADS[name]
        args = list(w["quick" if self.quick else "args"])
        cap = w["quick_capacity" if self.quick else "capacity"]
        return args, cap

    def quality(self, workload: str, router: str, replicas: int = 3, gateways: int = 1,
                args: list[str] | None = None, capacity: int | None = None, scale: float = TIME_SCALE,
                label: str | None = None, rerun: int = 0, sink: list[dict] | None = None) -> dict:
        """One run; its row goes to `sink` when given (a section's own list), else to the
        re-run it belongs to, else to the main rows. A peer router (`PEER_ROUTERS`) runs as its
        own process in front of the sims instead of Envoy (bench/peers.py)."""
        base_args, base_cap = self.wl(workload)
        args = args or base_args
        capacity = capacity or base_cap
        self.n += 1
        rdir = self.logdir / f"{self.n:02d}-{workload}-{label or router}-{replicas}r-{gateways}g"
        rdir.mkdir(parents=True)
        known = {**ROUTERS, **EXTRA_ROUTERS}
        kwargs = dict(known[router]) if router in known else {"with_filter": False, "lb": "round_robin"}
        max_s = 60.0 if self.quick else 150.0
        t0 = time.time()
        if router in PEER_ROUTERS:
            with Fleet(replicas, sim_args(capacity, scale), gateways=0, logdir=rdir) as f, \
                    PeerRouter(router, f.sims, rdir) as peer:
                cpu0 = proc_cpu_s(peer.proc.pid)
                rep = loadgen(args, [peer.url], [f"http://{s.address}" for s in f.sims], rdir / "report.json", max_s,
                              ["--records", str(rdir / "records.jsonl")])
                router_cpu = proc_cpu_s(peer.proc.pid) - cpu0
            row = row_from(rep, workload=workload, router=label or router, replicas=replicas, gateways=gateways,
                           kv_capacity_tokens=capacity, time_scale=scale, envoy_cpu_s=None,
                           router_cpu_s=round(router_cpu, 2), decisions={})
            return self._keep(row, rerun, sink, t0)
        with Fleet(replicas, sim_args(capacity, scale), gateways=gateways, logdir=rdir, **kwargs) as f:
            cpu0 = [proc_cpu_s(e.proc.pid) for e in f.envoys]
            rep = loadgen(args, [f"http://127.0.0.1:{e.port}" for e in f.envoys],
                          [f"http://{s.address}" for s in f.sims], rdir / "report.json", max_s,
                          ["--records", str(rdir / "records.jsonl")])
            envoy_cpu = sum(proc_cpu_s(e.proc.pid) for e in f.envoys) - sum(cpu0)
            dec = counters(f.envoys) if kwargs.get("with_filter", True) else {}
        row = row_from(rep, workload=workload, router=label or router, replicas=replicas, gateways=gateways,
                       kv_capacity_tokens=capacity, time_scale=scale, envoy_cpu_s=round(envoy_cpu, 2),
                       decisions=dec)
        if sink is None and not rerun:
            self.records[row_key(row)] = rdir / "records.jsonl"
        return self._keep(row, rerun, sink, t0)

    def main_row(self, workload: str, router: str, replicas: int = 3, gateways: int = 1,
                 capacity: int | None = None) -> dict | None:
        """The main row this run measured of `router` on `workload` (at the workload's KV capacity
        unless `capacity`), if any: what a section that shares the main table's runs takes."""
        key = (workload, router, replicas, gateways, capacity or self.wl(workload)[1])
        return next((r for r in self.rows if row_key(r) == key), None)

    def _keep(self, row: dict, rerun: int, sink: list[dict] | None, t0: float) -> dict:
        if sink is not None:
            sink.append(row)
        elif rerun:
            row["rerun"] = rerun
            self.reruns[rerun - 1].append(row)
        else:
            self.rows.append(row)
        workload, replicas, gateways = row["workload"], row["replicas"], row["gateways"]
        hr = row["hit_rate"]
        print(f"  {workload:12s} {row['router']:28s} {replicas}r {gateways}g  hit {hr if hr is None else round(hr, 3)}"
              f"  ttft p95 {(row['ttft_ms'] or {}).get('p95', 0):8.0f}  e2e mean {(row['e2e_ms'] or {}).get('mean', 0):8.0f}"
              f"  err {row['errors']}  client cpu {row['client_cpu_util']:.2f}  ({time.time() - t0:.0f}s)", flush=True)
        return row

    def reference(self, workload: str, rerun: int = 0) -> dict:
        """One replica with the fleet's total KV capacity (and compute: 3x time scale)."""
        _, cap = self.wl(workload)
        return self.quality(workload, "reference", replicas=1, capacity=3 * cap, scale=3 * TIME_SCALE,
                            label="reference_1_replica_3x", rerun=rerun)

    def workload_section(self, workload: str, routers: list[str] | None = None, reference: bool = True) -> None:
        """The single-replica reference (unless `reference` is False) and each router of
        `routers` (all by default, QUICK_ROUTERS when quick) on the workload."""
        print(f"== {workload}", flush=True)
        if routers is None:
            routers = QUICK_ROUTERS if self.quick else list(ROUTERS)
            if workload == "chat" and self.quick:
                routers = routers + ["warmroute_sticky_session"]
        if reference:
            self.reference(workload)
        for r in routers:
            self.quality(workload, r)

    def scale8(self) -> None:
        print("== 8 replicas", flush=True)
        for workload in (["agent"] if self.quick else ["agent", "conversation"]):
            args, cap = self.wl(workload)
            args = list(args)
            if workload == "agent":  # 8/3 the agents: same load per replica
                i = args.index("--agents")
                args[i + 1] = str(round(int(args[i + 1]) * 8 / 3))
            else:  # trace replayed 8/3 faster than real time: same load per replica
                i = args.index("--speedup")
                args[i + 1] = str(float(args[i + 1]) * 8 / 3)
                j = args.index("--limit")
                args[j + 1] = str(round(int(args[j + 1]) * 8 / 3))
            for r in ["envoy_round_robin", "envoy_least_request", "warmroute_cache_aware"]:
                self.quality(workload, r, replicas=8, args=args, capacity=cap)

    def gateways(self) -> None:
        print("== 3 gateways", flush=True)
        for workload in (["agent"] if self.quick else ["agent", "conversation", "chat"]):
            self.quality(workload, "warmroute_cache_aware", gateways=3)

    def reruns_section(self, n: int = RERUNS) -> None:
        """Runs the pairs behind the targets nearest their limits `n` more times.

        One run of a pair scatters by about ±5% on this machine (conversation TTFT P95
        ratio 0.54-0.65x, 3-gateway agent ratio 0.94-1.0x, uniform's worst figure
        1.01-1.06x over one session), as much as the distance to those limits; a
        target is then the median of the pair's ratios over the main run and these."""
        print(f"== target re-runs ({n} more of each pair)", flush=True)
        for i in range(1, n + 1):
            while len(self.reruns) < i:
                self.reruns.append([])
            for workload, router, gateways in RERUN_PAIRS:
                if router == "reference_1_replica_3x":
                    self.reference(workload, rerun=i)
                else:
                    self.quality(workload, router, gateways=gateways, rerun=i)

    def eviction(self, rounds: int = EVICTION_ROUNDS) -> None:
        """cache_aware with and without the pods' cache reports, on a fleet that evicts all
        the time behind several gateways, in paired rounds: the first round's rows are the section's, the others
        join the re-runs, so each target is the median ratio over the rounds. The order
        alternates by round: the machine's speed drifts over minutes, and a fixed order
        would bias every round's ratio the same way."""
        print(f"== eviction-heavy ({rounds} paired rounds)", flush=True)
        pair = ("warmroute_cache_aware", "warmroute_cache_aware_no_feedback")
        for i in range(rounds):
            while i and len(self.reruns) < i:
                self.reruns.append([])
            for router in (pair if i % 2 == 0 else pair[::-1]):
                self.quality("evicting", router, gateways=EVICTION_GATEWAYS, rerun=i)
