//! The backend's own cache report against what the index predicted.
//!
//! ```text
//! predicted = matched_blocks                     (the index's claim for the pod chosen;
//!                                                 none for a match lowered for blocks a
//!                                                 pending prompt brings, [`crate::routing::pending`]:
//!                                                 whether the pod has them when it admits
//!                                                 this one depends on timing)
//! reported  = cached_tokens / prompt_tokens · prompt_blocks
//!             (usage.prompt_tokens_details.cached_tokens and usage.prompt_tokens:
//!              vLLM, SGLang; as a share of the prompt, since the index counts
//!              bytes and the pod tokens)
//! evicted  ⇔ reported + 2 + predicted / 10 < predicted
//! then      forget, on that pod, what it last used at or before t_last, oldest
//!           first, at most 1/8 of its entries ([`crate::routing::index::FORGET_SHARE`])
//!           (t_last: when the deepest predicted block was last used, before this request)
//! ```
//! vLLM and SGLang evict least recently used blocks first: a pod that lost a
//! block last used at `t_last` has lost whatever it last used before, too.
//! So the index drops that pod's entries of that age, here at once and in
//! every VM through the log ([`crate::routing::index_log`], an *evicted* event): the
//! next request for any of those prefixes is not steered there for a cache
//! that is gone. The prompt that revealed it is not among them: its request
//! has just prefilled it again, and its entries were refreshed when it was
//! routed. The index only approximates a pod's cache (its blocks are bytes,
//! the pod's are tokens; it does not see other gateways' traffic), hence the
//! slack: only a clear shortfall counts.
//!
//! ## Requests the pod computes again whatever it holds
//! Some parameters make the engine skip its prefix-cache *reads*: it prefills
//! the whole prompt (or all past a point) and reports few or no cached
//! tokens, while the cache stays as it was. Such a report is no evidence of
//! an eviction, and taken as one it would let any client wipe the index
//! (each such request on a predicted hit would forget the pod's older
//! entries in every VM). So the prompt reader marks them
//! ([`crate::prompt::prefix::PromptKey::skips_cache_reads`]) and their reports
//! are not read; they route as usual. The parameters, from the engines' source:
//!
//! | parameter | engine | why it skips |
//! |---|---|---|
//! | `prompt_logprobs` not null (chat, completions) | vLLM | `SamplingParams.__post_init__`: `skip_reading_prefix_cache = prompt_logprobs is not None` (`vllm/sampling_params.py`); `Request.get_skip_reading_prefix_cache` and `KVCacheManager.get_computed_blocks` then match nothing (`vllm/v1/request.py`, `vllm/v1/core/kv_cache_manager.py`) |
//! | `echo: true` (completions, with `logprobs`; chat, with `top_logprobs`, which defaults to 0) | vLLM | `to_sampling_params`: `if prompt_logprobs is None and self.echo: prompt_logprobs = self.logprobs` (completions) or `self.top_logprobs` (chat) |
//! | `logprob_start_len` ≥ 0 with `return_logprob` | SGLang | `Req._compute_max_prefix_len` caps the match at `logprob_start_len` (`sglang/srt/managers/schedule_batch.py`); its native field, taken wherever it appears |
//! | `echo: true` with `logprobs` (completions) | SGLang, older | its first OpenAI adapter (`openai_api/adapter.py`) set `logprob_start_len = 0` for them; today's `serving_completions.py` computes no prompt logprobs there and only warns |
//! | `skip_reading_prefix_cache: true` | vLLM | the sampling parameter itself |
//!
//! `echo: true` is taken as skipping on either endpoint even without logprobs:
//! that costs only the evidence of the few echoed requests that do read the
//! cache. Streamed, vLLM refuses `prompt_logprobs` (400), so no report comes.
//! A request under another `cache_salt` is not among them: the salt is in
//! its blocks' hashes ([`crate::prompt::prefix`]), so the index predicts no hit.
//!
//! ## When this index's order is not the pods'
//! ```text
//! surplus  ⇔ predicted + 2 + reported / 10 < reported      (the pod clearly had more)
//! forget (above) only if none of this VM's previous SURPLUS_WINDOW reports of that pod was a surplus
//! ```
//! The cut goes by this index's order of uses, which is the pods' only if they
//! see no prompts this index did not. Behind several gateway replicas (or
//! beside clients that reach the pods directly) the others keep prefixes warm
//! that this gateway last sent long ago, so "older than the lost block" here
//! includes much that the pod still holds, and forgetting it steers those
//! conversations away from their cache. A report of more of a prompt than
//! the index credited the pod with says the pod holds what this index does
//! not: another client's prompts; or cache the index credits only in part (a
//! turn's answer, which the pod caches while it decodes and the index never
//! saw; blocks that a trace shares across conversations); or cache kept past
//! the index's capacity. In each case its order of uses is not the pods', so
//! a shortfall is counted but forgets nothing, and the index ages its entries
//! out by capacity and TTL as it would without reports. A cut one VM makes
//! still reaches every VM through the log.
//!
//! Kept per pod: pooled, one pod that always reports a full cache (a bug or
//! a lie) would turn the cut off for every pod. The other clients are most
//! often other gateways, which send to every pod, so each pod's own reports
//! show them too, only fewer per window: behind 3 gateways of 2 workers a VM
//! reads ~9 reports per pod in a run of the eviction bench (~28 in all).
//!
//! | parameter | value | why |
//! |---|---|---|
//! | [`SURPLUS_WINDOW`] | 16 reports | on the evicting fleet one gateway sees a surplus in ~1% of reports, where the cut is right, and three gateways rotating each session's turns in ~17%, where the cut lost 2% of hit rate and 4-5% of TTFT against no reports, and with the rule hit rate, TTFT mean and P95 are 1.002x, 0.979x and 0.967x (medians of 10 and 25 paired rounds, `docs/decisions/0011-eviction-reports-surplus-rule.md`; measured with the window pooled over the pods). 16 reports pass without a surplus with probability 0.05 at 17% and 0.85 at 1% |
//!
//! Cost: conversation traffic whose next turns carry the previous answers
//! reports surpluses even behind one gateway (most reports on the bench's
//! conversation trace), so there the cut is off. That trace evicts little
//! (a handful of shortfalls in ~800 reports); where pods evict a lot and
//! turns carry answers, the index forgets only by its capacity and TTL.
//!
//! ## Bytes per token, learned
//! ```text
//! on each report of a prompt of ≥ 2 KB (its canonical bytes, [`crate::prompt::prefix`]):
//!   b = the prompt's bytes      r = clamp(b / prompt_tokens, ratio / 1.5, ratio · 1.5)
//!   B ← 0.98·B + b              T ← 0.98·T + b / r
//! ratio = bytes_per_token = B / T    (starting from index.bytes_per_token, worth 4096 tokens)
//! ```
//! The index sizes each pod's share from its capacity in tokens
//! (`vllm:cache_config_info`), in prompt bytes: a wrong ratio makes the index
//! believe a pod holds less (or more) than it does. The configured 4 bytes per
//! token fits English BPE; code, other languages and the simulator's word
//! tokens (≈7) differ by up to 2x. Each report carries both sides of the ratio
//! (the prompt's canonical bytes, the pod's token count), so the index follows
//! the tokenizer the pods really run, over the last ~50 reports. Prompts under
//! 2 KB are left out: there the chat template's own tokens (a few per message)
//! weigh too much. Chat prompts of 2-8 KB are the common case on a real engine
//! (measured in front of vLLM, `docs/real-engine.md`): a floor of 8 KB left the
//! ratio at its configured value for a whole chat workload.
//! The new ratio is a weighted mean of the old one and the report's `r`, so
//! one report moves it by 1.5× at the most, whatever token count it claims: a
//! report of 10^15 tokens would otherwise pin the ratio at its floor for
//! ~1,500 reports and shrink the index's idea of every pod 8×. The bound costs
//! little where the ratio really moves: from the configured 4 to the
//! simulator's 7.3 bytes per token, 90% of the way takes 12 reports of 40
//! blocks (10 unbounded; 23 with a bound of 1.25×).
//!
//! The report is read from the response without delaying a byte: only for a
//! request the index predicted a hit for, whose answer will carry usage (not
//! streamed, or a stream with `stream_options.include_usage`), and only the
//! tail of each body chunk, until it is found. The response is never changed.

use crate::prompt::openai::Endpoint;

/// Reports after a surplus during which a VM's shortfalls forget nothing ([`Surplus`]).
pub const SURPLUS_WINDOW: u32 = u16::BITS;

/// Which of this VM's last [`SURPLUS_WINDOW`] reports showed a surplus
/// (formula above).
#[derive(Debug, Default, Clone, Copy)]
pub struct Surplus {
    recent: u16,
}

impl Surplus {
    /// Folds one report in; returns whether a shortfall in it may forget (no
    /// surplus among the previous [`SURPLUS_WINDOW`] reports; a report is
    /// never both).
    pub fn observe(&mut self, surplus: bool) -> bool {
        let clear = self.recent == 0;
        self.recent = (self.recent << 1) | u16::from(surplus);
        clear
    }
}

/// A [`Surplus`] window per pod, by slot; a slot taken by another pod starts clear.
#[derive(Debug, Default)]
pub struct Surpluses {
    pods: Vec<(u64, Surplus)>,
}

impl Surpluses {
    /// [`Surplus::observe`] for the pod `id` in `slot`.
    pub fn observe(&mut self, slot: usize, id: u64, surplus: bool) -> bool {
        if self.pods.len() <= slot {
            self.pods.resize(slot + 1, (id, Surplus::default()));
        }
        match self.pods.get_mut(slot) {
            Some(pod) => {
                if pod.0 != id {
                    *pod = (id, Surplus::default());
                }
                pod.1.observe(surplus)
            }
            None => true,
        }
    }
}

/// What one report said against the index's prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verdict {
    /// The pod clearly had less than predicted.
    pub shortfall: bool,
    /// The pod clearly had more than predicted.
    pub surplus: bool,
    /// The shortfall made the index forget ([`Surplus`]).
    pub forgot: bool,
}

/// Canonical prompt bytes a report's prompt needs to count towards [`TokenRatio`].
pub const RATIO_MIN_BYTES: usize = 2048;

/// Prompt bytes per pod token, learned from the pods' reports (formula above).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenRatio {
    bytes: f64,
    tokens: f64,
}

impl TokenRatio {
    /// Weight of each earlier report against a new one.
    const DECAY: f64 = 0.98;
    /// Tokens the configured ratio is worth before the first report.
    const PRIOR_TOKENS: f64 = 4096.0;

    /// Starting from the configured ratio.
    pub fn new(bytes_per_token: f64) -> TokenRatio {
        TokenRatio {
            bytes: bytes_per_token * Self::PRIOR_TOKENS,
            tokens: Self::PRIOR_TOKENS,
        }
    }

    /// The most one report moves the ratio, either way.
    const STEP: f64 = 1.5;

    /// One report: a prompt of `bytes` canonical bytes was `tokens` pod tokens.
    pub fn observe(&mut self, bytes: usize, tokens: u64) {
        if bytes < RATIO_MIN_BYTES || tokens == 0 {
            return;
        }
        let bytes = bytes as f64;
        let now = self.bytes_per_token();
        let own = (bytes / tokens as f64).clamp(now / Self::STEP, now * Self::STEP);
        self.bytes = self.bytes * Self::DECAY + bytes;
        self.tokens = self.tokens * Self::DECAY + bytes / own;
    }

    /// Prompt bytes per token, within the range `index.bytes_per_token` accepts.
    pub fn bytes_per_token(&self) -> f64 {
        (self.bytes / self.tokens.max(f64::MIN_POSITIVE)).clamp(0.5, 64.0)
    }
}

/// Bytes at the end of each response chunk searched for the report (a usage
/// object, the last thing in an answer or in its usage chunk, is ~200 bytes).
pub const TAIL_BYTES: usize = 1024;

/// A usage report: prompt tokens, and how many of them the pod had cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u64,
}

/// The usage report at the end of `text`, if it holds one.
pub fn report(text: &[u8]) -> Option<Report> {
    Some(Report {
        prompt_tokens: number(text, b"\"prompt_tokens\"")?,
        cached_tokens: number(text, b"\"cached_tokens\"")?,
    })
}

/// The usage report at the end of an answer to `endpoint`: OpenAI's
/// ([`report`]), or on `/v1/messages` Anthropic's, where the prompt is split
/// in three (vLLM's `_build_anthropic_usage`: `input_tokens` is the prompt
/// less what was read from and written to the cache, floored at 0):
///
/// ```text
/// prompt_tokens = input_tokens + cache_read_input_tokens + cache_creation_input_tokens
/// cached_tokens = cache_read_input_tokens     (absent without --enable-prompt-tokens-details: no report)
/// ```
/// A streamed answer carries it in its last `message_delta` event (and a
/// first, partial one in `message_start`, with the same prompt counts once
/// vLLM has them).
///
/// On `/v1/responses` (a request without `previous_response_id`: a
/// follow-up's report counts the stored conversation its key does not), the
/// Responses API's usage (vLLM's `ResponseUsage`, always sent, streamed in
/// the closing `response.completed` event):
/// ```text
/// prompt_tokens = input_tokens      cached_tokens = input_tokens_details.cached_tokens
/// ```
/// vLLM fills `cached_tokens` from the engine's own prefill count whatever
/// its flags (`SimpleContext.append_output`), unlike chat's
/// `prompt_tokens_details`. An answer that took several engine turns (built-in
/// tools) sums both over its turns, and later turns read what earlier ones
/// wrote, so its share only overstates what the pod had: never an eviction.
pub fn report_for(endpoint: Option<Endpoint>, text: &[u8]) -> Option<Report> {
    match endpoint {
        Some(Endpoint::Messages) => {}
        Some(Endpoint::Responses) => {
            return Some(Report {
                prompt_tokens: number(text, b"\"input_tokens\"")?,
                cached_tokens: number(text, b"\"cached_tokens\"")?,
            })
        }
        _ => return report(text),
    }
    let cached = number(text, b"\"cache_read_input_tokens\"")?;
    let written = number(text, b"\"cache_creation_input_tokens\"").unwrap_or(0);
    let input = number(text, b"\"input_tokens\"")?;
    Some(Report {
        prompt_tokens: input.saturating_add(cached).saturating_add(written),
        cached_tokens: cached,
    })
}

/// The number after the last `key:` in `text`.
fn number(text: &[u8], key: &[u8]) -> Option<u64> {
    let at = text.windows(key.len()).rposition(|w| w == key)?;
    let rest = &text[at + key.len()..];
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    let rest = rest.strip_prefix(b":")?;
    let digits: Vec<u8> = rest
        .iter()
        .copied()
        .skip_while(u8::is_ascii_whitespace)
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

impl Report {
    /// The prompt blocks the pod had cached, by its own account.
    pub fn cached_blocks(&self, prompt_blocks: u32) -> f64 {
        if self.prompt_tokens == 0 {
            return 0.0;
        }
        let share = (self.cached_tokens as f64 / self.prompt_tokens as f64).min(1.0);
        share * f64::from(prompt_blocks)
    }

    /// Whether the pod clearly had less than the `predicted_blocks` of a
    /// `prompt_blocks`-block prompt the index credited it with.
    pub fn shows_eviction(&self, predicted_blocks: u32, prompt_blocks: u32) -> bool {
        let predicted = f64::from(predicted_blocks);
        self.cached_blocks(prompt_blocks) + 2.0 + predicted / 10.0 < predicted
    }

    /// Whether the pod clearly had more than the `predicted_blocks` of a
    /// `prompt_blocks`-block prompt the index credited it with.
    pub fn shows_surplus(&self, predicted_blocks: u32, prompt_blocks: u32) -> bool {
        let cached = self.cached_blocks(prompt_blocks);
        f64::from(predicted_blocks) + 2.0 + cached / 10.0 < cached
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_report_is_found_in_an_answer_or_a_usage_chunk() {
        let answer = br#"{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":900,"total_tokens":904,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":768}}}"#;
        let r = report(answer).unwrap();
        assert_eq!((r.prompt_tokens, r.cached_tokens), (900, 768));
        let chunk = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\": 10, \"prompt_tokens_details\": {\"cached_tokens\": 0}}}\n\ndata: [DONE]\n\n";
        assert_eq!(report(chunk).map(|r| r.cached_tokens), Some(0));
        assert_eq!(
            report(b"data: {\"choices\":[{\"delta\":{\"content\":\"cached_tokens\"}}]}"),
            None
        );
        assert_eq!(report(b"\"prompt_tokens\":3,\"cached_tokens\":null"), None);
        assert_eq!(report(b""), None);
    }

    #[test]
    fn the_messages_apis_report_adds_its_three_parts() {
        // vLLM 0.32's /v1/messages answer, non-streamed (`exclude_none`), and its
        // stream's last usage event.
        let answer = br#"{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"model":"tiny","stop_reason":"max_tokens","usage":{"input_tokens":30,"output_tokens":8,"cache_creation_input_tokens":64,"cache_read_input_tokens":160}}"#;
        let r = report_for(Some(Endpoint::Messages), answer).unwrap();
        assert_eq!((r.prompt_tokens, r.cached_tokens), (254, 160));
        let stream = concat!(
            "event: message_delta\n",
            r#"data: {"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":2,"output_tokens":8,"cache_read_input_tokens":252}}"#,
            "\n\nevent: message_stop\n",
            r#"data: {"type":"message_stop"}"#,
            "\n\n"
        )
        .as_bytes();
        let r = report_for(Some(Endpoint::Messages), stream).unwrap();
        assert_eq!((r.prompt_tokens, r.cached_tokens), (254, 252));
        // Without the cache fields (no --enable-prompt-tokens-details): no report.
        let bare = br#"{"usage":{"input_tokens":254,"output_tokens":8}}"#;
        assert_eq!(report_for(Some(Endpoint::Messages), bare), None);
        // The OpenAI endpoints read OpenAI's shape, not this one.
        assert_eq!(report_for(Some(Endpoint::Chat), answer), None);
        assert!(report_for(Some(Endpoint::Messages), &u64::MAX.to_string().into_bytes()).is_none());
        let huge = format!(
            r#"{{"input_tokens":{m},"cache_read_input_tokens":{m},"cache_creation_input_tokens":{m}}}"#,
            m = u64::MAX
        );
        let r = report_for(Some(Endpoint::Messages), huge.as_bytes()).unwrap();
        assert_eq!(r.prompt_tokens, u64::MAX);
    }

    #[test]
    fn vllms_own_messages_reports() {
        // vLLM 0.32's answers as `make real` captured them (bench/real/fixtures): a first turn
        // (nothing cached, 480 tokens written), and a streamed second turn whose last usage
        // event says 480 of its 732 prompt tokens were read from the cache.
        let answer = include_bytes!("../../../../bench/real/fixtures/vllm-messages.json");
        let r = report_for(Some(Endpoint::Messages), answer).unwrap();
        assert_eq!((r.prompt_tokens, r.cached_tokens), (503, 0));
        let stream = include_bytes!("../../../../bench/real/fixtures/vllm-messages-stream.sse");
        let tail = &stream[stream.len().saturating_sub(TAIL_BYTES)..];
        let r = report_for(Some(Endpoint::Messages), tail).unwrap();
        assert_eq!((r.prompt_tokens, r.cached_tokens), (732, 480));
        // Its first event counts the prompt without saying what was cached: no report.
        let start = &stream[..stream.iter().position(|&b| b == b'}').unwrap_or(0) + 200];
        assert_eq!(report_for(Some(Endpoint::Messages), start), None);
    }

    #[test]
    fn vllms_own_responses_reports() {
        // vLLM 0.32's /v1/responses answers as `make real` captured them: a first turn
        // (217 prompt tokens, none cached) and a streamed follow-up whose closing
        // `response.completed` event says 224 of its 243 were read from the cache.
        let answer = include_bytes!("../../../../bench/real/fixtures/vllm-responses.json");
        let r = report_for(Some(Endpoint::Responses), answer).unwrap();
        assert_eq!((r.prompt_tokens, r.cached_tokens), (217, 0));
        let stream = include_bytes!("../../../../bench/real/fixtures/vllm-responses-stream.sse");
        let tail = &stream[stream.len().saturating_sub(TAIL_BYTES)..];
        let r = report_for(Some(Endpoint::Responses), tail).unwrap();
        assert_eq!((r.prompt_tokens, r.cached_tokens), (243, 224));
        // The per-turn lists' keys are not the totals'.
        let turns = br#"{"input_tokens_per_turn":[5],"cached_tokens_per_turn":[4]}"#;
        assert_eq!(report_for(Some(Endpoint::Responses), turns), None);
    }

    #[test]
    fn only_a_clear_shortfall_is_an_eviction() {
        let r = |cached| Report {
            prompt_tokens: 1000,
            cached_tokens: cached,
        };
        // 40 of 50 blocks predicted (800 tokens' worth); slack 2 + 4 blocks.
        assert!(!r(800).shows_eviction(40, 50));
        assert!(!r(700).shows_eviction(40, 50));
        assert!(r(600).shows_eviction(40, 50));
        assert!(r(0).shows_eviction(40, 50));
        assert!(!r(0).shows_eviction(2, 50), "too little predicted to tell");
        assert!(!Report {
            prompt_tokens: 0,
            cached_tokens: 0
        }
        .shows_eviction(0, 0));
    }

    #[test]
    fn only_a_clear_excess_is_a_surplus() {
        let r = |cached| Report {
            prompt_tokens: 1000,
            cached_tokens: cached,
        };
        // 20 of 50 blocks predicted (400 tokens' worth).
        assert!(!r(400).shows_surplus(20, 50));
        assert!(
            !r(480).shows_surplus(20, 50),
            "24 blocks: within the slack of 2 + 2.4"
        );
        assert!(r(600).shows_surplus(20, 50));
        assert!(!r(600).shows_eviction(20, 50));
        assert!(!Report {
            prompt_tokens: 0,
            cached_tokens: 0
        }
        .shows_surplus(0, 0));
    }

    #[test]
    fn a_surplus_stops_forgetting_for_sixteen_reports() {
        let mut s = Surplus::default();
        assert!(s.observe(false));
        // A surplus is never a shortfall: what it stops is the reports after it.
        s.observe(true);
        let forgetting: Vec<bool> = (0..20).map(|_| s.observe(false)).collect();
        assert_eq!(
            forgetting.iter().position(|&f| f),
            Some(16),
            "{forgetting:?}"
        );
        // A third of reports in surplus (three gateways rotating turns): never after the first.
        let rotating: Vec<bool> = (0..60).map(|i| s.observe(i % 3 == 0)).collect();
        assert!(!rotating[1..].iter().any(|&f| f), "{rotating:?}");
    }

    #[test]
    fn one_pods_surpluses_leave_the_others_forgetting() {
        let mut s = Surpluses::default();
        for _ in 0..40 {
            s.observe(1, 7, true);
        }
        assert!(s.observe(0, 5, false));
        assert!(s.observe(2, 9, false));
        assert!(!s.observe(1, 7, false));
        // Another pod in slot 1 starts with a clear window.
        assert!(s.observe(1, 8, false));
    }

    #[test]
    fn one_report_moves_the_ratio_a_little_whatever_it_claims() {
        for tokens in [1, u64::MAX, 1_000_000_000_000_000] {
            let mut r = TokenRatio::new(4.0);
            r.observe(512 * 256, tokens);
            let moved = r.bytes_per_token() / 4.0;
            assert!((0.66..=1.5).contains(&moved), "{tokens}: {moved}");
        }
        // Settled on 7.3 bytes per token, a forged report moves it by about 1%: far
        // from the tenth that resizes the index.
        let mut r = TokenRatio::new(4.0);
        for _ in 0..200 {
            r.observe(40 * 256, 1400);
        }
        let settled = r.bytes_per_token();
        r.observe(40 * 256, 1_000_000_000_000_000);
        assert!(
            r.bytes_per_token() / settled > 0.98,
            "{}",
            r.bytes_per_token()
        );
    }

    #[test]
    fn the_ratio_follows_the_pods_tokenizer_and_ignores_short_prompts() {
        let mut r = TokenRatio::new(4.0);
        assert_eq!(r.bytes_per_token(), 4.0);
        r.observe(1500, 300);
        assert_eq!(r.bytes_per_token(), 4.0, "a short prompt says little");
        // Prompts of 40 blocks of 256 bytes that the pods count as 1400 tokens: 7.3 bytes each.
        for _ in 0..200 {
            r.observe(40 * 256, 1400);
        }
        assert!(
            (r.bytes_per_token() - 7.31).abs() < 0.05,
            "{}",
            r.bytes_per_token()
        );
    }
}
