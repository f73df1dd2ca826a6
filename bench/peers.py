"""The peers in the same run (issue #34): the SGLang router and vLLM's router in front of the same
simulated fleet as warmroute, on every routing-quality workload, in paired rounds.

Each peer is one process on 127.0.0.1 (`PeerRouter`), started on a fresh fleet of sims and stopped
with it, from .venv-peers (`make peers-setup`, bench/peers-requirements.txt). Its rows are
`Bench.quality` rows like every other router's, kept apart in `res["peers"]` (one list per round)
so the main tables and targets are untouched. The routers' settings, and the docs each tuned
setting comes from, are `scenarios.PEER_ROUTERS`.

Targets, at the peers' defaults, per workload, on the medians over rounds: warmroute's hit rate at
least the peer's minus 1 point; warmroute's TTFT P95 and mean E2E below the peer's (the median of
the per-round ratios < 1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from statistics import median

from scenarios import PEER_DEFAULTS, PEER_ROUNDS, PEER_ROUTERS, PEER_WORKLOADS
from warmroute_harness import ROOT, Sim, free_port

PEERS_VENV = ROOT / ".venv-peers"
WARMROUTE = "warmroute_cache_aware"


def peer_binary(exe: str) -> Path:
    p = PEERS_VENV / "bin" / exe
    if not p.exists():
        raise RuntimeError(f"{p} missing: run `make peers-setup`")
    return p


class PeerRouter:
    """One peer router process in front of `sims`, on 127.0.0.1 (its metrics port too); a
    context manager that always stops it. Ready when its `/readiness` counts every sim healthy
    (both routers register workers in the background after they start listening)."""

    def __init__(self, name: str, sims: list[Sim], logdir: Path):
        self.name = name
        self.spec = PEER_ROUTERS[name]
        self.sims = sims
        self.logdir = logdir
        self.port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        s = self.spec
        return [str(peer_binary(s["exe"])), *s["cmd"], "--host", "127.0.0.1", "--port", str(self.port),
                "--worker-urls", *[f"http://{x.address}" for x in self.sims],
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
                "--log-level", s["log_level"], *s["args"]]

    def readiness(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"{self.url}/readiness", timeout=2) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def __enter__(self) -> "PeerRouter":
        log = open(self.logdir / f"{self.name}.log", "wb")
        # Nothing of theirs may reach for a model hub: the sims serve no tokenizer.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        log.close()
        deadline, last = time.time() + 60, None
        try:
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited {self.proc.returncode} before it was ready "
                                       f"(log: {self.logdir / (self.name + '.log')})")
                last = self.readiness()
                if last and last.get("healthy_workers") == len(self.sims):
                    return self
                time.sleep(0.1)
            raise RuntimeError(f"{self.name} not ready after 60 s: {last}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM (both drain in-flight requests, none is left when a run ends), SIGKILL after 10 s."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __exit__(self, *exc) -> None:
        self.stop()


def routers_for(workload: str, peers: list[str] | None = None) -> list[str]:
    """warmroute and the peers (`peers`, all by default) documented for the workload."""
    return [WARMROUTE] + [r for r, s in PEER_ROUTERS.items() if workload in s.get("workloads", PEER_WORKLOADS)
                          and (peers is None or r in peers)]


def section(b, rounds: int = PEER_ROUNDS, workloads: list[str] | None = None,
            out: list[list[dict]] | None = None, routers: list[str] | None = None,
            reuse_warmroute: bool = False) -> list[list[dict]]:
    """`rounds` paired rounds: per workload, warmroute and each peer row on fresh fleets, the order
    reversed every other round. Appends one list of rows per round to `out` as it goes (so a run
    stopped midway keeps what it measured) and returns it. With `reuse_warmroute` (the fast
    profile), the first round takes warmroute's row of a workload from the main rows this run
    measured (the same router, fleet and workload, minutes earlier) instead of running it again;
    such a row is marked `reused`."""
    out = [] if out is None else out
    for i in range(rounds):
        print(f"== peers, round {i + 1} of {rounds}", flush=True)
        rows: list[dict] = []
        out.append(rows)
        for w in workloads or PEER_WORKLOADS:
            order = routers_for(w, routers)
            for r in (order if i % 2 == 0 else order[::-1]):
                have = next((x for x in b.rows if x["workload"] == w and x["router"] == r and x["replicas"] == 3
                             and x["gateways"] == 1), None) if reuse_warmroute and i == 0 and r == WARMROUTE else None
                if have:
                    rows.append(row := {**have, "reused": True})
                    print(f"  {w:12s} {r:28s} the row measured above", flush=True)
                else:
                    row = b.quality(w, r, sink=rows)
                row["round"] = i + 1
    return out


def _g(r: dict, *path):
    v = r
    for p in path:
        if v is None:
            return None
        v = v.get(p)
    return v


# The figures compared: (label, path in a row, lower is better).
FIGURES = (("hit rate", ("hit_rate",), False), ("TTFT p95", ("ttft_ms", "p95"), True),
           ("E2E mean", ("e2e_ms", "mean"), True))


def _by(rounds: list[list[dict]], workload: str, router: str) -> list[dict | None]:
    return [next((r for r in rows if r["workload"] == workload and r["router"] == router), None) for rows in rounds]


def summary(rounds: list[list[dict]] | None) -> list[dict]:
    """Per workload and router: the median of each figure over the rounds, and how many rounds."""
    out = []
    if not rounds:
        return out
    for w in PEER_WORKLOADS:
        for router in routers_for(w):
            rs = [r for r in _by(rounds, w, router) if r is not None and not r.get("errors")]
            if not rs:
                continue
            med = {}
            for label, path, _ in FIGURES:
                vals = [_g(r, *path) for r in rs if _g(r, *path) is not None]
                med[label] = median(vals) if vals else None
            out.append({"workload": w, "router": router, "runs": len(rs), **med,
                        "errors": sum((r.get("errors") or 0) for r in _by(rounds, w, router) if r)})
    return out


def targets(rounds: list[list[dict]] | None) -> list[dict]:
    """At the peers' defaults, per workload: warmroute's hit rate >= the peer's - 1 point (medians
    over rounds); TTFT P95 and mean E2E: the median of the per-round ratios warmroute / peer < 1."""
    out: list[dict] = []
    if not rounds:
        return out

    def check(name, measured, limit, ok):
        out.append({"target": name, "measured": measured, "limit": limit,
                    "result": "n/a" if ok is None else ("PASS" if ok else "FAIL")})

    for w in PEER_WORKLOADS:
        for peer in PEER_DEFAULTS:
            pairs = [(a, p) for a, p in zip(_by(rounds, w, WARMROUTE), _by(rounds, w, peer))
                     if a is not None and p is not None and not a.get("errors") and not p.get("errors")]
            if not pairs:
                continue
            n = len(pairs)
            hw = median(a["hit_rate"] or 0 for a, _ in pairs)
            hp = median(p["hit_rate"] or 0 for _, p in pairs)
            check(f"{w}: warmroute hit rate >= {peer} - 1 point (defaults)",
                  f"{hw * 100:.1f}% vs {hp * 100:.1f}% (medians of {n} rounds)", ">= peer - 1.0 pt",
                  hw >= hp - 0.01)
            for label, path, _ in FIGURES[1:]:
                ratios = [_g(a, *path) / _g(p, *path) for a, p in pairs if _g(a, *path) and _g(p, *path)]
                if not ratios:
                    continue
                m = median(ratios)
                each = ", ".join(f"{x:.2f}" for x in ratios)
                check(f"{w}: warmroute {label} below {peer}'s (defaults)",
                      f"{m:.2f}x median of {n} paired rounds ({each}); "
                      f"{median(_g(a, *path) for a, _ in pairs):.0f} vs {median(_g(p, *path) for _, p in pairs):.0f} ms",
                      "< 1.00x", m < 1.0)
    return out


def markdown(rounds: list[list[dict]] | None) -> list[str]:
    L: list[str] = []
    rows = summary(rounds)
    if not rows:
        return L
    n = len(rounds or [])
    L.append("## The peers in the same run\n")
    L.append(f"The SGLang router and vLLM's router, each one process on 127.0.0.1 in front of the same simulated "
             f"fleet (3 replicas, each workload's KV capacity), against warmroute (cache_aware, one Envoy), "
             f"{n} paired rounds, the order reversed every other round. Each figure is the median over the rounds "
             "without errors (`runs`); hit rate as in the main table, latencies in ms of wall time at time scale "
             f"10. `evicting` runs through one gateway here."
             + (" warmroute's rows on " + ", ".join(sorted({r["workload"] for rs in rounds or [] for r in rs
                                                             if r.get("reused")}))
                + " are the main table's (the fast profile measures them once)." if any(
                    r.get("reused") for rs in rounds or [] for r in rs) else "")
             + " Settings (`bench/scenarios.py`, PEER_ROUTERS):\n")
    for name, s in PEER_ROUTERS.items():
        flags = " ".join(s["args"]) or "(none)"
        L.append(f"- `{name}`: `{flags}`. {s['why']}")
    L.append("")
    L.append("| workload | router | runs | hit rate | TTFT p95 | E2E mean | errors |")
    L.append("|---|---|---|---|---|---|---|")
    for r in rows:
        hr = r["hit rate"]
        L.append(f"| {r['workload']} | {r['router']} | {r['runs']} | {'' if hr is None else f'{hr * 100:.1f}%'} | "
                 f"{r['TTFT p95'] or 0:.0f} | {r['E2E mean'] or 0:.0f} | {r['errors']} |")
    L.append("")
    return L
