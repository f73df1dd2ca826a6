"""Soak: a long saturated run through the real Envoy, the gate on, a discovered pool, with faults
and reloads midway.

    make soak            (or: cd e2e && ../.venv/bin/python soak.py [--requests N] [--pool 500] ...)

`make soak` runs it twice: as below, then over a pool of 500 pods (the Makefile's SOAK_POOL_ARGS:
a knee of one request, 1024 in flight, a 1 s scrape period, a smaller index).

Streamed completions (unique prompts) from the project's load client, closed loop at a
concurrency past the point where throughput stops rising, through Envoy with 2 worker threads
and the shipped deploy/envoy/envoy-pool.yaml: the pods are the `pool` cluster's endpoints,
discovered by EDS from a watched file, and the filter reads them from Envoy's admin `/clusters`.
The gate is on, with a knee of `--knee` requests per pod that the load keeps every pod past:
most requests wait at the gate and leave it as others end. The pool:

    sim-0 .. sim-2   pods that serve (sim-1 is the one killed)
    sim-stall        holds every response for --stall-ms after its first byte; its engine runs
                     on, so its /metrics shows it idle while its clients still wait
    sim-500          answers a share (--error-rate) of its completion requests 500 at once
                     (vLLM's error body); its /metrics and /health still answer
    sim-spare        takes sim-2's place in the pool and gives it back (EDS)
    sim-x*           with --pool N: more pods that serve, up to N endpoints in all

Events are placed by progress (requests Envoy completed):

    10 %  swap             EDS: sim-2 leaves the pool (its requests in flight finish), sim-spare joins
    20 %  mark A0          phase A: steady load, nothing happens
    40 %  mark A1, reload  Envoy gets a new listener by file-based LDS (atomic rename into a
                           watched directory) whose filter has a changed configuration
                           (`metrics.period_ms` halved, 500 -> 250 ms) and a rebuilt module (the same
                           code plus a custom section), as a rollout of a new build would:
                           Envoy must start new VMs, configure them and retire the old ones
    45 %  swap             back: sim-2 in, sim-spare out (once the old VMs are gone: the new
                           ones, which hold the scrape lease from then on, meet it)
    50 %  kill             sim-1 SIGKILLed, started again on its port 2 s later
    70 %  mark B0          phase B: the VMs that met one swap and one kill meet them again
    75 %  swap
    80 %  kill
    85 %  swap             back: the pool ends as it began
    end   mark B1

Each phase starts after its VMs have seen a few times the index's capacity in requests (an
index replica's hash map may double under eviction churn for that long after it filled,
filter/core/src/routing/index: a high-water mark, not a leak) and have ticked WARM_TICKS times
(the scraping VM's memory settles in ticks: it reads the pool, ~420 KB for 500 pods, and every
pod's /metrics at each).

Checks (exit status 1 if one fails; every figure is printed either way):
- lost requests: every failed request must have been in flight on the killed pod when it died
  (started before it was reaped, ended after the kill signal, answered by it), or be a 500 that
  sim-500 itself answered (the pod's answer, passed on; counted and printed). A 429 from the
  gate is lost too: no class's queue or wait limit is reached by this load;
- the reload: LDS accepted it, new VMs were created and configured (the filter's configure log
  line), the new tick period is in force (the scrape rate doubles from phase A to a quiet window
  after the load), and the old VMs are gone;
- memory flat after warm-up: over phase A and over phase B, Envoy's RSS within RSS_SLACK (plus
  what the connections its pools newly keep open hold, CONNECTION_BYTES each) and every VM's
  linear memory unchanged. Between the phases the reload may raise the high-water
  mark (a second module compiled, two sets of VMs while the old listener drains); phase B holds
  faults the VMs have met before, which must not raise it again;
- the filter's in-flight and prefill gauges, and the gate's held-request gauges, back to 0 once
  the load has stopped; nothing held at the gate at the end;
- no retry dropped by the pool's max_retries, no upstream connection refused by its
  max_connections (a pod back from a restart would get none and serve its queue one request
  at a time).

Each VM's linear memory is read from /proc/<envoy>/maps (`warmroute_harness.wasm_memories`).
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from warmroute_harness import (LOADGEN_BIN, ROOT, WASM, Envoy, Sim, free_port, get, spawn_envoy, stop_envoy,
                               wasm_memories)

# Envoy's RSS moves a little with allocator caches; a leak of 100 bytes a request would add
# 6 MiB over phase A of the default run (60k requests), 9 MiB over phase B.
RSS_SLACK_BYTES = 5 << 20
# What an upstream connection Envoy keeps open holds (its objects, codec and socket; its buffers
# are released when empty): 15.8 KiB of tcmalloc's live heap each, measured by closing 400 and
# 800 idle connections to a pod. The pools grow to the most requests a pod ever had at once,
# which the stalling pod and the gate keep raising for a while: a phase may grow Envoy's RSS by
# this much per connection its pools' high-water mark rose, on top of RSS_SLACK.
CONNECTION_BYTES = 16 << 10
DOWN_S = 2.0
# The reload's drain and the client's idle pool (see Soak.start): the slowest response in these
# runs is about 3.2 s (a held request on the stalling pod), well inside DRAIN_S - POOL_IDLE_S.
DRAIN_S = 12
POOL_IDLE_S = 2
# Reads of the pool after Envoy applied a swap by which every VM routes over the new list
# (e2e/test_pool.py: the read under way may predate it, the next publishes the slot table,
# every VM applies it at its next tick, one more for a VM that ticks just after the holder).
APPLIED_WITHIN = 4
# Ticks of a set of VMs before a phase starts (20 % of the default run is ~14 s, ~28 ticks).
WARM_TICKS = 24
LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
POOL_CONFIG = ROOT / "deploy" / "envoy" / "envoy-pool.yaml"


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


def start_all(sims: list[Sim], logdir: Path) -> None:
    """Starts every sim, a few dozen at a time (a 500-pod pool starts in seconds, not minutes)."""
    with ThreadPoolExecutor(32) as pool:
        for f in [pool.submit(s.start, logdir) for s in sims]:
            f.result()


@dataclass
class Sample:
    t: float
    completed: int
    rss: int
    heap: int
    vms: dict[int, int]
    active_vms: int
    scrapes: int  # the filter's scrapes, good and failed
    held: int  # requests held at the gate (the gauge, every class)
    pool: int  # endpoints in Envoy's pool cluster
    upstream: int  # open connections to the pods
    reply: int = 0  # bytes of the admin's /clusters reply the filter reads (at the marks only)


@dataclass
class Kill:
    sent: float
    dead: float = 0.0
    restarted: float = 0.0


@dataclass
class Swap:
    at: float
    out: str
    into: str


@dataclass
class Soak:
    args: argparse.Namespace
    logdir: Path
    sims: list[Sim] = field(default_factory=list)
    pool: list[Sim] = field(default_factory=list)  # the pool's endpoints now
    envoy: Envoy | None = None
    samples: list[Sample] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    swaps: list[Swap] = field(default_factory=list)
    reload_at: float = 0.0
    start_ticks: int = 0  # the lease holder's reads of the pool at the start of the load
    reload_ticks: int = 0  # and at the reload
    vms_before_reload: int = 0
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
                      + int(st.get("wasmcustom.warmroute.scrape.failed", "0")),
                      sum(int(v) for k, v in st.items() if k.startswith("wasmcustom.warmroute.gate.")
                          and k.endswith(".queued")),
                      int(st.get("cluster.pool.membership_total", "0")),
                      int(st.get("cluster.pool.upstream_cx_active", "0")))

    def mark(self) -> Sample:
        """A sample, and the size of the pool's admin reply: the scraping VM reads it whole each
        tick, and it grows with the digits of Envoy's per-host counters."""
        smp = self.sample()
        smp.reply = len(get(self.envoy.admin_port, "/clusters?format=json&filter=^pool$"))
        return smp

    def sampler(self) -> None:
        while not self.stop.is_set():
            try:
                self.samples.append(self.sample())
            except OSError:
                pass
            self.stop.wait(1.0)

    # --- setup -------------------------------------------------------------------------------

    def start(self) -> None:
        a = self.args
        # Small KV caches (100k tokens a pod): the filter's index replicas, sized from them, are
        # full and evicting within the first ~15k requests, so both phases run at capacity.
        base = ["--time-scale", str(a.time_scale), "--kv-capacity-tokens", "100000"]
        serving = [Sim(f"sim-{i}", free_port(), base) for i in range(3)]
        self.victim, self.leaver = serving[1], serving[2]
        self.stall = Sim("sim-stall", free_port(), base + ["--stall-after-first-byte-ms", str(a.stall_ms)])
        self.erring = Sim("sim-500", free_port(), base + ["--error-rate", str(a.error_rate)])
        self.spare = Sim("sim-spare", free_port(), base)
        named = [*serving, self.stall, self.erring]
        fillers = [Sim(f"sim-x{i}", free_port(), base) for i in range(max(0, a.pool - len(named)))]
        self.sims = [*named, self.spare, *fillers]
        start_all(self.sims, self.logdir)
        self.pool = [*named, *fillers]
        gate = {"knee": {"requests": a.knee},
                # One class whose queue and wait hold the whole load: a 429 here is a fault.
                "classes": [{"name": "standard", "max_wait_ms": 30000, "max_queue": 4096}],
                "default_class": "standard"}
        slots = max(64, len(self.pool) + 1)
        # stale_after_ms: its default (2000) unless the period needs more (2 periods + a timeout).
        metrics = {"period_ms": a.period_ms, "timeout_ms": a.period_ms * 4 // 5,
                   "stale_after_ms": max(2000, 3 * a.period_ms)}
        overrides = {"gate": gate, "pool": {"max_backends": slots}, "metrics": metrics}
        if a.max_blocks:
            overrides["index"] = {"max_blocks": a.max_blocks}
        self.envoy = Envoy(self.sims, config_file=POOL_CONFIG, concurrency=2, filter_overrides=overrides)
        self.envoy.eds_path = self.logdir / "eds" / "pool.yaml"
        self.envoy.eds_path.parent.mkdir()
        self.envoy.set_endpoints(self.pool)
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
        # old connection says `connection: close` from the start. A connection idle in the
        # client's pool gets no response to say it, so the client drops idle connections after
        # POOL_IDLE_S (below the drain time, as a client behind a reloading proxy must): after
        # that, a request can only go out on an old connection in the first POOL_IDLE_S
        # seconds, and DRAIN_S - POOL_IDLE_S leaves it three times the slowest response here.
        self.envoy.proc = spawn_envoy(cfg, "envoy-soak", self.logdir, self.envoy.admin_port, 2,
                                      extra_args=("--drain-time-s", str(DRAIN_S), "--drain-strategy", "immediate"))
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

    def settle(self) -> None:
        """Waits until the pool is whole in every VM: Envoy holds the swapped list and the
        filter has read it (APPLIED_WITHIN reads), and a restarted pod has answered two scrapes
        since (`Envoy.wait_scraped`: then every VM has had the ticks that bring it back)."""
        e = self.envoy
        e.wait_for(f"Envoy's pool at {len(self.pool)} pods",
                   lambda: e.stat("cluster.pool.membership_total") == len(self.pool))
        e.wait_ticks(APPLIED_WITHIN)
        if self.kills:
            e.wait_scraped(self.victim)

    def swap(self) -> None:
        """EDS: the leaver and the spare trade places in the pool, whichever is in now."""
        out, into = (self.leaver, self.spare) if self.leaver in self.pool else (self.spare, self.leaver)
        self.pool = [into if s is out else s for s in self.pool]
        self.swaps.append(Swap(time.time(), out.name, into.name))
        self.envoy.set_endpoints(self.pool)

    def reload(self) -> None:
        listener = copy.deepcopy(self.listener)
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        wasm = next(f["typed_config"] for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.wasm")
        wasm["config"]["vm_config"]["code"]["local"]["filename"] = str(
            rebuilt_module(WASM, self.logdir / "warmroute-rebuilt.wasm"))
        fc = json.loads(wasm["config"]["configuration"]["value"])
        # The scrape timeout must stay below the period (the config check rejects it otherwise).
        period = self.args.period_ms // 2
        fc["metrics"]["period_ms"], fc["metrics"]["timeout_ms"] = period, period * 4 // 5
        wasm["config"]["configuration"]["value"] = json.dumps(fc, indent=1)
        self.reload_at = time.time()
        self.reload_ticks = self.envoy.ticks()
        self.vms_before_reload = self.envoy.stat("wasm.envoy.wasm.runtime.v8.active")
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
        # The load starts once the filter has read the pool: before that it routes by Envoy's
        # fallback policy, which this run is not about.
        e = soak.envoy
        e.wait_for("Envoy's pool", lambda: e.stat("cluster.pool.membership_total") == len(soak.pool))
        e.wait_for("two reads of the pool", lambda: e.membership_reads() >= 2)
        soak.start_ticks = e.ticks()
        before = soak.stats()
        configured_before = configure_lines(logdir)
        sampler = threading.Thread(target=soak.sampler, daemon=True)
        sampler.start()
        report_path, records_path = logdir / "loadgen.json", logdir / "records.jsonl"
        loadgen = subprocess.Popen([
            str(LOADGEN_BIN), "uniform", "--requests", str(args.requests), "--rate", "1e9",
            "--concurrency", str(args.concurrency), "--prompt-tokens", "64", "--output-tokens", "8",
            "--max-seconds", str(args.max_seconds), "--timeout-s", "30", "--pool-idle-s", str(POOL_IDLE_S), "--quiet",
            "--json", str(report_path), "--records", str(records_path),
            "--target", f"http://127.0.0.1:{soak.envoy.port}"])
        base = int(before.get("http.ingress.downstream_rq_completed", "0"))
        plan = [(0.10, "swap"), (0.20, "A0"), (0.40, "A1"), (0.40, "reload"), (0.45, "swap"), (0.50, "kill"),
                (0.70, "B0"), (0.75, "swap"), (0.80, "kill"), (0.85, "swap")]
        for frac, what in plan:
            while loadgen.poll() is None and progress(soak) - base < frac * args.requests:
                time.sleep(0.05)
            # A mark waits for the pool to be whole again in every VM: a restarted pod scraped
            # and back in rotation, a swap read (events the load goes on through).
            if what[0] in "AB" and loadgen.poll() is None:
                soak.settle()
            # A phase starts once its VMs have ticked WARM_TICKS times: the scraping VM's
            # memory settles in ticks (a read of the pool and a scrape of each pod per tick).
            if what in ("A0", "B0") and loadgen.poll() is None:
                since = soak.reload_ticks if what == "B0" else soak.start_ticks
                e.wait_for(f"{WARM_TICKS} ticks before {what}", lambda: e.ticks() >= since + WARM_TICKS,
                           timeout=WARM_TICKS * e.tick_s * 4 + 30)
            if loadgen.poll() is not None:
                print(f"soak: the load ended before the {what} at {frac:.0%} (a faster machine: raise --requests)",
                      file=sys.stderr)
                break
            if what == "kill":
                soak.kill_and_restart(soak.victim)
            elif what == "swap":
                if soak.reload_at:
                    # The new VMs' first swap must be theirs, not the draining VMs' (which share
                    # the scrape lease): phase B then holds only faults they have met.
                    e.wait_for("the old VMs retired", lambda: e.stat("wasm.envoy.wasm.runtime.v8.active")
                               <= soak.vms_before_reload)
                soak.swap()
            elif what == "reload":
                soak.reload()
            else:
                soak.marks[what] = soak.mark()
        loadgen.wait(args.max_seconds + 60)
        end_of_load = soak.marks["B1"] = soak.mark()
        # Ticks of the new period: the gauges are published at the tick (counted by the pool's
        # reads, one per tick of the lease holder; every VM ticks on the same period).
        e.wait_ticks(4)
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
    return sum("warmroute: " in line and ", strategy " in line
               for line in log.read_text(errors="replace").splitlines())


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def verdict(soak: Soak, args, before, after, end_of_load: Sample, final: Sample, quiet: Sample,
            report: dict, records: list[dict], configured_before: int, configured_after: int,
            wall: float) -> int:
    problems: list[str] = []
    start = report["started_unix_ms"] / 1000
    victim = soak.victim.name
    failed = [r for r in records if r["outcome"] != "ok"]
    excused: dict[int, int] = {}
    lost, erred = [], []
    for r in failed:
        s = start + r["start_ms"] / 1000
        e = s + r["e2e_ms"] / 1000
        k = next((i for i, k in enumerate(soak.kills)
                  if s < k.dead and e >= k.sent and r.get("replica") == victim), None)
        if k is not None:
            excused[k] = excused.get(k, 0) + 1
        elif r.get("status") == 500 and r.get("replica") == soak.erring.name:
            erred.append(r)
        else:
            lost.append(r)

    print("\n== soak figures")
    print(f"wall time {wall:.0f} s (load {report['runtime_s']:.1f} s); requests {len(records)} of {args.requests}, "
          f"ok {report['ok']}, failed {len(failed)}, aborted {report['aborted']}, skipped {report['skipped']}")
    e2e = report.get("e2e_ms") or {}
    print(f"throughput {report['throughput_rps']:.0f} req/s at concurrency {args.concurrency}; "
          f"e2e ms p50 {e2e.get('p50', 0):.1f} p99 {e2e.get('p99', 0):.1f}")
    served = report["served"]
    fill = [v for k, v in served.items() if k.startswith("sim-x")]
    print("served by " + ", ".join(f"{k} {v}" for k, v in served.items() if not k.startswith("sim-x"))
          + (f"; {len(fill)} filler pods {min(fill)}-{max(fill)} each" if fill else ""))
    for i, k in enumerate(soak.kills):
        print(f"kill {i + 1} of {victim} at +{k.sent - start:.1f} s (reaped in {1000 * (k.dead - k.sent):.0f} ms, "
              f"back at +{k.restarted - start:.1f} s): {excused.get(i, 0)} requests in flight on it failed")
    for w in soak.swaps:
        print(f"swap at +{w.at - start:.1f} s: {w.out} left the pool, {w.into} joined")
    routed = lambda name: sum(1 for r in records if r.get("replica") == name)  # noqa: E731
    print(f"{soak.erring.name} answered {len(erred)} requests 500 ({len(erred) / max(1, len(records)):.1%} of all)")
    stalled = sorted(r["e2e_ms"] for r in records if r.get("replica") == soak.stall.name and r["outcome"] == "ok")
    if stalled:
        print(f"{soak.stall.name} served {len(stalled)} requests, e2e ms p50 {stalled[len(stalled) // 2]:.0f} "
              f"max {stalled[-1]:.0f} (stall {args.stall_ms} ms after the first byte)")
    else:
        problems.append(f"{soak.stall.name} served nothing: its stall was not exercised")
    if not erred:
        problems.append(f"{soak.erring.name} answered nothing: its 500s were not exercised")
    if len(soak.pool) > 6:
        fillers = [x for x in soak.pool if x.name.startswith("sim-x")]
        print(f"pool of {len(soak.pool)} pods: {sum(1 for x in fillers if routed(x.name))} of {len(fillers)} "
              f"filler pods served requests")
    print(f"lost requests (failed, not in flight on the killed pod, not {soak.erring.name}'s own 500): {len(lost)}")
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
        print(f"the pool's admin reply (bytes): A {m['A0'].reply} -> {m['A1'].reply}, "
              f"B {m['B0'].reply} -> {m['B1'].reply}")
        for phase in "AB":
            a, b = m[phase + "0"], m[phase + "1"]
            opened = max(0, high_water(soak, b) - high_water(soak, a))
            allowed = RSS_SLACK_BYTES + opened * CONNECTION_BYTES
            print(f"phase {phase}: Envoy RSS {mib(a.rss)} -> {mib(b.rss)}, connections to the pods at most "
                  f"{high_water(soak, a)} -> {high_water(soak, b)}: RSS may grow {mib(allowed)}")
            print(f"VM linear memory, phase {phase} (KiB): " + ", ".join(
                f"{a.vms[x] >> 10} -> {b.vms.get(x, 0) >> 10}" for x in sorted(a.vms)))
            if b.rss > a.rss + allowed:
                problems.append(f"Envoy RSS grew {mib(b.rss - a.rss)} over phase {phase}")
            if a.vms.keys() != b.vms.keys() or any(b.vms[x] != a.vms[x] for x in a.vms):
                problems.append(f"VM memory changed over phase {phase}")

    print("timeline (s, requests done, Envoy RSS MiB, heap MiB, VMs, their linear memory MiB, "
          "requests held at the gate, connections to the pods):")
    step = max(1, len(soak.samples) // 24)
    for smp in soak.samples[::step]:
        print(f"   +{smp.t - start:5.1f} {smp.completed:7d} {smp.rss / (1 << 20):6.1f} {smp.heap / (1 << 20):5.1f}"
              f" {smp.active_vms} {sum(smp.vms.values()) / (1 << 20):5.1f} {smp.held:4d} {smp.upstream:5d}")
    with open(soak.logdir / "samples.jsonl", "w") as f:
        for smp in soak.samples:
            f.write(json.dumps({**smp.__dict__, "vms": {hex(a): v for a, v in smp.vms.items()}}) + "\n")

    # The gate.
    gate = {k.removeprefix("wasmcustom.warmroute.gate."): int(v) for k, v in after.items()
            if k.startswith("wasmcustom.warmroute.gate.")}
    classes = sorted({k.split(".")[0] for k in gate})
    for c in classes:
        g = {k.split(".", 1)[1]: v for k, v in gate.items() if k.startswith(c + ".")}
        released = g.get("released", 0)
        print(f"gate {c}: admitted {g.get('admitted', 0)}, held {g.get('held', 0)}, released {released} "
              f"(mean wait {g.get('wait_ms', 0) / max(1, released):.0f} ms), shed {g.get('shed_deadline', 0)} "
              f"past their deadline and {g.get('shed_queue_full', 0)} over a full queue, "
              f"{g.get('abandoned', 0)} abandoned by their client; held at most "
              f"{max((x.held for x in soak.samples), default=0)} at once (1 s samples)")
        if not g.get("held", 0):
            problems.append("the gate held nothing: the load never took every pod past its knee")

    # Gauges.
    gauges = {k.removeprefix("wasmcustom."): v for k, v in after.items()
              if k.startswith("wasmcustom.warmroute.backend.") and k.endswith((".inflight", ".prefill_blocks"))}
    busy = {k: v for k, v in gauges.items() if v != "0"}
    print(f"gauges at the end: {len(gauges)} in-flight and prefill gauges, {len(busy)} not 0"
          + (": " + ", ".join(f"{k}={v}" for k, v in sorted(busy.items())) if busy else ""))
    if busy:
        problems.append("in-flight gauges not back to 0")
    queued = {k: v for k, v in gate.items() if k.endswith(".queued") and v}
    if queued:
        problems.append(f"requests still held at the gate at the end: {queued}")

    print("\nsoak: " + ("PASS" if not problems else "FAIL: " + "; ".join(problems)))
    return 1 if problems else 0


def high_water(soak: Soak, at: Sample) -> int:
    """The most connections to the pods Envoy held at once up to `at` (1 s samples)."""
    return max([s.upstream for s in soak.samples if s.t <= at.t] + [at.upstream])


def scrape_rates(soak: Soak, final: Sample, quiet: Sample) -> tuple[float, float]:
    """Scrapes (good or failed) per second under the first configuration, over phase A (no
    fault, no reload), and under the second, over a window after the load with every pod up."""
    def rate(a: Sample | None, b: Sample | None) -> float:
        return (b.scrapes - a.scrapes) / (b.t - a.t) if a and b and b.t > a.t else 0.0
    return rate(soak.marks.get("A0"), soak.marks.get("A1")), rate(final, quiet)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300_000)
    # Past the knee on a 2-core machine: throughput was flat from 384 up, latency rising.
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--time-scale", type=float, default=50)
    p.add_argument("--max-seconds", type=float, default=480)
    # Every pod past this many requests in flight holds requests at the gate; the load keeps
    # 512 in flight over 5 pods that serve.
    p.add_argument("--knee", type=int, default=16)
    p.add_argument("--stall-ms", type=int, default=1000)
    # Not 1: a pod that fails every request at once looks idle, and the router and the gate,
    # which count a 500 as the pod's answer (it may be the client's fault), send it a large
    # share of the load (46 % of all requests at rate 1, 5 pods), leaving the gate little to do.
    p.add_argument("--error-rate", type=float, default=0.25)
    p.add_argument("--pool", type=int, default=0, help="pods in the pool in all (more pods that serve added)")
    # The reload halves it. Every pod is scraped once a period: a 500-pod pool wants a longer one.
    p.add_argument("--period-ms", type=int, default=500)
    # Each phase must start after its VMs' index replicas have churned through a few times
    # their capacity (see the top); a 500-pod pool's would need millions of requests at the
    # default (262144), so that run bounds it as a smaller gateway would.
    p.add_argument("--max-blocks", type=int, default=0, help="index.max_blocks (0: the default)")
    p.add_argument("--logdir")
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
