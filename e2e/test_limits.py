"""Buffers and streams through the real Envoy: bodies past the listener's buffer are proxied, not
answered 413, and stalled HTTP/2 uploads cannot grow Envoy's memory past the shipped limits."""

from __future__ import annotations

import http.client
import json
import time

import pytest

from warmroute_harness import MODEL, Fleet, StalledUploads, chat, filter_config, post

FAST = ["--time-scale", "20"]
MiB = 1 << 20


def hcm(cfg: dict) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def debug(headers: dict[str, str]) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in headers.get("x-warmroute", "").split(";") if "=" in kv)


def big_chat(size: int) -> bytes:
    # 64-byte words: ~size/64 prompt tokens for the sim, far under its context limit.
    words = " ".join("w" * 63 + str(i % 10) for i in range(size // 64))
    return json.dumps(chat(MODEL, [{"role": "user", "content": words}], max_tokens=2)).encode()


def post_split(port: int, body: bytes, first: int) -> tuple[int, dict[str, str]]:
    """POSTs `body` chunked, without content-length: `first` bytes, a pause long enough for Envoy
    to hand them to the filter on their own, then the rest in one write. Envoy then delivers
    the rest in reads of a whole listener buffer, each added to what the filter already holds:
    the worst case for a buffering filter."""

    def pieces():
        yield body[:first]
        time.sleep(0.05)
        yield body[first:]

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/chat/completions", body=pieces(), headers={"content-type": "application/json"},
              encode_chunked=True)
    r = c.getresponse()
    r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}


@pytest.mark.parametrize(
    "max_body, fallback",
    [
        (None, None),  # the shipped max_body_bytes (8 MiB): the 2 MiB prompt is read and routed
        (512 * 1024, "too_large"),  # below the listener's 1 MiB: routed by load, still proxied
    ],
)
def test_a_body_past_the_listener_buffer_is_proxied_not_413(max_body, fallback):
    overrides = {"debug_header": True} | ({"max_body_bytes": max_body} if max_body else {})
    with Fleet(3, FAST, filter_overrides=overrides, listener_buffer_limit=MiB) as f:
        assert f.envoy.config["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"] == MiB
        body = big_chat(2 * MiB)
        assert len(body) > 2 * MiB
        r = post(f.envoy.port, "/v1/chat/completions", body)
        assert r.status == 200, r.body[:200]
        assert r.replica is not None
        assert debug(r.headers).get("fallback") == fallback
        for _ in range(3):
            status, headers = post_split(f.envoy.port, body, first=64 * 1024)
            assert status == 200, f"chunked 2 MiB body answered {status}"
            assert headers.get("x-sim-replica") is not None
            assert debug(headers).get("fallback") == fallback


def test_stalled_http2_uploads_leave_rss_bounded_and_envoy_serving():
    n, size = 100, 7 * MiB
    with Fleet(3, FAST) as f:
        cfg = f.envoy.config
        heap_limit = next(m["typed_config"]["max_heap_size_bytes"] for m in cfg["overload_manager"]["resource_monitors"]
                          if m["name"] == "envoy.resource_monitors.fixed_heap")
        h2opts = hcm(cfg)["http2_protocol_options"]
        body_limit = hcm(cfg)["route_config"]["virtual_hosts"][0]["request_body_buffer_limit"]
        max_body = filter_config(cfg).get("max_body_bytes", 8 * MiB)  # the filter's default when unset
        # The premises: all streams fit one connection, the filter holds every byte of each (it
        # waits for the end of a prompt below max_body_bytes), and together they need more than
        # the heap limit, so only the overload manager can keep Envoy under the bound.
        assert h2opts["max_concurrent_streams"] >= n
        assert size < max_body <= body_limit
        assert n * size > heap_limit
        idle = f.envoy.rss_bytes()
        # Everything the heap monitor admits (stream resets from 50% of it on, refusals from 95%)
        # on top of what Envoy holds idle (code, V8 VMs, its own heap). The last 5% covers what
        # arrives in one 50 ms refresh before the monitor reacts.
        bound = idle + heap_limit
        peak = idle

        def sample():
            nonlocal peak
            peak = max(peak, f.envoy.rss_bytes())

        with StalledUploads(f.envoy.port, n, size, MODEL) as up:
            up.pump(30, sample, until_sent=True)
            up.pump(1.0, sample)
            # Stalled or reset, the uploads must not take the gateway down.
            r = post(f.envoy.port, "/v1/chat/completions", chat(MODEL, [{"role": "user", "content": "still there?"}]),
                     timeout=10)
            assert r.status == 200 and r.replica is not None, (r.status, r.body[:200])
            up.pump(1.0, sample)
            reset = len(up.reset_by_server)
            stalled = len(up.open_streams)
        print(f"RSS idle {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, bound {bound / MiB:.0f} MiB; "
              f"{reset} streams reset by Envoy, {stalled} left stalled")
        assert peak <= bound, f"RSS peaked at {peak / MiB:.0f} MiB, over the {bound / MiB:.0f} MiB bound"
        assert reset > 0, "the overload manager reset no stream"
        assert reset + stalled == n
        # Closing the connection ends every stream Envoy still held.
        f.envoy.wait_for("no stream left active after the close",
                         lambda: f.envoy.stats().get("http.ingress.downstream_rq_active") == "0")
