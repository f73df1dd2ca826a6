"""A fleet on 127.0.0.1: N simulated vLLM replicas behind one or more real Envoys."""

from __future__ import annotations

import tempfile
from pathlib import Path

from .client import free_port
from .envoy import Envoy
from .sim import Sim


class Fleet:
    """N sims + one or more Envoys; a context manager that always tears down.

    Several gateways (`gateways` > 1) share the same sims, each with its own filter state,
    as several Envoy deployments in front of one inference fleet would."""

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
        # Replicas of one gateway (a config with peers) each list every replica's peer port.
        for e in self.envoys:
            e.peer_ports = [g.peer_port for g in self.envoys]

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
        """The fleet's prefix-cache (hits, queries) in tokens, summed over the sims."""
        hits = queries = 0.0
        for s in self.sims:
            m = s.metrics()
            hits += m.get("vllm:prefix_cache_hits_total", 0.0)
            queries += m.get("vllm:prefix_cache_queries_total", 0.0)
        return hits, queries
