use super::*;
use crate::fleet::health::Outcome;
use crate::fleet::inflight::InFlight;
use crate::fleet::responses::Entry;
use crate::fleet::scrape::Scrape;
use crate::hash::address_id;
use crate::prompt::openai::{prompt_key, Endpoint};
use crate::routing::exchange::{Batch, PeerAnswer};
use crate::routing::index::PromptModel;
use crate::routing::index_log::Event;
use crate::testing::MemoryHost;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn cfg(strategy: &str) -> Config {
    Config::parse(
            format!(
                r#"{{"strategy":"{strategy}","backends":[{{"name":"a","address":"127.0.0.1:1"}},{{"name":"b","address":"127.0.0.1:2"}},{{"name":"c","address":"127.0.0.1:3"}}]}}"#
            )
            .as_bytes(),
        )
        .unwrap()
}

/// What a request without an output limit holds once its prefill is done.
fn one() -> Delta {
    Delta {
        requests: 1,
        prefill_blocks: 0,
        decode_tokens: crate::testing::config(1).policy.default_output_tokens as i32,
    }
}

/// Nothing in flight anywhere, by the ledger.
fn assert_idle(a: &Router, host: &MemoryHost) {
    assert_eq!(
        a.fleet().store(host).inflight().unwrap(),
        vec![InFlight::default(); 3]
    );
}

/// A request with this prompt and no session.
fn prompt(key: &PromptKey) -> Request<'_> {
    Request {
        key: Some(key),
        session: None,
        previous: None,
    }
}

fn chat(turns: &[(&str, &str)]) -> PromptKey {
    let messages: Vec<String> = turns
        .iter()
        .map(|(role, content)| format!(r#"{{"role":"{role}","content":"{content}"}}"#))
        .collect();
    let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
    prompt_key(Endpoint::Chat, body.as_bytes(), 256, ANCHOR_BYTES).unwrap()
}

/// A conversation's first two turns: a long system prompt, a question, an answer, a question.
fn two_turns() -> (PromptKey, PromptKey) {
    let sys = "x".repeat(4000);
    let answer = "y".repeat(3000);
    let turn1 = chat(&[("system", &sys), ("user", "q1")]);
    let turn2 = chat(&[
        ("system", &sys),
        ("user", "q1"),
        ("assistant", &answer),
        ("user", "q2"),
    ]);
    (turn1, turn2)
}

#[test]
fn a_prefix_learned_by_one_vm_is_matched_by_another() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let mut b = Router::new(cfg("cache_aware"), &host);
    assert_ne!(a.fleet().vm_id(), b.fleet().vm_id());
    let (turn1, turn2) = two_turns();
    let first = a.route(&host, &prompt(&turn1));
    a.fleet_mut()
        .release(&host, first.decision.order[0], one())
        .unwrap();
    // Turn 2 goes through the other VM: only the shared log can tell it where turn 1 went.
    let second = b.route(&host, &prompt(&turn2));
    assert_eq!(second.decision.order[0], first.decision.order[0]);
    assert!(second.decision.matched >= 15, "{:?}", second.decision);
    assert_eq!(second.host_errors, 0);
}

#[test]
fn inflight_is_accounted_and_released() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("least_request"), &host);
    let picks: Vec<usize> = (0..3)
        .map(|_| a.route(&host, &Request::default()).decision.order[0])
        .collect();
    let mut sorted = picks.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec![0, 1, 2],
        "least_request spreads in-flight work"
    );
    let requests = |a: &Router| -> Vec<u32> {
        let inflight = a.fleet().store(&host).inflight().unwrap();
        inflight.iter().map(|f| f.requests).collect()
    };
    // While others are open, a release waits for this VM's next ledger write...
    a.fleet_mut().release(&host, picks[0], one()).unwrap();
    assert_eq!(requests(&a), vec![1, 1, 1]);
    // ... though this VM counts it at once.
    let mut own = vec![1, 1, 1];
    own[picks[0]] = 0;
    let seen: Vec<u32> = a
        .fleet()
        .inflight(&host)
        .unwrap()
        .iter()
        .map(|f| f.requests)
        .collect();
    assert_eq!(seen, own);
    let next = a.route(&host, &Request::default()).decision.order[0];
    assert_eq!(next, picks[0], "this VM routes on its own release at once");
    assert_eq!(requests(&a), vec![1, 1, 1]);
    // ... or for the tick...
    a.fleet_mut().release(&host, picks[1], one()).unwrap();
    a.fleet_mut().flush_releases(&host).unwrap();
    let mut left = vec![1, 1, 1];
    left[picks[1]] = 0;
    assert_eq!(requests(&a), left);
    // ... and the last open request's end writes everything.
    a.fleet_mut().release(&host, picks[2], one()).unwrap();
    assert_eq!(requests(&a), left);
    a.fleet_mut().release(&host, next, one()).unwrap();
    assert_idle(&a, &host);
}

#[test]
fn a_request_the_ledger_never_heard_of_releases_nothing() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("least_request"), &host);
    let first = a.route(&host, &Request::default());
    assert_eq!(first.claim, one());
    // Every CAS of the next request's ledger write loses: the one try of
    // each decision, then every retry of the last.
    host.inject_conflicts
        .set(MAX_REDECISIONS + crate::fleet::store::MAX_CAS_RETRIES);
    let lost = a.route(&host, &Request::default());
    assert_eq!(
        (lost.claim, lost.host_errors, lost.redecided),
        (Delta::default(), 1, MAX_REDECISIONS)
    );
    a.fleet_mut()
        .release(&host, lost.decision.order[0], lost.claim)
        .unwrap();
    let inflight = a.fleet().store(&host).inflight().unwrap();
    assert_eq!(
        inflight[first.decision.order[0]].requests, 1,
        "{inflight:?}"
    );
    a.fleet_mut()
        .release(&host, first.decision.order[0], first.claim)
        .unwrap();
    assert_idle(&a, &host);
}

#[test]
fn a_decision_is_made_again_when_another_worker_wrote_the_ledger_since_its_read() {
    // Two new prompts that an idle fleet places on the same pod.
    let ask = |i: usize| chat(&[("user", &format!("{i} {}", "y".repeat(4000)))]);
    let alone = |key: &PromptKey| {
        let host = MemoryHost::default();
        Router::new(cfg("cache_aware"), &host)
            .route(&host, &prompt(key))
            .decision
            .order[0]
    };
    let (k1, k2) = (0..64)
        .flat_map(|i| (0..i).map(move |j| (j, i)))
        .find(|&(j, i)| alone(&ask(j)) == alone(&ask(i)))
        .map(|(j, i)| (ask(j), ask(i)))
        .unwrap();
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let mut b = Router::new(cfg("cache_aware"), &host);
    // `a` reads the ledger (idle) for k2; `b` routes k1 before `a` writes.
    let (_, look) = a.admit(&host, &prompt(&k2));
    let first = b.route(&host, &prompt(&k1));
    assert_eq!(first.redecided, 0);
    let second = a.route_admitted(&host, &prompt(&k2), Some(look));
    assert_eq!(second.redecided, 1, "{second:?}");
    assert_ne!(second.decision.order[0], first.decision.order[0]);
    let inflight = a.fleet().store(&host).inflight().unwrap();
    assert_eq!(inflight.iter().map(|f| f.requests).sum::<u32>(), 2);
}

#[test]
fn only_uncached_blocks_wait_for_prefill() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let long = "x".repeat(4000);
    let turn1 = chat(&[("user", &long)]);
    let turn2 = chat(&[("user", &long), ("assistant", "ok"), ("user", &long)]);
    let route = |a: &mut Router, key: &PromptKey| a.route(&host, &prompt(key));
    let first = route(&mut a, &turn1);
    let b = first.decision.order[0];
    assert_eq!(first.claim.prefill_blocks as u32, first.blocks);
    // Turn 1's answer started: its prefill no longer holds anyone up.
    let mut claim = first.claim;
    a.fleet_mut().prefilled(b, &mut claim);
    assert_eq!(claim, one());
    // Open requests wait for a write: here the tick's.
    a.fleet_mut().flush_releases(&host).unwrap();
    let claim = a.fleet().store(&host).inflight().unwrap()[b];
    assert_eq!((claim.requests, claim.prefill_blocks), (1, 0));
    // Done (with 3 pods and 1 request in flight the load bound would move turn 2).
    a.fleet_mut().release(&host, b, one()).unwrap();
    let second = route(&mut a, &turn2);
    assert_eq!(second.decision.order[0], b);
    assert!(second.decision.matched >= first.blocks, "{second:?}");
    assert_eq!(
        second.claim.prefill_blocks as u32,
        second.blocks - second.decision.matched
    );
    let claim = a.fleet().store(&host).inflight().unwrap()[b];
    assert_eq!(
        (claim.requests, claim.prefill_blocks),
        (1, second.claim.prefill_blocks as u32)
    );
}

#[test]
fn a_prefix_is_shared_while_another_request_with_it_waits_on_its_pod() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let doc = "x".repeat(6000);
    // Continuations (so their matches count in full, see the next test).
    let ask = |q: &str| {
        chat(&[
            ("user", &doc),
            ("assistant", "ok"),
            ("user", &q.repeat(2000)),
        ])
    };
    let first = a.route(&host, &prompt(&ask("a")));
    let b = first.decision.order[0];
    let second = a.route(&host, &prompt(&ask("b")));
    assert!(
        a.matched[b] > 0 && a.shared[b],
        "{:?} {:?}",
        a.matched,
        a.shared
    );
    assert!(a.shared.iter().enumerate().all(|(c, &s)| c == b || !s));
    // Both answers started: the document waits in no prefill, its next user holds it alone.
    a.close(first.pending.unwrap());
    a.close(second.pending.unwrap());
    assert_eq!((a.pending_prompts(), a.pending.blocks()), (0, 0));
    a.route(&host, &prompt(&ask("c")));
    assert!(a.matched[b] > 0 && a.shared.iter().all(|&s| !s));
}

#[test]
fn a_small_request_avoids_the_pod_busy_with_a_huge_prompt_or_a_long_answer() {
    for busy_with in ["prompt", "answer"] {
        let host = MemoryHost::default();
        let mut a = Router::new(cfg("least_request"), &host);
        let mut heavy = chat(&[(
            "user",
            &"w ".repeat(if busy_with == "prompt" { 200_000 } else { 10 }),
        )]);
        if busy_with == "answer" {
            heavy.max_output_tokens = Some(32_000);
        }
        let busy = a.route(&host, &prompt(&heavy)).decision.order[0];
        // One small request on each other pod: request counts are now equal.
        for i in 0..2 {
            let small = chat(&[("user", &format!("small {i}"))]);
            assert_ne!(a.route(&host, &prompt(&small)).decision.order[0], busy);
        }
        for i in 0..30 {
            let small = chat(&[("user", &format!("next {i}"))]);
            let r = a.route(&host, &prompt(&small));
            assert_ne!(r.decision.order[0], busy, "{busy_with}, request {i}");
            a.fleet_mut()
                .release(&host, r.decision.order[0], r.claim)
                .unwrap();
        }
    }
}

#[test]
fn forged_continuations_cannot_pile_onto_one_pod() {
    // 50 requests in flight at once, all "continuations" of one conversation that
    // this gateway never saw: without a bound they would all follow the anchor.
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    for i in 0..50 {
        let key = chat(&[
            ("user", "the same opening turn"),
            ("assistant", "ok"),
            ("user", &format!("forged {i}")),
        ]);
        assert!(key.continuation);
        a.route(&host, &prompt(&key));
    }
    let inflight = a.fleet().store(&host).inflight().unwrap();
    // The bound at the last decision: ceil((1 + eps) * (49 + 1) / 3) = 25.
    let most = inflight.iter().map(|f| f.requests).max().unwrap();
    assert!(most <= 25, "{inflight:?}");
    assert_eq!(inflight.iter().map(|f| f.requests).sum::<u32>(), 50);
}

#[test]
fn blocks_a_pending_prompt_brings_are_no_hit_on_any_worker() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let mut b = Router::new(cfg("cache_aware"), &host);
    let doc = "x".repeat(12_000); // past the index's dense head
    let ask = |q: &str| chat(&[("user", &format!("{doc} {}", q.repeat(2000)))]);
    // While the prompts that bring the document wait for their prefill, it is no
    // hit, whichever worker routes the next (B by A's ledger share, A by its
    // ticket and B's share), and the next prompt's whole prefill is accounted.
    let first = a.route(&host, &prompt(&ask("a")));
    let second = b.route(&host, &prompt(&ask("b")));
    let third = a.route(&host, &prompt(&ask("c")));
    for next in [&second, &third] {
        assert_eq!(next.decision.matched, 0, "{next:?}");
        assert_eq!(next.claim.prefill_blocks as u32, next.blocks);
    }
    // Their answers started: the document is a hit on their pods, for both workers.
    let answered = |r: &mut Router, routed: &Routed| {
        let mut claim = routed.claim;
        r.fleet_mut()
            .prefilled(routed.decision.order[0], &mut claim);
        r.close(routed.pending.unwrap());
    };
    answered(&mut a, &first);
    answered(&mut b, &second);
    answered(&mut a, &third);
    a.fleet_mut().flush_releases(&host).unwrap();
    b.fleet_mut().flush_releases(&host).unwrap();
    for (r, q) in [(&mut a, "d"), (&mut b, "e")] {
        let next = r.route(&host, &prompt(&ask(q)));
        assert!(next.decision.matched * 2 > next.blocks, "{next:?}");
    }
    // B dropped A's answered prompts; it keeps the one A just sent.
    assert_eq!(b.pending.foreign_prompts(), 1);
}

#[test]
fn an_event_for_a_slot_this_fleet_lacks_is_not_kept() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let mut b = Router::new(cfg("cache_aware"), &host);
    let ask = chat(&[("user", &"x".repeat(12_000))]);
    a.route(&host, &prompt(&ask));
    // A's event, its backend rewritten past the fleet (another pool's VM, a corrupt slot):
    // B must not keep lists for 60000 slots on it (scanned at every request after).
    let mut rewritten = 0;
    for key in host.shared_keys() {
        let Ok((Some(mut v), _)) = host.get_shared(&key) else {
            continue;
        };
        if Event::decode(&v).is_some_and(|ev| ev.head.kind == Kind::Received) {
            v[18..20].copy_from_slice(&60_000u16.to_le_bytes());
            host.set_shared(&key, &v, None).unwrap();
            rewritten += 1;
        }
    }
    assert_eq!(rewritten, 1);
    b.route(&host, &prompt(&chat(&[("user", &"y".repeat(4000))])));
    assert_eq!(b.pending.foreign_prompts(), 0);
    assert!(
        b.pending.foreign_pods() <= b.fleet().slot_count(),
        "{}",
        b.pending.foreign_pods()
    );
}

#[test]
fn a_restarted_log_is_followed_from_its_new_head() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let mut b = Router::new(cfg("cache_aware"), &host);
    let long = "x".repeat(4000);
    let key = chat(&[("user", &long)]);
    let req = prompt(&key);
    for _ in 0..3 {
        a.route(&host, &req);
        b.route(&host, &req);
    }
    // The ledger is gone (a restart of the key space, another release's layout).
    for k in host.shared_keys().iter().filter(|k| k.contains("ledger")) {
        host.remove_shared(k);
    }
    assert!(b.route(&host, &req).log_gap, "the restart is counted");
    // A's events written from the new head reach B again.
    let other = chat(&[("user", &"y".repeat(4000))]);
    let placed = a.route(&host, &prompt(&other));
    // Its answer started (else its blocks still wait for their prefill).
    let mut claim = placed.claim;
    a.fleet_mut()
        .prefilled(placed.decision.order[0], &mut claim);
    a.fleet_mut().flush_releases(&host).unwrap();
    let seen = b.route(&host, &prompt(&other));
    assert!(!seen.log_gap);
    assert_eq!(seen.decision.order[0], placed.decision.order[0]);
    assert!(seen.decision.matched > 0, "{seen:?}");
}

#[test]
fn round_robin_rotates_across_vms() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("round_robin"), &host);
    let mut b = Router::new(cfg("round_robin"), &host);
    let picks: Vec<usize> = (0..6)
        .map(|i| {
            let r = if i % 2 == 0 { &mut a } else { &mut b };
            r.route(&host, &Request::default()).decision.order[0]
        })
        .collect();
    assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
}

#[test]
fn a_vm_creates_the_shared_values_as_it_is_configured() {
    // Were they created by the first request instead, two workers' first requests
    // could both find them missing, and both take rotation number 0.
    let host = MemoryHost::default();
    let kept = |host: &MemoryHost, name: &str| {
        host.shared_keys()
            .into_iter()
            .filter(|k| k.ends_with(name))
            .count()
    };
    let r = Router::new(cfg("cache_aware"), &host);
    assert_eq!(kept(&host, ".ledger.v5"), 1);
    assert_eq!(
        kept(&host, ".rotation.v1"),
        0,
        "only strategies that rotate keep one"
    );
    // The ledger created empty reads as the missing one did.
    assert!(r
        .fleet()
        .inflight(&host)
        .unwrap()
        .iter()
        .all(|f| f.requests == 0));
    Router::new(cfg("round_robin"), &host);
    assert_eq!(kept(&host, ".rotation.v1"), 1);
}

#[test]
fn index_sizes_to_backend_capacity() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    // This VM's own scrape applies at once.
    let scrape = |tokens| Scrape {
        capacity_tokens: Some(tokens),
        ..Scrape::default()
    };
    a.update_fleet(|f| f.record_scrape(&host, 0, Outcome::Answered(scrape(6400)), 1))
        .unwrap();
    assert_eq!(a.index.capacity(0), 100);
    // Another VM's scrape reaches this one at its tick.
    let mut b = Router::new(cfg("cache_aware"), &host);
    b.update_fleet(|f| f.record_scrape(&host, 1, Outcome::Answered(scrape(12_800)), 1))
        .unwrap();
    assert_eq!(a.index.capacity(1), a.index.capacity(2));
    a.update_fleet(|f| f.refresh_health(&host)).unwrap();
    assert_eq!(a.index.capacity(1), 200);
    assert_eq!(a.fleet().health()[0].scrape.capacity_tokens, Some(6400));
}

#[test]
fn pods_that_keep_whole_prompts_size_the_prompt_model() {
    let host = MemoryHost::default();
    let llama = |prompt_cache: &str| {
        Config::parse(
            format!(
                r#"{{"backends":[{{"name":"a","address":"127.0.0.1:1"}},{{"name":"b","address":"127.0.0.1:2"}}],
                    "metrics":{{"engine":"llamacpp","capacity_tokens":64000{prompt_cache}}}}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    };
    let mut a = Router::new(
        llama(r#","prompt_cache":{"slots":2,"ram_tokens":6400}"#),
        &host,
    );
    // 6400 tokens x 4 bytes per token / 256-byte blocks.
    assert_eq!(
        a.index.prompt_model(),
        Some(PromptModel {
            slots: 2,
            ram_blocks: 100
        })
    );
    // The RAM cache in blocks follows the ratio the pods report.
    for _ in 0..300 {
        a.learn_ratio(40 * 256, 40 * 32);
    }
    let ram = a.index.prompt_model().map_or(0, |m| m.ram_blocks);
    assert!((190..=200).contains(&ram), "{ram}");
    // Without `prompt_cache` the index forgets by blocks alone.
    assert_eq!(Router::new(llama(""), &host).index.prompt_model(), None);
}

#[test]
fn a_conversation_the_pod_no_longer_holds_is_routed_as_a_new_one() {
    let host = MemoryHost::default();
    // One pod that keeps one whole prompt.
    let cfg = Config::parse(
        br#"{"backends":[{"name":"a","address":"127.0.0.1:1"}],
            "metrics":{"engine":"llamacpp","capacity_tokens":64000,
                       "prompt_cache":{"slots":1,"ram_tokens":0}}}"#,
    )
    .unwrap();
    let mut a = Router::new(cfg, &host);
    // First questions long enough that each conversation's prompt goes past the system
    // prompt's blocks (a prompt within another is held with it, not evicted by it).
    let (sys, q1) = ("x".repeat(4000), "q".repeat(600));
    let turn1 = chat(&[("system", &sys), ("user", &q1)]);
    let turn2 = chat(&[
        ("system", &sys),
        ("user", &q1),
        ("assistant", &"y".repeat(3000)),
        ("user", "q2"),
    ]);
    let first = a.route(&host, &prompt(&turn1));
    a.fleet_mut().release(&host, 0, one()).unwrap();
    let other = chat(&[("system", &sys), ("user", &"o".repeat(600))]);
    a.route(&host, &prompt(&other));
    a.fleet_mut().release(&host, 0, one()).unwrap();
    // Turn 1 was evicted by the other conversation: turn 2 is believed to find the shared
    // system prompt there, not the conversation's history.
    let second = a.route(&host, &prompt(&turn2));
    assert!(
        first.decision.matched == 0 && second.decision.matched < 16,
        "{:?}",
        second.decision
    );
}

#[test]
fn the_index_follows_the_ratio_the_pods_report() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let scrape = Scrape {
        capacity_tokens: Some(6400),
        ..Scrape::default()
    };
    a.update_fleet(|f| f.record_scrape(&host, 0, Outcome::Answered(scrape), 1))
        .unwrap();
    assert_eq!(a.index.capacity(0), 100);
    // The pods count 32 tokens per 256-byte block: 8 bytes per token, twice the default.
    for _ in 0..300 {
        a.learn_ratio(40 * 256, 40 * 32);
    }
    assert!(
        (a.bytes_per_token() - 8.0).abs() < 0.5,
        "{}",
        a.bytes_per_token()
    );
    assert!(
        (190..=200).contains(&a.index.capacity(0)),
        "{}",
        a.index.capacity(0)
    );
    let mut pinned = cfg("cache_aware");
    pinned.index.learn_bytes_per_token = false;
    let mut p = Router::new(pinned, &host);
    p.learn_ratio(40 * 256, 40 * 32);
    assert_eq!(p.bytes_per_token(), 4.0);
}

/// A `/v1/responses` follow-up whose predecessor the record says `previous` answered.
fn follow_up<'a>(key: &'a PromptKey, previous: Previous) -> Request<'a> {
    Request {
        key: Some(key),
        session: None,
        previous: Some(previous),
    }
}

fn responses_key(input: &str) -> PromptKey {
    let body = format!(r#"{{"model":"m","previous_response_id":"resp_1","input":"{input}"}}"#);
    prompt_key(Endpoint::Responses, body.as_bytes(), 256, ANCHOR_BYTES).unwrap()
}

#[test]
fn a_follow_up_goes_to_the_pod_that_answered_whatever_its_load() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let key = responses_key(&"z".repeat(2000));
    let pod_c = crate::hash::address_id("127.0.0.1:3");
    // Pod c is the busiest by far: every request until now went there.
    for _ in 0..12 {
        let r = a.route(&host, &follow_up(&key, Previous::Answered(pod_c)));
        assert_eq!(
            r.decision.order,
            vec![2],
            "the holder only: no fallback serves it"
        );
        assert_eq!(r.decision.reason, Reason::StoredResponse);
        assert_eq!(r.continued, Some(Continued::Holder));
    }
    assert_eq!(a.fleet().store(&host).inflight().unwrap()[2].requests, 12);
    // Without the record, the same body is routed as usual (away from c's load).
    let usual = a.route(&host, &prompt(&key));
    assert_ne!(usual.decision.order[0], 2);
    assert_eq!(usual.continued, None);
}

#[test]
fn a_follow_up_whose_holder_is_unknown_gone_or_down_routes_as_usual() {
    let host = MemoryHost::default();
    let mut a = Router::new(cfg("cache_aware"), &host);
    let key = responses_key("and then?");
    let unknown = a.route(&host, &follow_up(&key, Previous::Unknown));
    assert_eq!(unknown.continued, Some(Continued::Unknown));
    assert_ne!(unknown.decision.reason, Reason::StoredResponse);
    // A pod this fleet does not have (left the pool, or another fleet's).
    let elsewhere = crate::hash::address_id("127.0.0.1:9");
    let gone = a.route(&host, &follow_up(&key, Previous::Answered(elsewhere)));
    assert_eq!(gone.continued, Some(Continued::HolderGone));
    assert_ne!(gone.decision.reason, Reason::StoredResponse);
    assert!(
        gone.decision.order.len() > 1,
        "routed as usual, fallbacks and all"
    );
    // Pod b fails its scrapes until it is out of rotation.
    let pod_b = crate::hash::address_id("127.0.0.1:2");
    for now in 1..=3 {
        a.update_fleet(|f| f.record_scrape(&host, 1, Outcome::Failed, now))
            .unwrap();
    }
    let down = a.route(&host, &follow_up(&key, Previous::Answered(pod_b)));
    assert_eq!(down.continued, Some(Continued::HolderDown));
    assert_ne!(down.decision.order[0], 1);
}

fn with_peers(strategy: &str, backends: &str) -> Config {
    Config::parse(
        format!(
            r#"{{"strategy":"{strategy}","backends":[{backends}],"peers":{{"cluster":"peers","port":15099}}}}"#
        )
        .as_bytes(),
    )
    .unwrap()
}

const ABC: &str = r#"{"name":"a","address":"127.0.0.1:1"},{"name":"b","address":"127.0.0.1:2"},{"name":"c","address":"127.0.0.1:3"}"#;

#[test]
fn a_conversation_routed_by_one_replica_is_matched_by_another() {
    // Two gateway replicas: each its own Envoy (shared data), the same pods,
    // which the second lists in another order (its slots differ).
    let (here, there) = (MemoryHost::default(), MemoryHost::default());
    let mut a = Router::new(with_peers("cache_aware", ABC), &here);
    let cba = r#"{"name":"c","address":"127.0.0.1:3"},{"name":"b","address":"127.0.0.1:2"},{"name":"a","address":"127.0.0.1:1"}"#;
    let mut b = Router::new(with_peers("cache_aware", cba), &there);
    let (turn1, turn2) = two_turns();
    let first = a.route(&here, &prompt(&turn1));
    let pod = first.decision.order[0];
    here.now.set(here.now.get() + 40);
    let reply = a.serve_peer(&here, 7, (0, None), (None, 1 << 20)).unwrap();
    let batch = Batch::decode(&reply).unwrap();
    assert_eq!((batch.replica, batch.events.len()), (7, 1));
    assert_eq!(batch.events[0].age_ms, 40);
    let imported = b.import_peer(&there, &batch, there.now.get(), (64, 32));
    assert_eq!(
        imported,
        Imported {
            events: 1,
            dropped: 0,
            answers: 0
        }
    );
    // Nothing new since: the next pull from where this one ended is empty.
    assert!(Batch::decode(
        &a.serve_peer(&here, 7, (batch.next_seq, None), (None, 1 << 20))
            .unwrap()
    )
    .unwrap()
    .events
    .is_empty());
    let second = b.route(&there, &prompt(&turn2));
    assert_eq!(
        second.decision.order[0],
        2 - pod,
        "the same pod, in b's slots"
    );
    assert!(second.decision.matched >= 15, "{:?}", second.decision);
    // What b imported is not served again: nothing echoes back to a.
    let back =
        Batch::decode(&b.serve_peer(&there, 8, (0, None), (None, 1 << 20)).unwrap()).unwrap();
    assert_eq!(back.events.len(), 1, "only b's own turn 2");
    assert_eq!(back.pods, [format!("127.0.0.1:{}", pod + 1)]);
}

#[test]
fn a_stored_response_answered_behind_one_replica_is_found_by_another() {
    let (here, there) = (MemoryHost::default(), MemoryHost::default());
    let mut a = Router::new(with_peers("cache_aware", ABC), &here);
    let mut b = Router::new(with_peers("cache_aware", ABC), &there);
    let pod = address_id("127.0.0.1:2");
    for id in [11, 12] {
        let e = Entry {
            id,
            pod,
            at_ms: here.now.get(),
        };
        a.fleet().store(&here).remember_response(e, 64).unwrap();
        a.fleet().store(&here).share_response(e).unwrap();
    }
    here.now.set(here.now.get() + 30);
    // A replica of an earlier release does not ask for answers, and gets none.
    let old = Batch::decode(&a.serve_peer(&here, 7, (0, None), (None, 1 << 20)).unwrap()).unwrap();
    assert_eq!(old.answers, None);
    let batch = Batch::decode(
        &a.serve_peer(&here, 7, (0, Some(1)), (None, 1 << 20))
            .unwrap(),
    )
    .unwrap();
    let answers = batch.answers.clone().unwrap();
    assert_eq!(answers.next, 2);
    assert_eq!(
        answers.entries,
        [PeerAnswer {
            id: 12,
            pod,
            age_ms: 30
        }]
    );
    there.now.set(1_000);
    assert_eq!(
        b.import_peer(&there, &batch, there.now.get(), (64, 32))
            .answers,
        1
    );
    let found = b.fleet().store(&there).response_holder(12).unwrap();
    assert_eq!(
        found,
        Some(Entry {
            id: 12,
            pod,
            at_ms: 970
        })
    );
    // What b imported is not in b's ring: nothing echoes back to a.
    let back = Batch::decode(
        &b.serve_peer(&there, 8, (0, Some(0)), (None, 1 << 20))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(back.answers.map(|a| a.entries.len()), Some(0));
    // With the record off, a peer's answers are not written.
    assert_eq!(
        b.import_peer(&there, &batch, there.now.get(), (0, 32))
            .answers,
        0
    );
}

#[test]
fn a_catch_up_reply_full_of_events_still_carries_the_answers() {
    let here = MemoryHost::default();
    let mut a = Router::new(with_peers("cache_aware", ABC), &here);
    for i in 0..40 {
        a.route(
            &here,
            &prompt(&chat(&[("user", &format!("{i}").repeat(3000))])),
        );
    }
    let pod = address_id("127.0.0.1:2");
    for id in 0..20 {
        let e = Entry {
            id,
            pod,
            at_ms: here.now.get(),
        };
        a.fleet().store(&here).share_response(e).unwrap();
    }
    let batch =
        Batch::decode(&a.serve_peer(&here, 7, (0, Some(0)), (None, 4096)).unwrap()).unwrap();
    assert!(
        !batch.events.is_empty() && batch.next_seq < 40,
        "the events fill the reply: {} served",
        batch.events.len()
    );
    assert_eq!(
        batch.answers.map(|a| (a.entries.len(), a.next)),
        Some((20, 20))
    );
    // The same within a puller's ask, well below the reply's limit.
    let asked = Batch::decode(
        &a.serve_peer(&here, 7, (0, Some(0)), (Some(4096), 1 << 20))
            .unwrap(),
    )
    .unwrap();
    assert!(asked.next_seq < 40);
    assert_eq!(asked.answers.map(|a| a.entries.len()), Some(20));
}

#[test]
fn a_peer_event_about_a_pod_this_replica_lacks_is_dropped() {
    let (here, there) = (MemoryHost::default(), MemoryHost::default());
    let mut a = Router::new(with_peers("cache_aware", ABC), &here);
    let mut b = Router::new(
        with_peers("cache_aware", r#"{"name":"z","address":"127.0.0.1:9"}"#),
        &there,
    );
    a.route(&here, &prompt(&chat(&[("user", &"q".repeat(3000))])));
    let batch =
        Batch::decode(&a.serve_peer(&here, 7, (0, None), (None, 1 << 20)).unwrap()).unwrap();
    assert_eq!(
        b.import_peer(&there, &batch, 0, (64, 32)),
        Imported {
            events: 0,
            dropped: 1,
            answers: 0
        }
    );
    assert_eq!(b.fleet().store(&there).log_next_seq(), Ok(0));
}

#[test]
fn a_joining_replica_keeps_a_peer_outbox_longer_than_the_log_ring() {
    // Replica a routed more conversations than its log has slots (64 at the
    // default 1 MiB); replica b joins and copies them all in one pull. Every
    // VM of b, the importer and another, then matches the first one's next
    // turn where a put it: one slot per event would lap b's ring, and its VMs
    // would keep only the last 64.
    let (here, there) = (MemoryHost::default(), MemoryHost::default());
    let mut a = Router::new(with_peers("cache_aware", ABC), &here);
    let mut b = Router::new(with_peers("cache_aware", ABC), &there);
    let mut other = Router::new(with_peers("cache_aware", ABC), &there);
    let slots = a.fleet().store(&here).keys.log_shape().slots as usize;
    let turns: Vec<(PromptKey, PromptKey)> = (0..slots + 36)
        .map(|i| {
            let q1 = format!("{i:04}").repeat(1000);
            (
                chat(&[("system", "s"), ("user", &q1)]),
                chat(&[
                    ("system", "s"),
                    ("user", &q1),
                    ("assistant", "a1"),
                    ("user", "q2"),
                ]),
            )
        })
        .collect();
    let first = a.route(&here, &prompt(&turns[0].0)).decision.order[0];
    for (t, _) in &turns[1..] {
        a.route(&here, &prompt(t));
    }
    let batch =
        Batch::decode(&a.serve_peer(&here, 7, (0, None), (None, 1 << 20)).unwrap()).unwrap();
    assert_eq!(batch.events.len(), turns.len());
    let imported = b.import_peer(&there, &batch, there.now.get(), (64, slots / 2));
    assert_eq!((imported.events, imported.dropped), (turns.len() as u32, 0));
    for vm in [&mut b, &mut other] {
        let next = vm.route(&there, &prompt(&turns[0].1));
        // Placement alone may pick the same pod (rendezvous on the prefix): the reason tells.
        assert_eq!(
            (next.decision.order[0], next.decision.reason),
            (first, crate::routing::policy::Reason::CacheHit),
            "{:?}",
            next.decision
        );
        assert!(!next.log_gap, "the import lapped the ring");
    }
}

#[test]
fn a_reply_cut_to_the_asked_size_continues_where_it_ended() {
    let here = MemoryHost::default();
    let mut a = Router::new(with_peers("cache_aware", ABC), &here);
    for i in 0..20 {
        a.route(
            &here,
            &prompt(&chat(&[("user", &format!("{i:04}").repeat(300))])),
        );
    }
    // Asked for less than one event: still one, so the cursor moves.
    let one = Batch::decode(
        &a.serve_peer(&here, 7, (0, None), (Some(1), 1 << 20))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(one.events.len(), 1);
    let (mut since, mut lens) = (one.next_seq, vec![one.events[0].len]);
    let mut pulls = 1;
    loop {
        let b = Batch::decode(
            &a.serve_peer(&here, 7, (since, None), (Some(600), 1 << 20))
                .unwrap(),
        )
        .unwrap();
        if b.events.is_empty() {
            break;
        }
        assert!(b.events.len() < 20, "cut to the ask");
        lens.extend(b.events.iter().map(|e| e.len));
        since = b.next_seq;
        pulls += 1;
    }
    let whole =
        Batch::decode(&a.serve_peer(&here, 7, (0, None), (None, 1 << 20)).unwrap()).unwrap();
    assert!(pulls > 2);
    assert_eq!(
        lens,
        whole.events.iter().map(|e| e.len).collect::<Vec<_>>(),
        "each event once, in order"
    );
}
