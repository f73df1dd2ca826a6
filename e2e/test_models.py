"""Several models and a LoRA adapter behind one gateway: the request's model decides the pods.

What the filter knows of a pod's adapters and queue comes from its scrapes: tests wait for a
scrape of it that began after the state changed, and for every VM's tick after that, counted
in scrapes (Envoy's per-host counts), not seconds."""

from __future__ import annotations

import collections
import http.client
import json
from concurrent.futures import ThreadPoolExecutor

from warmroute_harness import Fleet, post, words

PERIOD_MS = 200
LLAMA, QWEN, SQL = "llama-8b", "qwen-7b", "sql-lora"
# sim-0..2 serve llama (sim-1 and sim-2 can load the sql adapter, one adapter at a time);
# sim-3 serves qwen.
SIM_ARGS = {
    "sim-0": ["--model", LLAMA],
    "sim-1": ["--model", LLAMA, "--enable-lora", "--max-loras", "1", "--lora-modules", f"{SQL}=/adapters/sql"],
    "sim-2": ["--model", LLAMA, "--enable-lora", "--max-loras", "1", "--lora-modules", f"{SQL}=/adapters/sql"],
    "sim-3": ["--model", QWEN],
}
DECLARED = {
    "sim-0": {"models": [LLAMA]},
    "sim-1": {"models": [LLAMA], "adapters": [SQL]},
    "sim-2": {"models": [LLAMA], "adapters": [SQL]},
    "sim-3": {"models": [QWEN]},
}


def fleet() -> Fleet:
    f = Fleet(4, ["--time-scale", "20"],
              filter_overrides={"route": {"model_header": "x-gateway-model-name"},
                                "metrics": {"period_ms": PERIOD_MS, "timeout_ms": 150}})
    for s in f.sims:
        s.args += SIM_ARGS[s.name]
    f.envoy.backend_fields = DECLARED
    return f


def ask(port: int, model: str, tag: str, tokens: int = 2):
    return post(port, "/v1/chat/completions",
                {"model": model, "max_tokens": tokens,
                 "messages": [{"role": "user", "content": f"{tag} " + words(tag, 200)}]})


def test_every_request_lands_on_a_pod_that_serves_its_model():
    with fleet() as f:
        jobs = [(m, f"{m}-{i}") for i in range(20) for m in (LLAMA, QWEN, SQL)]
        with ThreadPoolExecutor(6) as ex:
            replies = list(ex.map(lambda j: (j[0], ask(f.envoy.port, *j)), jobs))
        served = collections.defaultdict(collections.Counter)
        for model, r in replies:
            assert r.status == 200, (model, r.status, r.body[:200])
            served[model][r.replica] += 1
        assert set(served[QWEN]) == {"sim-3"}, served
        # 20 distinct llama prompts, placed by rendezvous on their hash (~uniform over 3 pods):
        # all on one with probability 3 (1/3)^20 = 9e-10.
        assert set(served[LLAMA]) <= {"sim-0", "sim-1", "sim-2"} and len(served[LLAMA]) >= 2, served
        assert set(served[SQL]) <= {"sim-1", "sim-2"}, served
        # No pod serves it, and every pod says what it serves: OpenAI's 404, not a random pod.
        r = ask(f.envoy.port, "mistral-7b", "m")
        assert r.status == 404 and r.replica is None, (r.status, r.headers)
        assert r.json()["error"]["code"] == "model_not_found"
        assert f.envoy.counter("warmroute.unknown_model") == 1


def test_adapter_requests_concentrate_where_it_is_loaded():
    with fleet() as f:
        holder = next(s for s in f.sims if s.name == "sim-2")
        # A long sql request straight to sim-2 keeps the adapter loaded there (running), and
        # its only adapter slot taken; sim-1 has a free slot.
        c = http.client.HTTPConnection("127.0.0.1", holder.port, timeout=30)
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": SQL, "max_tokens": 100_000, "stream": True,
             "messages": [{"role": "user", "content": words("hold", 50)}]}),
            {"content-type": "application/json"})
        resp = c.getresponse()
        resp.read1(1)
        try:
            f.envoy.wait_for("the adapter running on sim-2", lambda: f'running_lora_adapters="{SQL}"' in holder.metrics_text())
            f.envoy.wait_scraped(holder)  # a scrape of it, seen by every VM
            served = collections.Counter(ask(f.envoy.port, SQL, f"sql-{i}").replica for i in range(20))
        finally:
            c.close()
        assert served == {"sim-2": 20}, served


def test_adapter_requests_move_to_a_free_slot_once_the_loaded_pods_saturate():
    f = fleet()
    holder = next(s for s in f.sims if s.name == "sim-2")
    holder.args += ["--max-num-seqs", "1"]  # the held request takes its only sequence
    with f:
        c = http.client.HTTPConnection("127.0.0.1", holder.port, timeout=60)
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": SQL, "max_tokens": 100_000, "stream": True,
             "messages": [{"role": "user", "content": words("hold", 50)}]}),
            {"content-type": "application/json"})
        c.getresponse().read1(1)
        with ThreadPoolExecutor(8) as ex:
            try:
                f.envoy.wait_for("the adapter running on sim-2",
                                 lambda: f'running_lora_adapters="{SQL}"' in holder.metrics_text())
                f.envoy.wait_scraped(holder)
                # Adapter requests go where it is loaded and queue there (one sequence, held)...
                queued = [ex.submit(ask, f.envoy.port, SQL, f"queued-{i}") for i in range(8)]
                f.envoy.wait_for("4 queued on sim-2", lambda: holder.metrics().get("vllm:num_requests_waiting", 0) >= 4)
                f.envoy.wait_scraped(holder)  # a scrape shows the queue: saturated
                # ... until it saturates: then to the pod with a free adapter slot.
                after = collections.Counter(ask(f.envoy.port, SQL, f"after-{i}").replica for i in range(6))
            finally:
                c.close()
            first = collections.Counter(q.result(timeout=60).replica for q in queued)
        assert first["sim-2"] >= 4, first
        assert after == {"sim-1": 6}, after
