use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn lens(ix: &Index, blocks: &[u64], now: u64) -> Vec<u32> {
    let mut out = Vec::new();
    ix.match_lengths(blocks, now, &mut out);
    out
}

#[test]
fn longest_prefix_per_backend() {
    let mut ix = Index::new(3, 1 << 16, 60_000);
    ix.record(&[1, 2, 3, 4], 0, 0);
    ix.record(&[1, 2], 1, 0);
    assert_eq!(lens(&ix, &[1, 2, 3, 9], 10), vec![3, 2, 0]);
    assert_eq!(lens(&ix, &[7, 2, 3], 10), vec![0, 0, 0]);
}

#[test]
fn a_record_says_where_the_blocks_it_brings_start() {
    let mut ix = Index::new(3, 1 << 16, 60_000);
    assert_eq!(ix.record(&[1, 2, 3, 4], 0, 0), 0);
    assert_eq!(ix.record(&[1, 2, 7, 8, 9], 0, 0), 2);
    assert_eq!(ix.record(&[1, 2, 3], 0, 5000), 3, "held it all");
    assert_eq!(ix.record(&[1, 2, 3], 1, 0), 0, "another backend");
    assert_eq!(ix.record(&[1, 2, 3, 4, 5], 0, 70_000), 0, "past the TTL");
    // A log event's form: the first new sampled position, to a stride.
    let c: Vec<u64> = (0..100).collect();
    let mut d = c.clone();
    d[70..].iter_mut().for_each(|h| *h += 1000);
    let kept = |c: &[u64]| kept_positions(c.len()).map(|i| c[i]).collect::<Vec<_>>();
    assert_eq!(ix.record_kept(100, &kept(&c), 2, 0), 0);
    assert_eq!(ix.record_kept(100, &kept(&d), 2, 0), 71);
}

fn chain(tag: u64, n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| tag << 32 | i).collect()
}

#[test]
fn last_kept_below_is_the_walk_along_the_chain() {
    // Every end of short chains; around each doubling and the chain's end of long ones.
    for len in (0..150).chain([255, 256, 257, 1000, 1024, 4097, 70_000]) {
        let kept: Vec<usize> = kept_positions(len).collect();
        let near = |e: usize| (e + 2).is_power_of_two() || e.is_power_of_two() || e + 3 > len;
        for end in (0..len + 3).filter(|&e| len < 150 || near(e) || near(e + 1)) {
            for n in [
                0,
                1,
                31,
                32,
                33,
                47,
                48,
                49,
                kept.len().saturating_sub(1),
                kept.len(),
                kept.len() + 5,
            ] {
                let walk = kept
                    .iter()
                    .take(n)
                    .enumerate()
                    .take_while(|&(_, &i)| i < end)
                    .last();
                let walk = walk.map(|(k, &i)| (k, i));
                assert_eq!(
                    last_kept_below(len, end, n),
                    walk,
                    "len {len} end {end} n {n}"
                );
            }
        }
    }
}

#[test]
fn sampled_positions_cover_every_block_once() {
    for n in [1, 31, 32, 33, 64, 100, 512, 1024, 2048] {
        // Up to the last sampled position, every block is counted exactly once.
        let upto = (0..n).rev().find(|&i| sampled(i)).unwrap_or(0);
        let covered: u32 = (0..n).filter(|&i| sampled(i)).map(span).sum();
        assert_eq!(covered, upto as u32 + 1, "{n}");
        assert!(n - (upto + 1) < stride(n - 1), "{n}");
    }
    assert_eq!((0..512).filter(|&i| sampled(i)).count(), 32 + 16 * 4);
}

#[test]
fn prompts_that_differ_past_the_last_sample_stay_bounded() {
    // 35 blocks: 34 shared, the last (off the sample) differs per prompt. An entry
    // that counted no capacity would grow the index until the TTL removed it.
    let cap = 1024;
    let mut ix = Index::new(1, cap, 600_000);
    let mut max_queue = 0;
    for p in 0..50_000u64 {
        let mut blocks = chain(1, 34);
        blocks.push(0xdead_0000_0000 | p);
        ix.record(&blocks, 0, p);
        max_queue = max_queue.max(ix.lru[0].queue.len());
    }
    assert!(ix.map.len() <= cap, "{} entries", ix.map.len());
    assert!(ix.len_of(0) <= cap);
    assert!(max_queue <= 2 * cap + 1024 + 35, "queue {max_queue}");
    // The shared part is still there (it is refreshed by every prompt).
    assert_eq!(lens(&ix, &chain(1, 34), 50_000), vec![34]);
}

#[test]
fn the_map_is_as_large_as_it_gets_once_the_index_is_full() {
    // hashbrown's own growth would hold 1536 entries in 2048 slots (1792 usable):
    // more than half full, too full to clear removals' tombstones in place.
    let cap = 1024 + 512;
    let mut ix = Index::new(1, cap, 600_000);
    let prompt = |p: u64| {
        let mut blocks = chain(1, 34);
        blocks.push(0xdead_0000_0000 | p);
        blocks
    };
    let mut p = 0;
    while ix.len_of(0) < cap {
        ix.record(&prompt(p), 0, p);
        p += 1;
    }
    let full = ix.map.allocation_size();
    // Churn: every prompt evicts the oldest one's block.
    for p in p..p + 20 * cap as u64 {
        ix.record(&prompt(p), 0, p);
        assert_eq!(
            ix.map.allocation_size(),
            full,
            "the map grew after {p} prompts"
        );
    }
}

#[test]
fn hostile_capacities_never_wrap_the_bound() {
    let mut ix = Index::new(3, 1 << 26, 1000);
    ix.set_capacities(&[Some(usize::MAX), Some(usize::MAX / 2), None]);
    let total: u64 = (0..3).map(|b| ix.capacity(b) as u64).sum();
    assert!(total <= 1 << 26, "{total}");
    assert!((0..3).all(|b| ix.capacity(b) >= 1));
}

#[test]
fn a_pod_that_claims_a_vast_cache_takes_no_other_pods_share() {
    let mut ix = Index::new(3, 3000, 1000);
    // Within the bound, each gets what it asks.
    ix.set_capacities(&[Some(500), Some(1000), Some(1200)]);
    assert_eq!(
        (0..3).map(|b| ix.capacity(b)).collect::<Vec<_>>(),
        [500, 1000, 1200]
    );
    // One claims a vast cache (10^12 tokens and more): the others keep theirs, it gets what is left.
    ix.set_capacities(&[Some(500), Some(usize::MAX), Some(1200)]);
    assert_eq!(
        (0..3).map(|b| ix.capacity(b)).collect::<Vec<_>>(),
        [500, 1300, 1200]
    );
    // Two honest pods that ask more than an equal share split the bound evenly with the liar.
    ix.set_capacities(&[Some(2000), Some(usize::MAX), Some(2000)]);
    assert_eq!(
        (0..3).map(|b| ix.capacity(b)).collect::<Vec<_>>(),
        [1000, 1000, 1000]
    );
}

#[test]
fn empty_slots_take_no_share_from_the_pods() {
    // A discovered pool of 64 slots holding 4 pods of a vast cache each.
    let mut ix = Index::new(64, 1 << 18, 1000);
    let mut known = vec![Some(0); 64];
    for b in [3, 10, 20, 40] {
        known[b] = Some(1 << 20);
    }
    ix.set_capacities(&known);
    // A quarter each of the bound less the block each empty slot keeps.
    assert_eq!(ix.capacity(3), ((1 << 18) - 60) / 4);
    assert_eq!(ix.capacity(0), 1);
    // A pod of unknown capacity asks an equal share of the members'.
    known[40] = None;
    ix.set_capacities(&known);
    assert_eq!(ix.capacity(40), ((1 << 18) - 60) / 4);
}

#[test]
fn a_long_prompt_costs_a_sample_of_entries_but_counts_all_its_blocks() {
    let mut ix = Index::new(1, 1 << 20, 60_000);
    ix.record(&chain(1, 512), 0, 0);
    assert_eq!(ix.len_of(0), 512);
    assert!(ix.map.len() <= 100, "{}", ix.map.len());
    assert_eq!(lens(&ix, &chain(1, 512), 1), vec![512]);
}

#[test]
fn turns_of_a_conversation_count_each_block_once() {
    let mut ix = Index::new(1, 1 << 20, 60_000);
    let ends: Vec<usize> = (100..1000).step_by(37).chain([1000]).collect();
    for &end in &ends {
        ix.record(&chain(1, end), 0, 0);
    }
    // 1000 blocks, each once up to the last sample (991); past it the last ones wait
    // for the next turn. A turn that ended off the sample counts one block for it,
    // not the stretch its samples count again.
    let off_sample = ends.iter().filter(|&&e| !sampled(e - 1)).count();
    assert_eq!(off_sample, 23);
    assert_eq!(ix.len_of(0), 992 + off_sample);
}

#[test]
fn a_continuation_matches_where_the_earlier_prompt_ended() {
    let mut ix = Index::new(2, 1 << 20, 60_000);
    for (b, end) in [(0, 300), (1, 457)] {
        ix.record(&chain(1, end), b, 0);
    }
    // The next turn extends both earlier prompts.
    let mut next = chain(1, 457);
    next.extend(chain(2, 90));
    assert_eq!(lens(&ix, &next, 1), vec![300, 457]);
}

#[test]
fn a_shared_prefix_is_rounded_down_by_less_than_a_sixteenth() {
    let mut ix = Index::new(1, 1 << 20, 60_000);
    ix.record(&chain(1, 800), 0, 0);
    for shared in [1, 20, 33, 70, 129, 300, 513, 799] {
        let mut other = chain(1, shared);
        other.extend(chain(3, 200));
        let m = lens(&ix, &other, 1)[0] as usize;
        assert!(m <= shared && m + shared / 16 >= shared, "{shared}: {m}");
    }
}

#[test]
fn a_queue_record_is_as_small_as_a_map_slot() {
    assert_eq!(std::mem::size_of::<Rec>(), 16);
    let r = Rec::new(7, TIME_MAX, 2048);
    assert_eq!((r.time(), r.span()), (TIME_MAX, 2048));
}

#[test]
fn entries_age_out() {
    let mut ix = Index::new(1, 1 << 16, 1000);
    ix.record(&[1, 2], 0, 0);
    assert_eq!(lens(&ix, &[1, 2], 1000), vec![2]);
    assert_eq!(lens(&ix, &[1, 2], 1001), vec![0]);
    ix.expire(5000);
    assert!(ix.is_empty());
}

#[test]
fn capacity_evicts_least_recently_used() {
    let mut ix = Index::new(1, 4096, 1 << 40);
    ix.set_capacities(&[Some(4)]);
    ix.record(&[1, 2], 0, 0);
    ix.record(&[3, 4], 0, 5000);
    ix.record(&[1, 2], 0, 10_000); // refresh: now 3,4 are the oldest
    ix.record(&[5, 6], 0, 15_000);
    assert_eq!(ix.len_of(0), 4);
    assert_eq!(lens(&ix, &[1, 2], 20_000), vec![2]);
    assert_eq!(lens(&ix, &[3, 4], 20_000), vec![0]);
    assert_eq!(lens(&ix, &[5, 6], 20_000), vec![2]);
}

#[test]
fn memory_stays_bounded_under_churn() {
    let mut ix = Index::new(2, 2048, 1 << 40);
    for i in 0..50_000u64 {
        ix.record(&[i * 3, i * 3 + 1, i * 3 + 2], (i % 2) as usize, i * 2000);
    }
    assert!(ix.len() <= 2048);
    assert!(ix
        .lru
        .iter()
        .all(|l| l.queue.len() <= 2 * l.live + 1024 + 3));
    assert!(ix.map.len() <= 2048);
    // Every chain here starts with its own block: each first block counted is an entry.
    assert!(ix.firsts.len() <= ix.map.len());
    assert!(ix.firsts.values().all(|&c| c == 1));
}

#[test]
fn capacities_never_exceed_the_bound() {
    let mut ix = Index::new(2, 2048, 1000);
    ix.set_capacities(&[Some(10_000), None]);
    assert!(ix.capacity(0) + ix.capacity(1) <= 2048);
    // The unknown one asks an equal share, and keeps it.
    assert_eq!((ix.capacity(0), ix.capacity(1)), (1024, 1024));
    ix.set_capacities(&[Some(10_000), Some(100)]);
    assert_eq!((ix.capacity(0), ix.capacity(1)), (1948, 100));
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// The lookup spelled out one backend at a time: walk the sampled
    /// positions while it holds them; where it stops, the deepest block it
    /// holds since the previous sampled position ends its match.
    fn reference(ix: &Index, blocks: &[u64], now_ms: u64) -> Vec<u32> {
        let last = blocks.len().saturating_sub(1);
        let sampled: Vec<usize> = (0..blocks.len()).filter(|&i| kept(i, last)).collect();
        (0..ix.lru.len())
            .map(|b| {
                let holds = |j: usize| ix.fresh(blocks[j], b, now_ms);
                let mut m = 0;
                for (k, &i) in sampled.iter().enumerate() {
                    if holds(i) {
                        m = i + 1;
                        continue;
                    }
                    let since = if k == 0 { 0 } else { sampled[k - 1] + 1 };
                    if let Some(j) = (since..i).rev().find(|&j| holds(j)) {
                        m = j + 1;
                    }
                    break;
                }
                m as u32
            })
            .collect()
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config())]

        /// Prompts that share prefixes of a few chains, on a few backends, at
        /// times that let entries expire and capacities that evict (holes),
        /// with a pod's reported eviction or its slot's new pod now and then;
        /// the query may start with a first block nobody was sent (tag 3).
        #[test]
        fn match_lengths_agree_with_the_reference(
            ops in proptest::collection::vec((0..3u64, 1..200usize, 0..5usize, 0..4000u64, 0..12u8), 0..40),
            capacity in 16..4096usize,
            query in (0..4u64, 0..220usize, 0..6000u64),
        ) {
            let chain = |tag: u64, n: usize| -> Vec<u64> { (0..n as u64).map(|i| crate::hash::mix(tag << 32 | i)).collect() };
            let mut ix = Index::new(5, capacity, 3000);
            let mut t = 0;
            for (tag, len, b, dt, op) in ops {
                t += dt;
                match op {
                    10 => ix.forget_used_before(b, t.saturating_sub(dt)),
                    11 => ix.forget(b),
                    _ => {
                        ix.record(&chain(tag, len), b, t);
                    }
                }
            }
            // The first-block counts are the backends holding an entry for it.
            for tag in 0..4 {
                let h = chain(tag, 1)[0];
                let holders = (0..5).filter(|&b| ix.map.contains_key(&ix.key(h, b))).count() as u32;
                prop_assert_eq!(ix.firsts.get(&h).copied().unwrap_or(0), holders);
            }
            let (tag, len, dt) = query;
            let now = t + dt;
            let mut out = Vec::new();
            ix.match_lengths(&chain(tag, len), now, &mut out);
            prop_assert_eq!(out, reference(&ix, &chain(tag, len), now));
        }
    }
}

// A conversation: a shared head of `shared` blocks, then its own blocks.
use crate::testing::tagged_chain as convo;

fn whole_prompts(slots: usize, ram_blocks: usize) -> Index {
    let mut ix = Index::new(3, 1 << 16, 600_000);
    ix.set_prompt_model(Some(PromptModel { slots, ram_blocks }));
    ix
}

#[test]
fn a_pod_holding_whole_prompts_forgets_its_least_recent_one() {
    // Two slots, no RAM cache: the third conversation sent to pod 0 evicts the first.
    let mut ix = whole_prompts(2, 0);
    for (t, tag) in [1, 2, 3].into_iter().enumerate() {
        ix.record(&convo(tag, 4, 20), 0, t as u64);
    }
    assert_eq!(ix.chains_of(0), 2);
    assert_eq!(
        lens(&ix, &convo(1, 4, 21), 10)[0],
        4,
        "only the shared head"
    );
    assert_eq!(lens(&ix, &convo(2, 4, 21), 10)[0], 20);
    assert_eq!(lens(&ix, &convo(3, 4, 21), 10)[0], 20);
    // The evicted prompt's own blocks left the index; the shared head stayed.
    assert_eq!(ix.len_of(0), 4 + 16 + 16);
    // Without the model the index keeps all three (the blocks fit its share).
    let mut blocks = Index::new(3, 1 << 16, 600_000);
    for (t, tag) in [1, 2, 3].into_iter().enumerate() {
        blocks.record(&convo(tag, 4, 20), 0, t as u64);
    }
    assert_eq!(lens(&blocks, &convo(1, 4, 21), 10)[0], 20);
}

#[test]
fn a_conversations_turns_are_one_prompt() {
    // Each turn extends the last one: the slot holds the longer prompt, not both.
    let mut ix = whole_prompts(1, 0);
    for turn in 1..=6 {
        ix.record(&convo(1, 4, 10 * turn), 0, turn as u64);
        assert_eq!(ix.chains_of(0), 1, "turn {turn}");
    }
    assert_eq!(lens(&ix, &convo(1, 4, 61), 10)[0], 60);
    // Past the dense head, where a turn's end is off the sample, the next turn still
    // extends it, and the earlier turn's end is found while the conversation is held.
    ix.record(&convo(1, 4, 71), 0, 7);
    ix.record(&convo(1, 4, 83), 0, 8);
    assert_eq!(ix.chains_of(0), 1);
    let mut other = convo(1, 4, 83);
    other[71..].iter_mut().for_each(|h| *h ^= 0xffff);
    assert_eq!(lens(&ix, &other, 10)[0], 71, "the earlier turn's end");
    // Another conversation evicts it, end included.
    ix.record(&convo(2, 4, 40), 0, 9);
    assert_eq!(ix.chains_of(0), 1);
    assert_eq!(lens(&ix, &other, 10)[0], 4);
    assert_eq!(ix.len_of(0), 40);
}

#[test]
fn the_ram_cache_keeps_older_prompts_while_they_fit() {
    // One slot and 50 blocks of RAM: the newest prompt whatever its size, then older ones
    // newest first while their sum fits; one larger than the RAM cache is never kept there.
    let mut ix = whole_prompts(1, 50);
    ix.record(&convo(1, 0, 20), 0, 1);
    ix.record(&convo(2, 0, 20), 0, 2);
    ix.record(&convo(3, 0, 60), 0, 3);
    ix.record(&convo(4, 0, 20), 0, 4);
    // Newest first: 4 in the slot; 3 (60 > 50) skipped; 2 (20) and 1 (40) fit.
    let held = |ix: &Index| {
        [1, 2, 3, 4].map(|t| lens(ix, &convo(t, 0, if t == 3 { 60 } else { 20 }), 10)[0])
    };
    assert_eq!(held(&ix), [20, 20, 0, 20]);
    ix.record(&convo(5, 0, 20), 0, 5);
    // 5 in the slot; 4 and 2 fill 40 of 50; 1 would make 60: gone, and nothing older stays.
    assert_eq!(held(&ix), [0, 20, 0, 20]);
    assert_eq!(ix.chains_of(0), 3);
    // The budget is also bounded by the pod's index share.
    let mut small = Index::new(1, 30, 600_000);
    small.set_prompt_model(Some(PromptModel {
        slots: 1,
        ram_blocks: 1 << 20,
    }));
    small.record(&convo(1, 0, 10), 0, 1);
    small.record(&convo(2, 0, 10), 0, 2);
    small.record(&convo(3, 0, 10), 0, 3);
    small.record(&convo(4, 0, 10), 0, 4);
    assert_eq!(small.chains_of(0), 4, "30 blocks of RAM: 3 older prompts");
    small.record(&convo(5, 0, 10), 0, 5);
    assert_eq!(small.chains_of(0), 4);
}

#[test]
fn a_log_event_builds_the_same_prompts() {
    // One replica records whole chains, the other the kept hashes an event carries,
    // some of them cut to the chain's head.
    let mut a = whole_prompts(2, 40);
    let mut b = whole_prompts(2, 40);
    let kept = |c: &[u64]| kept_positions(c.len()).map(|i| c[i]).collect::<Vec<_>>();
    let prompts = [
        convo(1, 8, 35),
        convo(2, 8, 70),
        convo(1, 8, 47),
        convo(3, 8, 130),
        convo(2, 8, 75),
        convo(4, 8, 12),
    ];
    for (t, p) in prompts.iter().enumerate() {
        a.record(p, t % 3, t as u64);
        b.record_kept(p.len(), &kept(p), t % 3, t as u64);
    }
    for p in prompts.iter() {
        assert_eq!(lens(&a, p, 10), lens(&b, p, 10));
    }
    for pod in 0..3 {
        assert_eq!(a.chains_of(pod), b.chains_of(pod));
        assert_eq!(a.len_of(pod), b.len_of(pod));
    }
    // A cut event stands for the chain's head: the head is held, as by the index.
    let long = convo(5, 0, 200);
    let cut: Vec<u64> = kept(&long).into_iter().take(40).collect();
    b.record_kept(long.len(), &cut, 0, 20);
    let head = sampled_at(39) + 1;
    assert_eq!(lens(&b, &long, 20)[0] as usize, head);
}

#[test]
fn the_model_is_off_for_blocks_and_forgetting_a_slot_clears_it() {
    let mut ix = whole_prompts(1, 0);
    ix.record(&convo(1, 0, 10), 1, 1);
    ix.record(&convo(2, 0, 10), 1, 2);
    assert_eq!(ix.chains_of(1), 1);
    ix.forget(1);
    assert_eq!(ix.chains_of(1), 0);
    ix.record(&convo(1, 0, 10), 1, 3);
    // Chains idle past the TTL leave with their entries.
    ix.expire(3 + 600_001);
    assert_eq!(ix.chains_of(1), 0);
    // Turning the model off keeps what is held and stops counting prompts.
    ix.record(&convo(1, 0, 10), 1, 700_000);
    ix.set_prompt_model(None);
    ix.record(&convo(2, 0, 10), 1, 700_001);
    assert_eq!(ix.chains_of(1), 0);
    assert_eq!(lens(&ix, &convo(1, 0, 10), 700_002)[1], 10);
    // Turning it on evicts at once what no longer fits.
    ix.record(&convo(3, 0, 10), 1, 700_003);
    ix.set_prompt_model(Some(PromptModel {
        slots: 1,
        ram_blocks: 0,
    }));
    assert_eq!(
        ix.chains_of(1),
        0,
        "chains recorded without the model are not known"
    );
    ix.record(&convo(4, 0, 10), 1, 700_004);
    ix.record(&convo(5, 0, 10), 1, 700_005);
    assert_eq!(lens(&ix, &convo(4, 0, 10), 700_006)[1], 0);
    assert_eq!(lens(&ix, &convo(5, 0, 10), 700_006)[1], 10);
}

#[test]
fn a_conversation_whose_prompt_was_evicted_is_known_to_be_nowhere() {
    let mut ix = whole_prompts(1, 0);
    ix.record(&convo(1, 4, 20), 0, 1);
    let next_turn = convo(1, 4, 30);
    let mut m = Vec::new();
    ix.match_lengths(&next_turn, 2, &mut m);
    assert!(!ix.history_evicted(&next_turn, &m, 4), "held: not gone");
    ix.record(&convo(2, 4, 20), 0, 2);
    ix.match_lengths(&next_turn, 3, &mut m);
    assert_eq!(m, vec![4, 0, 0]);
    assert!(ix.history_evicted(&next_turn, &m, 4));
    // A conversation this index never saw, or one a pod holds past the head, is not.
    assert!(!ix.history_evicted(&convo(3, 4, 30), &m, 4));
    ix.record(&convo(1, 4, 20), 1, 4);
    ix.match_lengths(&next_turn, 5, &mut m);
    assert!(!ix.history_evicted(&next_turn, &m, 4));
    // Without the model nothing is evicted by prompts.
    let mut blocks = Index::new(3, 1 << 16, 600_000);
    blocks.record(&convo(1, 4, 20), 0, 1);
    blocks.record(&convo(2, 4, 20), 0, 2);
    assert!(!blocks.history_evicted(&next_turn, &[4, 0, 0], 4));
}

#[test]
fn an_evicted_prompt_whose_deepest_sample_is_the_shared_system_prompt_says_nothing_of_others() {
    // 89 shared blocks and a one-block question: the chain's deepest sampled position (87)
    // lies in the system prompt, so its ghost is a hash every conversation carries.
    let mut ix = whole_prompts(1, 0);
    ix.record(&convo(1, 89, 90), 0, 1);
    ix.record(&convo(2, 89, 90), 0, 2);
    let other = convo(3, 89, 100);
    let mut m = Vec::new();
    ix.match_lengths(&other, 3, &mut m);
    assert!(m[0] > 0 && m.iter().all(|&n| n <= 90), "{m:?}");
    assert!(!ix.history_evicted(&other, &m, 90));
}
