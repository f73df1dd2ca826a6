"""The real Envoy as a child process: the repository's config rendered for one run, and its stats.

The configuration is the repository's own `envoy.yaml` (or a variant under deploy/envoy/), patched
only where a run must differ: ports, backend list, the filter's JSON, concurrency, the pool's
load-balancing policy, the listener's buffer limit, headers the run itself sets as a trusted
stage would. Tests and the bench thus exercise the shipped config, not a copy.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import yaml

from .client import free_port, get, wait_http
from .repo import ROOT, WASM, envoy_binary
from .sim import Sim

T = TypeVar("T")


def spawn_envoy(cfg: dict, name: str, logdir: Path, admin_port: int, concurrency: int,
                level: str = "info", extra_args: tuple[str, ...] = ()) -> subprocess.Popen:
    """Starts Envoy on `cfg` (written to logdir/<name>.yaml, log in <name>.log) and waits until
    its admin port says ready. `--base-id` is the admin port, so several Envoys coexist;
    `extra_args` are more command-line flags (e.g. `--drain-time-s`)."""
    path = logdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log = open(logdir / f"{name}.log", "wb")
    proc = subprocess.Popen(
        [
            envoy_binary(),
            "-c", str(path),
            "--concurrency", str(concurrency),
            "--base-id", str(admin_port),
            "-l", level,
            "--disable-hot-restart",
            *extra_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    try:
        wait_http(admin_port, "/ready", timeout=30, proc=proc)
    except BaseException:
        # The caller never gets the process: stop it here rather than leak it.
        proc.kill()
        proc.wait(5)
        raise
    finally:
        log.close()  # the child keeps its own copy of the descriptor
    return proc


def stop_envoy(proc: subprocess.Popen | None, grace: float = 5) -> None:
    """SIGTERM, then SIGKILL if Envoy has not drained within `grace` seconds."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wasm_memories(pid: int) -> dict[int, int]:
    """Each V8 Wasm memory of the process: start address -> read-write bytes (memory.size).

    Neither the filter nor Envoy exports a VM's memory (`wasm.*` stats count VMs, `/memory` is
    Envoy's own heap), so it is read from /proc/<pid>/maps: V8 reserves 8 GiB of address space
    per Wasm memory and makes its first `memory.size` bytes read-write, so the read-write
    mapping that ends where such a reservation begins is one VM's linear memory."""
    maps = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
            if m:
                maps.append((int(m[1], 16), int(m[2], 16), m[3]))
    rw_ending_at = {hi: lo for lo, hi, perm in maps if perm.startswith("rw")}
    out = {}
    for lo, hi, perm in maps:
        if perm.startswith("---") and hi - lo >= 4 << 30 and lo in rw_ending_at:
            start = rw_ending_at[lo]
            out[start] = lo - start
    return out


def filter_config(envoy_cfg: dict) -> dict:
    """The warmroute JSON embedded in an Envoy config."""
    return json.loads(_wasm_filter(envoy_cfg)["config"]["configuration"]["value"])


def _wasm_filter(envoy_cfg: dict) -> dict:
    for listener in envoy_cfg["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                for hf in f["typed_config"].get("http_filters", []):
                    if hf["name"] == "envoy.filters.http.wasm":
                        return hf["typed_config"]
    raise KeyError("no wasm filter in the Envoy config")


def _deep_update(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


@dataclass
class Envoy:
    """The real Envoy with warmroute, configured from a repository YAML file."""

    sims: list[Sim]
    config_file: Path = ROOT / "envoy.yaml"
    concurrency: int = 2
    filter_overrides: dict = field(default_factory=dict)
    with_filter: bool = True
    lb: str | None = None  # replace the pool's policy: "round_robin" or "least_request" (no filter runs)
    # Sims that are endpoints of the pool clusters (default: all); the filter still lists every sim.
    endpoints: list[Sim] | None = None
    # Extra fields of the filter's backend entry per sim name (e.g. "models", "adapters").
    backend_fields: dict[str, dict] = field(default_factory=dict)
    wasm_file: Path = WASM  # the filter module (the overhead bench also loads a floor filter)
    listener_buffer_limit: int | None = None  # replace the listener's per_connection_buffer_limit_bytes
    access_log: str | None = None  # a text format: log each request to Envoy's stdout (its log file)
    port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log_path: Path | None = field(default=None, init=False)  # Envoy's log, set by start()
    config: dict = field(default_factory=dict)
    tick_s: float = 0.5  # the filter's tick period (metrics.period_ms), set by render()
    filter: dict = field(default_factory=dict)  # the filter's JSON as rendered (or reconfigured)
    # Serve the listener from a watched file (LDS) instead of static_resources, so that
    # reconfigure() can change the filter's JSON in the running Envoy (a VM reload).
    dynamic_listener: bool = False
    lds_path: Path | None = None
    # The pool's EDS file, for a config whose pool Envoy discovers (deploy/envoy/envoy-pool.yaml).
    eds_path: Path | None = None
    # Replace the config's stats_config (e.g. a control plane's, from its bootstrap).
    stats_config: dict | None = None
    # A bootstrap fragment Envoy merges over the config (--config-yaml), as istio-agent passes
    # a bootstrap override.
    config_yaml: str | None = None
    # Headers the shipped config strips from clients (early header mutation) that this run's
    # client sends itself, standing for the trusted stage an operator puts before warmroute
    # (e.g. the gate's class, which jwt_authn would set from a token). Each must be stripped
    # by the config, or rendering fails: a test must not believe it bypasses a strip that
    # is not there.
    trusted_headers: tuple[str, ...] = ()
    # With a config that has a `warmroute-peers` cluster (deploy/envoy/envoy-peers.yaml): this
    # replica's peer port, and every replica's (the cluster's endpoints; default: its own).
    peer_port: int = field(default_factory=free_port)
    peer_ports: list[int] = field(default_factory=list)
    # The address the peer port binds (replicas found by DNS share one port, each its own address),
    # and a whole warmroute-peers cluster to use instead of the config's (e.g. the STRICT_DNS one
    # deploy/envoy-gateway/generate.py ships); peer_ports then lists nothing.
    peer_host: str = "127.0.0.1"
    peers_cluster: dict | None = None

    def render(self) -> dict:
        cfg = yaml.safe_load(self.config_file.read_text())
        cfg["admin"]["address"]["socket_address"]["port_value"] = self.admin_port
        if self.stats_config is not None:
            cfg["stats_config"] = copy.deepcopy(self.stats_config)
        listener = cfg["static_resources"]["listeners"][0]
        listener["address"]["socket_address"]["port_value"] = self.port
        if self.listener_buffer_limit is not None:
            listener["per_connection_buffer_limit_bytes"] = self.listener_buffer_limit
        wasm = _wasm_filter(cfg)
        wasm["config"]["vm_config"]["code"]["local"]["filename"] = str(self.wasm_file)
        fc = filter_config(cfg)
        if "pool" not in fc:  # a discovered pool lists no addresses
            fc["backends"] = [
                {**(fc["backends"][i] if i < len(fc["backends"]) else {}), "name": s.name, "address": s.address,
                 **self.backend_fields.get(s.name, {})}
                for i, s in enumerate(self.sims)
            ]
        has_peers = any(c["name"] == "warmroute-peers" for c in cfg["static_resources"]["clusters"])
        if has_peers:
            sa = listener["additional_addresses"][0]["address"]["socket_address"]
            sa["address"], sa["port_value"] = self.peer_host, self.peer_port
            fc["peers"]["port"] = self.peer_port
        _deep_update(fc, self.filter_overrides)
        self.filter = fc
        self.tick_s = fc.get("metrics", {}).get("period_ms", 500) / 1000
        wasm["config"]["configuration"]["value"] = json.dumps(fc, indent=1)
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        if self.access_log is not None:
            hcm["access_log"] = [{
                "name": "envoy.access_loggers.stdout",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
                    "log_format": {"text_format_source": {"inline_string": self.access_log + "\n"}},
                },
            }]
        if not self.with_filter:
            hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.wasm"]
        if self.trusted_headers:
            strips = [m for ext in hcm.get("early_header_mutation_extensions", [])
                      for m in ext["typed_config"]["mutations"]]
            missing = set(self.trusted_headers) - {m.get("remove") for m in strips}
            if missing:
                raise ValueError(f"{self.config_file.name} does not strip {sorted(missing)}")
            for ext in hcm["early_header_mutation_extensions"]:
                ext["typed_config"]["mutations"] = [m for m in ext["typed_config"]["mutations"]
                                                    if m.get("remove") not in self.trusted_headers]
        for cluster in cfg["static_resources"]["clusters"]:
            eds = cluster.get("eds_cluster_config", {}).get("eds_config", {}).get("path_config_source")
            if eds is not None and self.eds_path is not None:
                eds["path"] = str(self.eds_path)
                eds["watched_directory"] = {"path": str(self.eds_path.parent)}
            if cluster["name"] == "warmroute-peers" and self.peers_cluster is not None:
                cluster.clear()
                cluster.update(copy.deepcopy(self.peers_cluster))
            elif cluster["name"] == "warmroute-peers":
                cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
                    for p in (self.peer_ports or [self.peer_port])
                ]
            if cluster["name"] == "envoy-admin":
                sa = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                sa["socket_address"]["port_value"] = self.admin_port
            eps = cluster.get("load_assignment", {}).get("endpoints")
            if cluster["name"] in ("pool", "pool-metrics") and eps is not None:
                eps[0]["lb_endpoints"] = [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": s.port}}}}
                    for s in (self.sims if self.endpoints is None else self.endpoints)
                ]
                if self.lb and cluster["name"] == "pool":
                    cluster.pop("load_balancing_policy", None)
                    cluster["lb_policy"] = self.lb.upper()
            elif cluster["name"].startswith("sim-") and eps is not None:
                idx = int(cluster["name"].split("-")[1])
                if idx < len(self.sims):
                    sa = eps[0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
                    sa["port_value"] = self.sims[idx].port
        self.config = cfg
        return cfg

    def start(self, logdir: Path) -> "Envoy":
        for attempt in range(3):
            try:
                return self._start(logdir)
            except RuntimeError:
                log = logdir / f"envoy-{self.port}.log"
                lost_port = log.exists() and "Address already in use" in log.read_text(errors="replace")
                if attempt == 2 or not lost_port:
                    raise
                # free_port() saw the ports free, but another socket (the fleet's own
                # outgoing connections use ephemeral ports) took one before Envoy bound it.
                self.port, self.admin_port = free_port(), free_port()
        raise AssertionError("unreachable")

    def _start(self, logdir: Path) -> "Envoy":
        if "eds_cluster_config" in self.config_file.read_text():
            self.eds_path = logdir / f"eds-{self.port}" / "pool.yaml"
            self.eds_path.parent.mkdir(exist_ok=True)
            self.set_endpoints(self.sims if self.endpoints is None else self.endpoints)
        cfg = self.render()
        if self.dynamic_listener:
            self.lds_path = logdir / f"lds-{self.port}" / "listeners.yaml"
            self.lds_path.parent.mkdir(exist_ok=True)
            self._write_listeners()
            cfg = copy.deepcopy(cfg)
            cfg["static_resources"].pop("listeners")
            cfg.setdefault("node", {"id": f"warmroute-{self.port}", "cluster": "warmroute"})
            cfg["dynamic_resources"] = {"lds_config": {"resource_api_version": "V3", "path_config_source": {
                "path": str(self.lds_path), "watched_directory": {"path": str(self.lds_path.parent)}}}}
        # A replaced listener (and the filter config it holds, whose VM still ticks) drains
        # for 1 s rather than Envoy's default 10 minutes, so a reconfiguration completes.
        extra = ("--drain-time-s", "1") if self.dynamic_listener else ()
        if self.config_yaml is not None:
            extra += ("--config-yaml", self.config_yaml)
        # The bench reads the filter's log by this name (envoy-<port>.log).
        self.proc = spawn_envoy(cfg, f"envoy-{self.port}", logdir, self.admin_port, self.concurrency,
                                extra_args=extra)
        self.log_path = logdir / f"envoy-{self.port}.log"
        return self

    def set_endpoints(self, sims: list[Sim]) -> None:
        """Replaces the pool's endpoints (file-based EDS, one rename): what a control plane
        does when pods come and go."""
        cla = {"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
               "cluster_name": "pool",
               "endpoints": [{"lb_endpoints": [
                   {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": s.port}}}}
                   for s in sims]}]}
        tmp = self.eds_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"resources": [cla]}, sort_keys=False))
        tmp.rename(self.eds_path)

    def _write_listeners(self) -> None:
        """Replaces the LDS file in one rename, which is what the watched directory reacts to."""
        listeners = [{"@type": "type.googleapis.com/envoy.config.listener.v3.Listener", **listener}
                     for listener in self.config["static_resources"]["listeners"]]
        tmp = self.lds_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"resources": listeners}, sort_keys=False))
        tmp.rename(self.lds_path)

    def reconfigure(self, filter_overrides: dict, timeout: float = 10) -> None:
        """Changes the filter's JSON in the running Envoy (needs `dynamic_listener`): the new
        listener's filter configures a new root context in each VM, and the old listener
        drains with its own (which ticks, and scrapes, until then). Returns once the new
        listener serves and the old one is gone."""
        assert self.lds_path is not None, "reconfigure needs dynamic_listener=True"
        wasm = _wasm_filter(self.config)
        fc = filter_config(self.config)
        _deep_update(fc, filter_overrides)
        wasm["config"]["configuration"]["value"] = json.dumps(fc, indent=1)
        self.filter = fc
        self.tick_s = fc.get("metrics", {}).get("period_ms", 500) / 1000
        before = int(self.stats().get("listener_manager.lds.update_success", "0"))
        self._write_listeners()
        deadline = time.time() + timeout
        def settled() -> bool:
            st = self.stats()
            return (int(st.get("listener_manager.lds.update_success", "0")) > before
                    and st.get("listener_manager.total_listeners_draining") == "0"
                    and st.get("listener_manager.total_filter_chains_draining", "0") == "0")
        while not settled():
            if time.time() > deadline:
                raise TimeoutError("Envoy did not take the new listener (see its log)")
            time.sleep(0.05)

    def stop(self) -> None:
        stop_envoy(self.proc)

    def pids(self) -> list[int]:
        """The processes that make up this gateway (whose CPU time is its cost): Envoy alone
        here; a gateway with a companion process (the bench's ext_proc picker) adds it."""
        if self.proc is None:
            raise RuntimeError("Envoy is not running")
        return [self.proc.pid]

    def rss_bytes(self) -> int:
        """Envoy's resident set size now (VmRSS of /proc/<pid>/status)."""
        if self.proc is None:
            raise RuntimeError("Envoy is not running")
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc/<pid>/status")

    def wasm_memories(self) -> dict[int, int]:
        """Each Wasm VM's linear memory in bytes, by its start address (see `wasm_memories`)."""
        if self.proc is None:
            raise RuntimeError("Envoy is not running")
        return wasm_memories(self.proc.pid)

    def stats(self) -> dict[str, str]:
        """Every counter and gauge by name, from the admin's JSON stats (histograms left out).

        Values are text, as the admin's plain `/stats` page prints them, so a stat compares
        with "0" whatever its kind; int() it for arithmetic."""
        doc = json.loads(get(self.admin_port, "/stats?format=json"))
        return {s["name"]: str(s["value"]) for s in doc["stats"] if "name" in s}

    def settled_stats(self, ticks: int = 3, timeout: float = 30) -> dict[str, str]:
        """Stats once the filter's VMs have flushed what they counted: the filter adds request
        counts to Envoy's counters at its tick, not per request. Counted in ticks of the lease
        holder (see `ticks`), not in seconds, so a late tick on a loaded machine only waits
        longer; every VM ticks on the same period, so `ticks` of the holder's cover one of
        each. Without a tick clock (metrics off, fixed list) it can only wait 2 periods."""
        if self.has_tick_clock():
            self.wait_ticks(ticks, timeout)
        else:
            time.sleep(2 * self.tick_s + 0.1)
        return self.stats()

    def stat(self, name: str, stats: dict[str, str] | None = None) -> int:
        """One counter or gauge as a number (0 when absent)."""
        v = (self.stats() if stats is None else stats).get(name, "0")
        try:
            return int(v)
        except ValueError:
            return 0

    def wait_for(self, what: str, ready: Callable[[], T], timeout: float = 30, poll: float = 0.02,
                 detail: Callable[[], str] | None = None) -> T:
        """Polls `ready` until it returns something truthy, and returns that. The timeout is a
        hang guard, not the assertion: tests count events (scrapes, reads, requests), and a
        timeout only says the event never came, failing with `what` in the message, what
        `detail` says of the test's own state, and Envoy's warnings (CI keeps no log files).
        Envoy exiting fails at once, also when `ready` itself asks Envoy's admin."""
        deadline = time.time() + timeout
        while True:
            exited = self.proc is not None and self.proc.poll() is not None
            if not exited:
                try:
                    got = ready()
                except OSError:
                    if self.proc is None or self.proc.poll() is None:
                        raise
                    exited = True
                else:
                    if got:
                        return got
            if exited or time.time() > deadline:
                why = (f"Envoy exited with {self.proc.returncode}" if exited
                       else f"not seen within {timeout:.0f} s")
                raise AssertionError(f"hang guard: {what} {why}{self._said(detail)}\n{self.log_warnings()}")
            time.sleep(poll)

    @staticmethod
    def _said(detail: Callable[[], str] | None) -> str:
        """What `detail` says, or why it could not: never in place of the guard's own message."""
        if detail is None:
            return ""
        try:
            return f"; {detail()}"
        except Exception as e:  # noqa: BLE001 (whatever failed, the guard's own message comes out)
            return f"; (detail failed: {e!r})"

    def log_warnings(self, last: int = 20) -> str:
        """The last `last` lines of Envoy's log at warning level or above (the filter's own
        warnings included), and its last line whatever its level."""
        path = self.log_path
        try:
            lines = path.read_text(errors="replace").splitlines() if path else None
        except OSError as e:
            return f"(Envoy's log unreadable: {e})"
        if lines is None:
            return "(no Envoy log)"
        bad = [x for x in lines if any(f"[{lv}]" in x for lv in ("warning", "error", "critical"))]
        tail = bad[-last:] + [x for x in lines[-1:] if not bad or x != bad[-1]]
        return f"{path.name}, {len(bad)} warnings or worse; last:\n" + "\n".join(x[:300] for x in tail)

    def host_stats(self, cluster: str) -> dict[int, dict[str, int]]:
        """Envoy's per-host counters of `cluster` (admin /clusters), by the host's port.

        Envoy before 1.38 ignores `filter` and lists every cluster; `pool` and `pool-metrics`
        share their hosts' ports, so only the named cluster's entry is read."""
        doc = json.loads(get(self.admin_port, f"/clusters?format=json&filter=^{cluster}$"))
        out: dict[int, dict[str, int]] = {}
        for c in doc.get("cluster_statuses", []):
            if c.get("name") != cluster:
                continue
            for h in c.get("host_statuses", []):
                port = h["address"]["socket_address"]["port_value"]
                out[port] = {s["name"]: int(s.get("value") or 0) for s in h.get("stats", []) if "name" in s}
        return out

    def scrapes(self, sim: Sim | None = None) -> int:
        """Scrapes that have ended (answered or failed), counted by Envoy's metrics cluster
        per host as they end, not at the filter's tick: of `sim`, or of the most scraped
        pod (one per tick of the lease holder, while its previous scrape is not pending)."""
        hosts = self.host_stats("pool-metrics")
        ended = {port: h.get("rq_success", 0) + h.get("rq_error", 0) for port, h in hosts.items()}
        if sim is not None:
            return ended.get(sim.port, 0)
        return max(ended.values(), default=0)

    def wait_scraped(self, sim: Sim, ticks: int = 2, timeout: float = 30) -> None:
        """Waits until a scrape of `sim` that began after the call has ended (two more have: the
        first may have been under way) and every VM has had a tick to read what it published
        (`ticks` more of the holder's, one period apart, as every VM's are)."""
        start = self.scrapes(sim)
        self.wait_for(f"2 scrapes of {sim.name} (at {start})", lambda: self.scrapes(sim) >= start + 2, timeout)
        self.wait_ticks(ticks, timeout)

    def membership_reads(self) -> int:
        """Reads of a discovered pool's endpoints that have ended: the lease holder makes one per
        tick, through the `envoy-admin` cluster."""
        return self.stat("cluster.envoy-admin.upstream_rq_completed")

    def has_tick_clock(self) -> bool:
        """Whether `ticks` can count: the shipped filter runs and reads a discovered pool or
        scrapes through the `pool-metrics` cluster (a floor filter, or none, has no tick)."""
        if not self.with_filter or self.wasm_file != WASM:
            return False
        clusters = {c["name"] for c in self.config.get("static_resources", {}).get("clusters", [])}
        if "pool" in self.filter:
            return "envoy-admin" in clusters
        return self.filter.get("metrics", {}).get("enabled", True) and "pool-metrics" in clusters

    def ticks(self) -> int:
        """A clock that counts the lease holder's ticks from Envoy's stats: a discovered pool's
        membership reads, else the scrapes of the most scraped pod. Only the holder's ticks
        are observable; the filter exports no per-VM tick count."""
        if not self.has_tick_clock():
            raise RuntimeError("no tick clock: no filter, or metrics off and the pool a fixed list")
        return self.membership_reads() if "pool" in self.filter else self.scrapes()

    def wait_ticks(self, n: int, timeout: float = 30, detail: Callable[[], str] | None = None) -> int:
        """Waits until the lease holder has ticked `n` more times; returns the clock."""
        start = self.ticks()
        return self.wait_for(f"{n} ticks of the filter (clock at {start})",
                             lambda: (t := self.ticks()) >= start + n and t, timeout, detail=detail)

    def counter(self, name: str) -> int:
        """The filter's counter `name` once settled (see `settled_stats`)."""
        return self.stat(f"wasmcustom.{name}", self.settled_stats())
