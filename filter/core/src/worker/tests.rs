use super::*;
use crate::config::ENDPOINT_HEADER;
use crate::fleet::view::Standing;
use crate::testing::{MemoryHost, Reply, SentCallout, TestExchange};
use std::collections::BTreeSet;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const CONFIG: &str = r#"{"backends":[
        {"name":"a","address":"127.0.0.1:1"},
        {"name":"b","address":"127.0.0.1:2"},
        {"name":"c","address":"127.0.0.1:3"}],
        "metrics":{"period_ms":500,"timeout_ms":400,"unhealthy_after":2}}"#;

const METRICS: &str = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n\
vllm:kv_cache_usage_perc 0.1\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n";

fn worker(host: &MemoryHost) -> Worker {
    Worker::configure(host, CONFIG.as_bytes()).unwrap()
}

fn chat_body(user: &str) -> Vec<u8> {
    format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"{user}"}}]}}"#,
            "s".repeat(600)
        )
        .into_bytes()
}

/// Drives one request through the callbacks up to the routing decision.
fn send(w: &mut Worker, host: &MemoryHost, headers: &[(&str, &str)], body: &[u8]) -> Exchange {
    *host.exchange.borrow_mut() = TestExchange::request(headers, body);
    let mut ex = Exchange::default();
    if w.on_request_headers(host, &mut ex, body.is_empty()) == Step::Pause {
        assert_eq!(
            w.on_request_body(host, &mut ex, body.len() / 2, false),
            Step::Pause
        );
        assert_eq!(
            w.on_request_body(host, &mut ex, body.len(), true),
            Step::Continue
        );
    }
    ex
}

fn chat_headers() -> Vec<(&'static str, &'static str)> {
    vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-type", "application/json"),
    ]
}

fn routed_to(host: &MemoryHost) -> Option<String> {
    host.exchange.borrow().header(ENDPOINT_HEADER)
}

fn inflight(w: &Worker, host: &MemoryHost) -> Vec<u32> {
    w.router
        .fleet()
        .store(host)
        .inflight()
        .unwrap()
        .iter()
        .map(|f| f.requests)
        .collect()
}

/// Answers every callout dispatched since the last call with `reply`.
fn answer(w: &mut Worker, host: &MemoryHost, reply: impl Fn(&str) -> Reply) {
    deliver(w, host, &host.take_callouts(), reply);
}

/// Delivers `reply(pod address)` to each of `sent`.
fn deliver(w: &mut Worker, host: &MemoryHost, sent: &[SentCallout], reply: impl Fn(&str) -> Reply) {
    for c in sent {
        let r = reply(c.header(ENDPOINT_HEADER).unwrap_or_default());
        let (headers, size) = (usize::from(r.status.is_some()), r.body.len());
        *host.reply.borrow_mut() = r;
        w.on_scrape(host, c.token, headers, size);
    }
}

fn ok(body: &str) -> Reply {
    Reply {
        status: Some("200".into()),
        body: body.as_bytes().to_vec(),
    }
}

#[test]
fn a_prompt_waits_on_its_pod_until_its_first_response_byte() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    let body = chat_body(&"q".repeat(3000));
    let mut first = send(&mut w, &host, &chat_headers(), &body);
    let mut second = send(&mut w, &host, &chat_headers(), &body);
    assert!(first.pending.is_some() && second.pending.is_some());
    assert_eq!(w.router.pending_prompts(), 2);
    // The first answer streams: its prompt no longer waits, the second's does.
    host.exchange.borrow_mut().status = Some("200".into());
    w.on_response_headers(&host, &mut first, false);
    w.on_response_body(&host, &mut first, 10, false);
    assert!(first.pending.is_none());
    assert_eq!(w.router.pending_prompts(), 1);
    // The second ends without a byte of body (an error, a reset): its end clears it.
    w.on_log(&host, &mut second);
    w.on_log(&host, &mut first);
    assert_eq!(w.router.pending_prompts(), 0);
}

#[test]
fn a_request_is_routed_through_the_callbacks() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    let mut headers = chat_headers();
    // A client's own routing header is never what Envoy sees.
    headers.push((ENDPOINT_HEADER, "10.9.9.9:80"));
    let body = chat_body("hello");
    let mut ex = send(&mut w, &host, &headers, &body);
    let dest = routed_to(&host).unwrap();
    assert!(dest.starts_with("127.0.0.1:"), "{dest}");
    assert!(!dest.contains("10.9.9.9"));
    assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 1);
    host.exchange.borrow_mut().status = Some("200".into());
    w.on_response_headers(&host, &mut ex, false);
    w.on_response_body(&host, &mut ex, 10, false);
    w.on_response_body(&host, &mut ex, 0, true);
    w.on_log(&host, &mut ex);
    assert_eq!(
        inflight(&w, &host),
        vec![0, 0, 0],
        "the only open request wrote its release"
    );
    w.tick(&host);
    assert_eq!(host.metric("warmroute.requests.cache_aware.2xx"), Some(1));
    assert_eq!(host.metric("warmroute.decision.placed"), Some(1));
}

#[test]
fn each_route_is_noted_for_the_access_log_when_asked() {
    let note = |host: &MemoryHost| {
        let e = host.exchange.borrow();
        e.filter_state
            .iter()
            .find(|(k, _)| k == ROUTE_STATE)
            .map(|(_, v)| v.clone())
    };
    let noted = CONFIG.replacen('{', r#"{"route_log":true,"#, 1);
    let host = MemoryHost::default();
    let mut w = Worker::configure(&host, noted.as_bytes()).unwrap();
    let body = chat_body(&"n".repeat(3000));
    let mut ex = send(&mut w, &host, &chat_headers(), &body);
    let first = note(&host).unwrap();
    assert!(
        first.starts_with("backend=")
            && first.contains(";match=0/")
            && first.ends_with(";reason=placed"),
        "{first}"
    );
    // Answered: its prompt is in the pod's cache now, and the same prompt is a hit.
    host.exchange.borrow_mut().status = Some("200".into());
    w.on_log(&host, &mut ex);
    send(&mut w, &host, &chat_headers(), &body);
    let second = note(&host).unwrap();
    assert!(second.ends_with(";reason=cache_hit"), "{second}");
    assert!(!second.contains(";match=0/"), "{second}");
    // An unreadable body says why it was routed by load alone.
    send(&mut w, &host, &chat_headers(), b"{not json");
    assert!(note(&host).unwrap().ends_with(";fallback=not_json"));

    // Off by default.
    let host = MemoryHost::default();
    let mut w = worker(&host);
    send(&mut w, &host, &chat_headers(), &body);
    assert_eq!(note(&host), None);
}

#[test]
fn a_body_that_ends_with_trailers_is_routed_on_what_was_buffered() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    let body = chat_body("with trailers");
    *host.exchange.borrow_mut() = TestExchange::request(&chat_headers(), &body);
    let mut ex = Exchange::default();
    assert_eq!(w.on_request_headers(&host, &mut ex, false), Step::Pause);
    assert_eq!(
        w.on_request_body(&host, &mut ex, body.len(), false),
        Step::Pause
    );
    assert!(routed_to(&host).is_none());
    assert_eq!(w.on_request_trailers(&host, &mut ex), Step::Continue);
    assert!(routed_to(&host).is_some());
    assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 1);
    w.on_log(&host, &mut ex);
    w.tick(&host);
    assert_eq!(
        host.metric("warmroute.prompt_blocks").map(|b| b > 0),
        Some(true)
    );
}

#[test]
fn an_unreadable_body_is_still_routed() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    let mut ex = send(&mut w, &host, &chat_headers(), b"{not json");
    assert!(routed_to(&host).is_some());
    w.on_log(&host, &mut ex);
    w.tick(&host);
    assert_eq!(host.metric("warmroute.fallback.not_json"), Some(1));
    assert_eq!(host.metric("warmroute.decision.fallback"), Some(1));
}

#[test]
fn a_tick_scrapes_every_backend_and_sizes_the_index() {
    let host = MemoryHost::default();
    host.now.set(1000);
    let mut w = worker(&host);
    w.tick(&host);
    let sent = host.take_callouts();
    let mut dests: Vec<&str> = sent
        .iter()
        .map(|c| c.header(ENDPOINT_HEADER).unwrap_or_default())
        .collect();
    dests.sort();
    assert_eq!(dests, vec!["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
    assert!(sent.iter().all(|c| c.cluster == "pool"
        && c.header(":path") == Some("/metrics")
        && c.timeout_ms == 400));
    // Pending scrapes are not sent again until answered.
    w.tick(&host);
    assert!(host.take_callouts().is_empty());
    deliver(&mut w, &host, &sent, |_| ok(METRICS));
    let h = w.router.fleet().health();
    assert!(h
        .iter()
        .all(|h| h.scraped_ms == 1000 && h.scrape.running == 1.0));
    assert_eq!(h[0].scrape.capacity_tokens, Some(16_000));
    w.tick(&host);
    assert_eq!(
        host.take_callouts().len(),
        3,
        "answered scrapes are due again"
    );
    assert_eq!(host.metric("warmroute.scrape.ok"), Some(3));
}

#[test]
fn a_pod_that_stops_answering_leaves_rotation_and_comes_back() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    let down = |dest: &str| {
        if dest == "127.0.0.1:2" {
            // Envoy reports a failed callout as a reply without headers.
            Reply::default()
        } else {
            ok(METRICS)
        }
    };
    for t in 1..=2 {
        host.now.set(t * 500);
        w.tick(&host);
        answer(&mut w, &host, down);
    }
    assert_eq!(
        w.router
            .fleet()
            .health()
            .iter()
            .map(|h| h.down)
            .collect::<Vec<_>>(),
        vec![false, true, false]
    );
    // No request goes to it while it is down.
    for i in 0..12 {
        let mut ex = send(&mut w, &host, &chat_headers(), &chat_body(&format!("q{i}")));
        assert_ne!(routed_to(&host).as_deref(), Some("127.0.0.1:2"));
        w.on_log(&host, &mut ex);
    }
    // Two good scrapes in a row bring it back (one could be a flap), and the
    // gauge says so at the next tick.
    for t in 3..=4 {
        host.now.set(t * 500);
        w.tick(&host);
        answer(&mut w, &host, |_| ok(METRICS));
        assert_eq!(w.router.fleet().health()[1].down, t == 3);
    }
    w.tick(&host);
    assert_eq!(host.metric("warmroute.backend.b.healthy"), Some(1));
    assert_eq!(host.metric("warmroute.scrape.failed"), Some(2));
}

/// Ends `ex` as Envoy would report it: `upstream` answered `status`.
fn end(w: &mut Worker, host: &MemoryHost, ex: &mut Exchange, upstream: &str, status: &str) {
    {
        let mut e = host.exchange.borrow_mut();
        e.upstream = Some(upstream.into());
        e.status = Some(status.into());
        e.details = Some(if status.starts_with('5') {
            "upstream_reset_before_response_started{remote_connection_failure}".into()
        } else {
            "via_upstream".into()
        });
    }
    w.on_log(host, ex);
}

#[test]
fn a_slow_metrics_endpoint_does_not_eject_a_pod_that_serves() {
    for serving in [true, false] {
        let host = MemoryHost::default();
        // The scraper holds the lease and routes nothing (as Envoy's main-thread
        // VM); another worker sees the pod answer and says so at its tick.
        let mut w = worker(&host);
        let mut other = worker(&host);
        for t in 1..=4u64 {
            host.now.set(t * 500);
            w.tick(&host);
            let sent = host.take_callouts();
            if serving {
                let mut ex = send(&mut other, &host, &chat_headers(), &chat_body("q"));
                end(&mut other, &host, &mut ex, "127.0.0.1:2", "200");
            }
            other.tick(&host);
            assert!(host.take_callouts().is_empty());
            // b's /metrics times out (Envoy fails the callout after timeout_ms).
            host.now.set(t * 500 + 400);
            deliver(&mut w, &host, &sent, |dest| {
                if dest == "127.0.0.1:2" {
                    Reply::default()
                } else {
                    ok(METRICS)
                }
            });
        }
        assert_eq!(
            w.router.fleet().health()[1].down,
            !serving,
            "serving={serving}"
        );
        w.tick(&host);
        assert_eq!(host.metric("warmroute.scrape.slow"), Some(4));
    }
}

#[test]
fn a_pod_failing_its_requests_leaves_this_workers_rotation_for_a_while() {
    let host = MemoryHost::default();
    host.now.set(1000);
    let mut w = worker(&host);
    // Whatever the filter chose, Envoy's last upstream is the one to blame: a
    // request retried from b to c and served there counts for c.
    for i in 0..3 {
        assert_eq!(
            w.router.fleet().standing(host.now.get())[1],
            Standing::In,
            "after {i} errors"
        );
        let mut ex = send(&mut w, &host, &chat_headers(), &chat_body(&format!("r{i}")));
        end(&mut w, &host, &mut ex, "127.0.0.1:3", "200");
        let mut ex = send(&mut w, &host, &chat_headers(), &chat_body(&format!("f{i}")));
        end(&mut w, &host, &mut ex, "127.0.0.1:2", "503");
    }
    assert_eq!(w.router.fleet().standing(host.now.get())[1], Standing::Out);
    w.tick(&host);
    assert_eq!(host.metric("warmroute.ejections"), Some(1));
    assert_eq!(host.metric("warmroute.backend.b.healthy"), Some(0));
    let routed = |w: &mut Worker, n: usize| {
        (0..n)
            .filter(|i| {
                let mut ex = send(w, &host, &chat_headers(), &chat_body(&format!("x{i}")));
                let to = routed_to(&host);
                end(w, &host, &mut ex, "127.0.0.1:1", "200");
                to.is_some_and(|d| d.starts_with("127.0.0.1:2"))
            })
            .count()
    };
    assert_eq!(routed(&mut w, 12), 0);
    // The ejection lasts stale_after_ms; then real traffic probes the pod again.
    host.now.set(1000 + w.config().metrics.stale_after_ms);
    assert!(routed(&mut w, 12) > 0);
    // A client that went away is nobody's fault.
    for i in 0..3 {
        let mut ex = send(&mut w, &host, &chat_headers(), &chat_body(&format!("g{i}")));
        let mut e = host.exchange.borrow_mut();
        e.upstream = Some("127.0.0.1:3".into());
        e.details = Some("downstream_remote_disconnect".into());
        e.status = Some("503".into());
        drop(e);
        w.on_log(&host, &mut ex);
    }
    assert_eq!(w.router.fleet().standing(host.now.get())[2], Standing::In);
}

#[test]
fn a_success_on_a_settled_pod_spares_the_upstream_read() {
    let host = MemoryHost::default();
    host.now.set(1000);
    let mut w = worker(&host);
    let fresh = w.config().metrics.stale_after_ms / crate::fleet::passive::SERVED_SLACK;
    // Ends a request for the same prompt (so the same chosen pod) as Envoy
    // reports it: served by `upstream`, or by the pod chosen; true when the
    // filter asked which upstream served.
    let serve = |w: &mut Worker, status: &str, upstream: Option<&str>| {
        let mut ex = send(w, &host, &chat_headers(), &chat_body("same prompt"));
        let to = routed_to(&host).unwrap_or_default();
        // The first of the endpoint list: the pod chosen.
        let chosen = to.split(',').next().unwrap_or_default().to_string();
        let before = host.upstream_reads.get();
        end(w, &host, &mut ex, upstream.unwrap_or(&chosen), status);
        (host.upstream_reads.get() > before, chosen)
    };
    // The first success credits the pod; the next ones within the slack
    // change nothing and ask nothing.
    let (read, chosen) = serve(&mut w, "200", None);
    assert!(read);
    assert!(!serve(&mut w, "200", None).0);
    host.now.set(1000 + fresh);
    assert!(!serve(&mut w, "200", None).0);
    // Past it, the pod is credited again; a failure is always read, and the
    // success after it clears the streak, so it is read too.
    host.now.set(1001 + fresh);
    assert!(serve(&mut w, "200", None).0);
    assert!(serve(&mut w, "503", None).0);
    assert!(serve(&mut w, "200", None).0);
    assert!(!serve(&mut w, "200", None).0);
    // While another pod has a streak, a success is read even on a settled
    // chosen pod: a retry may have moved it to the failing one, and cleared it.
    let other = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
        .into_iter()
        .find(|a| *a != chosen)
        .unwrap();
    assert!(serve(&mut w, "503", Some(other)).0);
    assert!(serve(&mut w, "200", Some(other)).0);
    assert!(!serve(&mut w, "200", None).0);
    // A settled pod that starts failing is read every time, and ejected.
    for i in 0..w.config().metrics.eject_after_errors {
        assert!(serve(&mut w, "503", None).0, "failure {i}");
    }
    let b = w.router.fleet().backend_at(&chosen).unwrap();
    assert_eq!(w.router.fleet().standing(host.now.get())[b], Standing::Out);
}

#[test]
fn a_scrape_that_never_returns_counts_as_slow_and_is_sent_again() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    w.tick(&host);
    assert_eq!(host.take_callouts().len(), 3);
    // Lost after timeout + period (900 ms): slow, and scraped again. No pod has
    // answered a request, so slow counts against it.
    host.now.set(901);
    w.tick(&host);
    assert_eq!(host.take_callouts().len(), 3);
    assert!(w.router.fleet().health().iter().all(|h| h.failures == 1));
    w.tick(&host);
    assert_eq!(host.metric("warmroute.scrape.slow"), Some(3));
}

#[test]
fn the_scrape_lease_passes_to_another_worker() {
    let host = MemoryHost::default();
    let mut a = worker(&host);
    let mut b = worker(&host);
    a.tick(&host);
    assert_eq!(
        host.take_callouts().len(),
        3,
        "the first to tick takes the lease"
    );
    b.tick(&host);
    assert!(host.take_callouts().is_empty(), "one scraper per Envoy");
    // A stops ticking (its VM is gone): its lease expires after 3 periods.
    host.now.set(1500);
    b.tick(&host);
    assert!(
        host.take_callouts().is_empty(),
        "not before the lease expires"
    );
    host.now.set(1501);
    b.tick(&host);
    let sent = host.take_callouts();
    assert_eq!(sent.len(), 3);
    // B's scrapes reach A's view at A's next tick.
    deliver(&mut b, &host, &sent, |_| ok(METRICS));
    a.tick(&host);
    assert!(host.take_callouts().is_empty(), "A lost the lease");
    assert!(a
        .router
        .fleet()
        .health()
        .iter()
        .all(|h| h.scraped_ms == 1501));
}

#[test]
fn releases_wait_for_the_tick_while_others_are_open() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    let mut first = send(&mut w, &host, &chat_headers(), &chat_body("one"));
    let mut second = send(&mut w, &host, &chat_headers(), &chat_body("two"));
    assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 2);
    // One ends while the other is open: the ledger hears of it at the tick.
    w.on_log(&host, &mut first);
    assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 2);
    w.tick(&host);
    assert_eq!(inflight(&w, &host).iter().sum::<u32>(), 1);
    let open = w.router.fleet().inflight(&host).unwrap();
    let b = open.iter().position(|f| f.requests == 1).unwrap();
    let name = &w.config().backends[b].name;
    assert_eq!(
        host.metric(&format!("warmroute.backend.{name}.inflight")),
        Some(1)
    );
    w.on_log(&host, &mut second);
    assert_eq!(inflight(&w, &host), vec![0, 0, 0]);
}

#[test]
fn a_crashed_vms_in_flight_is_taken_back_within_three_ticks() {
    let host = MemoryHost::default();
    let mut a = worker(&host);
    let mut b = worker(&host);
    let mut open: Vec<Exchange> = (0..10)
        .map(|i| send(&mut a, &host, &chat_headers(), &chat_body(&format!("q{i}"))))
        .collect();
    for ex in open.iter_mut().take(5) {
        a.on_log(&host, ex);
    }
    // Five ended, five still open: the releases wait in A for its next write.
    assert_eq!(inflight(&b, &host).iter().sum::<u32>(), 10);
    // A's VM crashes: no on_log, no on_done, no tick ever again.
    drop(a);
    for t in 1..=3 {
        host.now.set(t * 500);
        b.tick(&host);
    }
    assert_eq!(inflight(&b, &host), vec![0, 0, 0]);
    for name in ["a", "b", "c"] {
        assert_eq!(
            host.metric(&format!("warmroute.backend.{name}.inflight")),
            Some(0)
        );
    }
}

#[test]
fn a_live_vm_keeps_its_requests_however_long_they_run() {
    let host = MemoryHost::default();
    let mut a = worker(&host);
    let mut b = worker(&host);
    let mut ex = send(&mut a, &host, &chat_headers(), &chat_body("long"));
    for t in 1..=20 {
        host.now.set(t * 500);
        a.tick(&host);
        b.tick(&host);
    }
    assert_eq!(inflight(&b, &host).iter().sum::<u32>(), 1);
    a.on_log(&host, &mut ex);
    assert_eq!(inflight(&b, &host), vec![0, 0, 0]);
}

#[test]
fn the_debug_header_tells_cache_details_only_when_asked() {
    let body = chat_body("hello");
    for (extra, want_match) in [
        (r#""debug_header":true"#, false),
        (r#""debug_header":true,"debug_match_counts":true"#, true),
    ] {
        let host = MemoryHost::default();
        let cfg = CONFIG.replacen('{', &format!("{{{extra},"), 1);
        let mut w = Worker::configure(&host, cfg.as_bytes()).unwrap();
        let mut ex = send(&mut w, &host, &chat_headers(), &body);
        w.on_response_headers(&host, &mut ex, false);
        let headers = host.exchange.borrow().response_headers.clone();
        let (name, value) = &headers[0];
        assert_eq!(name, DEBUG_HEADER);
        assert!(value.starts_with("backend="), "{value}");
        assert_eq!(value.contains(";match="), want_match, "{value}");
        assert_eq!(value.contains(";reason="), want_match, "{value}");
    }
}

#[test]
fn a_bad_config_names_its_field() {
    let host = MemoryHost::default();
    let e = match Worker::configure(&host, br#"{"backends":[{"name":"a","address":"x"}]}"#) {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    };
    assert_eq!(e.field, "backends[0].address");
}

const POOL: &str = r#"{"pool":{"cluster":"pool","admin_cluster":"envoy-admin","max_backends":4},
        "metrics":{"period_ms":500,"timeout_ms":400}}"#;

/// Envoy's admin answer listing `pods` (all healthy) for cluster `pool`.
fn endpoints(pods: &[&str]) -> Reply {
    let hosts: Vec<String> = pods
            .iter()
            .map(|a| {
                let (ip, port) = a.rsplit_once(':').unwrap();
                format!(r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":{port}}}}},"health_status":{{"eds_health_status":"HEALTHY"}}}}"#)
            })
            .collect();
    ok(&format!(
        r#"{{"cluster_statuses":[{{"name":"pool","host_statuses":[{}]}}]}}"#,
        hosts.join(",")
    ))
}

/// One tick of `w` at `now`, Envoy listing `pods`; every scrape answers.
fn pool_tick(w: &mut Worker, host: &MemoryHost, now: u64, pods: &[&str]) {
    host.now.set(now);
    w.tick(host);
    let sent = host.take_callouts();
    for c in &sent {
        let r = if c.cluster == "envoy-admin" {
            assert_eq!(
                c.header(":path"),
                Some("/clusters?format=json&filter=%5Epool%24")
            );
            endpoints(pods)
        } else {
            ok(METRICS)
        };
        let (headers, size) = (usize::from(r.status.is_some()), r.body.len());
        *host.reply.borrow_mut() = r;
        w.on_scrape(host, c.token, headers, size);
    }
}

/// Where `n` fresh prompts go (the primary's address), ended at once.
fn spread(w: &mut Worker, host: &MemoryHost, tag: &str, n: usize) -> BTreeSet<String> {
    (0..n)
        .filter_map(|i| {
            let mut ex = send(w, host, &chat_headers(), &chat_body(&format!("{tag}{i}")));
            let to = routed_to(host).map(|d| d.split(',').next().unwrap_or("").to_string());
            w.on_log(host, &mut ex);
            to
        })
        .collect()
}

#[test]
fn a_discovered_pool_follows_envoys_endpoints() {
    let host = MemoryHost::default();
    let mut a = Worker::configure(&host, POOL.as_bytes()).unwrap();
    let mut b = Worker::configure(&host, POOL.as_bytes()).unwrap();
    // Before the first read there is no pod: no header, Envoy's fallback routes.
    assert!(spread(&mut b, &host, "none", 3).is_empty());
    pool_tick(
        &mut a,
        &host,
        500,
        &["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"],
    );
    let all: BTreeSet<String> = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
        .map(String::from)
        .into();
    assert_eq!(spread(&mut a, &host, "x", 30), all);
    // Another VM sees the pool at its own tick.
    pool_tick(&mut b, &host, 510, &[]);
    assert_eq!(spread(&mut b, &host, "y", 30), all);
    // A warm prefix on the pod that stays keeps its pod; .2 leaves.
    let warm = chat_body("warm");
    let mut ex = send(&mut a, &host, &chat_headers(), &warm);
    let home = routed_to(&host).unwrap();
    a.on_log(&host, &mut ex);
    let gone = if home.starts_with("10.0.0.2") {
        "10.0.0.1:8000"
    } else {
        "10.0.0.2:8000"
    };
    let stay: Vec<&str> = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
        .into_iter()
        .filter(|p| *p != gone)
        .collect();
    pool_tick(&mut a, &host, 1000, &stay);
    pool_tick(&mut b, &host, 1010, &[]);
    for w in [&mut a, &mut b] {
        assert!(!spread(w, &host, "z", 30).contains(gone));
    }
    let mut ex = send(&mut b, &host, &chat_headers(), &warm);
    assert_eq!(
        routed_to(&host).unwrap()[..13],
        home[..13],
        "the pod that stayed keeps its prefix"
    );
    b.on_log(&host, &mut ex);
    // A new pod takes a free slot and gets traffic; the slot of the pod that
    // left is the last one reused.
    let mut joined = stay.clone();
    joined.push("10.0.0.4:8000");
    pool_tick(&mut a, &host, 1500, &joined);
    assert!(spread(&mut a, &host, "n", 40).contains("10.0.0.4:8000"));
    assert_eq!(
        a.router.fleet().backend(3).map(|b| b.address.as_str()),
        Some("10.0.0.4:8000")
    );
    // An unusable answer (only other clusters) changes nothing; an Envoy that ignores
    // `filter` lists every cluster, and the pool's own hosts are read from it.
    for (t, admin) in [
        (
            2000,
            r#"{"cluster_statuses":[{"name":"other"}]}"#.to_string(),
        ),
        (2500, {
            let pool = endpoints(&joined).body;
            let pool = String::from_utf8_lossy(&pool);
            pool.replace(
                r#"{"cluster_statuses":["#,
                r#"{"cluster_statuses":[{"name":"other"},"#,
            )
        }),
    ] {
        host.now.set(t);
        a.tick(&host);
        for c in host.take_callouts() {
            let r = if c.cluster == "envoy-admin" {
                ok(&admin)
            } else {
                ok(METRICS)
            };
            let (headers, size) = (usize::from(r.status.is_some()), r.body.len());
            *host.reply.borrow_mut() = r;
            a.on_scrape(&host, c.token, headers, size);
        }
        assert!(spread(&mut a, &host, "k", 40).contains("10.0.0.4:8000"));
    }
    // Envoy lists no endpoint at all (an empty EDS push): the members stay for the grace.
    let grace = a.config().pool.as_ref().map_or(0, |p| p.empty_grace_ms);
    pool_tick(&mut a, &host, 3000, &[]);
    pool_tick(&mut a, &host, 3000 + grace - 1, &[]);
    assert!(spread(&mut a, &host, "g", 40).contains("10.0.0.4:8000"));
    // Still empty past it: the pool emptied, nothing to route to, no slot keeps a pod.
    pool_tick(&mut a, &host, 3000 + grace, &[]);
    assert!(spread(&mut a, &host, "e", 5).is_empty());
    assert!(a.router.fleet().backends().iter().all(Option::is_none));
}

#[test]
fn a_pod_back_on_a_new_address_starts_cold() {
    // Checked in the VM that read the change, and in one that applies the old
    // pod's log events only afterwards: a check routes the prompt, which records
    // it on the new pod.
    for check_late_vm in [false, true] {
        let host = MemoryHost::default();
        // One slot, so the new address must reuse the old one's.
        let one = POOL.replace(r#""max_backends":4"#, r#""max_backends":1"#);
        let mut w = Worker::configure(&host, one.as_bytes()).unwrap();
        let mut late = Worker::configure(&host, one.as_bytes()).unwrap();
        pool_tick(&mut w, &host, 500, &["10.0.0.1:8000"]);
        let warm = chat_body("warm");
        for _ in 0..2 {
            let mut ex = send(&mut w, &host, &chat_headers(), &warm);
            w.on_log(&host, &mut ex);
        }
        w.tick(&host);
        let hits = host.metric("warmroute.matched_blocks").unwrap_or(0);
        assert!(hits > 0);
        // The pod moves: its slot's cache picture goes with the old address.
        pool_tick(&mut w, &host, 1000, &[]);
        pool_tick(&mut w, &host, 1500, &["10.0.0.9:8000"]);
        let v = if check_late_vm { &mut late } else { &mut w };
        v.tick(&host);
        let mut ex = send(v, &host, &chat_headers(), &warm);
        assert_eq!(routed_to(&host).as_deref(), Some("10.0.0.9:8000"));
        v.on_log(&host, &mut ex);
        v.tick(&host);
        assert_eq!(
            host.metric("warmroute.matched_blocks"),
            Some(hits),
            "late VM: {check_late_vm}"
        );
    }
}

#[test]
fn a_fleet_gone_silent_leaves_no_shared_data_behind() {
    let host = MemoryHost::default();
    host.now.set(1000);
    let mut old = worker(&host);
    for i in 0..5 {
        let mut ex = send(
            &mut old,
            &host,
            &chat_headers(),
            &chat_body(&format!("o{i}")),
        );
        old.on_log(&host, &mut ex);
    }
    old.tick(&host);
    let fleet_keys = |host: &MemoryHost| -> Vec<(String, usize)> {
        host.shared_sizes()
            .into_iter()
            .filter(|(k, _)| k != crate::fleet::store::FLEETS_KEY)
            .collect()
    };
    let old_keys = fleet_keys(&host);
    assert!(old_keys.iter().any(|(_, n)| *n > 0));
    // Reconfigured to another backend list: the old VMs are gone.
    let other = CONFIG.replace("127.0.0.1:3", "127.0.0.1:4");
    let mut new = Worker::configure(&host, other.as_bytes()).unwrap();
    for i in 0..5 {
        let mut ex = send(
            &mut new,
            &host,
            &chat_headers(),
            &chat_body(&format!("n{i}")),
        );
        new.on_log(&host, &mut ex);
    }
    new.tick(&host);
    let kept = |host: &MemoryHost| -> usize {
        fleet_keys(host)
            .iter()
            .filter(|(k, _)| old_keys.iter().any(|(o, _)| o == k))
            .map(|(_, n)| n)
            .sum()
    };
    assert!(kept(&host) > 0, "swept while still fresh");
    host.now.set(1000 + crate::fleet::store::FLEET_IDLE_MS + 1);
    new.tick(&host);
    assert_eq!(kept(&host), 0, "{:?}", fleet_keys(&host));
    // The fleet in use keeps its values.
    let mut ex = send(&mut new, &host, &chat_headers(), &chat_body("after"));
    assert!(routed_to(&host).is_some());
    new.on_log(&host, &mut ex);
    assert!(fleet_keys(&host)
        .iter()
        .any(|(k, n)| *n > 0 && !old_keys.iter().any(|(o, _)| o == k)));
}

const MODELS: &str = r#"{"backends":[
        {"name":"a","address":"127.0.0.1:1","models":["llama"],"adapters":["sql"]},
        {"name":"b","address":"127.0.0.1:2","models":["qwen"]},
        {"name":"c","address":"127.0.0.1:3","models":["llama"],"adapters":["sql"]}],
        "route":{"model_header":"x-gateway-model-name"},
        "metrics":{"period_ms":500,"timeout_ms":400}}"#;

fn ask(w: &mut Worker, host: &MemoryHost, model: &str, tag: &str) -> (Step, Option<String>) {
    let body = format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"{tag} {}"}}]}}"#,
        "w ".repeat(300)
    );
    let mut headers = chat_headers();
    headers.push(("x-gateway-model-name", "forged"));
    *host.exchange.borrow_mut() = TestExchange::request(&headers, body.as_bytes());
    let mut ex = Exchange::default();
    assert_eq!(w.on_request_headers(host, &mut ex, false), Step::Pause);
    let step = w.on_request_body(host, &mut ex, body.len(), true);
    let to = routed_to(host).map(|d| d.split(',').next().unwrap_or("").to_string());
    w.on_log(host, &mut ex);
    (step, to)
}

#[test]
fn requests_go_to_pods_that_serve_their_model_and_an_unknown_one_gets_a_404() {
    let host = MemoryHost::default();
    let mut w = Worker::configure(&host, MODELS.as_bytes()).unwrap();
    for i in 0..20 {
        let (_, to) = ask(&mut w, &host, "qwen", &format!("q{i}"));
        assert_eq!(to.as_deref(), Some("127.0.0.1:2"));
        assert_eq!(
            host.exchange
                .borrow()
                .header("x-gateway-model-name")
                .as_deref(),
            Some("qwen"),
            "the body's model is published, the client's copy is not"
        );
        let (_, to) = ask(&mut w, &host, "llama", &format!("l{i}"));
        assert_ne!(to.as_deref(), Some("127.0.0.1:2"));
    }
    let (step, to) = ask(&mut w, &host, "mistral", "m");
    assert_eq!((step, to), (Step::Replied, None));
    let reply = host.exchange.borrow().local_reply.clone().unwrap();
    assert_eq!(reply.status, 404);
    let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(
        body["error"]["message"],
        "The model `mistral` does not exist."
    );
    w.tick(&host);
    assert_eq!(host.metric("warmroute.unknown_model"), Some(1));
    assert_eq!(inflight(&w, &host), vec![0, 0, 0], "a 404 holds nothing");
}

/// A model's decisions as its per-model stats count them, over every reason.
fn model_decisions(host: &MemoryHost, model: &str) -> i64 {
    [
        "cache_hit",
        "placed",
        "spillover",
        "replicated",
        "least_loaded",
        "round_robin",
        "random",
        "sticky",
        "stored_response",
        "fallback",
    ]
    .iter()
    .map(|r| {
        let name = format!("warmroute.model.decision.{r}.{model}");
        host.metric(&name)
            .unwrap_or_else(|| panic!("{name} not defined"))
    })
    .sum()
}

#[test]
fn per_model_stats_count_the_declared_models_and_every_other_under_other() {
    let host = MemoryHost::default();
    let mut w = Worker::configure(&host, MODELS.as_bytes()).unwrap();
    for (model, n) in [("llama", 3), ("sql", 2), ("qwen", 1)] {
        for i in 0..n {
            ask(&mut w, &host, model, &format!("{model}{i}"));
        }
    }
    // A model no pod serves is answered 404, no decision; a body not read is `other`.
    assert_eq!(ask(&mut w, &host, "mistral", "m").0, Step::Replied);
    let mut ex = send(&mut w, &host, &chat_headers(), b"{not json");
    w.on_log(&host, &mut ex);
    w.tick(&host);
    for (model, n) in [("llama", 3), ("sql", 2), ("qwen", 1), ("other", 1)] {
        assert_eq!(model_decisions(&host, model), n, "{model}");
    }
    let blocks = |what: &str, m: &str| host.metric(&format!("warmroute.model.{what}.{m}"));
    assert!(blocks("prompt_blocks", "llama") > Some(0));
    assert!(blocks("matched_blocks", "llama") <= blocks("prompt_blocks", "llama"));
    assert_eq!(
        blocks("prompt_blocks", "other"),
        Some(0),
        "an unread body has no blocks"
    );
    // No stat names a model the operator did not declare.
    let names = host.metric_names();
    assert!(!names.iter().any(|n| n.contains("mistral")), "{names:?}");
}

#[test]
fn per_model_stats_are_bounded_by_the_configuration() {
    // 40 declared names, one twice, one with a quote, one named like the bucket.
    let mut models: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    models.insert(1, "m0".into());
    models.insert(2, r#"a\"b"#.into());
    models.insert(3, "other".into());
    let cfg = serde_json::json!({
        "backends": [{"name": "a", "address": "127.0.0.1:1", "models": models},
                     {"name": "b", "address": "127.0.0.1:2", "adapters": ["m5", "lora/x.1"]}],
    });
    let json = cfg.to_string();
    let cfg = crate::config::Config::parse(json.as_bytes()).unwrap();
    let kept = crate::worker::stats::stat_models(&cfg);
    let want: Vec<String> = (0..crate::worker::stats::MAX_MODEL_STATS)
        .map(|i| format!("m{i}"))
        .collect();
    assert_eq!(kept, want, "the first 32 plain names, each once");
    let host = MemoryHost::default();
    Worker::configure(&host, json.as_bytes()).unwrap();
    let per_model = host
        .metric_names()
        .into_iter()
        .filter(|n| n.starts_with("warmroute.model."))
        .count();
    assert_eq!(per_model, 12 * (crate::worker::stats::MAX_MODEL_STATS + 1));
}

#[test]
fn a_model_with_a_line_break_is_routed_without_the_model_header() {
    // No models declared: any model goes to any pod, so this one is routed, not a 404.
    let cfg = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"},{"name":"b","address":"127.0.0.1:2"}],
        "route":{"model_header":"x-gateway-model-name"}}"#;
    let host = MemoryHost::default();
    let mut w = Worker::configure(&host, cfg.as_bytes()).unwrap();
    let mut headers = chat_headers();
    headers.push(("x-gateway-model-name", "forged"));
    let body = |model: &str| {
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
            .into_bytes()
    };
    // The body's JSON escapes decode to a real CR LF.
    let mut ex = send(&mut w, &host, &headers, &body(r"a\r\nx-injected: 1"));
    assert!(routed_to(&host).is_some(), "routed as usual");
    assert_eq!(host.exchange.borrow().header("x-gateway-model-name"), None);
    assert_eq!(host.exchange.borrow().header("x-injected"), None);
    w.on_log(&host, &mut ex);
    for bad in [r"a\nb", r"a\rb", r"a\tb", r"a\u0000b", r"a\u007fb"] {
        let mut ex = send(&mut w, &host, &headers, &body(bad));
        assert!(routed_to(&host).is_some(), "{bad}");
        assert_eq!(
            host.exchange.borrow().header("x-gateway-model-name"),
            None,
            "{bad}"
        );
        w.on_log(&host, &mut ex);
    }
    // A plain name is still published.
    let mut ex = send(&mut w, &host, &headers, &body("llama"));
    assert_eq!(
        host.exchange
            .borrow()
            .header("x-gateway-model-name")
            .as_deref(),
        Some("llama")
    );
    w.on_log(&host, &mut ex);
}

#[test]
fn adapter_requests_stay_on_the_pods_that_have_it_loaded() {
    let host = MemoryHost::default();
    host.now.set(500);
    let mut w = Worker::configure(&host, MODELS.as_bytes()).unwrap();
    w.tick(&host);
    let lora = |running: &str| {
        format!(
                "{METRICS}vllm:lora_requests_info{{max_lora=\"1\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"\"}} 1.8e9\n"
            )
    };
    // c has `sql` loaded, a another adapter (its only slot taken).
    answer(&mut w, &host, |dest| match dest {
        "127.0.0.1:1" => ok(&lora("law")),
        "127.0.0.1:3" => ok(&lora("sql")),
        _ => ok(METRICS),
    });
    for i in 0..20 {
        let (_, to) = ask(&mut w, &host, "sql", &format!("s{i}"));
        assert_eq!(to.as_deref(), Some("127.0.0.1:3"), "request {i}");
    }
    // Another VM learns it at its tick.
    let mut other = Worker::configure(&host, MODELS.as_bytes()).unwrap();
    other.tick(&host);
    let (_, to) = ask(&mut other, &host, "sql", "o");
    assert_eq!(to.as_deref(), Some("127.0.0.1:3"));
}

#[test]
fn several_discovered_pools_each_serve_their_model() {
    let host = MemoryHost::default();
    host.now.set(500);
    let cfg = r#"{"pool":{"clusters":[{"cluster":"llama","models":["llama"]},
            {"cluster":"qwen","models":["qwen"]}]},"metrics":{"period_ms":500,"timeout_ms":400}}"#;
    let mut w = Worker::configure(&host, cfg.as_bytes()).unwrap();
    w.tick(&host);
    let host_entry = |ip: &str| {
        format!(r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":8000}}}}}}"#)
    };
    let body = format!(
        r#"{{"cluster_statuses":[{{"name":"llama","host_statuses":[{},{}]}},{{"name":"qwen","host_statuses":[{}]}}]}}"#,
        host_entry("10.0.0.1"),
        host_entry("10.0.0.2"),
        host_entry("10.0.0.3")
    );
    for c in host.take_callouts() {
        if c.cluster == "envoy-admin" {
            assert_eq!(
                c.header(":path"),
                Some("/clusters?format=json&filter=%5E%28llama%7Cqwen%29%24")
            );
            *host.reply.borrow_mut() = ok(&body);
            w.on_scrape(&host, c.token, 1, body.len());
        }
    }
    for i in 0..10 {
        assert_eq!(
            ask(&mut w, &host, "qwen", &format!("q{i}")).1.as_deref(),
            Some("10.0.0.3:8000")
        );
        let (_, to) = ask(&mut w, &host, "llama", &format!("l{i}"));
        assert!(
            matches!(to.as_deref(), Some("10.0.0.1:8000" | "10.0.0.2:8000")),
            "{to:?}"
        );
    }
    assert_eq!(ask(&mut w, &host, "mistral", "m").0, Step::Replied);
}

/// Routes `body`, delivers one response chunk holding `usage` with
/// `cached` tokens, and ends it; returns the blocks the index predicted.
fn answered_with(w: &mut Worker, host: &MemoryHost, body: &[u8], cached: Option<u64>) -> u32 {
    let mut ex = send(w, host, &chat_headers(), body);
    let matched = ex.awaiting_report.as_ref().map_or(0, |p| p.blocks);
    let usage = cached.map_or(String::new(), |c| {
        format!(
            r#","usage":{{"prompt_tokens":10000,"prompt_tokens_details":{{"cached_tokens":{c}}}}}"#
        )
    });
    host.exchange.borrow_mut().response_body =
        format!(r#"{{"choices":[{{"message":{{"content":"ok"}}}}]{usage}}}"#).into_bytes();
    let size = host.exchange.borrow().response_body.len();
    w.on_response_body(host, &mut ex, size, true);
    w.on_log(host, &mut ex);
    matched
}

#[test]
fn a_pods_report_of_an_eviction_makes_every_vm_forget_what_it_used_before() {
    // One pod, two VMs. Checked once in the VM that read the report and once in
    // the other: a check routes its prompt, which records it again.
    let one_pod = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}]}"#;
    for check_other_vm in [false, true] {
        let host = MemoryHost::default();
        let mut a = Worker::configure(&host, one_pod.as_bytes()).unwrap();
        let mut b = Worker::configure(&host, one_pod.as_bytes()).unwrap();
        let older = chat_body(&"an older conversation ".repeat(500));
        let newer = chat_body(&"a newer conversation ".repeat(500));
        host.now.set(1000);
        answered_with(&mut a, &host, &older, Some(0));
        host.now.set(2000);
        answered_with(&mut a, &host, &newer, Some(0));
        // As predicted: nothing changes.
        host.now.set(3000);
        assert!(answered_with(&mut a, &host, &newer, Some(10_000)) > 0);
        // The pod lost the newer prompt (last used at 3000), so the older one too.
        host.now.set(4000);
        assert!(answered_with(&mut a, &host, &newer, Some(0)) > 0);
        a.tick(&host);
        assert_eq!(host.metric("warmroute.feedback.evictions"), Some(1));
        assert_eq!(host.metric("warmroute.feedback.forgets"), Some(1));
        let w = if check_other_vm { &mut b } else { &mut a };
        // Only the system prompt both share (refreshed by the newer one) is left.
        let ex = send(w, &host, &chat_headers(), &older);
        let left = ex.awaiting_report.as_ref().map_or(0, |p| p.blocks);
        assert!(
            left <= 3,
            "{left} blocks of the older prompt still predicted (other VM: {check_other_vm})"
        );
        w.on_log(&host, &mut { ex });
        // The prompt that revealed it was just prefilled again: still a hit.
        let ex = send(w, &host, &chat_headers(), &newer);
        assert!(ex.awaiting_report.is_some(), "other VM: {check_other_vm}");
    }
}

#[test]
fn a_report_from_the_pod_a_retry_moved_to_is_no_evidence_on_the_one_predicted() {
    let two = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"},{"name":"b","address":"127.0.0.1:2"}]}"#;
    for retried in [false, true] {
        let host = MemoryHost::default();
        let mut w = Worker::configure(&host, two.as_bytes()).unwrap();
        let body = chat_body(&"a long conversation ".repeat(500));
        host.now.set(1000);
        answered_with(&mut w, &host, &body, Some(0));
        host.now.set(2000);
        let mut ex = send(&mut w, &host, &chat_headers(), &body);
        assert!(ex.awaiting_report.is_some());
        let chosen = routed_to(&host).unwrap_or_default();
        let chosen = chosen.split(',').next().unwrap_or_default().to_string();
        let other = if chosen == "127.0.0.1:1" {
            "127.0.0.1:2"
        } else {
            "127.0.0.1:1"
        };
        {
            let mut e = host.exchange.borrow_mut();
            e.upstream = Some(if retried { other.into() } else { chosen });
            e.response_body = br#"{"choices":[],"usage":{"prompt_tokens":10000,"prompt_tokens_details":{"cached_tokens":0}}}"#.to_vec();
        }
        let size = host.exchange.borrow().response_body.len();
        w.on_response_body(&host, &mut ex, size, true);
        w.on_log(&host, &mut ex);
        w.tick(&host);
        assert_eq!(
            host.metric("warmroute.feedback.evictions"),
            Some(i64::from(!retried)),
            "retried: {retried}"
        );
    }
}

#[test]
fn a_pod_that_holds_what_this_index_never_sent_it_forgets_nothing_on_a_shortfall() {
    let one_pod = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"}]}"#;
    let host = MemoryHost::default();
    let mut w = Worker::configure(&host, one_pod.as_bytes()).unwrap();
    let older = chat_body(&"an older conversation ".repeat(500));
    let newer = chat_body(&"a newer conversation ".repeat(500));
    host.now.set(1000);
    answered_with(&mut w, &host, &older, Some(0));
    host.now.set(2000);
    answered_with(&mut w, &host, &newer, Some(0));
    // Three reports of whole prompts cached of which the index credited the pod
    // only the shared system prompt: what other gateways sent there.
    for t in 0..3 {
        let other = chat_body(&format!("another gateway's conversation {t} ").repeat(500));
        host.now.set(2500 + t);
        answered_with(&mut w, &host, &other, Some(10_000));
    }
    host.now.set(4000);
    assert!(answered_with(&mut w, &host, &newer, Some(0)) > 0);
    w.tick(&host);
    assert_eq!(host.metric("warmroute.feedback.evictions"), Some(1));
    assert_eq!(host.metric("warmroute.feedback.forgets"), Some(0));
    assert_eq!(host.metric("warmroute.feedback.surpluses"), Some(3));
    // The older prompt is still credited to the pod.
    let ex = send(&mut w, &host, &chat_headers(), &older);
    assert!(ex.awaiting_report.as_ref().map_or(0, |p| p.blocks) > 3);
}

#[test]
fn a_stream_without_a_usage_report_is_not_watched() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    let streamed = |extra: &str| {
        format!(
            r#"{{"model":"m","stream":true,{extra}"messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"q"}}]}}"#,
            "s".repeat(600)
        )
    };
    for _ in 0..2 {
        let mut ex = send(&mut w, &host, &chat_headers(), streamed("").as_bytes());
        assert!(ex.awaiting_report.is_none());
        w.on_log(&host, &mut ex);
    }
    let with_usage = streamed(r#""stream_options":{"include_usage":true},"#);
    let ex = send(&mut w, &host, &chat_headers(), with_usage.as_bytes());
    assert!(ex.awaiting_report.is_some());
}

#[test]
fn an_operator_may_ask_pods_for_usage_on_streams_that_did_not() {
    let streamed = |extra: &str| {
        format!(
            r#"{{"model":"m","stream":true,{extra}"messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"q"}}]}}"#,
            "s".repeat(600)
        )
    };
    let cfg = CONFIG.replace(
        r#""metrics":"#,
        r#""feedback":{"request_usage":true},"metrics":"#,
    );
    for (ask, extra, asked) in [
        (true, "", true),
        (false, "", false),
        // The client chose its stream options: they are left alone.
        (true, r#""stream_options":{"include_usage":false},"#, false),
    ] {
        let host = MemoryHost::default();
        let config = if ask { cfg.as_str() } else { CONFIG };
        let mut w = Worker::configure(&host, config.as_bytes()).unwrap();
        let body = streamed(extra);
        let len = body.len().to_string();
        let mut headers = chat_headers();
        headers.push(("content-length", &len));
        for turn in 0..2 {
            let mut ex = send(&mut w, &host, &headers, body.as_bytes());
            let sent = host.exchange.borrow().body.clone();
            let v: serde_json::Value = serde_json::from_slice(&sent).unwrap();
            let length = host.exchange.borrow().header("content-length");
            assert_eq!(length, Some(sent.len().to_string()), "ask {ask}, {extra}");
            assert_eq!(
                v["stream_options"]["include_usage"] == true,
                asked,
                "{extra}"
            );
            // The second turn is a predicted hit: watched only when the answer reports.
            if turn == 1 {
                assert_eq!(ex.awaiting_report.is_some(), asked, "ask {ask}, {extra}");
            }
            w.on_log(&host, &mut ex);
        }
    }
}

#[test]
fn the_index_sizing_is_in_the_stats() {
    let host = MemoryHost::default();
    let mut w = Worker::configure(&host, POOL.as_bytes()).unwrap();
    // The first tick learns the pod, the second scrapes it, the third shows it.
    for t in [500, 1000] {
        pool_tick(&mut w, &host, t, &["10.0.0.1:8000"]);
    }
    host.now.set(1500);
    w.tick(&host);
    // vllm:cache_config_info: 1000 blocks of 16 tokens; the configured 4 bytes per token.
    let slot = (0..4)
        .find(|&b| w.router.fleet().backend(b).is_some())
        .unwrap();
    let name = w.router.fleet().backend(slot).unwrap().name.clone();
    assert_eq!(
        host.metric(&format!("warmroute.backend.{name}.kv_capacity_tokens")),
        Some(16_000)
    );
    assert_eq!(
        host.metric("warmroute.index.bytes_per_token_milli"),
        Some(4000)
    );
}

fn responses_headers() -> Vec<(&'static str, &'static str)> {
    vec![
        (":method", "POST"),
        (":path", "/v1/responses"),
        ("content-type", "application/json"),
    ]
}

/// Delivers a `/v1/responses` answer from `upstream` in `chunks`, and ends the exchange.
fn answer_from(
    w: &mut Worker,
    host: &MemoryHost,
    ex: &mut Exchange,
    upstream: &str,
    status: &str,
    chunks: &[&str],
) {
    {
        let mut e = host.exchange.borrow_mut();
        e.status = Some(status.into());
        e.upstream = Some(upstream.into());
    }
    w.on_response_headers(host, ex, false);
    for (i, c) in chunks.iter().enumerate() {
        host.exchange.borrow_mut().response_body = c.as_bytes().to_vec();
        w.on_response_body(host, ex, c.len(), i + 1 == chunks.len());
    }
    w.on_log(host, ex);
}

/// A Responses request `body` through `w`, answered by `upstream`.
fn responses_answered(
    w: &mut Worker,
    host: &MemoryHost,
    body: &[u8],
    upstream: &str,
    status: &str,
    chunks: &[&str],
) {
    let mut ex = send(w, host, &responses_headers(), body);
    answer_from(w, host, &mut ex, upstream, status, chunks);
}

#[test]
fn a_stored_responses_follow_up_goes_to_the_pod_that_answered_it_from_any_vm() {
    let host = MemoryHost::default();
    let mut a = worker(&host);
    let mut b = worker(&host);
    let first = br#"{"model":"m","input":"What is the capital of France?"}"#;
    // Whichever pod the filter chose, Envoy's last try reached c: c holds the response.
    // Its id arrives split across chunks.
    responses_answered(
        &mut a,
        &host,
        first,
        "127.0.0.1:3",
        "200",
        &[
            r#"{"id":"resp_a1b2"#,
            r#"c3","created_at":1,"object":"response"}"#,
        ],
    );
    a.tick(&host);
    assert_eq!(host.metric("warmroute.responses.remembered"), Some(1));
    // The follow-up, through the other VM: to c alone, whatever the loads.
    let follow = br#"{"model":"m","previous_response_id":"resp_a1b2c3","input":"And of Spain?"}"#;
    for _ in 0..4 {
        let mut ex = send(&mut b, &host, &responses_headers(), follow);
        assert_eq!(routed_to(&host).as_deref(), Some("127.0.0.1:3"));
        b.on_log(&host, &mut ex);
    }
    b.tick(&host);
    assert_eq!(host.metric("warmroute.decision.stored_response"), Some(4));
    assert_eq!(host.metric("warmroute.responses.holder"), Some(4));
}

#[test]
fn a_client_cannot_steer_by_an_id_no_pod_answered() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    // A body that merely names an id (answered with an error naming it), an
    // answer not stored, an answer whose id never comes: none is remembered.
    let hi = r#"{"model":"m","input":"hi""#;
    for (rest, status, answer) in [
        (
            r#","id":"resp_forged"}"#,
            "404",
            r#"{"id":"resp_forged","error":{"code":404}}"#,
        ),
        (r#","store":false}"#, "200", r#"{"id":"resp_forged"}"#),
        ("}", "200", r#"{"object":"response"}"#),
    ] {
        let body = format!("{hi}{rest}");
        responses_answered(
            &mut w,
            &host,
            body.as_bytes(),
            "127.0.0.1:2",
            status,
            &[answer],
        );
    }
    w.tick(&host);
    assert_eq!(host.metric("warmroute.responses.remembered"), Some(0));
    assert_eq!(host.metric("warmroute.responses.not_remembered"), Some(1));
    // A follow-up naming it routes as usual, and says so.
    let follow = br#"{"model":"m","previous_response_id":"resp_forged","input":"x"}"#;
    let mut ex = send(&mut w, &host, &responses_headers(), follow);
    assert!(
        routed_to(&host).is_some_and(|d| d.contains(',')),
        "fallbacks: routed as usual"
    );
    w.on_log(&host, &mut ex);
    w.tick(&host);
    assert_eq!(host.metric("warmroute.responses.unknown"), Some(1));
    assert_eq!(host.metric("warmroute.decision.stored_response"), Some(0));
}

#[test]
fn a_holder_out_of_rotation_or_out_of_the_fleet_is_not_pinned() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    for (upstream, id) in [("127.0.0.1:2", "resp_b"), ("10.0.0.9:8000", "resp_x")] {
        let body = format!(r#"{{"id":"{id}"}}"#);
        let hi = br#"{"model":"m","input":"hi"}"#;
        responses_answered(&mut w, &host, hi, upstream, "200", &[&body]);
    }
    // b fails two scrapes in a row: out of rotation.
    for _ in 0..2 {
        host.now.set(host.now.get() + 600);
        w.tick(&host);
        answer(&mut w, &host, |pod| match pod {
            "127.0.0.1:2" => Reply::default(),
            _ => ok(METRICS),
        });
    }
    w.tick(&host);
    for (id, stat) in [("resp_b", "holder_down"), ("resp_x", "holder_gone")] {
        let body = format!(r#"{{"model":"m","previous_response_id":"{id}","input":"x"}}"#);
        let mut ex = send(&mut w, &host, &responses_headers(), body.as_bytes());
        let dest = routed_to(&host).unwrap_or_default();
        assert!(!dest.starts_with("127.0.0.1:2"), "{id}: {dest}");
        w.on_log(&host, &mut ex);
        w.tick(&host);
        assert_eq!(
            host.metric(&format!("warmroute.responses.{stat}")),
            Some(1),
            "{id}"
        );
    }
}

#[test]
fn a_messages_turn_is_checked_against_the_pods_anthropic_report() {
    let host = MemoryHost::default();
    let mut w = worker(&host);
    let headers = [
        (":method", "POST"),
        (":path", "/v1/messages"),
        ("content-type", "application/json"),
    ];
    let turn = |n: usize| {
        let mut messages = vec![format!(
            r#"{{"role":"user","content":"{}"}}"#,
            "q".repeat(3000)
        )];
        for i in 1..n {
            messages.push(format!(
                r#"{{"role":"assistant","content":[{{"type":"text","text":"answer {i}"}}]}}"#
            ));
            messages.push(format!(r#"{{"role":"user","content":"more {i}"}}"#));
        }
        format!(
            r#"{{"model":"m","max_tokens":8,"system":"{}","messages":[{}]}}"#,
            "s".repeat(600),
            messages.join(",")
        )
        .into_bytes()
    };
    let mut first = send(&mut w, &host, &headers, &turn(1));
    let pod = routed_to(&host).unwrap();
    let pod = pod.split(',').next().unwrap_or_default().to_string();
    answer_from(
        &mut w,
        &host,
        &mut first,
        &pod,
        "200",
        &[r#"{"usage":{"input_tokens":900,"output_tokens":8}}"#],
    );
    let mut second = send(&mut w, &host, &headers, &turn(2));
    assert!(
        routed_to(&host).unwrap().starts_with(&pod),
        "turn 2 extends turn 1"
    );
    assert!(
        second.awaiting_report.is_some(),
        "a predicted hit whose answer carries usage"
    );
    let report = r#"{"type":"message","usage":{"input_tokens":10,"output_tokens":8,"cache_creation_input_tokens":0,"cache_read_input_tokens":890}}"#;
    answer_from(&mut w, &host, &mut second, &pod, "200", &[report]);
    w.tick(&host);
    assert_eq!(host.metric("warmroute.feedback.reports"), Some(1));
    assert_eq!(host.metric("warmroute.feedback.reported_tokens"), Some(890));
}

/// A replica of a 3-pod gateway with peers (its peer listener on 15099).
fn replica(host: &MemoryHost) -> Worker {
    let config = CONFIG.replace(
        r#""metrics":"#,
        r#""peers":{"cluster":"peers","port":15099},"metrics":"#,
    );
    Worker::configure(host, config.as_bytes()).unwrap()
}

/// What `w` answers a peer's `GET path` arriving on `port` (status, body).
fn peer_get(w: &mut Worker, host: &MemoryHost, path: &str, port: u16) -> (u32, Vec<u8>) {
    let mut ex = TestExchange::request(&[(":method", "GET"), (":path", path)], b"");
    ex.local_port = Some(port);
    *host.exchange.borrow_mut() = ex;
    let step = w.on_request_headers(host, &mut Exchange::default(), true);
    assert_eq!(step, Step::Replied);
    assert_eq!(routed_to(host), None, "a peer's request is never routed");
    let reply = host.exchange.borrow().local_reply.clone().unwrap();
    (reply.status, reply.body)
}

#[test]
fn replicas_pull_each_others_placements_and_a_client_cannot() {
    let (here, there) = (MemoryHost::default(), MemoryHost::default());
    // Replicas started at different times take different ids.
    there.now.set(1);
    let (mut a, mut b) = (replica(&here), replica(&there));
    let path = format!("{}?since=0", crate::routing::exchange::PEER_PATH);
    // A client asking on the client listener's port gets nothing.
    assert_eq!(peer_get(&mut a, &here, &path, 10000), (404, Vec::new()));
    let body = chat_body(&"q".repeat(3000));
    send(&mut a, &here, &chat_headers(), &body);
    let pod = routed_to(&here).unwrap();
    // b's lease holder reads the peers cluster (a on .1, b itself on .2), then pulls both.
    there.now.set(500);
    b.tick(&there);
    let sent = there.take_callouts();
    let admin = sent
        .iter()
        .find(|c| c.header(":path").is_some_and(|p| p.contains("peers")))
        .unwrap();
    let peers = endpoints(&["10.0.0.1:15099", "10.0.0.2:15099"]);
    let peers = Reply {
        body: String::from_utf8_lossy(&peers.body)
            .replace(r#""name":"pool""#, r#""name":"peers""#)
            .into_bytes(),
        ..peers
    };
    deliver(&mut b, &there, std::slice::from_ref(admin), |_| {
        peers.clone()
    });
    there.now.set(1000);
    b.tick(&there);
    let sent = there.take_callouts();
    assert!(
        sent.iter().all(|c| c.cluster != "envoy-admin"),
        "the peers' endpoints are read every 2 s, not at every tick"
    );
    let pulls: Vec<SentCallout> = sent.into_iter().filter(|c| c.cluster == "peers").collect();
    assert_eq!(pulls.len(), 2);
    let (status, from_a) = peer_get(&mut a, &here, pulls[0].header(":path").unwrap(), 15099);
    assert_eq!(status, 200);
    let (_, from_b) = peer_get(&mut b, &there, pulls[1].header(":path").unwrap(), 15099);
    deliver(&mut b, &there, &pulls, |dest| {
        let body = if dest == "10.0.0.1:15099" {
            &from_a
        } else {
            &from_b
        };
        Reply {
            status: Some("200".into()),
            body: body.clone(),
        }
    });
    b.tick(&there);
    assert_eq!(there.metric("warmroute.peers.events_imported"), Some(1));
    // a's request is still in flight: b counts it on that pod, as its own VMs' are counted.
    let slot = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
        .iter()
        .position(|p| pod.starts_with(p))
        .unwrap();
    let mut expected = vec![0, 0, 0];
    expected[slot] = 1;
    assert_eq!(inflight(&b, &there), expected);
    assert_eq!(there.metric("warmroute.peers.pulls_ok"), Some(1));
    // b itself is not pulled again; a is, from where its reply ended.
    there.now.set(1500);
    b.tick(&there);
    let again: Vec<SentCallout> = there
        .take_callouts()
        .into_iter()
        .filter(|c| c.cluster == "peers")
        .collect();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].header(ENDPOINT_HEADER), Some("10.0.0.1:15099"));
    assert!(!again[0].header(":path").unwrap().ends_with("since=0"));
    // The same prompt through b goes where a sent it.
    send(&mut b, &there, &chat_headers(), &body);
    assert_eq!(routed_to(&there), Some(pod));
}

#[test]
fn a_worker_that_routes_little_still_serves_its_peers_every_event() {
    // Two workers of one replica; the shared log holds 64 events (the default 1 MiB).
    let host = MemoryHost::default();
    let (mut busy, mut idle) = (replica(&host), replica(&host));
    let path = format!("{}?since=0", crate::routing::exchange::PEER_PATH);
    let route = |w: &mut Worker, from: usize| {
        for i in from..from + 40 {
            send(
                w,
                &host,
                &chat_headers(),
                &chat_body(&format!("question {i}")),
            );
        }
    };
    route(&mut busy, 0);
    // The idle worker's tick follows the log, as its requests would.
    host.now.set(500);
    idle.tick(&host);
    route(&mut busy, 40);
    let (status, body) = peer_get(&mut idle, &host, &path, 15099);
    assert_eq!(status, 200);
    let batch = crate::routing::exchange::Batch::decode(&body).unwrap();
    assert_eq!(batch.events.len(), 80, "every event the busy worker routed");
}

#[test]
fn a_llamacpp_pod_is_read_by_its_names_and_sized_by_the_config() {
    let host = MemoryHost::default();
    host.now.set(1000);
    let cfg = r#"{"backends":[{"name":"a","address":"127.0.0.1:1"},{"name":"b","address":"127.0.0.1:2"}],
        "metrics":{"engine":"llamacpp","capacity_tokens":6144}}"#;
    let mut w = Worker::configure(&host, cfg.as_bytes()).unwrap();
    w.tick(&host);
    // What `llama-server --metrics` prints (no labels, no KV usage or size).
    let llama = "llamacpp:prompt_tokens_cached_total 3270\nllamacpp:requests_processing 2\n\
llamacpp:requests_deferred 3\n";
    answer(&mut w, &host, |_| ok(llama));
    let h = w.router.fleet().health();
    assert!(h.iter().all(|h| h.scrape.running == 2.0
        && h.scrape.waiting == 3.0
        && h.scrape.capacity_tokens == Some(6144)));
    w.tick(&host);
    host.now.set(1500);
    w.tick(&host);
    assert_eq!(
        host.metric("warmroute.backend.a.kv_capacity_tokens"),
        Some(6144)
    );
}
