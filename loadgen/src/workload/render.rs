//! Request bodies and the synthetic text inside them.
//!
//! Every body asks for a stream with `stream_options.include_usage`: the runner
//! takes TTFT from the first SSE chunk and the cached-token count from the
//! final usage chunk. `ignore_eos` (vLLM) makes real servers generate exactly
//! `max_tokens`, so output lengths match the workload rather than the model.
//!
//! Text is pseudo-words: each word is three syllables from a 16-syllable table,
//! indexed by the low 12 bits of one RNG draw, so the vocabulary is
//! 16³ = 4096 words, deterministic per seed. The simulated server counts
//! whitespace-separated words as tokens, so N words is an N-token prompt.

use anyhow::Result;
use bytes::Bytes;
use serde::Serialize;

use super::{Api, Message};
use crate::rng::Rng;

/// Options shared by all body renderings.
#[derive(Clone, Debug)]
pub struct RenderOpts {
    /// `model` field.
    pub model: String,
    /// Send vLLM's `ignore_eos: true` so real servers generate exactly `max_tokens`.
    pub ignore_eos: bool,
}

impl Default for RenderOpts {
    fn default() -> Self {
        Self {
            model: "sim-llama-8b".into(),
            ignore_eos: false,
        }
    }
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// What is asked: a chat's messages or a completion's prompt, each under its own key.
#[derive(Serialize)]
enum Input<'a> {
    #[serde(rename = "messages")]
    Messages(&'a [Message]),
    #[serde(rename = "prompt")]
    Prompt(&'a str),
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(flatten)]
    input: Input<'a>,
    max_tokens: u32,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
}

fn render_body(opts: &RenderOpts, input: Input<'_>, max_tokens: u32) -> Result<Bytes> {
    let body = Body {
        model: &opts.model,
        input,
        max_tokens,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        ignore_eos: opts.ignore_eos,
    };
    Ok(Bytes::from(serde_json::to_vec(&body)?))
}

/// Render a streaming chat-completions body.
pub fn render_chat(opts: &RenderOpts, messages: &[Message], max_tokens: u32) -> Result<Bytes> {
    render_body(opts, Input::Messages(messages), max_tokens)
}

/// Render a streaming completions body.
pub fn render_completion(opts: &RenderOpts, prompt: &str, max_tokens: u32) -> Result<Bytes> {
    render_body(opts, Input::Prompt(prompt), max_tokens)
}

/// Render `prompt` for `api`: a completions prompt, or one user message.
pub(super) fn render(opts: &RenderOpts, api: Api, prompt: &str, max_tokens: u32) -> Result<Bytes> {
    match api {
        Api::Completions => render_completion(opts, prompt, max_tokens),
        Api::Chat => render_chat(
            opts,
            &[Message::text("user", prompt.to_string())],
            max_tokens,
        ),
    }
}

pub(super) fn count_words(s: &str) -> usize {
    s.split_whitespace().count()
}

pub(super) fn messages_words(m: &[Message]) -> usize {
    m.iter().map(|m| count_words(&m.content)).sum()
}

const SYLLABLES: [&str; 16] = [
    "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ber", "dan", "fel", "gor", "hin", "jul",
    "pex", "quo",
];

/// Words per line of generated text.
const LINE_WORDS: usize = 12;

/// What goes before word `n` (counted from 0) of generated text.
pub(super) fn separator(n: usize) -> char {
    if n > 0 && n.is_multiple_of(LINE_WORDS) {
        '\n'
    } else {
        ' '
    }
}

/// Append `n` pseudo-words drawn from `rng` (vocabulary of 4096 words), in
/// lines of [`LINE_WORDS`]: real prompts have line breaks, and a JSON string
/// with escapes costs a parser about twice what plain text does, so text
/// without them would flatter the filter's measured cost.
pub(super) fn push_words(out: &mut String, rng: &mut Rng, n: usize) {
    for i in 0..n {
        let r = rng.next_u64();
        if !out.is_empty() {
            out.push(separator(i));
        }
        for k in 0..3 {
            out.push_str(SYLLABLES[((r >> (4 * k)) & 15) as usize]);
        }
    }
}

pub(super) fn words(rng: &mut Rng, n: usize) -> String {
    let mut s = String::with_capacity(n * 8);
    push_words(&mut s, rng, n);
    s
}
