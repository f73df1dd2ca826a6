//! The same canonical stream read with serde_json: the reference the
//! filter's own reader ([`crate::prompt::json`]) is tested against (the differential
//! property test in `openai` and the `prompt_key` fuzz target). Not used to
//! route: serde decodes every escaped string into a copy before it is hashed.

use super::{
    can_ask_usage, feed_escaped, feed_tag, hasher, reports_usage, skips_cache_reads, stores,
    tokens, Endpoint, ParseError, GROUP,
};
use crate::hash::response_id;
use crate::prompt::prefix::{PrefixHasher, PromptKey};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<Text<'a>>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
}

/// A request body's struct: `model` and `cache_salt`, the fields listed
/// (each optional), then the one it needs. `streamed` adds Chat's and
/// Completions' common fields: the output limit, the stream and its options,
/// and the cache reads (`super::CACHE_READS`).
macro_rules! request {
    ($name:ident, streamed { $($rest:tt)* }) => {
        request!($name {
            max_tokens: &'a RawValue,
            stream: &'a RawValue,
            stream_options: &'a RawValue,
            prompt_logprobs: &'a RawValue,
            echo: &'a RawValue,
            logprob_start_len: &'a RawValue,
            skip_reading_prefix_cache: &'a RawValue,
            $($rest)*
        });
    };
    ($name:ident { $($(#[$m:meta])* $field:ident: $ty:ty,)* ; $needed:ident: $needed_ty:ty }) => {
        #[derive(Deserialize)]
        struct $name<'a> {
            #[serde(borrow, default)]
            model: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            cache_salt: Option<Cow<'a, str>>,
            $(
                #[serde(borrow, default)]
                $(#[$m])*
                $field: Option<$ty>,
            )*
            #[serde(borrow)]
            $needed: $needed_ty,
        }
    };
}

request!(Chat, streamed {
    max_completion_tokens: &'a RawValue,
    tools: &'a RawValue,
    ; messages: Vec<Message<'a>>
});

request!(Completion, streamed { ; prompt: Text<'a> });

request!(Responses {
    max_output_tokens: &'a RawValue,
    instructions: Cow<'a, str>,
    tools: &'a RawValue,
    previous_response_id: Cow<'a, str>,
    store: &'a RawValue,
    ; input: Text<'a>
});

#[derive(Deserialize)]
struct BlockMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<Text<'a>>,
}

request!(Messages {
    max_tokens: &'a RawValue,
    /// Unused (the answer carries usage either way): named so that a body
    /// giving it twice is refused, as the filter's reader refuses it.
    #[allow(dead_code)]
    stream: &'a RawValue,
    system: Text<'a>,
    tools: &'a RawValue,
    ; messages: Vec<BlockMessage<'a>>
});

/// A JSON value as canonical bytes: a string's text, or raw JSON.
enum Text<'a> {
    Str(Cow<'a, str>),
    Raw(&'a RawValue),
    Parts(Vec<&'a RawValue>),
}

impl Text<'_> {
    const EMPTY: Text<'static> = Text::Str(Cow::Borrowed(""));

    fn is_empty(&self) -> bool {
        match self {
            Text::Str(text) => text.is_empty(),
            Text::Raw(r) => r.get().is_empty(),
            Text::Parts(p) => p.is_empty(),
        }
    }

    fn feed(&self, h: &mut PrefixHasher) {
        match self {
            Text::Str(text) => feed_escaped(h, text.as_bytes()),
            Text::Raw(r) => h.feed(r.get().as_bytes()),
            Text::Parts(parts) => {
                h.feed(b"[");
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        h.feed(b",");
                    }
                    h.feed(p.get().as_bytes());
                }
                h.feed(b"]");
            }
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text::Str(Cow::Owned(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Text<'de>, A::Error> {
                let mut parts = Vec::new();
                while let Some(p) = seq.next_element::<&'de RawValue>()? {
                    parts.push(p);
                }
                Ok(Text::Parts(parts))
            }
        }
        d.deserialize_any(V)
    }
}

fn feed_piece(h: &mut PrefixHasher, tag: &[u8], content: &Text<'_>) {
    feed_tag(h, tag);
    content.feed(h);
}

/// Each message as `0x1e role 0x1f content [0x1d tool_calls]`, conversation
/// started and anchored at the first that is not instructions; returns
/// whether it carries earlier turns, where its last message starts if so, and
/// how many assistant messages it carries.
fn feed_turns<'m, 'a: 'm>(
    h: &mut PrefixHasher,
    turns: impl Iterator<Item = (&'m Cow<'a, str>, &'m Option<Text<'a>>, Option<&'a RawValue>)>,
) -> (bool, usize, u32) {
    let (mut continuation, mut last_start, mut answers) = (false, 0, 0u32);
    for (role, content, calls) in turns {
        last_start = h.len();
        continuation |= matches!(role.as_ref(), "assistant" | "tool" | "function");
        answers = answers.saturating_add(u32::from(role.as_ref() == "assistant"));
        let turn = !matches!(role.as_ref(), "system" | "developer");
        if turn {
            h.begin_conversation();
        }
        feed_piece(h, role.as_bytes(), content.as_ref().unwrap_or(&Text::EMPTY));
        if let Some(calls) = calls {
            h.feed(&[GROUP]);
            h.feed(calls.get().as_bytes());
        }
        if turn {
            h.mark_anchor();
        }
    }
    (
        continuation,
        if continuation { last_start } else { 0 },
        answers,
    )
}

fn raw(v: Option<&RawValue>) -> Option<&[u8]> {
    v.map(|r| r.get().as_bytes())
}

/// The key of a Chat or Completions request (`request!`'s `streamed`
/// fields) with output limit `$limit`, its stream hashed in `$h`.
macro_rules! streamed_key {
    ($req:expr, $limit:expr, $h:expr) => {
        PromptKey {
            model: $req.model.map(Cow::into_owned),
            max_output_tokens: tokens(raw($limit)),
            reports_usage: reports_usage(raw($req.stream), raw($req.stream_options)),
            can_ask_usage: can_ask_usage(raw($req.stream), raw($req.stream_options)),
            // `super::CACHE_READS`, in its order.
            skips_cache_reads: skips_cache_reads([
                raw($req.prompt_logprobs),
                raw($req.echo),
                raw($req.logprob_start_len),
                raw($req.skip_reading_prefix_cache),
            ]),
            ..$h.finish()
        }
    };
}

/// [`super::prompt_key`] as serde_json reads the body.
pub fn prompt_key(
    endpoint: Endpoint,
    body: &[u8],
    block_bytes: usize,
    anchor_bytes: usize,
) -> Result<PromptKey, ParseError> {
    let classify = |e: serde_json::Error| {
        if e.is_data() {
            ParseError::Shape
        } else {
            ParseError::NotJson
        }
    };
    // The request's hasher, fed its tools.
    let start = |model: &Option<Cow<str>>, salt: &Option<Cow<str>>, tools: Option<&RawValue>| {
        let mut h = hasher(model.as_deref(), salt.as_deref(), block_bytes, anchor_bytes)?;
        if let Some(tools) = tools {
            feed_piece(&mut h, b"tools", &Text::Raw(tools));
        }
        Ok::<_, ParseError>(h)
    };
    match endpoint {
        Endpoint::Chat => {
            let req: Chat = serde_json::from_slice(body).map_err(classify)?;
            if req.messages.is_empty() {
                return Err(ParseError::Shape);
            }
            let mut h = start(&req.model, &req.cache_salt, req.tools)?;
            let turns = req
                .messages
                .iter()
                .map(|m| (&m.role, &m.content, m.tool_calls));
            let (continuation, history_bytes, answers) = feed_turns(&mut h, turns);
            let limit = req.max_completion_tokens.or(req.max_tokens);
            Ok(PromptKey {
                continuation,
                history_bytes,
                answers,
                ..streamed_key!(req, limit, h)
            })
        }
        Endpoint::Completions => {
            let req: Completion = serde_json::from_slice(body).map_err(classify)?;
            if req.prompt.is_empty() {
                return Err(ParseError::Shape);
            }
            let mut h = start(&req.model, &req.cache_salt, None)?;
            h.begin_conversation();
            req.prompt.feed(&mut h);
            Ok(streamed_key!(req, req.max_tokens, h))
        }
        Endpoint::Responses => {
            let req: Responses = serde_json::from_slice(body).map_err(classify)?;
            let mut h = start(&req.model, &req.cache_salt, req.tools)?;
            if let Some(instr) = req.instructions {
                feed_piece(&mut h, b"system", &Text::Str(instr));
            }
            h.begin_conversation();
            feed_piece(&mut h, b"input", &req.input);
            Ok(PromptKey {
                model: req.model.map(Cow::into_owned),
                max_output_tokens: tokens(raw(req.max_output_tokens)),
                reports_usage: req.previous_response_id.is_none(),
                previous_response: req.previous_response_id.map(|p| response_id(p.as_bytes())),
                stores_response: stores(raw(req.store)),
                ..h.finish()
            })
        }
        Endpoint::Messages => {
            let req: Messages = serde_json::from_slice(body).map_err(classify)?;
            if req.messages.is_empty() {
                return Err(ParseError::Shape);
            }
            let mut h = start(&req.model, &req.cache_salt, req.tools)?;
            if let Some(system) = &req.system {
                feed_piece(&mut h, b"system", system);
            }
            let turns = req.messages.iter().map(|m| (&m.role, &m.content, None));
            let (continuation, history_bytes, answers) = feed_turns(&mut h, turns);
            Ok(PromptKey {
                continuation,
                history_bytes,
                answers,
                model: req.model.map(Cow::into_owned),
                max_output_tokens: tokens(raw(req.max_tokens)),
                reports_usage: true,
                ..h.finish()
            })
        }
    }
}
