use super::*;
use crate::config::ENDPOINT_HEADER;
use crate::testing::{MemoryHost, TestExchange};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// Two pods, each past its knee at one request; scrapes off, so only
/// this gateway's in-flight requests count.
const GATED: &str = r#"{"backends":[
        {"name":"a","address":"127.0.0.1:1"},
        {"name":"b","address":"127.0.0.1:2"}],
        "metrics":{"enabled":false},
        "gate":{"knee":{"requests":1},
          "classes":[{"name":"interactive","max_wait_ms":5000,"max_queue":4},
                     {"name":"batch","max_wait_ms":60000,"max_queue":2}],
          "default_class":"batch","lower_share":0,
          "objectives":{"premium-chat":"interactive"}}}"#;

fn gated(host: &MemoryHost) -> Worker {
    Worker::configure(host, GATED.as_bytes()).unwrap()
}

/// Sends a chat request on `context` with these extra headers; returns
/// its exchange and the step its body callback returned.
fn send(
    w: &mut Worker,
    host: &MemoryHost,
    context: u32,
    extra: &[(&str, &str)],
) -> (Exchange, Step) {
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"question {context} {}"}}]}}"#,
        "x".repeat(300)
    );
    let mut headers = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    *host.exchange.borrow_mut() = TestExchange::request(&headers, body.as_bytes());
    host.context.set(context);
    let mut ex = Exchange::new(context);
    assert_eq!(w.on_request_headers(host, &mut ex, false), Step::Pause);
    let step = w.on_request_body(host, &mut ex, body.len(), true);
    (ex, step)
}

fn end(w: &mut Worker, host: &MemoryHost, ex: &mut Exchange) {
    host.context.set(ex.context);
    host.exchange.borrow_mut().status = Some("200".into());
    w.on_response_headers(host, ex, true);
    w.on_log(host, ex);
}

fn resumed(host: &MemoryHost) -> Vec<u32> {
    host.resumed.borrow().iter().map(|(c, _)| *c).collect()
}

#[test]
fn nothing_is_held_below_the_knee_and_each_pod_stays_below_it() {
    let host = MemoryHost::default();
    let mut w = gated(&host);
    let (_a, step_a) = send(&mut w, &host, 1, &[]);
    let first = host.exchange.borrow().header(ENDPOINT_HEADER);
    let (_b, step_b) = send(&mut w, &host, 2, &[]);
    let second = host.exchange.borrow().header(ENDPOINT_HEADER);
    assert_eq!((step_a, step_b), (Step::Continue, Step::Continue));
    assert_ne!(
        first, second,
        "the second request avoids the pod at its knee"
    );
    w.tick(&host);
    assert_eq!(host.metric("warmroute.gate.batch.admitted"), Some(2));
    assert_eq!(host.metric("warmroute.gate.batch.held"), Some(0));
}

#[test]
fn held_requests_leave_highest_class_first_as_requests_end() {
    let host = MemoryHost::default();
    let mut w = gated(&host);
    let (mut a, _) = send(&mut w, &host, 1, &[]);
    let (mut b, _) = send(&mut w, &host, 2, &[]);
    let (mut batch, s3) = send(&mut w, &host, 3, &[]);
    let (mut chat, s4) = send(&mut w, &host, 4, &[("x-warmroute-priority", "interactive")]);
    let (mut chat2, s5) = send(
        &mut w,
        &host,
        5,
        &[("x-gateway-inference-objective", "premium-chat")],
    );
    assert_eq!((s3, s4, s5), (Step::Pause, Step::Pause, Step::Pause));
    assert!(resumed(&host).is_empty());
    // Only the two routed prompts wait on their pods; the held ones are not routed yet.
    assert_eq!(w.router.pending_prompts(), 2);
    end(&mut w, &host, &mut a);
    assert_eq!(
        resumed(&host),
        vec![4],
        "interactive first, though batch came first"
    );
    // The released request went out with a route, and its context gets its state back.
    assert!(host.resumed.borrow()[0]
        .1
        .iter()
        .any(|(k, _)| k == ENDPOINT_HEADER));
    end(&mut w, &host, &mut chat);
    assert_eq!(resumed(&host), vec![4, 5]);
    end(&mut w, &host, &mut b);
    assert_eq!(resumed(&host), vec![4, 5, 3]);
    for ex in [&mut chat2, &mut batch] {
        end(&mut w, &host, ex);
    }
    // The released ones were routed, and closed what they kept at their end.
    assert_eq!(w.router.pending_prompts(), 0);
    w.tick(&host);
    assert_eq!(host.metric("warmroute.gate.interactive.released"), Some(2));
    assert_eq!(host.metric("warmroute.gate.batch.released"), Some(1));
    assert_eq!(host.metric("warmroute.backend.a.inflight"), Some(0));
    assert_eq!(host.metric("warmroute.backend.b.inflight"), Some(0));
}

#[test]
fn a_passed_deadline_or_a_full_queue_is_a_429_and_a_gone_client_frees_its_place() {
    let host = MemoryHost::default();
    let mut w = gated(&host);
    let (mut a, _) = send(&mut w, &host, 1, &[]);
    let (_b, _) = send(&mut w, &host, 2, &[]);
    host.now.set(1000);
    let (_late, s) = send(&mut w, &host, 3, &[("x-warmroute-deadline-ms", "100")]);
    assert_eq!(s, Step::Pause);
    let (mut gone, _) = send(&mut w, &host, 4, &[]);
    // The batch queue (2) is full.
    let (_full, s) = send(&mut w, &host, 5, &[]);
    assert_eq!(s, Step::Replied);
    host.now.set(1099);
    w.tick(&host);
    assert!(host.replies.borrow().iter().all(|(c, _)| *c == 5));
    host.now.set(1100);
    w.tick(&host);
    let replies = host.replies.borrow().clone();
    assert_eq!(
        replies.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        vec![5, 3]
    );
    for (_, r) in &replies {
        assert_eq!(r.status, 429);
        assert!(r
            .headers
            .iter()
            .any(|(k, v)| k == "retry-after" && v == "1"));
    }
    // The client of 4 leaves while held: when capacity returns, nothing is resumed.
    host.context.set(4);
    w.on_log(&host, &mut gone);
    end(&mut w, &host, &mut a);
    assert!(resumed(&host).is_empty());
    host.now.set(2000);
    w.tick(&host);
    assert_eq!(host.metric("warmroute.gate.batch.shed_deadline"), Some(1));
    assert_eq!(host.metric("warmroute.gate.batch.shed_queue_full"), Some(1));
    assert_eq!(host.metric("warmroute.gate.batch.abandoned"), Some(1));
    assert_eq!(host.metric("warmroute.gate.batch.queued"), Some(0));
}

#[test]
fn the_order_holds_across_vms_and_the_freeing_vm_wakes_the_holder() {
    let host = MemoryHost::default();
    let mut a = gated(&host);
    let mut b = gated(&host);
    let (mut first, _) = send(&mut a, &host, 1, &[]);
    let (mut second, _) = send(&mut b, &host, 2, &[]);
    // VM a holds a batch request, then VM b an interactive one.
    let (_batch, s1) = send(&mut a, &host, 3, &[]);
    let (_chat, s2) = send(&mut b, &host, 4, &[("x-warmroute-priority", "interactive")]);
    assert_eq!((s1, s2), (Step::Pause, Step::Pause));
    // A request of VM a ends: the grant goes to VM b's interactive request.
    end(&mut a, &host, &mut first);
    assert!(
        resumed(&host).is_empty(),
        "VM a cannot resume VM b's request"
    );
    let wake_b = b.holding.as_ref().unwrap().wake;
    assert_eq!(host.queued(wake_b), 1);
    b.on_wake(&host, wake_b);
    assert_eq!(resumed(&host), vec![4]);
    // A request of VM b ends: VM a's batch request goes, woken through its queue.
    end(&mut b, &host, &mut second);
    let wake_a = a.holding.as_ref().unwrap().wake;
    a.on_wake(&host, wake_a);
    assert_eq!(resumed(&host), vec![4, 3]);
}

#[test]
fn only_a_request_envoy_holds_whole_waits() {
    let host = MemoryHost::default();
    let mut w = gated(&host);
    let (_a, _) = send(&mut w, &host, 1, &[]);
    let (_b, _) = send(&mut w, &host, 2, &[]);
    let at_headers = |w: &mut Worker, context: u32, extra: &[(&str, &str)], body: &[u8]| {
        let mut headers = vec![(":method", "POST"), (":path", "/v1/chat/completions")];
        headers.extend_from_slice(extra);
        *host.exchange.borrow_mut() = TestExchange::request(&headers, body);
        let mut ex = Exchange::new(context);
        let step = w.on_request_headers(&host, &mut ex, body.is_empty());
        (step, ex)
    };
    // No body: it waits at its headers.
    assert_eq!(at_headers(&mut w, 3, &[], b"").0, Step::Pause);
    // A body too large to buffer, compressed or not: routed at once, not held.
    for (context, extra) in [
        (5, &[("content-length", "99999999")][..]),
        (
            6,
            &[("content-length", "99999999"), ("content-encoding", "gzip")][..],
        ),
    ] {
        assert_eq!(at_headers(&mut w, context, extra, b"{}").0, Step::Continue);
    }
    // A compressed body the gate cannot read is buffered whole, and then waits.
    let zipped = [0x1f, 0x8b, 8, 0];
    let (step, mut ex) = at_headers(&mut w, 4, &[("content-encoding", "gzip")], &zipped);
    assert_eq!(step, Step::Pause);
    assert_eq!(
        w.on_request_body(&host, &mut ex, zipped.len(), true),
        Step::Pause
    );
    assert!(ex.parked);
}

#[test]
fn a_request_that_ends_with_trailers_waits_too() {
    let host = MemoryHost::default();
    let mut w = gated(&host);
    let (_a, _) = send(&mut w, &host, 1, &[]);
    let (_b, _) = send(&mut w, &host, 2, &[]);
    *host.exchange.borrow_mut() = TestExchange::request(
        &[(":method", "POST"), (":path", "/v1/chat/completions")],
        b"",
    );
    host.context.set(3);
    let mut ex = Exchange::new(3);
    assert_eq!(w.on_request_headers(&host, &mut ex, false), Step::Pause);
    assert_eq!(w.on_request_trailers(&host, &mut ex), Step::Pause);
}

#[test]
fn a_full_class_still_lets_through_a_request_that_can_go() {
    // Pod a serves x, pod b serves y; each is at its knee with one request.
    let cfg = GATED
        .replace(
            r#""address":"127.0.0.1:1"}"#,
            r#""address":"127.0.0.1:1","models":["x"]}"#,
        )
        .replace(
            r#""address":"127.0.0.1:2"}"#,
            r#""address":"127.0.0.1:2","models":["y"]}"#,
        );
    let host = MemoryHost::default();
    let mut w = Worker::configure(&host, cfg.as_bytes()).unwrap();
    let mut ask = |context: u32, model: &str| {
        let body = format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"q{context}"}}]}}"#
        );
        let headers = [(":method", "POST"), (":path", "/v1/chat/completions")];
        *host.exchange.borrow_mut() = TestExchange::request(&headers, body.as_bytes());
        host.context.set(context);
        let mut ex = Exchange::new(context);
        w.on_request_headers(&host, &mut ex, false);
        w.on_request_body(&host, &mut ex, body.len(), true)
    };
    assert_eq!(ask(1, "x"), Step::Continue);
    // Two x requests wait: the batch queue (2) is full.
    assert_eq!((ask(2, "x"), ask(3, "x")), (Step::Pause, Step::Pause));
    // A y request finds pod b free: it goes, though its class's queue is full.
    assert_eq!(ask(4, "y"), Step::Continue);
    // Another x request is shed: nothing can take it and its queue is full.
    assert_eq!(ask(5, "x"), Step::Replied);
    assert_eq!(host.replies.borrow().len(), 1);
}

#[test]
fn a_stopping_vm_routes_what_it_held() {
    let host = MemoryHost::default();
    let mut w = gated(&host);
    let (_a, _) = send(&mut w, &host, 1, &[]);
    let (_b, _) = send(&mut w, &host, 2, &[]);
    let (_held, s) = send(&mut w, &host, 3, &[]);
    assert_eq!(s, Step::Pause);
    w.on_done(&host);
    assert_eq!(resumed(&host), vec![3]);
}

#[test]
fn a_lost_wake_up_is_made_up_by_the_check() {
    let host = MemoryHost::default();
    let mut a = gated(&host);
    let mut b = gated(&host);
    let (mut first, _) = send(&mut b, &host, 1, &[]);
    let (_second, _) = send(&mut b, &host, 2, &[]);
    let (_held, s) = send(&mut a, &host, 3, &[]);
    assert_eq!(s, Step::Pause);
    end(&mut b, &host, &mut first);
    let wake_a = a.holding.as_ref().unwrap().wake;
    assert_eq!(host.dequeue(wake_a).unwrap().map(|m| m.len()), Some(12));
    a.tick(&host);
    assert_eq!(resumed(&host), vec![3]);
}

#[test]
fn held_bodies_stop_at_the_byte_budget() {
    let host = MemoryHost::default();
    let budget = GATED.replace(
        r#""lower_share":0"#,
        r#""lower_share":0,"max_held_bytes":1048576"#,
    );
    let mut w = Worker::configure(&host, budget.as_bytes()).unwrap();
    let (_a, _) = send(&mut w, &host, 1, &[]);
    let (_b, _) = send(&mut w, &host, 2, &[]);
    // Both pods at their knee: bodies of 400 KB wait, until the third would pass 1 MiB.
    let big = |w: &mut Worker, context: u32| {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
            "y".repeat(400_000)
        );
        let headers = [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("x-warmroute-priority", "interactive"),
        ];
        *host.exchange.borrow_mut() = TestExchange::request(&headers, body.as_bytes());
        host.context.set(context);
        let mut ex = Exchange::new(context);
        w.on_request_headers(&host, &mut ex, false);
        w.on_request_body(&host, &mut ex, body.len(), true)
    };
    assert_eq!(big(&mut w, 3), Step::Pause);
    assert_eq!(big(&mut w, 4), Step::Pause);
    assert_eq!(big(&mut w, 5), Step::Replied);
    assert_eq!(
        host.exchange
            .borrow()
            .local_reply
            .as_ref()
            .map(|r| r.status),
        Some(429)
    );
    w.tick(&host);
    assert_eq!(
        host.metric("warmroute.gate.interactive.shed_queue_full"),
        Some(1)
    );
}
