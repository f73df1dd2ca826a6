"""Scrapes of pods whose sidecars require Istio mTLS (PeerAuthentication STRICT), through the real
Envoy and the real filter.

Each simulated pod sits behind its "sidecar": an Envoy listener that terminates TLS and requires a
client certificate signed by the mesh CA, for /metrics and the API alike. The gateway runs
deploy/envoy/envoy-mtls.yaml: its pool and scrape clusters (`pool`, `pool-metrics`) speak mTLS to
endpoints marked tlsMode: istio, as Istio's own outbound clusters and istio/generate.py's
warmroute-metrics do, with the certificate (`default`) and root CA (`ROOTCA`) from SDS files that
stand in for istio-agent. A CA and certificates are made per run (harness/warmroute_harness/tls.py).

With the certificate, every scrape is answered and every pod reads as up. The control takes the
certificate out of the scrape cluster only: the sidecars refuse every scrape's handshake, every
pod reads as down, and the filter routes on its own counts (issue #30's failure), while requests
still pass. Time is counted in events: scrapes of each pod as Envoy's scrape cluster counts them
per host when they end, and ticks of the lease holder; waits have timeouts as hang guards only."""

from __future__ import annotations

from warmroute_harness import MODEL, post
from warmroute_harness.tls import MtlsFleet

UNHEALTHY_AFTER = 2
SCRAPES = 3  # answered (or failed) scrapes of every pod before the verdict is read
OVERRIDES = {"strategy": "round_robin", "debug_header": True,
             "metrics": {"period_ms": 200, "timeout_ms": 150, "stale_after_ms": 1000, "unhealthy_after": UNHEALTHY_AFTER}}


def scrapes(f: MtlsFleet, outcome: str) -> dict[str, int]:
    """Scrapes of each pod that ended with `outcome` (rq_success, rq_error), by pod name."""
    hosts = f.envoy.host_stats("pool-metrics")
    return {p.name: hosts.get(p.port, {}).get(outcome, 0) for p in f.pods}


def wait_scrapes(f: MtlsFleet) -> None:
    """Until SCRAPES scrapes of every pod have ended, answered or failed (so a wrong outcome
    fails the assertion that follows, not the hang guard), then 2 ticks of the lease holder:
    every VM has read the verdicts and flushed its counters."""
    def ended() -> dict[str, int]:
        ok, failed = scrapes(f, "rq_success"), scrapes(f, "rq_error")
        return {name: ok[name] + failed[name] for name in ok}
    f.envoy.wait_for(f"{SCRAPES} ended scrapes of every pod", lambda: min(ended().values()) >= SCRAPES,
                     detail=lambda: f"ended {ended()}")
    f.envoy.wait_ticks(2)


def test_with_the_proxys_certificate_every_scrape_passes_strict_mtls():
    with MtlsFleet(2, ["--time-scale", "20"], filter_overrides=OVERRIDES) as f:
        e = f.envoy
        wait_scrapes(f)
        st = e.stats()
        assert scrapes(f, "rq_error") == {p.name: 0 for p in f.pods}
        assert e.stat("wasmcustom.warmroute.scrape.failed", st) == 0
        assert e.stat("wasmcustom.warmroute.scrape.ok", st) >= SCRAPES * len(f.pods)
        assert {p.name: st.get(f"wasmcustom.warmroute.backend.{p.name}.healthy") for p in f.pods} == \
            {p.name: "1" for p in f.pods}
        # Over TLS, with the certificate SDS `default` gave the scrape cluster, which each pod's
        # sidecar checked against the CA.
        assert e.stat("cluster.pool-metrics.ssl.handshake", st) >= len(f.pods)
        assert "cluster.pool-metrics.ssl.certificate.default.expiration_unix_time_seconds" in st
        side = f.sidecars.stats()
        for p in f.pods:
            tls = f.sidecars.tls(p, side)
            assert tls.get("handshake", 0) >= 1 and tls.get("fail_verify_no_cert", 0) == 0, (p.name, tls)
        # The API is behind the sidecars too.
        r = post(e.port, "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 1})
        assert r.status == 200 and r.replica in {p.name for p in f.pods}, (r.status, r.replica)


def test_without_the_certificate_every_scrape_fails_and_every_pod_reads_down():
    # The control: the same fleet, the scrape cluster's Istio mTLS without `default`. The pool
    # keeps its certificate, so requests still pass, routed without any pod's scraped load.
    with MtlsFleet(2, ["--time-scale", "20"], filter_overrides=OVERRIDES, client_cert=False) as f:
        e = f.envoy
        wait_scrapes(f)
        st = e.stats()
        assert scrapes(f, "rq_success") == {p.name: 0 for p in f.pods}
        assert e.stat("wasmcustom.warmroute.scrape.ok", st) == 0
        assert e.stat("wasmcustom.warmroute.scrape.failed", st) >= SCRAPES * len(f.pods)
        assert {p.name: st.get(f"wasmcustom.warmroute.backend.{p.name}.healthy") for p in f.pods} == \
            {p.name: "0" for p in f.pods}
        # Refused for the missing certificate, not for anything else.
        side = f.sidecars.stats()
        for p in f.pods:
            tls = f.sidecars.tls(p, side)
            assert tls.get("fail_verify_no_cert", 0) >= SCRAPES and tls.get("handshake", 0) == 0, (p.name, tls)
        r = post(e.port, "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 1})
        assert r.status == 200, r.status
