//! The `conversation` workload: replay of a Mooncake trace.
//!
//! One trace line is one request, sent at `timestamp / speedup` ms after the
//! run starts. The trace carries no text, only `hash_ids`, the ids of the
//! prompt's 512-token blocks (equal ids = equal content), so the prompt is
//! synthesised from them:
//!
//! ```text
//! block_words = round(512 · length_scale)            words per block id
//! prompt      = round(input_length · length_scale)   words
//! max_tokens  = min(round(output_length · output_scale), max_output)
//! ```
//!
//! (each at least 1). Block id `k` becomes the words `w{k}_0 … w{k}_{block_words−1}`,
//! so two requests share exactly as long a prefix as their leading runs of
//! equal ids: the trace's cache reuse is reproduced block for block, at any scale.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::render::{render, separator};
use super::{ms, Api, RenderOpts, Request, Session, Workload};

/// Tokens per `hash_ids` block in the Mooncake trace.
pub const TRACE_BLOCK_TOKENS: usize = 512;

/// One line of the Mooncake trace.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct TraceLine {
    /// Arrival, ms since trace start.
    pub timestamp: f64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Output tokens.
    pub output_length: u64,
    /// Ids of the prompt's 512-token blocks.
    pub hash_ids: Vec<u64>,
}

/// Parse a JSONL trace; blank lines are skipped, errors name the line.
pub fn parse_trace(text: &str) -> Result<Vec<TraceLine>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let t: TraceLine =
            serde_json::from_str(line).with_context(|| format!("trace line {}", i + 1))?;
        out.push(t);
    }
    Ok(out)
}

/// Options of the `conversation` workload.
#[derive(Clone, Debug)]
pub struct ConversationOpts {
    /// Divide trace timestamps by this.
    pub speedup: f64,
    /// Multiply token counts (input, block size) by this.
    pub length_scale: f64,
    /// Multiply output lengths by this (defaults to `length_scale`).
    pub output_scale: Option<f64>,
    /// Maximum number of requests (trace lines) to replay.
    pub limit: usize,
    /// Skip trace lines before this many seconds of trace time; later ones are shifted.
    pub start_offset_s: f64,
    /// Endpoint to send to.
    pub api: Api,
    /// Cap on `max_tokens` after scaling (0 = none).
    pub max_output: u32,
}

impl Default for ConversationOpts {
    fn default() -> Self {
        Self {
            speedup: 1.0,
            length_scale: 1.0,
            output_scale: None,
            limit: usize::MAX,
            start_offset_s: 0.0,
            api: Api::Completions,
            max_output: 0,
        }
    }
}

/// Synthesise the prompt of one trace line.
///
/// Block id `k` becomes `block_words` words `w{k}_{j}`, so equal ids give equal
/// text and a shared leading run of ids gives an equally long shared prefix.
/// The text is cut at `total_words`; if the ids do not cover `total_words`
/// (rounding), it is padded with words unique to `line_no`.
pub fn synth_prompt(
    hash_ids: &[u64],
    block_words: usize,
    total_words: usize,
    line_no: usize,
) -> String {
    use std::fmt::Write;
    let block_words = block_words.max(1);
    let mut s = String::with_capacity(total_words * 9);
    let mut n = 0;
    'outer: for &k in hash_ids {
        for j in 0..block_words {
            if n == total_words {
                break 'outer;
            }
            if n > 0 {
                s.push(separator(n));
            }
            // Writing to a String cannot fail.
            let _ = write!(s, "w{k}_{j}");
            n += 1;
        }
    }
    while n < total_words {
        if n > 0 {
            s.push(separator(n));
        }
        let _ = write!(s, "p{line_no}_{n}");
        n += 1;
    }
    s
}

/// `n · scale` rounded, at least 1: a scaled length is never empty.
fn scaled(n: u64, scale: f64) -> usize {
    ((n as f64) * scale).round().max(1.0) as usize
}

/// Build the `conversation` workload from parsed trace lines.
pub fn conversation_from_trace(
    lines: &[TraceLine],
    opts: &ConversationOpts,
    render_opts: &RenderOpts,
) -> Result<Workload> {
    if opts.speedup <= 0.0 || !opts.speedup.is_finite() {
        bail!("--speedup must be > 0");
    }
    if opts.length_scale <= 0.0 || !opts.length_scale.is_finite() {
        bail!("--length-scale must be > 0");
    }
    let out_scale = opts.output_scale.unwrap_or(opts.length_scale);
    let block_words = scaled(TRACE_BLOCK_TOKENS as u64, opts.length_scale);
    let offset_ms = opts.start_offset_s * 1000.0;
    let mut sessions = Vec::new();
    for (i, line) in lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.timestamp >= offset_ms)
        .take(opts.limit)
    {
        let total = scaled(line.input_length, opts.length_scale);
        let prompt = synth_prompt(&line.hash_ids, block_words, total, i);
        let mut max_tokens = scaled(line.output_length, out_scale).min(u32::MAX as usize) as u32;
        if opts.max_output > 0 {
            max_tokens = max_tokens.min(opts.max_output);
        }
        sessions.push(Session {
            id: format!("conv-{i}"),
            start: ms((line.timestamp - offset_ms) / opts.speedup),
            requests: vec![Request {
                api: opts.api,
                body: render(render_opts, opts.api, &prompt, max_tokens)?,
                headers: Vec::new(),
                think: Duration::ZERO,
                prompt_words: total,
                max_tokens,
            }],
        });
    }
    sessions.sort_by_key(|s| s.start);
    Ok(Workload {
        name: "conversation",
        sessions,
        agent_steps: false,
    })
}

/// Load a trace file and build the `conversation` workload.
pub fn conversation(
    path: &Path,
    opts: &ConversationOpts,
    render_opts: &RenderOpts,
) -> Result<Workload> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading trace {}", path.display()))?;
    let lines = parse_trace(&text)?;
    conversation_from_trace(&lines, opts, render_opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tests::{body_json, prompt_of};

    const TRACE: &str = r#"{"timestamp": 0, "input_length": 1800, "output_length": 100, "hash_ids": [0, 1, 2, 3]}

{"timestamp": 2000, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 7]}
{"timestamp": 500, "input_length": 300, "output_length": 1, "hash_ids": [9]}
"#;

    #[test]
    fn conversation_synthesis_shares_exact_prefix_blocks() {
        let lines = parse_trace(TRACE).unwrap();
        assert_eq!(lines.len(), 3);
        let opts = ConversationOpts {
            length_scale: 0.125,
            speedup: 2.0,
            ..Default::default()
        };
        let w = conversation_from_trace(&lines, &opts, &RenderOpts::default()).unwrap();
        // Sorted by start: line 0 (0 ms), line 2 (250 ms), line 1 (1000 ms).
        let ids: Vec<_> = w.sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["conv-0", "conv-2", "conv-1"]);
        assert_eq!(w.sessions[1].start, Duration::from_millis(250));
        assert_eq!(w.sessions[2].start, Duration::from_millis(1000));

        let a = prompt_of(&w.sessions[0].requests[0]);
        let b = prompt_of(&w.sessions[2].requests[0]);
        let c = prompt_of(&w.sessions[1].requests[0]);
        let (a, b, c): (Vec<&str>, Vec<&str>, Vec<&str>) = (
            a.split_whitespace().collect(),
            b.split_whitespace().collect(),
            c.split_whitespace().collect(),
        );
        // Lengths: input_length * 0.125.
        assert_eq!(a.len(), 225);
        assert_eq!(b.len(), 138);
        assert_eq!(c.len(), 38);
        assert_eq!(w.sessions[0].requests[0].prompt_words, 225);
        // Block = 512 * 0.125 = 64 words; a and b share ids [0, 1] → exactly 128 words.
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        assert_eq!(common, 128);
        // Different first block → nothing shared.
        assert_eq!(a.iter().zip(&c).take_while(|(x, y)| x == y).count(), 0);
        // max_tokens scaled, min 1.
        assert_eq!(w.sessions[0].requests[0].max_tokens, 13);
        assert_eq!(w.sessions[1].requests[0].max_tokens, 1);
        let j = body_json(&w.sessions[0].requests[0]);
        assert_eq!(j["stream"], true);
        assert_eq!(j["stream_options"]["include_usage"], true);
        assert_eq!(j["model"], "sim-llama-8b");
    }

    #[test]
    fn conversation_limit_offset_and_chat_api() {
        let lines = parse_trace(TRACE).unwrap();
        let opts = ConversationOpts {
            start_offset_s: 0.4,
            limit: 1,
            api: Api::Chat,
            ..Default::default()
        };
        let w = conversation_from_trace(&lines, &opts, &RenderOpts::default()).unwrap();
        assert_eq!(w.sessions.len(), 1);
        // First line at/after 400 ms in file order is line 1 (2000 ms), shifted by 400.
        assert_eq!(w.sessions[0].id, "conv-1");
        assert_eq!(w.sessions[0].start, Duration::from_millis(1600));
        let j = body_json(&w.sessions[0].requests[0]);
        assert_eq!(j["messages"][0]["role"], "user");
        assert_eq!(
            j["messages"][0]["content"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .count(),
            1100
        );
    }

    #[test]
    fn trace_errors_name_the_line() {
        let err = parse_trace("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\nnot json").unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }

    #[test]
    fn synth_pads_when_ids_do_not_cover_length() {
        let p = synth_prompt(&[5], 2, 4, 9);
        assert_eq!(p, "w5_0 w5_1 p9_2 p9_3");
        assert_eq!(synth_prompt(&[5, 6], 3, 4, 0), "w5_0 w5_1 w5_2 w6_0");
    }
}
