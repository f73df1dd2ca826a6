//! A response's tail → the pod's usage report → the cache verdicts and the
//! learned bytes per token, as the filter reads each answer it predicted a
//! hit for.
//! Input: the configured bytes per token (a byte: 0.5..=64), the predicted
//! and prompt blocks (u16 LE each), the prompt's canonical bytes (u32 LE),
//! then the tail.
//! Invariants: no panic; bounded allocation; a report appended to any tail
//! is the one read; the cached blocks lie within the prompt's; a report
//! shows an eviction or a surplus, never both; the ratio stays within
//! 0.5..=64 and one observation moves it by at most 1.5x, whatever it claims.
#![no_main]

use fuzz_support::bounded;
use libfuzzer_sys::fuzz_target;
use warmroute_core::prompt::openai::Endpoint;
use warmroute_core::routing::feedback::{report, report_for, Report, TokenRatio};

fuzz_target!(|data: &[u8]| {
    let [start, p0, p1, b0, b1, y0, y1, y2, y3, tail @ ..] = data else {
        return;
    };
    let start = 0.5 + f64::from(*start) * (63.5 / 255.0);
    let predicted = u32::from(u16::from_le_bytes([*p0, *p1]));
    let prompt = u32::from(u16::from_le_bytes([*b0, *b1]));
    let bytes = u32::from_le_bytes([*y0, *y1, *y2, *y3]) as usize;
    bounded(tail.len(), || {
        let mut ratio = TokenRatio::new(start);
        assert_eq!(ratio.bytes_per_token(), start);
        if let Some(r) = report_for(Some(Endpoint::Messages), tail) {
            verdicts(r, predicted, prompt);
        }
        if let Some(r) = report(tail) {
            verdicts(r, predicted, prompt);
            observe(&mut ratio, bytes, r.prompt_tokens);
            observe(&mut ratio, bytes, r.cached_tokens);
        }
        // The last report in a tail is the one read, whatever comes before it.
        let (p, c) = (u64::from(predicted) << 20 | bytes as u64, u64::from(prompt));
        let mut with = tail.to_vec();
        with.extend_from_slice(
            format!(r#","usage":{{"prompt_tokens":{p},"prompt_tokens_details":{{"cached_tokens":{c}}}}}}}"#)
                .as_bytes(),
        );
        let r = report(&with);
        assert_eq!(
            r,
            Some(Report {
                prompt_tokens: p,
                cached_tokens: c
            })
        );
        verdicts(r.unwrap(), predicted, prompt);
        // A run of reports, each moving the ratio by 1.5x at most.
        for (i, w) in tail.chunks(8).enumerate() {
            let mut t = [0u8; 8];
            t[..w.len()].copy_from_slice(w);
            observe(&mut ratio, bytes >> (i % 12), u64::from_le_bytes(t));
        }
    });
});

fn verdicts(r: Report, predicted: u32, prompt: u32) {
    let cached = r.cached_blocks(prompt);
    assert!(
        (0.0..=f64::from(prompt)).contains(&cached),
        "{r:?}: {cached}"
    );
    let (evicted, surplus) = (
        r.shows_eviction(predicted, prompt),
        r.shows_surplus(predicted, prompt),
    );
    assert!(!(evicted && surplus), "{r:?} {predicted}/{prompt}");
}

fn observe(ratio: &mut TokenRatio, bytes: usize, tokens: u64) {
    let was = ratio.bytes_per_token();
    ratio.observe(bytes, tokens);
    let is = ratio.bytes_per_token();
    assert!((0.5..=64.0).contains(&is), "{is}");
    let moved = is / was;
    let eps = 1e-9;
    assert!(
        (1.0 / 1.5 - eps..=1.5 + eps).contains(&moved),
        "{was} → {is} for {bytes} bytes in {tokens} tokens"
    );
}
