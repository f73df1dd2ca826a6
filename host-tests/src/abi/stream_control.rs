//! What a filter does to its stream: `proxy_continue_stream`, `proxy_close_stream`,
//! `proxy_send_local_response`. Each is recorded on the effective context's stream, or
//! answers BadArgument when the effective context is not an HTTP stream.

use super::memory::{read, read_str};
use super::{status, C};
use crate::headers::deserialize_pairs;
use crate::state::{LocalResponse, StreamState};
use crate::types::{Status, StreamType};
use wasmtime::Result;

/// Apply `f` to the effective context's stream: Ok, or BadArgument if there is none.
fn update_stream(c: &mut C<'_>, f: impl FnOnce(&mut StreamState)) -> Result<i32> {
    match c.data_mut().effective_stream_mut() {
        Some(stream) => {
            f(stream);
            status(Status::Ok)
        }
        None => status(Status::BadArgument),
    }
}

pub(super) fn continue_stream(mut c: C<'_>, ty: i32) -> Result<i32> {
    let Some(ty) = StreamType::from_raw(ty as u32) else {
        return status(Status::BadArgument);
    };
    update_stream(&mut c, |stream| stream.continue_calls.push(ty))
}

pub(super) fn close_stream(mut c: C<'_>, ty: i32) -> Result<i32> {
    let Some(ty) = StreamType::from_raw(ty as u32) else {
        return status(Status::BadArgument);
    };
    update_stream(&mut c, |stream| stream.close_calls.push(ty))
}

#[allow(clippy::too_many_arguments)] // the ABI's signature
pub(super) fn send_local_response(
    mut c: C<'_>, status_code: i32, dp: i32, dl: i32, bp: i32, bl: i32, hp: i32, hl: i32,
    grpc_status: i32,
) -> Result<i32> {
    let details = read_str(&mut c, dp, dl, "local response details")?;
    let body = read(&mut c, bp, bl, "local response body")?;
    let hbytes = read(&mut c, hp, hl, "local response headers")?;
    let Some(pairs) = deserialize_pairs(&hbytes) else {
        return status(Status::BadArgument);
    };
    // As given: names keep their case here, unlike in a `HeaderMap`.
    let headers = pairs
        .iter()
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect();
    update_stream(&mut c, |stream| {
        stream.local_response = Some(LocalResponse {
            status: status_code as u32,
            details,
            body,
            headers,
            grpc_status,
        })
    })
}
