"""One simulated vLLM replica (`warmroute-sim`) as a child process on 127.0.0.1."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .client import get, wait_http
from .prom import sums_by_name
from .repo import SIM_BIN


@dataclass
class Sim:
    """One simulated vLLM replica; `args` are extra `warmroute-sim` flags (time scale, KV size...)."""

    name: str
    port: int
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: Path | None = field(default=None, init=False)  # its stdout and stderr, set by start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, logdir: Path) -> "Sim":
        if not SIM_BIN.exists():
            raise RuntimeError(f"{SIM_BIN} missing: run `make build`")
        self.log_path = logdir / f"{self.name}.log"
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(SIM_BIN), "--port", str(self.port), "--name", self.name, *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_http(self.port, "/health", proc=self.proc)
        return self

    def state(self) -> str:
        """Running, exited (with its code) or not started, and what it printed besides its
        start line (a panic, a failed bind)."""
        if self.proc is None:
            return f"{self.name} not started"
        code = self.proc.poll()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path else []
        except OSError as e:
            lines = [f"(log unreadable: {e})"]
        lines = [x for x in lines if not x.startswith("warmroute-sim listening")]
        said = f", said: {' | '.join(x[:200] for x in lines[-3:])}" if lines else ""
        return f"{self.name} {'running' if code is None else f'exited {code}'}{said}"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def metrics_text(self) -> str:
        """The sim's /metrics as served (labels included)."""
        return get(self.port, "/metrics").decode()

    def metrics(self) -> dict[str, float]:
        """Unlabelled view of the sim's /metrics: metric name → value summed over label sets."""
        return sums_by_name(self.metrics_text())
