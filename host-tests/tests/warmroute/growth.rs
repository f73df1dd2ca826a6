//! What plausible but hostile traffic can make the filter grow: the VM's linear memory and
//! its work per request, measured in wasmtime fuel (deterministic, so bounding it is not a
//! timed assertion).
//!
//! The traffic is the index's worst shape: prompts that share a long prefix and differ only
//! in their last block, which falls between two sampled positions (see the top of
//! `filter/core/src/routing/index/mod.rs`), so each prompt leaves one entry of its own. They come far
//! faster than the index's TTL forgets them (rate × TTL is millions of entries), so only
//! each pod's capacity can bound what they leave behind: the index must fill, then stay the
//! same size and cost the same per request however many more come.

use crate::common::*;
use host_tests::*;
use serde_json::json;

/// The default `block_bytes`.
const BLOCK: usize = 256;
/// Canonical bytes in front of a lone user message's content: `0x1e user 0x1f`.
const MESSAGE_HEAD: usize = 6;
/// Blocks every prompt shares. Position 33, the last of them, is sampled; position 34,
/// each prompt's own block, is not.
const SHARED_BLOCKS: usize = 34;
/// Requests between two 1 ms steps of the clock: a busy worker (2000 per tick).
const REQUESTS_PER_MS: u64 = 4;
/// KV capacity each pod reports, in tokens (vLLM's `num_gpu_blocks × block_size`): one
/// GPU's worth for a mid-size model, 4096 index blocks at the default 4 bytes per token.
/// The index fills well before the 10k-th request, so 10k → 50k is its steady state.
const POD_KV_TOKENS: u64 = 262_144;
const REQUESTS: usize = 50_000;
/// Requests whose fuel makes one median.
const WINDOW: usize = 200;

/// Prompt `i`: the shared blocks, then one block of its own, and nothing after it.
fn prompt(shared: &str, i: u64) -> Vec<u8> {
    chat(&format!("{shared}{}", text(i, BLOCK)))
}

/// A vLLM pod's `/metrics`: idle, and its KV capacity.
fn pod_metrics(_: &HttpCall) -> HttpCallReply {
    let blocks = POD_KV_TOKENS / 16;
    HttpCallReply::ok(format!(
        "{}vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"{blocks}\"}} 1.0\n",
        vllm_metrics(0, 0, 0.1)
    ))
}

fn median_fuel(fuel: &[u64], from: usize) -> u64 {
    let mut w = fuel[from..from + WINDOW].to_vec();
    w.sort_unstable();
    w[WINDOW / 2]
}

#[test]
fn prompts_differing_past_the_last_sample_grow_neither_memory_nor_work() {
    let t0 = std::time::Instant::now();
    let h = fuel_host();
    let vm = start(&h, &config(4, json!({})));
    let fuel_of = |vm: &Vm| vm.fuel_used().expect("the host meters fuel");
    let shared = text(u64::MAX, SHARED_BLOCKS * BLOCK - MESSAGE_HEAD);
    let start_pages = vm.memory_pages();
    let mut pages = Vec::new();
    let mut fuel = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS as u64 {
        let before = fuel_of(&vm);
        post(&vm, "/v1/chat/completions", &prompt(&shared, i), &[]).finish();
        fuel.push(fuel_of(&vm) - before);
        if i % REQUESTS_PER_MS == REQUESTS_PER_MS - 1 {
            h.advance(1).unwrap();
            h.respond_all(pod_metrics).unwrap();
        }
        if [1_000, 10_000, REQUESTS as u64].contains(&(i + 1)) {
            pages.push(vm.memory_pages());
        }
    }
    assert!(
        vm.crashed().is_none(),
        "{}",
        vm.crashed().unwrap_or_default()
    );
    h.tick_all().unwrap();
    let n = REQUESTS as i64;
    // The traffic has the shape it claims, at the block level: every prompt is 35 full
    // blocks, and each matched exactly the 34 shared ones (the first, nothing).
    assert_eq!(
        h.metric_value("warmroute.prompt_blocks"),
        Some(35 * n),
        "prompts are not 35 blocks"
    );
    assert_eq!(
        h.metric_value("warmroute.matched_blocks"),
        Some(34 * (n - 1)),
        "prompts do not share exactly 34 blocks (or did not all reach the pod holding them)"
    );
    let [p1k, p10k, p50k] = pages[..] else {
        unreachable!()
    };
    let [f1k, f10k, f50k] = [1_000, 10_000, REQUESTS - WINDOW].map(|at| median_fuel(&fuel, at));
    eprintln!(
        "memory (64 KiB pages): start {start_pages}, 1k {p1k}, 10k {p10k}, 50k {p50k}; \
         median fuel per request over {WINDOW}: 1k {f1k}, 10k {f10k}, 50k {f50k} \
         ({:.3}x); {:.1?}",
        f50k as f64 / f1k as f64,
        t0.elapsed()
    );
    // Both measures are live: the index's growth shows in memory while it fills, and a
    // request costs fuel.
    assert!(p10k > start_pages, "{start_pages} → {p10k} pages");
    assert!(f1k > 0, "no fuel metered");
    assert!(
        p50k * 10 <= p10k * 11,
        "linear memory grew more than 10% from 10k to 50k requests: {p10k} → {p50k} pages"
    );
    assert!(
        f50k <= 2 * f1k,
        "a request at 50k costs more than twice one at 1k: {f1k} → {f50k} fuel"
    );
}
