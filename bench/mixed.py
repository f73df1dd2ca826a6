"""Mixed priority classes at overload: interactive chat and long batch jobs through
warmroute's cache_aware, without and with the priority gate, in paired rounds.

Each run starts a fresh fleet of 3 sims (`--max-num-seqs` from `scenarios.MIXED`) and one
Envoy, drives `warmroute-loadgen mixed` (interactive requests tagged
`x-warmroute-priority: interactive`, batch jobs `batch`), and keeps the client's per-class
report with the gate's counters. A round is one run without and one with the gate, in
alternating order (this machine's speed drifts over minutes: alternating keeps the drift
from favouring one side). The targets are medians over rounds of the per-round ratios
(bench/report.py `mixed_targets`).
"""

from __future__ import annotations

import threading
import time
from statistics import mean

from measure import loadgen
from scenarios import MIXED, MIXED_ROUNDS, SCALED_METRICS, TIME_SCALE, sim_args
from warmroute_harness import Fleet

MODES = {
    "without_gate": {"strategy": "cache_aware", "metrics": SCALED_METRICS},
    "with_gate": {"strategy": "cache_aware", "metrics": SCALED_METRICS, "gate": MIXED["gate"]},
}


def gate_stats(fleet: Fleet) -> dict[str, int]:
    """The gate's counters and gauges (`wasmcustom.warmroute.gate.*`), non-zero ones."""
    out = {}
    for k, v in fleet.envoy.settled_stats().items():
        if k.startswith("wasmcustom.warmroute.gate."):
            try:
                out[k.removeprefix("wasmcustom.warmroute.gate.")] = int(v)
            except ValueError:
                pass
    return {k: v for k, v in sorted(out.items()) if v}


class PodSampler:
    """Samples each sim's running and waiting requests every `period` s while a run lasts:
    the evidence that without the gate FIFO queues form in the sims and with it the pods run
    full batches at their knee."""

    def __init__(self, fleet: Fleet, period: float = 0.1):
        self.fleet, self.period = fleet, period
        self.samples: list[tuple[float, float]] = []  # (running, waiting) per pod per sample
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.stop.wait(self.period):
            for s in self.fleet.sims:
                try:
                    m = s.metrics()
                except OSError:
                    continue
                self.samples.append((m.get("vllm:num_requests_running", 0.0), m.get("vllm:num_requests_waiting", 0.0)))

    def __enter__(self) -> "PodSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)

    def summary(self) -> dict:
        """Mean running and waiting per pod over the samples taken while the pods were busy."""
        busy = [s for s in self.samples if s[0] > 0]
        if not busy:
            return {}
        return {"running_mean": round(mean(r for r, _ in busy), 2), "waiting_mean": round(mean(w for _, w in busy), 2),
                "waiting_max": max(w for _, w in busy), "samples": len(busy)}


def run_one(b, mode: str, rnd: int) -> dict:
    args = MIXED["quick" if b.quick else "args"]
    b.n += 1
    rdir = b.logdir / f"{b.n:02d}-mixed-{mode}-r{rnd}"
    rdir.mkdir(parents=True)
    max_s = 90.0 if b.quick else 150.0
    t0 = time.time()
    # The loadgen tags each request's class itself, as a trusted stage (jwt_authn from a
    # token) would at a real edge; the shipped config strips a client's copy.
    with Fleet(3, sim_args(MIXED["capacity"]) + MIXED["sim"], logdir=rdir, filter_overrides=MODES[mode],
               trusted_headers=("x-warmroute-priority",)) as f:
        with PodSampler(f) as pods:
            rep = loadgen(args, [f"http://127.0.0.1:{f.envoy.port}"], [f"http://{s.address}" for s in f.sims],
                          rdir / "report.json", max_s, ["--records", str(rdir / "records.jsonl")])
        gate = gate_stats(f)
    row = {"mode": mode, "round": rnd, "classes": rep.get("classes", {}), "gate": gate,
           "runtime_s": rep["runtime_s"], "requests": rep["requests"], "ok": rep["ok"], "shed": rep["shed"],
           "errors": rep["errors"], "aborted": rep["aborted"], "skipped": rep["skipped"],
           "client_cpu_util": rep["client_cpu_util"], "pods": pods.summary(), "share": rep["share"], "error_samples": rep["error_samples"]}
    c = row["classes"]
    i, bt = c.get("interactive", {}), c.get("batch", {})
    print(f"  mixed r{rnd} {mode:13s} interactive TTFT p50/p95 {(i.get('ttft_ms') or {}).get('p50', 0):6.0f}/"
          f"{(i.get('ttft_ms') or {}).get('p95', 0):6.0f} ms  shed {i.get('shed')} lost {i.get('lost')}  "
          f"batch {bt.get('output_tokens_per_s', 0):7.0f} tok/s lost {bt.get('lost')}  "
          f"pods running/waiting {row['pods'].get('running_mean')}/{row['pods'].get('waiting_mean')}  "
          f"client cpu {row['client_cpu_util']:.2f}  ({time.time() - t0:.0f}s)", flush=True)
    return row


def mixed(b, rounds: int = MIXED_ROUNDS) -> dict:
    """`rounds` paired runs; odd rounds run the gate first."""
    print(f"== mixed ({rounds} paired rounds)", flush=True)
    rows = []
    for rnd in range(1, rounds + 1):
        order = ["without_gate", "with_gate"] if rnd % 2 else ["with_gate", "without_gate"]
        for mode in order:
            rows.append(run_one(b, mode, rnd))
    return {"rounds": rounds, "rows": rows, "args": MIXED["quick" if b.quick else "args"],
            "sim": MIXED["sim"], "gate": MIXED["gate"], "capacity": MIXED["capacity"], "time_scale": TIME_SCALE}
