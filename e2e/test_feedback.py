"""The pods' own cache reports correct the filter's index when a pod evicted prefixes."""

from __future__ import annotations

import json

from warmroute_harness import MODEL, Fleet, post, words

DEBUG = {"debug_header": True, "debug_match_counts": True}


def matched(reply) -> int:
    fields = dict(kv.split("=", 1) for kv in reply.headers.get("x-warmroute", "").split(";") if "=" in kv)
    return int(fields["match"].split("/")[0])


def cached(reply) -> int:
    return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def ask(port: int, text: str):
    return post(port, "/v1/chat/completions",
                {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]})


def test_after_a_pod_evicts_prefixes_they_are_not_predicted_there_any_more():
    # One pod with 4k tokens of KV: two 1.5k-token prompts fit, three more evict them.
    with Fleet(1, ["--time-scale", "20", "--kv-capacity-tokens", "4000"],
               filter_overrides={"metrics": {"period_ms": 200, "timeout_ms": 150}, **DEBUG}) as f:
        pod = f.sims[0]
        older, newer = words("older", 1500), words("newer", 1500)
        ask(f.envoy.port, older)
        ask(f.envoy.port, newer)
        hit = ask(f.envoy.port, older)
        assert matched(hit) > 0 and cached(hit) > 0, (hit.headers, hit.body[-200:])
        hit = ask(f.envoy.port, newer)
        assert matched(hit) > 0 and cached(hit) > 0
        # Both evicted behind the filter's back: other long prompts straight to the pod.
        for i in range(3):
            post(pod.port, "/v1/chat/completions",
                 {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": words(f"evict{i}", 1500)}]})
        # The filter still predicts the newer prompt; the pod's answer says it had nothing.
        stale = ask(f.envoy.port, newer)
        assert matched(stale) > 0 and cached(stale) == 0, stale.headers
        assert f.envoy.counter("warmroute.feedback.evictions") >= 1
        # The older prompt, last used before it, is no longer predicted there either
        # (without the report the index would still credit the pod with it).
        again = ask(f.envoy.port, older)
        assert matched(again) == 0, again.headers
        assert cached(again) == 0


def test_an_operator_may_ask_the_pods_for_usage_on_streams():
    stream = {"model": MODEL, "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": words("s", 300)}]}
    for ask in (False, True):
        with Fleet(1, filter_overrides={"feedback": {"request_usage": ask}}) as f:
            reply = post(f.envoy.port, "/v1/chat/completions", stream)
            assert reply.status == 200, reply.body[:200]
            chunks = [json.loads(line[6:]) for line in reply.body.decode().splitlines()
                      if line.startswith("data: {")]
            usage = [c["usage"] for c in chunks if c.get("usage")]
            assert bool(usage) == ask, (ask, chunks[-2:])
            if ask:
                assert usage[-1]["prompt_tokens"] >= 300
                assert f.envoy.counter("warmroute.feedback.usage_requested") == 1


def test_requests_that_skip_the_pods_cache_forget_nothing():
    # Prompt logprobs make vLLM skip its prefix-cache reads: the pod reports 0 cached tokens
    # for a prefix it still holds. Taken as evictions, 20 of them would forget most of a
    # pod's older entries (up to an eighth of them each) in every VM.
    with Fleet(2, ["--time-scale", "20", "--kv-capacity-tokens", "200000"],
               filter_overrides={"metrics": {"period_ms": 200, "timeout_ms": 150}, **DEBUG}) as f:
        prompts = [words(f"doc{i}", 300) for i in range(50)]
        for p in prompts:
            assert ask(f.envoy.port, p).status == 200
        # The newest 20 again, each predicted where it is cached, with prompt logprobs or echo.
        for i, p in enumerate(prompts[30:]):
            skips = {"prompt_logprobs": 1} if i % 2 else {"echo": True}
            reply = post(f.envoy.port, "/v1/chat/completions",
                         {"model": MODEL, "max_tokens": 2, **skips,
                          "messages": [{"role": "user", "content": p}]})
            assert matched(reply) > 0 and cached(reply) == 0, (skips, reply.headers)
        assert f.envoy.counter("warmroute.feedback.evictions") == 0
        hits = 0
        for p in prompts:
            reply = ask(f.envoy.port, p)
            hits += matched(reply) > 0 and cached(reply) > 0
        assert hits >= 45, hits
