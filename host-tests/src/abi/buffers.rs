//! The buffers a context can see: plugin and VM configuration, request and response
//! bodies, an HTTP call's response body (`proxy_get_buffer_bytes`, `proxy_set_buffer_bytes`).

use super::memory::{copy_out, read};
use super::{status, C};
use crate::state::VmState;
use crate::types::{BufferType, Status};
use wasmtime::Result;

/// The bytes of a buffer visible to the current context (None => NotFound).
fn visible_buffer(s: &VmState, ty: BufferType) -> Option<Vec<u8>> {
    let stream = s.effective_stream();
    match ty {
        BufferType::PluginConfiguration => Some(s.plugin_config.clone()),
        BufferType::VmConfiguration => Some(s.vm_config.clone()),
        BufferType::HttpRequestBody => stream.map(|x| x.request_body.clone()),
        BufferType::HttpResponseBody => stream.map(|x| x.response_body.clone()),
        BufferType::HttpCallResponseBody => match &s.call_response {
            Some(Some((_, b, _))) => Some(b.clone()),
            _ => None,
        },
        _ => None,
    }
}

pub(super) fn get(
    mut c: C<'_>, ty: i32, start: i32, max: i32, ptr_ptr: i32, size_ptr: i32,
) -> Result<i32> {
    let Some(ty) = BufferType::from_raw(ty as u32) else {
        return status(Status::BadArgument);
    };
    let (start, max) = (start as u32 as usize, max as u32 as usize);
    let Some(buf) = visible_buffer(c.data(), ty) else {
        return status(Status::NotFound);
    };
    if start > buf.len() {
        return status(Status::BadArgument);
    }
    let end = start.saturating_add(max).min(buf.len());
    // An empty range leaves the return slots untouched.
    if end > start {
        copy_out(&mut c, &buf[start..end], ptr_ptr, size_ptr, "buffer bytes")?;
    }
    status(Status::Ok)
}

pub(super) fn set(mut c: C<'_>, ty: i32, start: i32, size: i32, ptr: i32, len: i32) -> Result<i32> {
    let Some(ty) = BufferType::from_raw(ty as u32) else {
        return status(Status::BadArgument);
    };
    let data = read(&mut c, ptr, len, "buffer data")?;
    let Some(stream) = c.data_mut().effective_stream_mut() else {
        return status(Status::NotFound);
    };
    let buf = match ty {
        BufferType::HttpRequestBody => &mut stream.request_body,
        BufferType::HttpResponseBody => &mut stream.response_body,
        _ => return status(Status::NotFound),
    };
    let start = (start as u32 as usize).min(buf.len());
    let end = start.saturating_add(size as u32 as usize).min(buf.len());
    buf.splice(start..end, data);
    status(Status::Ok)
}
