"""A hot prefix spreads before it hurts (issue 17, section 3), through the real Envoy.

guidellm's synthetic data with `prefix_tokens=1000,prompt_tokens=500` at concurrency 8 is
the first thing many users run: every request shares one 1000-token prefix. Before
replication, the two pods that first saw it kept it (each up to `balance.warm_min_cap`
requests) and the third never received it.
"""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor

from warmroute_harness import MODEL, Fleet, post, words

PREFIX = words("hot", 1000)
CLIENTS = 8
PER_CLIENT = 10


def test_one_hot_prefix_at_concurrency_8_reaches_all_3_pods():
    # Real-time replicas (12 ms per step): each request's 48 output tokens hold it on its
    # pod for ~0.6 s, against a client's ~1 ms between two requests, so 8 clients keep
    # about 8 requests in flight. The test asserts outcomes only, not times.
    #
    # Where the outcome depends on timing: the filter balances the two warm pods by load,
    # so with k other requests in flight on them the less loaded holds floor(k/2), and it
    # copies the prefix to the idle third pod as soon as that is >= 3 (replicate_gap 2 +
    # the copy's cost, 0.5 of a typical request), i.e. at any arrival that finds >= 6 of
    # the other 7 clients' requests in flight. For that never to happen, every one of the
    # >= 70 arrivals after the first round would have to find >= 2 of 7 clients between
    # requests. Even if a client were between requests 30% of the time (it is ~0.2%),
    # that is 1 - 0.7^7 - 7 * 0.3 * 0.7^6 = 0.67 per arrival, and 0.67^70 < 1e-12.
    # Rendezvous placement (the fleet's ports are new each run) only decides which pods
    # are warm first, not whether the third gets a copy.
    with Fleet(3, ["--time-scale", "1"]) as f:
        def client(c: int) -> list[tuple[str | None, int]]:
            out = []
            for i in range(PER_CLIENT):
                r = post(f.envoy.port, "/v1/completions",
                         {"model": MODEL, "prompt": f"{PREFIX} {words(f'c{c}r{i}_', 500)}", "max_tokens": 48})
                assert r.status == 200, r.body
                out.append((r.replica, r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]))
            return out

        with ThreadPoolExecutor(CLIENTS) as ex:
            served = [x for xs in ex.map(client, range(CLIENTS)) for x in xs]
        per_pod = collections.Counter(pod for pod, _ in served)
        # The prefix reached every pod: each served requests from its own cached copy.
        warm = {pod for pod, cached in served if cached >= 900}
        assert warm == {s.name for s in f.sims}, (per_pod, warm)
