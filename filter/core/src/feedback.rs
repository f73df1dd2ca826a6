//! The backend's own cache report against what the index predicted.
//!
//! ```text
//! predicted = matched_blocks · block_tokens       (the index's claim for the pod chosen)
//! reported  = usage.prompt_tokens_details.cached_tokens        (vLLM, SGLang)
//! evicted  ⇔ reported + slack < predicted,    slack = 2 · block_tokens + predicted / 10
//! keep      = ⌊reported / block_tokens⌋ blocks
//! ```
//! On an eviction the pod keeps the first `keep` blocks of the prompt's
//! chain, as far as the router can tell, and the index forgets the rest of
//! that chain there: in this VM at once, in the others through the log
//! ([`crate::index_log`], an *evicted* event). The next request with that
//! prefix is then not steered to a cache that is gone. The index only
//! approximates a pod's cache (its blocks are bytes, the pod's are tokens;
//! it cannot see other gateways' traffic), hence the slack: only a clear
//! shortfall counts.
//!
//! The report is read from the response without delaying a byte: only for a
//! request the index predicted a hit for, that will carry a usage report (a
//! non-streamed answer, or a stream with `stream_options.include_usage`), and
//! only the tail of each body chunk, until it is found. The response is never
//! changed.

/// Bytes at the end of each response chunk searched for the report (a usage
/// object, the last thing in an answer or in its usage chunk, is ~200 bytes).
pub const TAIL_BYTES: usize = 1024;

/// The `cached_tokens` count in `text`, if any.
pub fn cached_tokens(text: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"cached_tokens\"";
    let at = text.windows(KEY.len()).rposition(|w| w == KEY)?;
    let rest = &text[at + KEY.len()..];
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

/// How many leading blocks the pod still holds when its report shows it
/// evicted part of what the index predicted; `None` if the report agrees.
pub fn kept_blocks(predicted_blocks: u32, reported_tokens: u64, block_tokens: f64) -> Option<u32> {
    let block_tokens = block_tokens.max(f64::MIN_POSITIVE);
    let predicted = f64::from(predicted_blocks) * block_tokens;
    let slack = 2.0 * block_tokens + predicted / 10.0;
    ((reported_tokens as f64) + slack < predicted)
        .then(|| ((reported_tokens as f64) / block_tokens) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_report_is_found_in_an_answer_or_a_usage_chunk() {
        let answer = br#"{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":900,"total_tokens":904,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":768}}}"#;
        assert_eq!(cached_tokens(answer), Some(768));
        let chunk = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens_details\": {\"cached_tokens\": 0}}}\n\ndata: [DONE]\n\n";
        assert_eq!(cached_tokens(chunk), Some(0));
        assert_eq!(
            cached_tokens(b"data: {\"choices\":[{\"delta\":{\"content\":\"cached_tokens\"}}]}"),
            None
        );
        assert_eq!(cached_tokens(b"\"cached_tokens\":null"), None);
        assert_eq!(cached_tokens(b""), None);
    }

    #[test]
    fn only_a_clear_shortfall_is_an_eviction() {
        // 16 blocks of 64 tokens predicted (1024 tokens); slack 128 + 102.4.
        assert_eq!(kept_blocks(16, 1024, 64.0), None);
        assert_eq!(kept_blocks(16, 800, 64.0), None);
        assert_eq!(kept_blocks(16, 700, 64.0), Some(10));
        assert_eq!(kept_blocks(16, 0, 64.0), Some(0));
        assert_eq!(kept_blocks(0, 0, 64.0), None);
    }
}
