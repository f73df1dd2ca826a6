"""Soak: a long saturated run through the real Envoy with faults and a reload midway.

    make soak            (or: cd e2e && ../.venv/bin/python soak.py [--requests N] ...)

200,000 streamed completions (unique prompts) from the project's load client, closed loop at a
concurrency past the point where throughput stops rising, through Envoy with 2 worker threads
and the shipped envoy.yaml, in front of 3 simulated vLLM pods. Events are placed by progress
(requests Envoy completed):

    20 %  mark A0          phase A: steady load, nothing happens
    50 %  mark A1, reload  Envoy gets a new listener by file-based LDS (atomic rename into a
                           watched directory) whose filter has a changed configuration
                           (`metrics.period_ms` 500 -> 250 ms) and a rebuilt module (the same
                           code plus a custom section), as a rollout of a new build would:
                           Envoy must start new VMs, configure them and retire the old ones
    60 %  kill             one pod SIGKILLed, started again on its port 2 s later
    70 %  mark B0          phase B: the VMs that met one kill meet a second
    80 %  kill             the same pod again
    end   mark B1

Checks (exit status 1 if one fails; every figure is printed either way):
- lost requests: every failed request must have been in flight on the killed pod when it died
  (started before it was reaped, ended after the kill signal, answered by it);
- the reload: LDS accepted it, new VMs were created and configured (the filter's configure log
  line), the new tick period is in force (the scrape rate doubles from phase A to a quiet window
  after the load), and the old VMs are gone;
- memory flat after warm-up: over phase A and over phase B, Envoy's RSS within RSS_SLACK and
  every VM's linear memory unchanged. Between the phases the reload may raise the high-water
  mark (a second module compiled, two sets of VMs while the old listener drains); phase B holds
  a fault the VMs have met before, which must not raise it again;
- the filter's in-flight and prefill gauges back to 0 once the load has stopped;
- no retry dropped by the pool's max_retries, no upstream connection refused by its
  max_connections (a pod back from a restart would get none and serve its queue one request
  at a time).

The filter exports no memory gauge and Envoy none per VM (`wasm.*` stats count VMs, `/memory`
is Envoy's own heap), so each VM's linear memory is read from /proc/<envoy>/maps: V8 reserves
8 GiB of address space per Wasm memory and makes its first `memory.size` bytes read-write, so
the read-write mapping that ends where such a reservation begins is one VM's linear memory.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from warmroute_harness import LOADGEN_BIN, WASM, Envoy, Sim, free_port, get, spawn_envoy, stop_envoy, wasm_memories

# Envoy's RSS moves a little with allocator caches; a leak of 100 bytes a request would add
# 5 MiB over one phase (30 % of the requests).
RSS_SLACK_BYTES = 5 << 20
DOWN_S = 2.0
LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"


def leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def rebuilt_module(src: Path, dst: Path) -> Path:
    """The module plus one custom section: a different code hash (Envoy keys VMs by it) with
    the same code, as a new build of the filter would be."""
    name = b"warmroute.soak"
    payload = leb128(len(name)) + name + b"reload"
    dst.write_bytes(src.read_bytes() + b"\x00" + leb128(len(payload)) + payload)
    return dst


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class Sample:
    t: float
    completed: int
    rss: int
    heap: int
    vms: dict[int, int]
    active_vms: int
    scrapes: int  # the filter's scrapes, good and failed


@dataclass
class Kill:
    sent: float
    dead: float = 0.0
    restarted: float = 0.0


@dataclass
class Soak:
    args: argparse.Namespace
    logdir: Path
    sims: list[Sim] = field(default_factory=list)
    envoy: Envoy | None = None
    samples: list[Sample] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    reload_at: float = 0.0
    marks: dict[str, Sample] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def stats(self) -> dict[str, str]:
        return self.envoy.stats()

    def sample(self) -> Sample:
        st = self.stats()
        pid = self.envoy.proc.pid
        heap = json.loads(get(self.envoy.admin_port, "/memory")).get("allocated", "0")
        return Sample(time.time(), int(st.get("http.ingress.downstream_rq_completed", "0")), rss_bytes(pid),
                      int(heap), wasm_memories(pid), int(st.get("wasm.envoy.wasm.runtime.v8.active", "0")),
                      int(st.get("wasmcustom.warmroute.scrape.ok", "0"))
                      + int(st.get("wasmcustom.warmroute.scrape.failed", "0")))

    def sampler(self) -> None:
        while not self.stop.is_set():
            try:
                self.samples.append(self.sample())
            except OSError:
                pass
            self.stop.wait(1.0)

    # --- setup -------------------------------------------------------------------------------

    def start(self) -> None:
        # Small KV caches (100k tokens a pod): the filter's index replicas, sized from them, are
        # full and evicting within the first ~15k requests, so both phases run at capacity.
        sim_args = ["--time-scale", str(self.args.time_scale), "--kv-capacity-tokens", "100000"]
        self.sims = [Sim(f"sim-{i}", free_port(), sim_args).start(self.logdir) for i in range(3)]
        self.envoy = Envoy(self.sims, concurrency=2)
        cfg = self.envoy.render()
        self.listener = cfg["static_resources"].pop("listeners")[0]
        self.lds_dir = self.logdir / "lds"
        self.lds_dir.mkdir()
        # LDS from a file: Envoy watches the directory and reloads on a rename into it.
        cfg["node"] = {"id": "warmroute-soak", "cluster": "warmroute-soak"}
        cfg["dynamic_resources"] = {"lds_config": {
            "resource_api_version": "V3",
            "path_config_source": {"path": str(self.lds_dir / "listeners.yaml"),
                                   "watched_directory": {"path": str(self.lds_dir)}}}}
        self.write_lds(self.listener)
        # A replaced listener's connections drain for --drain-time-s (10 minutes by default),
        # then Envoy closes them, streams in flight included. Immediate: every response on an
        # old connection says `connection: close` from the start, so within a few seconds the
        # client has moved to the new filter and nothing is left to cut.
        self.envoy.proc = spawn_envoy(cfg, "envoy-soak", self.logdir, self.envoy.admin_port, 2,
                                      extra_args=("--drain-time-s", "5", "--drain-strategy", "immediate"))
        deadline = time.time() + 30
        while f":{self.envoy.port}" not in get(self.envoy.admin_port, "/listeners").decode():
            if time.time() > deadline:
                raise RuntimeError("the LDS listener never came up")
            time.sleep(0.1)

    def write_lds(self, listener: dict) -> None:
        tmp = self.lds_dir / ".listeners.yaml.tmp"
        tmp.write_text(json.dumps({"resources": [{"@type": LISTENER_TYPE, **listener}]}))
        os.rename(tmp, self.lds_dir / "listeners.yaml")

    def teardown(self) -> None:
        self.stop.set()
        if self.envoy is not None:
            stop_envoy(self.envoy.proc)
        for s in self.sims:
            s.stop()

    # --- events ------------------------------------------------------------------------------

    def kill_and_restart(self, victim: Sim) -> None:
        k = Kill(time.time())
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(10)
        k.dead = time.time()
        self.kills.append(k)
        time.sleep(DOWN_S)
        victim.start(self.logdir)
        k.restarted = time.time()

    def reload(self) -> None:
        listener = copy.deepcopy(self.listener)
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        wasm = next(f["typed_config"] for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.wasm")
        wasm["config"]["vm_config"]["code"]["local"]["filename"] = str(
            rebuilt_module(WASM, self.logdir / "warmroute-rebuilt.wasm"))
        fc = json.loads(wasm["config"]["configuration"]["value"])
        # The scrape timeout must stay below the period (the config check rejects it otherwise).
        fc["metrics"]["period_ms"], fc["metrics"]["timeout_ms"] = 250, 200
        wasm["config"]["configuration"]["value"] = json.dumps(fc, indent=1)
        self.reload_at = time.time()
        self.write_lds(listener)


def progress(soak: Soak) -> int:
    return soak.samples[-1].completed if soak.samples else 0


def run(args: argparse.Namespace) -> int:
    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="warmroute-soak-"))
    logdir.mkdir(parents=True, exist_ok=True)
    soak = Soak(args, logdir)
    t0 = time.time()
    try:
        soak.start()
        before = soak.stats()
        configured_before = configure_lines(logdir)
        sampler = threading.Thread(target=soak.sampler, daemon=True)
        sampler.start()
        report_path, records_path = logdir / "loadgen.json", logdir / "records.jsonl"
        loadgen = subprocess.Popen([
            str(LOADGEN_BIN), "uniform", "--requests", str(args.requests), "--rate", "1e9",
            "--concurrency", str(args.concurrency), "--prompt-tokens", "64", "--output-tokens", "8",
            "--max-seconds", str(args.max_seconds), "--timeout-s", "30", "--quiet",
            "--json", str(report_path), "--records", str(records_path),
            "--target", f"http://127.0.0.1:{soak.envoy.port}"])
        base = int(before.get("http.ingress.downstream_rq_completed", "0"))
        plan = [(0.20, "A0"), (0.50, "A1"), (0.50, "reload"), (0.60, "kill"), (0.70, "B0"), (0.80, "kill")]
        victim = soak.sims[1]
        for frac, what in plan:
            # A mark also waits for the restarted pod to be back in rotation (one tick).
            settle = max([k.restarted + 3 for k in soak.kills] + [0]) if what[0] in "AB" else 0
            while loadgen.poll() is None and (progress(soak) - base < frac * args.requests or time.time() < settle):
                time.sleep(0.05)
            if loadgen.poll() is not None:
                print(f"soak: the load ended before the {what} at {frac:.0%} (a faster machine: raise --requests)",
                      file=sys.stderr)
                break
            if what == "kill":
                soak.kill_and_restart(victim)
            elif what == "reload":
                soak.reload()
            else:
                soak.marks[what] = soak.sample()
        loadgen.wait(args.max_seconds + 60)
        end_of_load = soak.marks["B1"] = soak.sample()
        # Two ticks of the new period: the gauges are published at the tick.
        time.sleep(1.0)
        after = soak.stats()
        final = soak.sample()
        soak.stop.set()
        sampler.join(5)
        # The scrape rate of the new configuration, over a quiet window: all pods up, no load.
        time.sleep(3.0)
        quiet = soak.sample()
        configured_after = configure_lines(logdir)
        report = json.loads(report_path.read_text())
        records = [json.loads(line) for line in records_path.open()]
        return verdict(soak, args, before, after, end_of_load, final, quiet, report, records,
                       configured_before, configured_after, time.time() - t0)
    finally:
        soak.teardown()
        print(f"soak: logs in {logdir}")


def configure_lines(logdir: Path) -> int:
    log = logdir / "envoy-soak.log"
    return sum("warmroute: 3 backends, strategy" in line for line in log.read_text(errors="replace").splitlines())


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def verdict(soak: Soak, args, before, after, end_of_load: Sample, final: Sample, quiet: Sample,
            report: dict, records: list[dict], configured_before: int, configured_after: int,
            wall: float) -> int:
    problems: list[str] = []
    start = report["started_unix_ms"] / 1000
    victim = soak.sims[1].name
    failed = [r for r in records if r["outcome"] != "ok"]
    excused: dict[int, int] = {}
    lost = []
    for r in failed:
        s = start + r["start_ms"] / 1000
        e = s + r["e2e_ms"] / 1000
        k = next((i for i, k in enumerate(soak.kills)
                  if s < k.dead and e >= k.sent and r.get("replica") == victim), None)
        if k is None:
            lost.append(r)
        else:
            excused[k] = excused.get(k, 0) + 1

    print("\n== soak figures")
    print(f"wall time {wall:.0f} s (load {report['runtime_s']:.1f} s); requests {len(records)} of {args.requests}, "
          f"ok {report['ok']}, failed {len(failed)}, aborted {report['aborted']}, skipped {report['skipped']}")
    e2e = report.get("e2e_ms") or {}
    print(f"throughput {report['throughput_rps']:.0f} req/s at concurrency {args.concurrency}; "
          f"e2e ms p50 {e2e.get('p50', 0):.1f} p99 {e2e.get('p99', 0):.1f}; "
          f"served {report['served']}")
    for i, k in enumerate(soak.kills):
        print(f"kill {i + 1} of {victim} at +{k.sent - start:.1f} s (reaped in {1000 * (k.dead - k.sent):.0f} ms, "
              f"back at +{k.restarted - start:.1f} s): {excused.get(i, 0)} requests in flight on it failed")
    print(f"lost requests (failed, not in flight on the killed pod): {len(lost)}")
    for r in lost[:5]:
        print(f"   start +{r['start_ms'] / 1000:.3f} s replica {r.get('replica')} status {r.get('status')} {r.get('error')}")
    overflow = int(after.get("cluster.pool.upstream_rq_retry_overflow", "0"))
    pool = {k: int(after.get(f"cluster.pool.{k}", "0")) for k in (
        "upstream_rq_retry", "upstream_rq_retry_success", "upstream_cx_total", "upstream_cx_active",
        "upstream_cx_overflow", "upstream_rq_pending_overflow", "upstream_cx_connect_fail")}
    print(f"Envoy retries: {pool['upstream_rq_retry']} (succeeded {pool['upstream_rq_retry_success']}, "
          f"overflowed {overflow}); upstream connections: {pool['upstream_cx_total']} opened, "
          f"{pool['upstream_cx_active']} open at the end, {pool['upstream_cx_connect_fail']} refused, "
          f"{pool['upstream_cx_overflow']} over max_connections, "
          f"{pool['upstream_rq_pending_overflow']} requests over max_pending_requests")
    if overflow:
        problems.append(f"{overflow} retries dropped over max_retries")
    if pool["upstream_cx_overflow"]:
        problems.append("Envoy refused upstream connections over max_connections")
    if len(soak.kills) != 2:
        problems.append(f"{len(soak.kills)} kills instead of 2")
    if lost:
        problems.append(f"{len(lost)} requests lost")
    if report["aborted"] or report["skipped"] or len(records) != args.requests:
        problems.append("the load did not run to completion within --max-seconds")

    # The reload.
    lds = int(after.get("listener_manager.lds.update_success", "0")) - int(before.get("listener_manager.lds.update_success", "0"))
    created = int(after.get("wasm.envoy.wasm.runtime.v8.created", "0")) - int(before.get("wasm.envoy.wasm.runtime.v8.created", "0"))
    active_before = int(before.get("wasm.envoy.wasm.runtime.v8.active", "0"))
    active_after = int(after.get("wasm.envoy.wasm.runtime.v8.active", "0"))
    rate = scrape_rates(soak, final, quiet)
    print(f"reload at +{soak.reload_at - start:.1f} s: LDS updates accepted {lds}, VMs created {created}, "
          f"active VMs {active_before} before -> {active_after} at the end, "
          f"configure log lines {configured_before} -> {configured_after}, "
          f"scrapes/s {rate[0]:.1f} before -> {rate[1]:.1f} after")
    if soak.reload_at:
        if lds < 1 or created < 1 or configured_after <= configured_before:
            problems.append("the reload did not create and configure new VMs")
        if not rate[1] > 1.5 * rate[0]:
            problems.append("the new tick period is not in force after the reload")
        if active_after != active_before:
            problems.append(f"{active_after} VMs active at the end, {active_before} before the reload")
    else:
        problems.append("no reload happened")

    # Memory.
    m = soak.marks
    if set(m) != {"A0", "A1", "B0", "B1"}:
        problems.append(f"the run reached only the marks {sorted(m)}")
    else:
        print(f"Envoy RSS: A {mib(m['A0'].rss)} -> {mib(m['A1'].rss)}, B {mib(m['B0'].rss)} -> {mib(m['B1'].rss)}; "
              f"overall warm-up -> end of load {mib(m['A0'].rss)} -> {mib(m['B1'].rss)}, "
              f"peak {mib(max(s.rss for s in soak.samples))}, idle after {mib(final.rss)}")
        print(f"Envoy heap (tcmalloc allocated): A {mib(m['A0'].heap)} -> {mib(m['A1'].heap)}, "
              f"B {mib(m['B0'].heap)} -> {mib(m['B1'].heap)}")
        for phase in "AB":
            a, b = m[phase + "0"], m[phase + "1"]
            print(f"VM linear memory, phase {phase} (KiB): " + ", ".join(
                f"{a.vms[x] >> 10} -> {b.vms.get(x, 0) >> 10}" for x in sorted(a.vms)))
            if b.rss > a.rss + RSS_SLACK_BYTES:
                problems.append(f"Envoy RSS grew {mib(b.rss - a.rss)} over phase {phase}")
            if a.vms.keys() != b.vms.keys() or any(b.vms[x] != a.vms[x] for x in a.vms):
                problems.append(f"VM memory changed over phase {phase}")

    print("timeline (s, requests done, Envoy RSS MiB, heap MiB, VMs, their linear memory MiB):")
    step = max(1, len(soak.samples) // 24)
    for smp in soak.samples[::step]:
        print(f"   +{smp.t - start:5.1f} {smp.completed:7d} {smp.rss / (1 << 20):6.1f} {smp.heap / (1 << 20):5.1f}"
              f" {smp.active_vms} {sum(smp.vms.values()) / (1 << 20):5.1f}")
    with open(soak.logdir / "samples.jsonl", "w") as f:
        for smp in soak.samples:
            f.write(json.dumps({**smp.__dict__, "vms": {hex(a): v for a, v in smp.vms.items()}}) + "\n")

    # Gauges.
    gauges = {k.removeprefix("wasmcustom."): v for k, v in after.items()
              if k.startswith("wasmcustom.warmroute.backend.") and k.endswith((".inflight", ".prefill_blocks"))}
    print("gauges at the end: " + ", ".join(f"{k.removeprefix('warmroute.backend.')}={v}" for k, v in sorted(gauges.items())))
    if any(v != "0" for v in gauges.values()):
        problems.append("in-flight gauges not back to 0")

    print("\nsoak: " + ("PASS" if not problems else "FAIL: " + "; ".join(problems)))
    return 1 if problems else 0


def scrape_rates(soak: Soak, final: Sample, quiet: Sample) -> tuple[float, float]:
    """Scrapes (good or failed) per second under the first configuration, over phase A (no
    fault, no reload), and under the second, over a window after the load with every pod up."""
    def rate(a: Sample | None, b: Sample | None) -> float:
        return (b.scrapes - a.scrapes) / (b.t - a.t) if a and b and b.t > a.t else 0.0
    return rate(soak.marks.get("A0"), soak.marks.get("A1")), rate(final, quiet)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200_000)
    # Past the knee on a 2-core machine: throughput was flat from 384 up, latency rising.
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--time-scale", type=float, default=50)
    p.add_argument("--max-seconds", type=float, default=480)
    p.add_argument("--logdir")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
