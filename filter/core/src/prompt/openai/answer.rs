//! The id a pod gives a response it answers on `/v1/responses`, read from the
//! first bytes of its answer, without holding a byte back.
//!
//! A follow-up names its predecessor by that id (`previous_response_id`),
//! and vLLM keeps stored responses in the memory of the instance that
//! answered them: the record of who answered which id
//! ([`crate::fleet::responses`]) learns it here. Where the id is, in vLLM's
//! answers (`vllm/entrypoints/openai/responses/`):
//!
//! | answer | the id |
//! |---|---|
//! | JSON (`stream` false; `background` too) | the top-level `id` (`ResponsesResponse.id`, its first field, from `request.request_id`) |
//! | server-sent events (`stream` true) | the first event, `event: response.created`, `data: {"response":{"id":...},"sequence_number":0,"type":"response.created"}` (`_convert_stream_to_sse_events`) |
//!
//! The answer is read by the validating JSON reader ([`crate::prompt::json`])
//! over what has arrived so far: a value cut short by the end of what
//! arrived is [`Scan::More`], never an id, so a truncated id is never taken
//! for a whole one. Fields before the id are skipped whole (another engine
//! may put `type` or `object` first); the id must lie in the first
//! [`SCAN_BYTES`] of the answer, or it is [`Scan::Absent`]: the scan keeps at
//! most that much of one answer. The id is hashed at once
//! ([`crate::hash::response_id`]); its text is kept nowhere.
//!
//! Which body this is (JSON or events) is told by its first byte: `{` is
//! JSON, anything else an event stream.

use crate::hash::response_id;
use crate::prompt::json::{JsonReader, Syntax};

/// Most bytes of an answer the scan reads: vLLM's id is within its first 60.
pub const SCAN_BYTES: usize = 4096;

/// What the first bytes of an answer say of its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// The response's id, hashed.
    Id(u64),
    /// Not yet known: more of the answer is needed.
    More,
    /// The answer names no id where one is looked for (another shape, an
    /// error body, or past [`SCAN_BYTES`]).
    Absent,
}

/// The id in `prefix`, the answer's first bytes; `whole`: the answer ends
/// there (nothing more will come).
pub fn scan(prefix: &[u8], whole: bool) -> Scan {
    let prefix = prefix.get(..SCAN_BYTES).unwrap_or(prefix);
    let whole = whole || prefix.len() >= SCAN_BYTES;
    let Some(start) = prefix.iter().position(|b| !b.is_ascii_whitespace()) else {
        return if whole { Scan::Absent } else { Scan::More };
    };
    let body = &prefix[start..];
    let found = if body.first() == Some(&b'{') {
        top_level_id(body)
    } else {
        first_event_id(body, whole)
    };
    match found {
        Ok(Some(id)) => Scan::Id(id),
        Ok(None) => Scan::Absent,
        Err(Syntax) if !whole => Scan::More,
        Err(Syntax) => Scan::Absent,
    }
}

/// The top-level `id` of a JSON object: `Ok(None)` when the object ends (or
/// its `id` is not a string) without one; `Err` where the bytes end first.
fn top_level_id(body: &[u8]) -> Result<Option<u64>, Syntax> {
    let mut r = JsonReader::new(body);
    object_id(&mut r, |r, _| r.value().map(|_| true))
}

/// The `id` of the object at `r`; `other(r, key)` reads any other key's value
/// and says whether to go on.
fn object_id<'a>(
    r: &mut JsonReader<'a>,
    mut other: impl FnMut(&mut JsonReader<'a>, &str) -> Result<bool, Syntax>,
) -> Result<Option<u64>, Syntax> {
    r.object()?;
    let mut first = true;
    while let Some(key) = r.key(first)? {
        first = false;
        let name = key.text(r.offsets());
        if name == "id" {
            return match r.peek() {
                Some(b'"') => {
                    let id = r.string()?;
                    Ok(Some(response_id(id.text(r.offsets()).as_bytes())))
                }
                // The value has not arrived yet.
                None => Err(Syntax),
                Some(_) => Ok(None),
            };
        }
        if !other(r, &name)? {
            return Ok(None);
        }
    }
    Ok(None)
}

/// `response.id` in the first `data:` line of an event stream (the
/// `response.created` event): `Ok(None)` when that event has none (or says it
/// is another event); `Err` where the bytes end first.
fn first_event_id(body: &[u8], whole: bool) -> Result<Option<u64>, Syntax> {
    let mut rest = body;
    loop {
        let (line, next) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None if whole => (rest, None),
            // A line still arriving: its field name may not be whole yet.
            None if !rest.starts_with(b"data:") => return Err(Syntax),
            None => (rest, None),
        };
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            return event_id(data);
        }
        // `event:`, `id:`, `retry:`, comments and blank lines before the first data.
        match next {
            Some(n) => rest = n,
            None => return Ok(None),
        }
    }
}

/// `response.id` in one event's data, unless its `type` (when it comes
/// first) names another event than `response.created`.
fn event_id(data: &[u8]) -> Result<Option<u64>, Syntax> {
    let mut r = JsonReader::new(data);
    match r.peek() {
        Some(b'{') => {}
        None => return Err(Syntax),
        Some(_) => return Ok(None),
    }
    r.object()?;
    let mut first = true;
    while let Some(key) = r.key(first)? {
        first = false;
        match key.text(r.offsets()).as_ref() {
            "response" if r.peek() == Some(b'{') => {
                return object_id(&mut r, |r, _| r.value().map(|_| true));
            }
            "type" if r.peek() == Some(b'"') => {
                let kind = r.string()?;
                if kind.text(r.offsets()) != "response.created" {
                    return Ok(None);
                }
            }
            _ => {
                r.value()?;
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const ID: &str = "resp_8f1c2b7d9e4a4f0b9c3d2e1f0a9b8c7d";

    /// vLLM 0.32's non-streamed answer, as `ResponsesResponse` serializes it
    /// (fields in declaration order; an output item carries its own `id`).
    fn json_answer(id: &str) -> String {
        format!(
            r#"{{"id":"{id}","created_at":1795786463,"incomplete_details":null,"instructions":"Be terse.","metadata":null,"model":"tiny","object":"response","output":[{{"id":"msg_0a1b","content":[{{"annotations":[],"text":"Paris.","type":"output_text","logprobs":null}}],"role":"assistant","status":"completed","type":"message"}}],"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":8,"previous_response_id":null,"status":"completed","usage":{{"input_tokens":20,"input_tokens_details":{{"cached_tokens":0}},"output_tokens":8,"total_tokens":28}}}}"#
        )
    }

    /// The first events of vLLM 0.32's stream.
    fn stream_answer(id: &str) -> String {
        format!(
            "event: response.created\ndata: {{\"response\":{{\"id\":\"{id}\",\"created_at\":1795786463,\"model\":\"tiny\",\"object\":\"response\",\"output\":[],\"status\":\"in_progress\"}},\"sequence_number\":0,\"type\":\"response.created\"}}\n\n\
             event: response.in_progress\ndata: {{\"response\":{{\"id\":\"{id}\"}},\"sequence_number\":1,\"type\":\"response.in_progress\"}}\n\n"
        )
    }

    fn hashed(id: &str) -> Scan {
        Scan::Id(response_id(id.as_bytes()))
    }

    #[test]
    fn the_id_of_a_json_answer_and_of_a_stream() {
        assert_eq!(scan(json_answer(ID).as_bytes(), true), hashed(ID));
        assert_eq!(scan(stream_answer(ID).as_bytes(), false), hashed(ID));
        // An engine that puts the event's type first, and CRLF lines.
        let typed = format!(
            ": keep-alive\r\nevent: response.created\r\ndata:{{\"type\":\"response.created\",\"sequence_number\":0,\"response\":{{\"object\":\"response\",\"id\":\"{ID}\"}}}}\r\n\r\n"
        );
        assert_eq!(scan(typed.as_bytes(), false), hashed(ID));
        // Escapes are decoded before hashing, as the follow-up's id is.
        assert_eq!(scan(br#"{"id":"resp_\u0041b"}"#, true), hashed("resp_Ab"));
    }

    #[test]
    fn every_prefix_is_more_or_the_whole_id_never_a_cut_one() {
        for answer in [json_answer(ID), stream_answer(ID)] {
            let b = answer.as_bytes();
            let mut first_found = None;
            for cut in 0..=b.len() {
                match scan(&b[..cut], false) {
                    Scan::More => assert!(first_found.is_none(), "{cut}"),
                    Scan::Id(id) => {
                        assert_eq!(Scan::Id(id), hashed(ID), "cut at {cut}");
                        first_found.get_or_insert(cut);
                    }
                    Scan::Absent => panic!("absent at {cut} of {answer}"),
                }
            }
            // Found as soon as the id's closing quote has arrived.
            let close = answer.find(ID).map(|at| at + ID.len() + 1);
            assert_eq!(first_found, close, "{answer}");
        }
    }

    /// vLLM 0.32's own answers, as `make real` captured them (`bench/real/fixtures`).
    const REAL_JSON: &[u8] =
        include_bytes!("../../../../../bench/real/fixtures/vllm-responses.json");
    const REAL_STREAM: &[u8] =
        include_bytes!("../../../../../bench/real/fixtures/vllm-responses-stream.sse");

    #[test]
    fn the_id_of_vllms_own_answers() {
        let id_of = |v: serde_json::Value| Scan::Id(response_id(v.as_str().unwrap().as_bytes()));
        let json: serde_json::Value = serde_json::from_slice(REAL_JSON).unwrap();
        assert_eq!(scan(REAL_JSON, true), id_of(json["id"].clone()));
        let first = std::str::from_utf8(REAL_STREAM)
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap();
        let created: serde_json::Value = serde_json::from_str(first).unwrap();
        assert_eq!(created["type"], "response.created");
        assert_eq!(
            scan(REAL_STREAM, false),
            id_of(created["response"]["id"].clone())
        );
        // Cut anywhere, as Envoy may deliver it: more, or that id.
        for answer in [REAL_JSON, REAL_STREAM] {
            let whole = scan(answer, true);
            for cut in 0..answer.len().min(200) {
                let s = scan(&answer[..cut], false);
                assert!(s == Scan::More || s == whole, "cut at {cut}: {s:?}");
            }
        }
    }

    #[test]
    fn answers_without_an_id_are_absent() {
        for body in [
            // vLLM's error body (404 for an unknown previous_response_id).
            r#"{"error":{"message":"Response with id 'resp_x' not found.","type":"invalid_request_error","param":"response_id","code":404}}"#,
            r#"{"object":"response","id":7}"#,
            r#"[1,2]"#,
            "event: error\ndata: {\"type\":\"error\",\"response\":{\"id\":\"resp_x\"}}\n\n",
            "data: [DONE]\n\n",
            "event: response.created\n\n",
        ] {
            assert_eq!(scan(body.as_bytes(), true), Scan::Absent, "{body}");
        }
        // An output item's id is not the response's.
        assert_eq!(
            scan(br#"{"output":[{"id":"msg_1"}],"id":"resp_2"}"#, true),
            hashed("resp_2")
        );
        // Past the bytes scanned: absent, not more.
        let late = format!(
            r#"{{"instructions":"{}","id":"{ID}"}}"#,
            "x".repeat(SCAN_BYTES)
        );
        assert_eq!(scan(late.as_bytes(), false), Scan::Absent);
        assert_eq!(scan(b"", true), Scan::Absent);
        assert_eq!(scan(b"  ", false), Scan::More);
    }

    #[test]
    fn hostile_answers_are_absent_or_more_never_a_panic() {
        let deep = "[".repeat(10_000);
        for body in [
            deep.as_str(),
            "{\"id\":\"\\ud800\"}",
            "{\"id\":\"\u{1}\"}",
            "data: {\"response\":{\"id\":",
            "\u{0}\u{ff}",
        ] {
            let s = scan(body.as_bytes(), true);
            assert!(matches!(s, Scan::Absent), "{body:?}: {s:?}");
            assert!(matches!(
                scan(body.as_bytes(), false),
                Scan::Absent | Scan::More
            ));
        }
    }
}
