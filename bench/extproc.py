"""The peers' architecture as a gateway of the overhead bench: the shipped Envoy config with an
ext_proc filter, configured as the Gateway API Inference Extension configures it
(bench/extproc-floor/envoy-ext-proc.yaml says where each setting comes from), in place of
warmroute's Wasm filter, calling the no-op picker (bench/extproc-floor) on 127.0.0.1.

The gateway's cost is Envoy's and the picker's together: `pids()` names both processes, and
the overhead bench sums their CPU time.
"""

from __future__ import annotations

import copy
import select
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from warmroute_harness import ROOT, Envoy

EXTPROC_PACKAGE = "warmroute-extproc-floor"
FRAGMENT = ROOT / "bench" / "extproc-floor" / "envoy-ext-proc.yaml"


def start_picker(binary: Path, endpoints: list[str], logdir: Path, threads: int = 1,
                 timeout: float = 20) -> tuple[subprocess.Popen, int]:
    """Starts the picker on a free loopback port; returns it and the port it printed."""
    log = open(logdir / f"extproc-picker-{int(time.time() * 1000)}.log", "wb")
    proc = subprocess.Popen([str(binary), "--listen", "127.0.0.1:0", "--endpoints", ",".join(endpoints),
                             "--threads", str(threads)], stdout=subprocess.PIPE, stderr=log)
    log.close()
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline().decode() if ready else ""
        if not line.startswith("listening "):
            raise RuntimeError(f"the ext_proc picker did not start (exit {proc.poll()}, said {line!r})")
        return proc, int(line.rsplit(":", 1)[1])
    except BaseException:
        proc.kill()
        proc.wait(5)
        raise


@dataclass
class ExtProcEnvoy(Envoy):
    """The shipped Envoy config, its Wasm filter replaced by the Inference Extension's ext_proc
    filter and cluster, with the no-op picker as a child process started beside Envoy."""

    picker_bin: Path = field(default=ROOT / "target" / "release" / EXTPROC_PACKAGE)
    picker_threads: int = 1
    picker: subprocess.Popen | None = None
    picker_port: int = 0

    def render(self) -> dict:
        cfg = super().render()
        frag = yaml.safe_load(FRAGMENT.read_text())
        hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        i = next(i for i, f in enumerate(hcm["http_filters"]) if f["name"] == "envoy.filters.http.wasm")
        hcm["http_filters"][i] = copy.deepcopy(frag["filter"])
        cluster = copy.deepcopy(frag["cluster"])
        sa = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
        sa["port_value"] = self.picker_port
        cfg["static_resources"]["clusters"].append(cluster)
        self.config = cfg
        return cfg

    def start(self, logdir: Path) -> "ExtProcEnvoy":
        endpoints = [s.address for s in (self.sims if self.endpoints is None else self.endpoints)]
        self.picker, self.picker_port = start_picker(self.picker_bin, endpoints, logdir, self.picker_threads)
        try:
            super().start(logdir)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        super().stop()
        if self.picker and self.picker.poll() is None:
            self.picker.terminate()
            try:
                self.picker.wait(5)
            except subprocess.TimeoutExpired:
                self.picker.kill()
                self.picker.wait(5)

    def pids(self) -> list[int]:
        return [self.proc.pid, self.picker.pid]

    def has_tick_clock(self) -> bool:
        return False
