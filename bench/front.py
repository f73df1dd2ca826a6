"""A round-robin front for a gateway's replicas whose members change during a run, and the
load client started in the background so that a bench can act while it runs.

The front is one plain Envoy (no filter) with one listener per *slot*; each slot proxies to
its own cluster of one endpoint, read from a file (file-based EDS, replaced in one rename, as
a control plane would). The load client spreads its requests round robin over the slots'
ports (`--target` repeated), so the front is a round-robin load balancer whose every request
says which slot took it (the client's record `gateway`), and each slot's endpoint at each
moment is known to the bench: a replica that joins is a slot pointed at it, one that leaves
is a slot pointed at another replica. `point` returns once the front serves the new endpoint
(read from its admin), so a request the client sent after that instant went there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from warmroute_harness import LOADGEN_BIN, free_port
from warmroute_harness.client import get
from warmroute_harness.envoy import spawn_envoy, stop_envoy


def _eds(cluster: str, port: int) -> dict:
    return {"resources": [{
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}]}


class Front:
    """`slots` listeners, each in front of one replica's client port at a time."""

    def __init__(self, slots: int, logdir: Path):
        self.logdir = logdir
        self.ports = [free_port() for _ in range(slots)]
        self.admin_port = free_port()
        self.proc: subprocess.Popen | None = None

    def _path(self, slot: int) -> Path:
        return self.logdir / f"front-eds-{slot}" / "slot.yaml"

    def _write(self, slot: int, port: int) -> None:
        path = self._path(slot)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(_eds(f"slot-{slot}", port), sort_keys=False))
        tmp.rename(path)

    def start(self, targets: list[int]) -> "Front":
        """Starts the front with slot i in front of client port targets[i]."""
        listeners, clusters = [], []
        for i, (port, target) in enumerate(zip(self.ports, targets)):
            self._write(i, target)
            listeners.append({
                "name": f"slot-{i}", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                                 ".HttpConnectionManager",
                        "stat_prefix": f"slot-{i}", "stream_idle_timeout": "600s",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                            {"match": {"prefix": "/"}, "route": {"cluster": f"slot-{i}", "timeout": "0s"}}]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]})
            path = self._path(i)
            clusters.append({
                "name": f"slot-{i}", "type": "EDS", "connect_timeout": "1s",
                # As many streams as the client can hold open (the defaults queue past 1024).
                "circuit_breakers": {"thresholds": [{"max_connections": 8192, "max_pending_requests": 8192,
                                                     "max_requests": 8192}]},
                "eds_cluster_config": {"eds_config": {"resource_api_version": "V3", "path_config_source": {
                    "path": str(path), "watched_directory": {"path": str(path.parent)}}}}})
        cfg = {"node": {"id": "front", "cluster": "front"},
               "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": self.admin_port}}},
               "static_resources": {"listeners": listeners, "clusters": clusters}}
        # One worker: the front only relays some tens of requests/s, and the 2 cores are the fleet's.
        self.proc = spawn_envoy(cfg, "front", self.logdir, self.admin_port, 1)
        for i, target in enumerate(targets):
            self._wait(i, target)
        return self

    def _serves(self, slot: int) -> list[int]:
        doc = json.loads(get(self.admin_port, f"/clusters?format=json&filter=^slot-{slot}$"))
        return [h["address"]["socket_address"]["port_value"]
                for c in doc.get("cluster_statuses", []) for h in c.get("host_statuses", [])]

    def _wait(self, slot: int, port: int, timeout: float = 10) -> None:
        deadline = time.time() + timeout
        while self._serves(slot) != [port]:
            if time.time() > deadline:
                raise TimeoutError(f"front slot {slot} did not move to port {port} (serves {self._serves(slot)})")
            time.sleep(0.01)

    def point(self, slot: int, port: int) -> float:
        """Puts `slot` in front of client port `port`; returns the Unix time (ms) from which
        the front sends the slot's new requests there."""
        self._write(slot, port)
        self._wait(slot, port)
        return time.time() * 1e3

    def stop(self) -> None:
        stop_envoy(self.proc)

    def __enter__(self) -> "Front":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Load:
    """`warmroute-loadgen` in the background: started, then waited for (bounded twice, by its own
    --max-seconds and by the wait's timeout), its report and per-request records read."""

    def __init__(self, args: list[str], targets: list[int], backends: list[str], outdir: Path, max_seconds: float):
        self.json, self.records = outdir / "report.json", outdir / "records.jsonl"
        cmd = [str(LOADGEN_BIN), *args, "--json", str(self.json), "--records", str(self.records), "--quiet",
               "--max-seconds", str(max_seconds), "--timeout-s", str(max_seconds)]
        for p in targets:
            cmd += ["--target", f"http://127.0.0.1:{p}"]
        for b in backends:
            cmd += ["--backend", b]
        self.max_seconds = max_seconds
        self.t0_ms = time.time() * 1e3
        self.proc = subprocess.Popen(cmd)

    def wait(self) -> tuple[dict, list[dict]]:
        try:
            rc = self.proc.wait(self.max_seconds + 60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        if rc != 0:
            raise RuntimeError(f"warmroute-loadgen exited {rc}")
        rep = json.loads(self.json.read_text())
        recs = [json.loads(line) for line in self.records.read_text().splitlines() if line.strip()]
        return rep, recs

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def sleep_until(self, seconds: float) -> None:
        """Sleeps until `seconds` after the client started (at once if that has passed)."""
        time.sleep(max(0.0, self.t0_ms / 1e3 + seconds - time.time()))


def hit_of(recs: list[dict]) -> tuple[float | None, int]:
    """Σcached / Σprompt tokens over successful records (the pods' own count, from each
    response's usage), and how many records that is."""
    ok = [r for r in recs if r["outcome"] == "ok" and r.get("prompt_tokens")]
    prompt = sum(r["prompt_tokens"] for r in ok)
    return ((sum(r.get("cached_tokens") or 0 for r in ok) / prompt) if prompt else None), len(ok)


def main(doc: str, workloads: list[str], choices: list[str], name: str, rounds, summary, report) -> int:
    """The command line of a bench built on the front (scale_midway.py, peer_faults.py):
    `rounds(n, workloads, logdir, out)` runs, `summary` reduces their rows, `report` prints."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", default=workloads, choices=choices)
    ap.add_argument("--out", default=f"{name}.jsonl")
    a = ap.parse_args()
    t = time.time()
    logdir = Path(tempfile.mkdtemp(prefix=f"warmroute-{name.replace('_', '-')}-"))
    report(summary(rounds(a.rounds, a.workloads, logdir, Path(a.out))))
    print(f"wall time {time.time() - t:.0f} s")
    return 0
