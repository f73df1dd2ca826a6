//! Outgoing HTTP (`proxy_http_call`): validated as Envoy does and recorded in the host-wide
//! call registry; the test answers it through `Host::respond`.

use super::memory::{read, read_header_map, read_str, write_u32};
use super::{status, C};
use crate::http_call::HttpCall;
use crate::types::Status;
use wasmtime::Result;

#[allow(clippy::too_many_arguments)] // the ABI's signature
pub(super) fn dispatch(
    mut c: C<'_>, up: i32, ul: i32, hp: i32, hl: i32, bp: i32, bl: i32, tp: i32, tl: i32,
    timeout: i32, ret: i32,
) -> Result<i32> {
    let upstream = read_str(&mut c, up, ul, "http call upstream")?;
    let headers = read_header_map(&mut c, hp, hl, "http call headers")?;
    let body = read(&mut c, bp, bl, "http call body")?;
    let trailers = read_header_map(&mut c, tp, tl, "http call trailers")?;
    let (Some(headers), Some(trailers)) = (headers, trailers) else {
        return status(Status::BadArgument);
    };
    // Envoy rejects calls without :path, :method or :authority (BadArgument) and
    // unknown clusters (BadArgument).
    if [":path", ":method", ":authority"]
        .iter()
        .any(|h| headers.get(h).is_none())
    {
        return status(Status::BadArgument);
    }
    let s = c.data();
    if let Some(known) = &s.shared.known_clusters {
        if !known.contains(&upstream) {
            return status(Status::BadArgument);
        }
    }
    let token = {
        let mut calls = s.shared.calls.lock().expect("calls lock");
        calls.next_token += 1;
        let token = calls.next_token;
        let call = HttpCall {
            token,
            vm: s.index,
            context_id: s.effective_ctx,
            upstream,
            headers,
            body,
            trailers,
            timeout_ms: timeout as u32,
            dispatched_at_ms: s.now_ms(),
        };
        calls.history.push(call.clone());
        calls.pending.insert(token, call);
        token
    };
    write_u32(&mut c, ret, token, "http call token")?;
    status(Status::Ok)
}
