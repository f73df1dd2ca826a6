use super::*;
use crate::hash::rendezvous;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn policy() -> PolicyConfig {
    crate::testing::config(1).policy
}

fn loads(v: &[f64]) -> Vec<BackendLoad> {
    v.iter()
        .map(|&l| BackendLoad {
            member: true,
            healthy: true,
            load: l,
            work: l,
            saturated: false,
            full: false,
            prefill: 0.0,
            headroom: f64::INFINITY,
        })
        .collect()
}

fn with_prefill(mut l: Vec<BackendLoad>, prefill: &[f64]) -> Vec<BackendLoad> {
    for (l, &p) in l.iter_mut().zip(prefill) {
        l.prefill = p;
    }
    l
}

const IDS: [u64; 4] = [11, 22, 33, 44];

/// A request matching `matched` blocks on each pod, of `blocks` blocks, anchored at `anchor`.
fn request(matched: &[u32], blocks: u32, anchor: u64) -> RequestKey<'_> {
    RequestKey {
        matched,
        blocks,
        anchor,
        ..Default::default()
    }
}

fn pick(strategy: Strategy, loads: &[BackendLoad], req: RequestKey<'_>) -> Decision {
    let cfg = policy();
    let c = Chooser {
        cfg: &cfg,
        loads,
        ids: &IDS[..loads.len()],
        fallbacks: 2,
    };
    c.choose(strategy, &req).unwrap()
}

#[test]
fn cache_aware_follows_the_longest_match() {
    let l = loads(&[0.0, 0.0, 0.0]);
    let d = pick(Strategy::CacheAware, &l, request(&[2, 9, 0], 10, 5));
    assert_eq!(d.order[0], 1);
    assert_eq!(d.reason, Reason::CacheHit);
    assert_eq!(d.matched, 9);
    assert_eq!(d.order.len(), 3);
}

#[test]
fn cache_aware_spills_when_the_owner_is_over_the_bound() {
    // total 12 over 3 → cap = ceil(1.5·13/3) = 7; owner at 10 is not eligible
    // (past least + warm_min_cap = 9 too, so even as the sole holder).
    let l = loads(&[10.0, 1.0, 1.0]);
    let d = pick(Strategy::CacheAware, &l, request(&[9, 0, 0], 10, 5));
    assert_ne!(d.order[0], 0);
    assert_eq!(d.reason, Reason::Spillover);
}

#[test]
fn a_warm_pod_keeps_its_conversation_below_the_warm_floor() {
    // total 2 over 3 → cap = ceil(1.5·3/3) = 2: the relative bound alone would
    // send the third request on pod 0 to a cold pod while the others idle.
    let l = loads(&[2.0, 0.0, 0.0]);
    let warm = request(&[9, 0, 0], 10, 5);
    let d = pick(Strategy::CacheAware, &l, warm);
    assert_eq!((d.order[0], d.reason), (0, Reason::CacheHit));
    // A cold prompt still gets the relative bound.
    for anchor in 0..20 {
        let cold = RequestKey {
            matched: &[0, 0, 0],
            anchor,
            ..warm
        };
        assert_ne!(pick(Strategy::CacheAware, &l, cold).order[0], 0);
    }
    // At the floor, the warm pod is over the bound too.
    let full = loads(&[8.0, 0.0, 0.0]);
    assert_eq!(
        pick(Strategy::CacheAware, &full, warm).reason,
        Reason::Spillover
    );
}

#[test]
fn a_continuation_stays_where_its_history_is_though_this_index_saw_part_of_it() {
    // This gateway saw 3 of the 9 history blocks go to pod 0 (other gateway
    // replicas sent the rest). cap = ceil(1.5·5/3) = 3, load term 0.5·4/3.
    let l = loads(&[4.0, 0.0, 0.0]);
    let partial = request(&[3, 0, 0], 10, 5);
    let continuation = RequestKey {
        continuation: true,
        history_blocks: 9,
        ..partial
    };
    let d = pick(Strategy::CacheAware, &l, continuation);
    assert_eq!((d.order[0], d.reason), (0, Reason::CacheHit));
    // A new prompt with the same partial match is not worth that load.
    assert_eq!(
        pick(Strategy::CacheAware, &l, partial).reason,
        Reason::Spillover
    );
}

#[test]
fn cache_aware_spills_away_from_a_saturated_owner() {
    // Full (a waiting queue alone does not move the sole holder).
    let mut l = loads(&[0.0, 0.0, 0.0]);
    l[1].saturated = true;
    l[1].full = true;
    let d = pick(Strategy::CacheAware, &l, request(&[0, 9, 0], 10, 5));
    assert_ne!(d.order[0], 1);
    assert_eq!(d.reason, Reason::Spillover);
}

#[test]
fn placement_avoids_a_deep_prefill_queue_and_ignores_a_shallow_one() {
    // Defaults: 8192 tokens of slack = 128 blocks of 256 bytes at 4 bytes per token.
    let slack = policy().prefill_slack_blocks;
    assert_eq!(slack, 128.0);
    let order = rendezvous(5, &IDS[..3], 0..3);
    let new_prompt = |l: &[BackendLoad]| pick(Strategy::CacheAware, l, request(&[0, 0, 0], 400, 5));
    let mut queues = [0.0; 3];
    queues[order[0]] = slack;
    let d = new_prompt(&with_prefill(loads(&[1.0, 1.0, 1.0]), &queues));
    assert_eq!(
        (d.order[0], d.reason),
        (order[0], Reason::Placed),
        "within the slack: rendezvous, so gateways agree"
    );
    queues[order[0]] = slack + 1.0;
    queues[order[1]] = slack + 1.0;
    let d = new_prompt(&with_prefill(loads(&[1.0, 1.0, 1.0]), &queues));
    assert_eq!(
        d.order[0], order[2],
        "queues deeper than the slack: elsewhere"
    );
}

#[test]
fn placement_avoids_a_queue_half_as_deep_as_the_prompt_itself_within_the_slack() {
    // 20 blocks, well within the 128-block slack: waiting behind 20 more would make
    // this 40-block prompt's time to first token 1.5x the shortest queue's.
    let order = rendezvous(5, &IDS[..3], 0..3);
    let place = |ahead: f64| {
        let mut queues = [0.0; 3];
        queues[order[0]] = ahead;
        pick(
            Strategy::CacheAware,
            &with_prefill(loads(&[1.0, 1.0, 1.0]), &queues),
            request(&[0, 0, 0], 40, 5),
        )
    };
    assert_eq!(place(19.0).order[0], order[0], "shallower: rendezvous");
    let d = place(20.0);
    assert_eq!((d.order[0], d.reason), (order[1], Reason::Placed));
    // A queue one prompt deeper, of prompts a little shorter than this one.
    let d = place(38.0);
    assert_eq!((d.order[0], d.reason), (order[1], Reason::Placed));
}

/// A prefix of 16 blocks held by the pods in `warm`, in a 24-block prompt.
fn shared(warm: &[usize]) -> [u32; 3] {
    let mut m = [0; 3];
    for &b in warm {
        m[b] = 16;
    }
    m
}

fn shared_prompt(matched: &[u32]) -> RequestKey<'_> {
    RequestKey {
        matched,
        blocks: 24,
        anchor: 5,
        ..Default::default()
    }
}

#[test]
fn a_hot_prefix_is_copied_to_the_idle_pod_before_its_copies_queue() {
    // Two copies carry 4 and 3 requests within the warm floor; pod 2 idles. The
    // copy costs 16 blocks (1024 tokens, 0.48 typical requests) of prefill, once.
    let m = shared(&[0, 1]);
    let d = pick(
        Strategy::CacheAware,
        &loads(&[4.0, 3.0, 0.0]),
        shared_prompt(&m),
    );
    assert_eq!((d.order[0], d.reason), (2, Reason::Replicated));
    assert_eq!(d.matched, 0, "the copy is prefilled in full");
    // Not while the copies are within replicate_gap + cost of the idle pod.
    let d = pick(
        Strategy::CacheAware,
        &loads(&[3.0, 2.0, 0.0]),
        shared_prompt(&m),
    );
    assert_eq!((d.order[0], d.reason), (1, Reason::CacheHit));
    // Nor when the colder pod is not below the fleet's mean: nothing idles.
    let d = pick(
        Strategy::CacheAware,
        &loads(&[5.0, 5.0, 4.0]),
        shared_prompt(&m),
    );
    assert_ne!(d.reason, Reason::Replicated);
}

#[test]
fn one_pods_prefix_a_conversation_or_a_costly_copy_is_not_replicated() {
    let l = loads(&[4.0, 3.0, 0.0]);
    // One copy: nothing says many requests share it (one conversation, or a prefix
    // used a few times): it stays within the warm floor.
    let one = shared(&[1]);
    let d = pick(Strategy::CacheAware, &l, shared_prompt(&one));
    assert_eq!((d.order[0], d.reason), (1, Reason::CacheHit));
    // A continuation keeps its pod.
    let two = shared(&[0, 1]);
    let cont = RequestKey {
        continuation: true,
        history_blocks: 16,
        ..shared_prompt(&two)
    };
    assert_ne!(
        pick(Strategy::CacheAware, &l, cont).reason,
        Reason::Replicated
    );
    // A copy longer than the prefill slack (128 blocks) is not cheap.
    let long = [200, 200, 0];
    let key = request(&long, 300, 5);
    assert_ne!(
        pick(Strategy::CacheAware, &l, key).reason,
        Reason::Replicated
    );
    // Replication off (a gap no load difference reaches).
    let cfg = PolicyConfig {
        replicate_gap: 1e9,
        ..policy()
    };
    let c = Chooser {
        cfg: &cfg,
        loads: &l,
        ids: &IDS[..3],
        fallbacks: 2,
    };
    let d = c.choose(Strategy::CacheAware, &shared_prompt(&two));
    assert_ne!(d.map(|d| d.reason), Some(Reason::Replicated));
}

#[test]
fn equally_warm_copies_take_the_shortest_prefill_queue() {
    // Requests arriving together spread over the copies instead of sharing a step.
    let order = rendezvous(5, &IDS[..3], 0..3);
    let m = shared(&[0, 1, 2]);
    let mut queues = [0.0; 3];
    queues[order[0]] = 8.0;
    queues[order[2]] = 8.0;
    let d = pick(
        Strategy::CacheAware,
        &with_prefill(loads(&[1.0, 1.0, 1.0]), &queues),
        shared_prompt(&m),
    );
    assert_eq!((d.order[0], d.reason), (order[1], Reason::CacheHit));
}

#[test]
fn a_hot_prefix_at_concurrency_8_reaches_every_pod() {
    // A closed loop of 8 clients sharing one prefix: each step the oldest request
    // ends and its client sends the next one; the index learns the prefix on the
    // pod each request goes to, and a request's prefill is queued until the next
    // step. Before replication, the two pods that first held the prefix kept it
    // at 4 requests each and the third got none.
    let mut held = [0u32; 3];
    let mut l = loads(&[0.0, 0.0, 0.0]);
    let mut open: Vec<usize> = Vec::new();
    let mut served = [0usize; 3];
    for step in 0..200u64 {
        if open.len() == 8 {
            let b = open.remove(0);
            l[b].load -= 1.0;
        }
        for x in l.iter_mut() {
            x.prefill = 0.0;
        }
        let d = pick(
            Strategy::CacheAware,
            &l,
            RequestKey {
                anchor: 5,
                random: step,
                ..shared_prompt(&held)
            },
        );
        let b = d.order[0];
        l[b].load += 1.0;
        l[b].prefill += f64::from(24 - d.matched);
        held[b] = 16;
        open.push(b);
        served[b] += 1;
    }
    assert!(held.iter().all(|&h| h == 16), "{held:?}");
    assert!(served.iter().all(|&n| n >= 40), "{served:?}");
}

#[test]
fn a_cache_hit_leaves_an_owner_whose_prefill_queue_costs_twice_what_the_hit_saves() {
    let slack = policy().prefill_slack_blocks;
    // A prefix that another request waiting there shares: not one conversation's.
    let hit = |queue: f64| {
        pick(
            Strategy::CacheAware,
            &with_prefill(loads(&[1.0, 1.0, 1.0]), &[queue, 0.0, 0.0]),
            RequestKey {
                matched: &[60, 0, 0],
                blocks: 100,
                anchor: 5,
                shared: &[true, false, false],
                ..Default::default()
            },
        )
    };
    assert_eq!(
        hit(slack + 100.0).order[0],
        0,
        "1 prompt of queue < twice 60% cached"
    );
    let d = hit(slack + 140.0);
    assert_ne!(d.order[0], 0, "1.4 prompts of queue > twice 60% cached");
    assert_eq!(d.reason, Reason::Spillover);
}

#[test]
fn the_sole_owner_of_a_conversation_keeps_it_whatever_its_prefill_queue() {
    let slack = policy().prefill_slack_blocks;
    let queued = with_prefill(loads(&[1.0, 1.0, 1.0]), &[slack + 1000.0, 0.0, 0.0]);
    // One conversation's next turn: no other open request shares its history.
    let turn = RequestKey {
        matched: &[90, 0, 0],
        blocks: 100,
        anchor: 5,
        shared: &[false, false, false],
        ..Default::default()
    };
    let d = pick(Strategy::CacheAware, &queued, turn);
    assert_eq!((d.order[0], d.reason), (0, Reason::CacheHit));
    // The same match while another open request on that pod shares it: a prefix
    // many requests use, whose queue counts as for any other prompt.
    let busy = RequestKey {
        shared: &[true, false, false],
        ..turn
    };
    let d = pick(Strategy::CacheAware, &queued, busy);
    assert_eq!((d.order[0] != 0, d.reason), (true, Reason::Spillover));
    // Any share counts: a turn that adds a long document to a short history
    // would still re-prefill that history elsewhere.
    let less = RequestKey {
        matched: &[20, 0, 0],
        ..turn
    };
    assert_eq!(pick(Strategy::CacheAware, &queued, less).order[0], 0);
    // On two pods the prefix is shared (or the conversation moved): the shorter queue wins.
    let two = RequestKey {
        matched: &[90, 90, 0],
        ..turn
    };
    assert_eq!(pick(Strategy::CacheAware, &queued, two).order[0], 1);
    // A waiting queue does not move it either; a full pod does.
    let mut saturated = queued.clone();
    saturated[0].saturated = true;
    assert_eq!(pick(Strategy::CacheAware, &saturated, turn).order[0], 0);
    saturated[0].full = true;
    assert_ne!(pick(Strategy::CacheAware, &saturated, turn).order[0], 0);
    // The waiting queue still moves an owner that is not the sole holder: one whose
    // prefix a waiting request shares, or either of two owners (their tie goes by
    // the anchor's rendezvous order: pod 1 here, checked first).
    let idle = loads(&[1.0, 1.0, 1.0]);
    let waiting_on = |b: usize| {
        let mut l = idle.clone();
        l[b].saturated = true;
        l
    };
    assert_eq!(pick(Strategy::CacheAware, &idle, busy).order[0], 0);
    let d = pick(Strategy::CacheAware, &waiting_on(0), busy);
    assert_eq!((d.order[0] != 0, d.reason), (true, Reason::Spillover));
    assert_eq!(pick(Strategy::CacheAware, &idle, two).order[0], 1);
    assert_eq!(pick(Strategy::CacheAware, &waiting_on(1), two).order[0], 0);
}

#[test]
fn a_sole_holder_keeps_its_conversation_up_to_a_warm_bound_above_the_least_loaded() {
    // 8 requests on the owner, 1 on each other pod: cap = ceil(1.5·11/3) = 6 and
    // the warm floor 8 would move this ninth request; the sole holder keeps it up
    // to least + max(cap, warm_min_cap) = 1 + 8 = 9 requests, this one included.
    let key = request(&[9, 0, 0], 10, 5);
    let l = loads(&[8.0, 1.0, 1.0]);
    let d = pick(Strategy::CacheAware, &l, key);
    assert_eq!((d.order[0], d.reason), (0, Reason::CacheHit));
    // Not a prefix that another request waiting there shares.
    let shared = RequestKey {
        shared: &[true, false, false],
        ..key
    };
    assert_eq!(
        pick(Strategy::CacheAware, &l, shared).reason,
        Reason::Spillover
    );
    // One request more and it leaves too.
    let d = pick(Strategy::CacheAware, &loads(&[9.0, 1.0, 1.0]), key);
    assert_eq!(d.reason, Reason::Spillover);
    // The least loaded pod is the least that is not full: a full idle pod does
    // not shrink the bound.
    let mut l = loads(&[8.0, 0.0, 1.0]);
    l[1].saturated = true;
    l[1].full = true;
    assert_eq!(pick(Strategy::CacheAware, &l, key).order[0], 0);
}

#[test]
fn cache_beats_modest_load_difference() {
    let l = loads(&[4.0, 2.0, 2.0]);
    let d = pick(Strategy::CacheAware, &l, request(&[9, 3, 3], 10, 5));
    assert_eq!(d.order[0], 0);
}

#[test]
fn new_prefixes_are_placed_deterministically_and_spread() {
    let l = loads(&[0.0, 0.0, 0.0]);
    let mut seen = [0usize; 3];
    for anchor in 0..300u64 {
        let a = pick(Strategy::CacheAware, &l, request(&[0, 0, 0], 4, anchor));
        let b = pick(Strategy::CacheAware, &l, request(&[0, 0, 0], 4, anchor));
        assert_eq!(a, b);
        assert_eq!(a.reason, Reason::Placed);
        seen[a.order[0]] += 1;
    }
    assert!(seen.iter().all(|&n| n > 70), "{seen:?}");
}

#[test]
fn a_match_inside_the_head_does_not_attract() {
    // Backend 0 holds the shared system prompt (4 blocks) only: new conversations are placed.
    let l = loads(&[0.0, 0.0, 0.0]);
    let mut seen = [0usize; 3];
    for anchor in 0..90u64 {
        let d = pick(
            Strategy::CacheAware,
            &l,
            RequestKey {
                matched: &[4, 0, 0],
                blocks: 6,
                head_blocks: 4,
                anchor,
                ..Default::default()
            },
        );
        assert_eq!(d.reason, Reason::Placed);
        seen[d.order[0]] += 1;
    }
    assert!(seen.iter().all(|&n| n > 15), "{seen:?}");
    let cont = pick(
        Strategy::CacheAware,
        &l,
        RequestKey {
            matched: &[5, 0, 0],
            blocks: 6,
            head_blocks: 4,
            anchor: 1,
            ..Default::default()
        },
    );
    assert_eq!((cont.order[0], cont.reason), (0, Reason::CacheHit));
}

#[test]
fn an_unseen_continuation_goes_to_the_anchor_owner_whatever_the_local_load() {
    let l = loads(&[0.0, 0.0, 0.0]);
    let key = |continuation| RequestKey {
        matched: &[0, 0, 0],
        blocks: 8,
        anchor: 77,
        continuation,
        history_blocks: if continuation { 6 } else { 0 },
        ..Default::default()
    };
    let owner = pick(Strategy::CacheAware, &l, key(true)).order[0];
    // This gateway alone sent 3 requests there: a new conversation avoids it...
    let mut busy = l.clone();
    busy[owner].load = 3.0;
    assert_ne!(
        pick(Strategy::CacheAware, &busy, key(false)).order[0],
        owner
    );
    // ...but a conversation under way stays where the other gateways put it,
    let d = pick(Strategy::CacheAware, &busy, key(true));
    assert_eq!((d.order[0], d.reason), (owner, Reason::Placed));
    assert_eq!(
        d.matched, 6,
        "believed to hold the history: only the last message queues for prefill"
    );
    // unless that pod is saturated.
    busy[owner].saturated = true;
    assert_ne!(pick(Strategy::CacheAware, &busy, key(true)).order[0], owner);
}

#[test]
fn never_everything_on_one_replica() {
    // Every request shares a system prompt that only backend 0 holds so far.
    let mut l = loads(&[0.0, 0.0, 0.0]);
    let mut count = [0usize; 3];
    for i in 0..60u64 {
        let d = pick(Strategy::CacheAware, &l, request(&[4, 0, 0], 10, i));
        l[d.order[0]].load += 1.0;
        count[d.order[0]] += 1;
    }
    // The owner, sole holder of the prefix (no waiting request shares it in this
    // test), takes at most one warm bound ((1+eps)·mean, +1 for rounding) above
    // the least loaded pod; the rest spill.
    let least = *count.iter().min().unwrap_or(&0);
    assert!(count[0] <= least + 31, "{count:?}");
    assert!(count.iter().all(|&c| c >= 10), "{count:?}");
}

#[test]
fn prefix_hash_is_consistent_with_bounded_spillover() {
    let l = loads(&[0.0, 0.0, 0.0]);
    let d = pick(
        Strategy::PrefixHash,
        &l,
        RequestKey {
            anchor: 42,
            ..Default::default()
        },
    );
    let owner = d.order[0];
    let mut hot = loads(&[0.0, 0.0, 0.0]);
    hot[owner].load = 20.0;
    let s = pick(
        Strategy::PrefixHash,
        &hot,
        RequestKey {
            anchor: 42,
            ..Default::default()
        },
    );
    assert_ne!(s.order[0], owner);
    assert_eq!(s.order[0], d.order[1], "spills to the key's next backend");
    assert_eq!(s.reason, Reason::Spillover);
}

#[test]
fn least_request_and_round_robin_and_random() {
    let l = loads(&[3.0, 1.0, 2.0]);
    assert_eq!(
        pick(Strategy::LeastRequest, &l, RequestKey::default()).order[0],
        1
    );
    let rr: Vec<usize> = (0..6)
        .map(|r| {
            pick(
                Strategy::RoundRobin,
                &l,
                RequestKey {
                    rotation: r,
                    ..Default::default()
                },
            )
            .order[0]
        })
        .collect();
    assert_eq!(rr, vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(
        pick(
            Strategy::Random,
            &l,
            RequestKey {
                random: 7,
                ..Default::default()
            }
        )
        .order[0],
        1
    );
}

#[test]
fn sticky_moves_only_the_dead_backends_sessions() {
    let l = loads(&[0.0, 0.0, 0.0, 0.0]);
    let before: Vec<usize> = (0..200)
        .map(|s| {
            pick(
                Strategy::StickySession,
                &l,
                RequestKey {
                    session: Some(s),
                    ..Default::default()
                },
            )
            .order[0]
        })
        .collect();
    let mut dead = l.clone();
    dead[2].healthy = false;
    for (s, &b) in before.iter().enumerate() {
        let now = pick(
            Strategy::StickySession,
            &dead,
            RequestKey {
                session: Some(s as u64),
                ..Default::default()
            },
        )
        .order[0];
        if b != 2 {
            assert_eq!(now, b, "session {s} moved off a live backend");
        } else {
            assert_ne!(now, 2);
        }
    }
    let no_session = pick(
        Strategy::StickySession,
        &l,
        RequestKey {
            rotation: 1,
            ..Default::default()
        },
    );
    assert_eq!(no_session.reason, Reason::RoundRobin);
}

#[test]
fn unhealthy_backends_are_skipped_unless_all_are() {
    let mut l = loads(&[0.0, 0.0]);
    l[0].healthy = false;
    for s in [
        Strategy::CacheAware,
        Strategy::PrefixHash,
        Strategy::LeastRequest,
        Strategy::RoundRobin,
        Strategy::Random,
        Strategy::StickySession,
    ] {
        for r in 0..10 {
            let d = pick(
                s,
                &l,
                RequestKey {
                    anchor: r,
                    rotation: r,
                    random: r,
                    session: Some(r),
                    matched: &[5, 0],
                    blocks: 5,
                    head_blocks: 0,
                    continuation: false,
                    history_blocks: 0,
                    instructions_blocks: 0,
                    answers: 0,
                    shared: &[],
                },
            );
            assert_eq!(d.order, vec![1], "{s:?}");
        }
    }
    l[1].healthy = false;
    let d = pick(Strategy::RoundRobin, &l, RequestKey::default());
    assert_eq!(d.order.len(), 2);
    // An empty slot is never chosen, not even when every member is out.
    l.push(BackendLoad::default());
    for r in 0..10 {
        let d = pick(
            Strategy::Random,
            &l,
            RequestKey {
                random: r,
                ..RequestKey::default()
            },
        );
        assert!(!d.order.contains(&2), "{:?}", d.order);
    }
    let none = Chooser {
        cfg: &policy(),
        loads: &[BackendLoad::default(); 3],
        ids: &[1, 2, 3],
        fallbacks: 2,
    };
    assert!(none
        .choose(Strategy::Random, &RequestKey::default())
        .is_none());
    assert!(none.fallback(7).is_none());
}

#[test]
fn a_second_turn_whose_first_ended_inside_the_head_goes_where_the_first_went() {
    let l = loads(&[0.0, 0.0, 0.0]);
    // 9 blocks of instructions every conversation shares, then the first message: the
    // head's full blocks are 10. Turn 1 went to `first`, which holds all 10; another pod
    // holds the 9.
    fn key(matched: &[u32]) -> RequestKey<'_> {
        RequestKey {
            matched,
            blocks: 12,
            head_blocks: 10,
            instructions_blocks: 9,
            answers: 1,
            anchor: 77,
            continuation: true,
            history_blocks: 11,
            ..Default::default()
        }
    }
    let owner = pick(Strategy::CacheAware, &l, key(&[0, 0, 0])).order[0];
    let first = (owner + 1) % 3;
    let mut m = [0; 3];
    m[first] = 10;
    m[owner] = 9;
    let d = pick(Strategy::CacheAware, &l, key(&m));
    assert_eq!(
        (d.order[0], d.reason, d.matched),
        (first, Reason::CacheHit, 10)
    );
    // A later turn may have gone to the anchor's pod through another gateway replica.
    let later = RequestKey {
        answers: 2,
        ..key(&m)
    };
    assert_eq!(pick(Strategy::CacheAware, &l, later).order[0], owner);
    // Equal holders, or none holding the head's full blocks: the anchor places it.
    let mut tie = m;
    tie[owner] = 10;
    assert_eq!(pick(Strategy::CacheAware, &l, key(&tie)).order[0], owner);
    let mut short = [0; 3];
    short[first] = 9;
    assert_eq!(pick(Strategy::CacheAware, &l, key(&short)).order[0], owner);
    // A first message too short to reach past the instructions' last block: a pod
    // holding those instructions alone holds no part of it.
    let instructions_only = RequestKey {
        head_blocks: 9,
        ..key(&short)
    };
    assert_eq!(
        pick(Strategy::CacheAware, &l, instructions_only).order[0],
        owner
    );
    // Over the warm bound it goes by the anchor as before.
    let mut busy = l.clone();
    busy[first].load = 9.0;
    assert_eq!(pick(Strategy::CacheAware, &busy, key(&m)).order[0], owner);
}
