//! The simulated engine: vLLM-style continuous batching as a step loop over a [`PrefixCache`].
//!
//! # Scheduling (one step, like vLLM V1's scheduler with chunked prefill)
//! 1. Requests whose client went away are aborted and their blocks released.
//! 2. Running sequences are served first, in arrival order, out of a token budget of
//!    `max_num_batched_tokens`: a decoding sequence takes 1 token, a sequence still prefilling
//!    takes `min(remaining prompt, remaining budget)` tokens (chunked prefill).
//! 3. Then waiting requests are admitted in FIFO order while `running < max_num_seqs`, budget is
//!    left, and the KV cache can hold them. Admission looks up the longest cached prefix (capped at
//!    `prompt_len - 1` tokens: like vLLM the last prompt token is always recomputed so the step
//!    yields logits), pins those blocks and reserves blocks for the rest of the prompt *and* all
//!    `max_tokens` decode tokens, so a running sequence never needs preemption. The first request
//!    that does not fit stops admission (head-of-line, as vLLM's FCFS policy).
//!
//! # LoRA adapters
//! A request may name a LoRA adapter. At most `max_loras` distinct adapters are in the running
//! batch at once, as in vLLM V1's scheduler (`vllm/v1/core/sched/scheduler.py`): a waiting
//! request whose adapter is not among the running ones while `max_loras` adapters already run
//! is skipped for this step and stays in the queue at its place, and admission goes on with the
//! requests behind it (base-model requests and requests for a running adapter pass it). Unlike
//! the KV-capacity stop, this is not head-of-line blocking. Simplifications: an adapter costs
//! nothing to load (vLLM loads it from disk or CPU memory on first use, `--max-cpu-loras`), and
//! adapter requests cost the same per token as base ones. An adapter's blocks are hashed from a
//! root salted with its name, so adapters and the base model never share cached blocks
//! ([`crate::cache::root_hash`]).
//!
//! The engine also keeps what vLLM exports as `vllm:lora_requests_info`: after every step, the
//! adapters with running and with waiting requests, and the wall time at which each such
//! combination was last seen ([`LoraInfo`]).
//!
//! # Cost model
//! `step_ms = base_ms + prefill_tokens * prefill_ms_per_token + batch_seqs * decode_ms_per_seq`,
//! where `prefill_tokens` counts only uncached prompt tokens computed in this step and
//! `batch_seqs` is the number of sequences in the step. The loop sleeps `step_ms / time_scale`
//! wall milliseconds (against an anchored clock, so sub-millisecond steps at high time scales
//! still average out right), then applies the step: prefill progress is recorded, newly full
//! blocks are committed to the cache, and every sequence whose prompt is complete emits one
//! token. The step that finishes a prompt emits the first token (time to first token).
//!
//! Output is deterministic: token `i` of a request is a word picked from a small vocabulary by a
//! hash of the prompt (and adapter) and `i`, so identical prompts get identical completions.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

mod predict;
pub use predict::{Prediction, Probe};

use crate::cache::{
    block_hashes_from, chain_hash, root_hash, token_of, BlockHash, PrefixCache, Token, ROOT_HASH,
};

/// Engine knobs (see [`crate::config::Args`] for the defaults and why).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub block_size: usize,
    pub num_blocks: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub base_ms: f64,
    pub prefill_ms_per_token: f64,
    pub decode_ms_per_seq: f64,
    pub time_scale: f64,
    /// Most distinct LoRA adapters in the running batch; `None` when LoRA is not enabled.
    pub max_loras: Option<usize>,
}

/// Token accounting of one finished sequence (OpenAI `usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeqUsage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Prompt tokens this request computed and left in the prefix cache (vLLM's
    /// `created_cache_tokens`: its prompt's tokens in full cached blocks when it finished, at
    /// most the prompt, less those it found cached).
    pub created_cache_tokens: usize,
}

/// What the engine tells the API layer about a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqEvent {
    /// One generated token; `text` is the delta (words after the first carry a leading space).
    /// `finish_reason` is set on the sequence's last token (always `"length"`: the simulator
    /// has no EOS and stops at `max_tokens`).
    Token {
        index: usize,
        text: String,
        finish_reason: Option<&'static str>,
    },
    /// The sequence is done; no more events for `index`.
    Finished {
        index: usize,
        usage: SeqUsage,
        finish_reason: &'static str,
    },
}

/// A request for one sequence. `index` is echoed in events (the choice index of a multi-prompt
/// completion request); the events channel may be shared by several sequences.
#[derive(Debug)]
pub struct SeqRequest {
    pub tokens: Vec<Token>,
    pub max_tokens: usize,
    pub index: usize,
    pub events: mpsc::UnboundedSender<SeqEvent>,
    /// The LoRA adapter the request runs under; `None` for the base model.
    pub lora: Option<Arc<str>>,
    /// Match nothing in the prefix cache (vLLM does so for prompt logprobs); the prompt's
    /// blocks are still cached once computed.
    pub skip_reading_prefix_cache: bool,
}

/// One series of `vllm:lora_requests_info`: a combination of running and waiting adapters and
/// the Unix time it was last seen at the end of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSeries {
    /// Adapters with running requests, comma-separated.
    pub running: String,
    /// Adapters with waiting requests, comma-separated.
    pub waiting: String,
    pub last_seen: f64,
}

/// What vLLM exports as `vllm:lora_requests_info`. vLLM sets the gauge child of the current label
/// combination to the current time after every step (`set_to_current_time` in
/// `vllm/v1/metrics/loggers.py`), and `prometheus_client` keeps every child it ever created:
/// `/metrics` shows one series per combination seen since start, and the current one is the
/// series with the latest value. Kept in creation order, as `prometheus_client` lists children.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoraInfo {
    pub max_loras: usize,
    pub series: Vec<LoraSeries>,
}

/// Requests in flight for one adapter.
#[derive(Debug)]
struct LoraLoad {
    name: Arc<str>,
    running: usize,
    waiting: usize,
}

/// Where a sequence is, for the per-adapter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Running,
}

/// Monotonic counters exported as Prometheus counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub request_success: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub steps: u64,
    pub aborted: u64,
}

/// Point-in-time engine state for `/metrics`.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub num_blocks: usize,
    pub block_size: usize,
    pub evictable_blocks: usize,
    pub evictions: u64,
    pub counters: Counters,
}

/// What one scheduled step does (returned by [`Engine::schedule`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepPlan {
    pub cost_ms: f64,
    pub prefill_tokens: usize,
    pub batch_seqs: usize,
}

const VOCAB: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "cache", "block", "prefix",
    "token", "route", "warm", "model", "batch", "decode", "fill", "queue", "step", "fleet", "node",
    "load", "hit",
];

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The `i`-th output word for a prompt whose seed is `seed`.
pub fn output_word(seed: u64, i: usize) -> &'static str {
    let idx = splitmix(seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d)) % VOCAB.len() as u64;
    VOCAB.get(idx as usize).copied().unwrap_or("tok")
}

/// The full deterministic completion text for a prompt (what a non-streamed request returns)
/// under the base model.
pub fn completion_text(tokens: &[Token], n: usize) -> String {
    let seed = chain_hash(ROOT_HASH, tokens);
    (0..n)
        .map(|i| output_word(seed, i))
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug)]
struct Seq {
    req: SeqRequest,
    /// Hash before block 0: salted by the adapter, if any.
    root: BlockHash,
    prompt_hashes: Vec<BlockHash>,
    /// Hashed blocks pinned by this sequence, in order (block k of prompt+output).
    pinned: Vec<BlockHash>,
    /// Reserved, not yet committed blocks.
    private: usize,
    /// Prompt tokens whose KV is computed (cached ones included).
    computed: usize,
    cached_tokens: usize,
    /// Prompt + generated tokens.
    all_tokens: Vec<Token>,
    generated: usize,
    seed: u64,
    /// Tokens scheduled in the current step (0 = not in this step).
    scheduled: usize,
}

impl Seq {
    fn prompt_len(&self) -> usize {
        self.req.tokens.len()
    }
    fn prefilling(&self) -> bool {
        self.computed < self.prompt_len()
    }
}

/// The engine state machine. Pure (no clock, no tasks): [`EngineHandle`] drives it in real time,
/// unit tests and the bench can drive it step by step.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    cache: PrefixCache,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    counters: Counters,
    /// Adapters with requests in flight, in the order they got their first one (vLLM's
    /// `LoRARequestStates` dict: an adapter leaves when its last request finishes).
    loras: Vec<LoraLoad>,
    lora_info: LoraInfo,
    /// `lora_info.series` index per (running, waiting) label pair.
    lora_series: HashMap<(String, String), usize>,
    /// Series of the current combination, `None` when `loras` changed since it was found.
    lora_current: Option<usize>,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        let cache = PrefixCache::new(cfg.block_size, cfg.num_blocks);
        let lora_info = LoraInfo {
            max_loras: cfg.max_loras.unwrap_or(0),
            series: Vec::new(),
        };
        Self {
            cfg,
            cache,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: Counters::default(),
            loras: Vec::new(),
            lora_info,
            lora_series: HashMap::new(),
            lora_current: None,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// Longest prompt + completion a request may ask for: `max_model_len`, but never more than
    /// the whole KV cache (such a request could never be admitted).
    pub fn max_len(&self) -> usize {
        self.cfg
            .max_model_len
            .min(self.cfg.num_blocks.saturating_mul(self.cfg.block_size))
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.cfg.block_size)
    }

    /// Queues a request (vLLM's `waiting`). Requests longer than [`max_len`](Self::max_len) must
    /// be rejected by the caller; if one slips through it is finished immediately with no output.
    pub fn add(&mut self, req: SeqRequest) {
        let n = req.tokens.len();
        if self.blocks_for(n + req.max_tokens) > self.cfg.num_blocks {
            let usage = SeqUsage {
                prompt_tokens: n,
                ..SeqUsage::default()
            };
            let _ = req.events.send(SeqEvent::Finished {
                index: req.index,
                usage,
                finish_reason: "length",
            });
            return;
        }
        let root = root_hash(req.lora.as_deref());
        let prompt_hashes = block_hashes_from(root, &req.tokens, self.cfg.block_size);
        let seed = chain_hash(root, &req.tokens);
        let all_tokens = req.tokens.clone();
        self.lora_moved(req.lora.as_ref(), None, Some(Phase::Waiting));
        self.waiting.push_back(Seq {
            req,
            root,
            prompt_hashes,
            pinned: Vec::new(),
            private: 0,
            computed: 0,
            cached_tokens: 0,
            all_tokens,
            generated: 0,
            seed,
            scheduled: 0,
        });
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_usage: self.cache.usage(),
            num_blocks: self.cfg.num_blocks,
            block_size: self.cfg.block_size,
            evictable_blocks: self.cache.evictable(),
            evictions: self.cache.evictions(),
            counters: self.counters,
        }
    }

    /// Plans the next step (see the module docs). `None` when there is nothing to run.
    pub fn schedule(&mut self) -> Option<StepPlan> {
        self.drop_aborted();
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut prefill_tokens = 0;
        for seq in &mut self.running {
            seq.scheduled = 0;
            if budget == 0 {
                continue;
            }
            if seq.prefilling() {
                let chunk = (seq.prompt_len() - seq.computed).min(budget);
                seq.scheduled = chunk;
                budget -= chunk;
                prefill_tokens += chunk;
            } else {
                seq.scheduled = 1;
                budget -= 1;
            }
        }
        // Adapters in the batch (vLLM's `scheduled_loras`).
        let mut batch_loras: Vec<Arc<str>> = Vec::new();
        if self.cfg.max_loras.is_some() {
            for name in self.running.iter().filter_map(|s| s.req.lora.as_ref()) {
                if !batch_loras.contains(name) {
                    batch_loras.push(name.clone());
                }
            }
        }
        let mut next = 0;
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(seq) = self.waiting.get(next) else {
                break;
            };
            if let (Some(max_loras), Some(name)) = (self.cfg.max_loras, seq.req.lora.as_ref()) {
                if batch_loras.len() >= max_loras && !batch_loras.contains(name) {
                    // vLLM: "Scheduling would exceed max_loras, skip." It stays queued.
                    next += 1;
                    continue;
                }
            }
            let n = seq.prompt_len();
            let max_hit = n.saturating_sub(1) / self.cfg.block_size;
            let hit = if seq.req.skip_reading_prefix_cache {
                0
            } else {
                self.cache.match_prefix(&seq.prompt_hashes).min(max_hit)
            };
            let private = self.blocks_for(n + seq.req.max_tokens).saturating_sub(hit);
            if !self.cache.admit(&seq.prompt_hashes[..hit], private) {
                break;
            }
            let Some(mut seq) = self.waiting.remove(next) else {
                break;
            };
            if let Some(name) = seq.req.lora.as_ref() {
                if self.cfg.max_loras.is_some() && !batch_loras.contains(name) {
                    batch_loras.push(name.clone());
                }
            }
            self.lora_moved(
                seq.req.lora.as_ref(),
                Some(Phase::Waiting),
                Some(Phase::Running),
            );
            seq.pinned = seq.prompt_hashes[..hit].to_vec();
            seq.private = private;
            seq.cached_tokens = hit * self.cfg.block_size;
            seq.computed = seq.cached_tokens;
            self.counters.prefix_cache_queries += n as u64;
            self.counters.prefix_cache_hits += seq.cached_tokens as u64;
            let chunk = (n - seq.computed).min(budget);
            seq.scheduled = chunk;
            budget -= chunk;
            prefill_tokens += chunk;
            self.running.push(seq);
        }
        let batch_seqs = self
            .running
            .iter()
            .filter(|s| s.scheduled > 0 || s.prompt_len() == 0)
            .count();
        if batch_seqs == 0 {
            return None;
        }
        let cost_ms = self.cfg.base_ms
            + prefill_tokens as f64 * self.cfg.prefill_ms_per_token
            + batch_seqs as f64 * self.cfg.decode_ms_per_seq;
        Some(StepPlan {
            cost_ms,
            prefill_tokens,
            batch_seqs,
        })
    }

    /// Applies the step planned by the last [`schedule`](Self::schedule): records prefill
    /// progress, emits tokens, commits full blocks, finishes sequences.
    pub fn complete(&mut self) {
        self.counters.steps += 1;
        let bs = self.cfg.block_size;
        let mut i = 0;
        while i < self.running.len() {
            let Some(seq) = self.running.get_mut(i) else {
                break;
            };
            if seq.scheduled == 0 && seq.prompt_len() > 0 {
                i += 1;
                continue;
            }
            let mut emit = false;
            if seq.prefilling() {
                seq.computed += seq.scheduled;
                if !seq.prefilling() {
                    self.counters.prompt_tokens += seq.prompt_len() as u64;
                    emit = true;
                }
            } else {
                emit = true;
            }
            seq.scheduled = 0;
            if emit {
                let word = output_word(seq.seed, seq.generated);
                let text = if seq.generated == 0 {
                    word.to_string()
                } else {
                    format!(" {word}")
                };
                seq.all_tokens.push(token_of(word));
                seq.generated += 1;
                self.counters.generation_tokens += 1;
                let finish_reason = (seq.generated >= seq.req.max_tokens).then_some("length");
                let _ = seq.req.events.send(SeqEvent::Token {
                    index: seq.req.index,
                    text,
                    finish_reason,
                });
            }
            // Commit every block that is now full of computed tokens.
            let known = if seq.prefilling() {
                seq.computed
            } else {
                seq.all_tokens.len()
            };
            while seq.private > 0 && seq.pinned.len() < known / bs {
                let k = seq.pinned.len();
                let hash = match seq.prompt_hashes.get(k) {
                    Some(h) => *h,
                    None => {
                        let parent = seq.pinned.last().copied().unwrap_or(seq.root);
                        match seq.all_tokens.get(k * bs..(k + 1) * bs) {
                            Some(block) => chain_hash(parent, block),
                            None => break,
                        }
                    }
                };
                self.cache.commit(hash);
                seq.private -= 1;
                seq.pinned.push(hash);
            }
            if seq.generated >= seq.req.max_tokens && !seq.prefilling() {
                let seq = self.running.remove(i);
                self.cache.release(&seq.pinned, seq.private);
                self.lora_moved(seq.req.lora.as_ref(), Some(Phase::Running), None);
                self.counters.request_success += 1;
                let usage = SeqUsage {
                    prompt_tokens: seq.prompt_len(),
                    completion_tokens: seq.generated,
                    cached_tokens: seq.cached_tokens,
                    created_cache_tokens: (seq.pinned.len() * bs)
                        .min(seq.prompt_len())
                        .saturating_sub(seq.cached_tokens),
                };
                let _ = seq.req.events.send(SeqEvent::Finished {
                    index: seq.req.index,
                    usage,
                    finish_reason: "length",
                });
                continue;
            }
            i += 1;
        }
    }

    /// Moves one request of adapter `lora` between phases (`None`: not in flight) in the
    /// per-adapter counts.
    fn lora_moved(&mut self, lora: Option<&Arc<str>>, from: Option<Phase>, to: Option<Phase>) {
        let Some(name) = lora else { return };
        let pos = match self.loras.iter().position(|l| l.name == *name) {
            Some(p) => p,
            None => {
                self.loras.push(LoraLoad {
                    name: name.clone(),
                    running: 0,
                    waiting: 0,
                });
                self.loras.len() - 1
            }
        };
        let Some(load) = self.loras.get_mut(pos) else {
            return;
        };
        for (phase, delta) in [(from, false), (to, true)] {
            let count = match phase {
                Some(Phase::Waiting) => &mut load.waiting,
                Some(Phase::Running) => &mut load.running,
                None => continue,
            };
            *count = if delta {
                *count + 1
            } else {
                count.saturating_sub(1)
            };
        }
        if load.running == 0 && load.waiting == 0 {
            self.loras.remove(pos);
        }
        self.lora_current = None;
    }

    /// Adapters with running requests and adapters with waiting requests, each in the order the
    /// adapters got their first request in flight.
    pub fn lora_adapters(&self) -> (Vec<Arc<str>>, Vec<Arc<str>>) {
        let pick = |f: fn(&LoraLoad) -> usize| {
            self.loras
                .iter()
                .filter(|l| f(l) > 0)
                .map(|l| l.name.clone())
                .collect()
        };
        (pick(|l| l.running), pick(|l| l.waiting))
    }

    /// Records the current adapter combination as seen at `unix_time` (wall-clock seconds), as
    /// vLLM does after every step. No-op unless LoRA is enabled.
    pub fn record_lora_info(&mut self, unix_time: f64) {
        if self.cfg.max_loras.is_none() {
            return;
        }
        let idx = match self.lora_current {
            Some(i) => i,
            None => {
                let (running, waiting) = self.lora_adapters();
                let key = (running.join(","), waiting.join(","));
                let i = match self.lora_series.get(&key) {
                    Some(i) => *i,
                    None => {
                        let i = self.lora_info.series.len();
                        self.lora_info.series.push(LoraSeries {
                            running: key.0.clone(),
                            waiting: key.1.clone(),
                            last_seen: unix_time,
                        });
                        self.lora_series.insert(key, i);
                        i
                    }
                };
                self.lora_current = Some(i);
                i
            }
        };
        if let Some(series) = self.lora_info.series.get_mut(idx) {
            series.last_seen = unix_time;
        }
    }

    /// `vllm:lora_requests_info`, when LoRA is enabled.
    pub fn lora_info(&self) -> Option<&LoraInfo> {
        self.cfg.max_loras.map(|_| &self.lora_info)
    }

    /// Removes requests whose client disconnected (their event receiver is gone).
    fn drop_aborted(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self
                .waiting
                .get(i)
                .is_some_and(|s| s.req.events.is_closed())
            {
                if let Some(seq) = self.waiting.remove(i) {
                    self.lora_moved(seq.req.lora.as_ref(), Some(Phase::Waiting), None);
                }
                self.counters.aborted += 1;
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if self
                .running
                .get(i)
                .is_some_and(|s| s.req.events.is_closed())
            {
                let seq = self.running.remove(i);
                self.cache.release(&seq.pinned, seq.private);
                self.lora_moved(seq.req.lora.as_ref(), Some(Phase::Running), None);
                self.counters.aborted += 1;
            } else {
                i += 1;
            }
        }
    }
}

/// A running engine: the [`Engine`] behind a mutex, stepped by a background tokio task in
/// (scaled) real time.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    inner: Arc<Mutex<Engine>>,
    notify: Arc<Notify>,
    /// When the step in flight ends (`None` between steps): what is left of it is part of a
    /// prediction's time ([`EngineHandle::predict`]).
    step_end: Arc<Mutex<Option<Instant>>>,
}

impl EngineHandle {
    /// Starts the step loop on the current tokio runtime.
    pub fn spawn(cfg: EngineConfig) -> Self {
        let time_scale = cfg.time_scale;
        let handle = Self {
            inner: Arc::new(Mutex::new(Engine::new(cfg))),
            notify: Arc::new(Notify::new()),
            step_end: Arc::new(Mutex::new(None)),
        };
        let h = handle.clone();
        tokio::spawn(async move { h.run(time_scale).await });
        handle
    }

    /// Locks the engine (a poisoned lock is recovered: the state is still consistent enough to
    /// serve metrics, and the simulator must keep serving).
    pub fn lock(&self) -> MutexGuard<'_, Engine> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn submit(&self, req: SeqRequest) {
        self.lock().add(req);
        self.notify.notify_one();
    }

    pub fn snapshot(&self) -> Snapshot {
        self.lock().snapshot()
    }

    fn set_step_end(&self, end: Option<Instant>) {
        *self.step_end.lock().unwrap_or_else(|e| e.into_inner()) = end;
    }

    /// [`Engine::predict`] now: the step in flight counts for the simulated time left of it.
    /// For the debug endpoint only.
    pub fn predict(&self, probe: Probe<'_>) -> (Prediction, Snapshot) {
        let end = *self.step_end.lock().unwrap_or_else(|e| e.into_inner());
        let engine = self.lock();
        let left_ms = end.map_or(0.0, |end| {
            end.saturating_duration_since(Instant::now()).as_secs_f64()
                * 1000.0
                * engine.cfg.time_scale
        });
        (engine.predict(probe, left_ms), engine.snapshot())
    }

    async fn run(&self, time_scale: f64) {
        let mut anchor = Instant::now();
        let mut sim_ms = 0.0_f64;
        loop {
            let plan = self.lock().schedule();
            let Some(plan) = plan else {
                self.notify.notified().await;
                anchor = Instant::now();
                sim_ms = 0.0;
                continue;
            };
            sim_ms += plan.cost_ms;
            let wall =
                Duration::try_from_secs_f64(sim_ms / 1000.0 / time_scale).unwrap_or(Duration::ZERO);
            let deadline = anchor + wall;
            let now = Instant::now();
            self.set_step_end(Some(deadline.max(now)));
            if deadline > now {
                tokio::time::sleep_until(deadline).await;
            } else {
                if now - deadline > Duration::from_millis(100) {
                    // Far behind (overloaded host): do not replay the backlog as a burst.
                    anchor = now;
                    sim_ms = 0.0;
                }
                tokio::task::yield_now().await;
            }
            let mut engine = self.lock();
            engine.complete();
            self.set_step_end(None);
            engine.record_lora_info(unix_time());
        }
    }
}

/// Wall-clock Unix time in seconds (Python's `time.time()`).
fn unix_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::tokenize;

    fn cfg() -> EngineConfig {
        EngineConfig {
            block_size: 16,
            num_blocks: 1000,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 100_000,
            base_ms: 12.0,
            prefill_ms_per_token: 0.06,
            decode_ms_per_seq: 0.15,
            time_scale: 1.0,
            max_loras: None,
        }
    }

    fn prompt(prefix: &str, n: usize) -> Vec<Token> {
        tokenize(
            &(0..n)
                .map(|i| format!("{prefix}{i}"))
                .collect::<Vec<_>>()
                .join(" "),
        )
    }

    fn submit(
        e: &mut Engine,
        tokens: Vec<Token>,
        max_tokens: usize,
    ) -> mpsc::UnboundedReceiver<SeqEvent> {
        submit_lora(e, tokens, max_tokens, None)
    }

    fn submit_lora(
        e: &mut Engine,
        tokens: Vec<Token>,
        max_tokens: usize,
        lora: Option<&str>,
    ) -> mpsc::UnboundedReceiver<SeqEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        e.add(SeqRequest {
            tokens,
            max_tokens,
            index: 0,
            events: tx,
            lora: lora.map(Arc::from),
            skip_reading_prefix_cache: false,
        });
        rx
    }

    fn run_to_idle(e: &mut Engine) -> Vec<StepPlan> {
        let mut plans = Vec::new();
        while let Some(p) = e.schedule() {
            plans.push(p);
            e.complete();
            assert!(plans.len() < 100_000, "engine does not terminate");
        }
        plans
    }

    fn usage_of(rx: &mut mpsc::UnboundedReceiver<SeqEvent>) -> (String, SeqUsage) {
        let mut text = String::new();
        while let Ok(ev) = rx.try_recv() {
            match ev {
                SeqEvent::Token { text: t, .. } => text.push_str(&t),
                SeqEvent::Finished { usage, .. } => return (text, usage),
            }
        }
        panic!("sequence did not finish");
    }

    #[test]
    fn prefill_cost_only_for_uncached_tokens() {
        let mut e = Engine::new(cfg());
        let p = prompt("w", 1000);
        let mut rx = submit(&mut e, p.clone(), 4);
        let plans = run_to_idle(&mut e);
        assert_eq!(plans.len(), 4, "first step prefills and emits token 0");
        assert_eq!(plans[0].prefill_tokens, 1000);
        let (text, u) = usage_of(&mut rx);
        assert_eq!(
            u,
            SeqUsage {
                prompt_tokens: 1000,
                completion_tokens: 4,
                cached_tokens: 0,
                created_cache_tokens: 992,
            }
        );
        assert_eq!(text, completion_text(&p, 4));

        let mut rx = submit(&mut e, p.clone(), 4);
        let plans = run_to_idle(&mut e);
        // 1000 tokens = 62 full blocks + 8; all 62 blocks hit.
        assert_eq!(plans[0].prefill_tokens, 1000 - 62 * 16);
        let (text2, u) = usage_of(&mut rx);
        assert_eq!(u.cached_tokens, 992);
        assert_eq!(
            u.created_cache_tokens, 0,
            "nothing new: as vLLM's second identical prompt"
        );
        assert_eq!(text2, text, "deterministic output");
        let expected = 12.0 + 8.0 * 0.06 + 0.15;
        assert!((plans[0].cost_ms - expected).abs() < 1e-9);
    }

    #[test]
    fn a_request_that_skips_cache_reads_prefills_all_and_leaves_the_cache() {
        let mut e = Engine::new(cfg());
        let p = prompt("w", 1000);
        let _rx = submit(&mut e, p.clone(), 1);
        run_to_idle(&mut e);
        let (tx, mut rx) = mpsc::unbounded_channel();
        e.add(SeqRequest {
            tokens: p.clone(),
            max_tokens: 1,
            index: 0,
            events: tx,
            lora: None,
            skip_reading_prefix_cache: true,
        });
        let plans = run_to_idle(&mut e);
        assert_eq!(plans[0].prefill_tokens, 1000);
        assert_eq!(usage_of(&mut rx).1.cached_tokens, 0);
        let mut rx = submit(&mut e, p, 1);
        run_to_idle(&mut e);
        assert_eq!(usage_of(&mut rx).1.cached_tokens, 992, "still cached");
    }

    #[test]
    fn fully_cached_prompt_recomputes_last_token() {
        let mut e = Engine::new(cfg());
        let p = prompt("w", 64);
        let _rx = submit(&mut e, p.clone(), 1);
        run_to_idle(&mut e);
        let mut rx = submit(&mut e, p, 1);
        let plans = run_to_idle(&mut e);
        assert_eq!(plans[0].prefill_tokens, 16);
        assert_eq!(usage_of(&mut rx).1.cached_tokens, 48);
    }

    #[test]
    fn output_blocks_are_cached_for_the_next_turn() {
        let mut e = Engine::new(cfg());
        let p = prompt("w", 32);
        let mut rx = submit(&mut e, p.clone(), 32);
        run_to_idle(&mut e);
        let (text, _) = usage_of(&mut rx);
        let mut next = p.clone();
        next.extend(tokenize(&text));
        next.extend(prompt("u", 20));
        let mut rx = submit(&mut e, next, 1);
        run_to_idle(&mut e);
        // 32 prompt + 32 output tokens = 4 full blocks (the last output token's block is full too).
        assert_eq!(usage_of(&mut rx).1.cached_tokens, 64);
    }

    #[test]
    fn chunked_prefill_respects_budget() {
        let mut c = cfg();
        c.max_num_batched_tokens = 512;
        let mut e = Engine::new(c);
        let mut rx = submit(&mut e, prompt("w", 1200), 2);
        let plans = run_to_idle(&mut e);
        let prefill: Vec<_> = plans.iter().map(|p| p.prefill_tokens).collect();
        assert_eq!(prefill, vec![512, 512, 176, 0]);
        assert_eq!(usage_of(&mut rx).1.completion_tokens, 2);
    }

    #[test]
    fn max_num_seqs_queues_fifo() {
        let mut c = cfg();
        c.max_num_seqs = 2;
        let mut e = Engine::new(c);
        let mut rxs: Vec<_> = (0..5)
            .map(|i| submit(&mut e, prompt(&format!("r{i}_"), 40), 10))
            .collect();
        e.schedule();
        assert_eq!((e.num_running(), e.num_waiting()), (2, 3));
        e.complete();
        run_to_idle(&mut e);
        for rx in &mut rxs {
            assert_eq!(usage_of(rx).1.completion_tokens, 10);
        }
        let s = e.snapshot();
        assert_eq!(s.counters.request_success, 5);
        assert_eq!(s.counters.generation_tokens, 50);
        assert_eq!(s.counters.prompt_tokens, 200);
        assert_eq!(s.running + s.waiting, 0);
        assert_eq!(s.kv_usage, 0.0);
    }

    #[test]
    fn kv_capacity_limits_admission() {
        let mut c = cfg();
        c.num_blocks = 20;
        let mut e = Engine::new(c);
        // Each needs ceil((100+60)/16) = 10 blocks: two fit, the third waits.
        let _rxs: Vec<_> = (0..3)
            .map(|i| submit(&mut e, prompt(&format!("r{i}_"), 100), 60))
            .collect();
        e.schedule();
        assert_eq!((e.num_running(), e.num_waiting()), (2, 1));
        assert!((e.snapshot().kv_usage - 1.0).abs() < 1e-9);
        e.complete();
        run_to_idle(&mut e);
        assert_eq!(e.snapshot().counters.request_success, 3);
    }

    #[test]
    fn aborted_requests_release_blocks() {
        let mut e = Engine::new(cfg());
        let rx = submit(&mut e, prompt("w", 100), 1000);
        e.schedule();
        e.complete();
        assert!(e.cache().used() > 0);
        drop(rx);
        assert!(e.schedule().is_none());
        assert_eq!(e.cache().used(), 0);
        assert_eq!(e.snapshot().counters.aborted, 1);
    }
    /// Submits `tokens` and steps the engine until its first token: the simulated ms that took
    /// (the cost of every step from the one that admits it to the one that emits its first
    /// token, with no other arrival: what [`Engine::predict`] forecasts).
    fn measured_ttft(e: &mut Engine, tokens: Vec<Token>, max_tokens: usize) -> f64 {
        let mut rx = submit(e, tokens, max_tokens);
        let mut t = 0.0;
        loop {
            let plan = e
                .schedule()
                .expect("the probe is queued: a step is planned");
            t += plan.cost_ms;
            e.complete();
            let mut first = false;
            while let Ok(ev) = rx.try_recv() {
                first |= matches!(ev, SeqEvent::Token { .. } | SeqEvent::Finished { .. });
            }
            if first {
                // Keep the receiver alive: dropping it aborts the sequence.
                std::mem::forget(rx);
                return t;
            }
        }
    }

    fn probe_of(tokens: &[Token], max_tokens: usize) -> (Vec<BlockHash>, usize, usize) {
        (
            crate::cache::block_hashes(tokens, 16),
            tokens.len(),
            max_tokens,
        )
    }

    /// The forecast equals what the engine then does, step for step, on states of every kind:
    /// idle, a cached prefix, a long prefill running (chunked), a queue behind max_num_seqs,
    /// and a KV cache too full to admit at once.
    #[test]
    fn prediction_is_the_engines_own_ttft() {
        let mut small = cfg();
        small.max_num_batched_tokens = 512;
        small.max_num_seqs = 3;
        let mut tight = cfg();
        tight.num_blocks = 60;
        type Setup = fn(&mut Engine) -> Vec<mpsc::UnboundedReceiver<SeqEvent>>;
        let cases: Vec<(&str, EngineConfig, Setup, Vec<Token>, usize)> = vec![
            ("idle", cfg(), |_| vec![], prompt("p", 700), 5),
            (
                "cached prefix",
                cfg(),
                |e| {
                    let rx = submit(e, prompt("p", 500), 3);
                    run_to_idle(e);
                    vec![rx]
                },
                prompt("p", 700),
                5,
            ),
            (
                "long prefills running and waiting, chunked",
                small.clone(),
                |e| {
                    let mut rxs = vec![
                        submit(e, prompt("a", 1500), 40),
                        submit(e, prompt("b", 300), 8),
                    ];
                    e.schedule();
                    e.complete();
                    rxs.push(submit(e, prompt("c", 900), 20));
                    rxs.push(submit(e, prompt("d", 50), 30));
                    rxs
                },
                prompt("p", 700),
                5,
            ),
            (
                "kv full: waits for blocks to free",
                tight,
                |e| {
                    let rxs = vec![
                        submit(e, prompt("a", 400), 200),
                        submit(e, prompt("b", 100), 50),
                    ];
                    e.schedule();
                    e.complete();
                    rxs
                },
                prompt("p", 300),
                10,
            ),
        ];
        for (name, c, setup, tokens, max_tokens) in cases {
            let mut e = Engine::new(c);
            let _keep = setup(&mut e);
            let (hashes, n, m) = probe_of(&tokens, max_tokens);
            let p = e.predict(
                Probe {
                    hashes: &hashes,
                    prompt_len: n,
                    max_tokens: m,
                },
                0.0,
            );
            let measured = measured_ttft(&mut e, tokens, max_tokens);
            let predicted = p.ttft_ms.unwrap_or(f64::NAN);
            assert!(
                (predicted - measured).abs() < 1e-9,
                "{name}: predicted {predicted} ms, the engine took {measured} ms"
            );
        }
    }

    #[test]
    fn prediction_reports_the_cached_prefix_and_what_was_evicted() {
        let mut c = cfg();
        c.num_blocks = 40;
        let mut e = Engine::new(c);
        let p = prompt("p", 330);
        let _a = submit(&mut e, p.clone(), 1);
        run_to_idle(&mut e);
        let (hashes, n, m) = probe_of(&p, 1);
        let probe = Probe {
            hashes: &hashes,
            prompt_len: n,
            max_tokens: m,
        };
        let before = e.predict(probe, 0.0);
        // 330 tokens: 20 full blocks, all cached (the cap is (330 - 1) / 16 = 20).
        assert_eq!((before.match_blocks, before.held_blocks), (20, 20));
        // Another prompt of 35 blocks evicts most of it.
        let _b = submit(&mut e, prompt("q", 560), 1);
        run_to_idle(&mut e);
        let after = e.predict(probe, 0.0);
        assert!(after.match_blocks < 20, "evicted: {after:?}");
        assert_eq!(after.held_blocks, 20, "held once: {after:?}");
        assert!(after.ttft_ms > before.ttft_ms, "{after:?} vs {before:?}");
    }

    #[test]
    fn step_in_flight_adds_its_time_left_and_applies_first() {
        let mut e = Engine::new(cfg());
        let _a = submit(&mut e, prompt("a", 100), 50);
        e.schedule();
        let (hashes, n, m) = probe_of(&prompt("p", 100), 5);
        let probe = Probe {
            hashes: &hashes,
            prompt_len: n,
            max_tokens: m,
        };
        let idle_step = 12.0 + 100.0 * 0.06 + 2.0 * 0.15;
        let p = e.predict(probe, 7.0).ttft_ms.unwrap_or(f64::NAN);
        // `a` decodes beside the probe's prefill: two sequences in the step.
        assert!((p - (7.0 + idle_step)).abs() < 1e-9, "{p}");
    }

    fn lora_cfg(max_loras: usize) -> EngineConfig {
        EngineConfig {
            max_loras: Some(max_loras),
            ..cfg()
        }
    }

    fn names(v: &[Arc<str>]) -> Vec<&str> {
        v.iter().map(|n| &**n).collect()
    }

    #[test]
    fn max_loras_skips_requests_of_other_adapters() {
        let mut e = Engine::new(lora_cfg(1));
        let mut a = submit_lora(&mut e, prompt("a", 40), 20, Some("a"));
        let mut b = submit_lora(&mut e, prompt("b", 40), 5, Some("b"));
        let mut base = submit(&mut e, prompt("c", 40), 5);
        let mut a2 = submit_lora(&mut e, prompt("d", 40), 5, Some("a"));
        e.schedule();
        // b would be a second adapter: skipped, while the base request and a second request for
        // the running adapter pass it.
        assert_eq!((e.num_running(), e.num_waiting()), (3, 1));
        let (running, waiting) = e.lora_adapters();
        assert_eq!((names(&running), names(&waiting)), (vec!["a"], vec!["b"]));
        e.complete();
        // b waits until no request of a runs.
        for _ in 0..19 {
            e.schedule();
            assert_eq!(names(&e.lora_adapters().1), vec!["b"]);
            e.complete();
        }
        e.schedule();
        let (running, waiting) = e.lora_adapters();
        assert_eq!((names(&running), names(&waiting)), (vec!["b"], vec![]));
        e.complete();
        run_to_idle(&mut e);
        for rx in [&mut a, &mut b, &mut base, &mut a2] {
            assert!(usage_of(rx).1.completion_tokens > 0);
        }
        assert_eq!(e.lora_adapters(), (vec![], vec![]));
    }

    #[test]
    fn max_loras_adapters_run_together() {
        let mut e = Engine::new(lora_cfg(2));
        let _rxs: Vec<_> = ["x", "y", "z", "x"]
            .iter()
            .enumerate()
            .map(|(i, a)| submit_lora(&mut e, prompt(&format!("p{i}_"), 20), 5, Some(a)))
            .collect();
        e.schedule();
        let (running, waiting) = e.lora_adapters();
        assert_eq!(
            (names(&running), names(&waiting)),
            (vec!["x", "y"], vec!["z"])
        );
        assert_eq!(e.num_running(), 3);
    }

    #[test]
    fn kv_capacity_still_blocks_head_of_line_with_lora() {
        let mut c = lora_cfg(1);
        c.num_blocks = 20;
        let mut e = Engine::new(c);
        // 10 blocks each: a fits; b is skipped for max_loras; the base request behind it does
        // not fit and stops admission, so the one after it (which would fit) waits too.
        let _a = submit_lora(&mut e, prompt("a", 100), 60, Some("a"));
        let _b = submit_lora(&mut e, prompt("b", 10), 2, Some("b"));
        let _big = submit(&mut e, prompt("c", 150), 60);
        let _small = submit(&mut e, prompt("d", 10), 2);
        e.schedule();
        assert_eq!((e.num_running(), e.num_waiting()), (1, 3));
    }

    #[test]
    fn adapters_do_not_share_prefix_blocks() {
        let mut e = Engine::new(lora_cfg(1));
        let p = prompt("w", 100);
        let cached = |e: &mut Engine, lora: Option<&str>| {
            let mut rx = submit_lora(e, p.clone(), 4, lora);
            run_to_idle(e);
            usage_of(&mut rx)
        };
        let (text_a, first) = cached(&mut e, Some("a"));
        assert_eq!(first.cached_tokens, 0);
        let (text_a2, again) = cached(&mut e, Some("a"));
        assert_eq!(again.cached_tokens, 96);
        assert_eq!(text_a, text_a2);
        assert_eq!(cached(&mut e, Some("b")).1.cached_tokens, 0);
        let (text_base, base) = cached(&mut e, None);
        assert_eq!(base.cached_tokens, 0);
        assert_eq!(text_base, completion_text(&p, 4));
        assert_ne!(text_a, text_base, "an adapter answers differently");
        assert_eq!(cached(&mut e, None).1.cached_tokens, 96);
    }

    #[test]
    fn lora_info_keeps_every_combination_with_its_last_time() {
        let mut e = Engine::new(lora_cfg(1));
        let _a = submit_lora(&mut e, prompt("a", 20), 3, Some("a"));
        let _b = submit_lora(&mut e, prompt("b", 20), 2, Some("b"));
        let mut t = 100.0;
        while e.schedule().is_some() {
            e.complete();
            t += 1.0;
            e.record_lora_info(t);
        }
        let info = e.lora_info().cloned().unwrap_or_default();
        assert_eq!(info.max_loras, 1);
        let got: Vec<(&str, &str, f64)> = info
            .series
            .iter()
            .map(|s| (s.running.as_str(), s.waiting.as_str(), s.last_seen))
            .collect();
        // a runs 3 steps with b waiting (the step that finishes a leaves b waiting alone), b
        // runs 2 steps, then nothing is in flight.
        assert_eq!(
            got,
            vec![
                ("a", "b", 102.0),
                ("", "b", 103.0),
                ("b", "", 104.0),
                ("", "", 105.0)
            ]
        );
        let mut e = Engine::new(cfg());
        let _c = submit_lora(&mut e, prompt("c", 20), 1, Some("c"));
        e.schedule();
        e.complete();
        e.record_lora_info(1.0);
        assert!(e.lora_info().is_none(), "LoRA disabled: no info");
    }
}
