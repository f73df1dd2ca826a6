//! Context switching and shutdown: `proxy_set_effective_context`, `proxy_done`.

use super::{status, C};
use crate::types::Status;
use wasmtime::Result;

/// Only the root context and live streams can be made effective.
pub(super) fn set_effective_context(mut c: C<'_>, ctx: i32) -> Result<i32> {
    let s = c.data_mut();
    let ctx = ctx as u32;
    if ctx == s.root_id || s.streams.contains_key(&ctx) {
        s.effective_ctx = ctx;
        status(Status::Ok)
    } else {
        status(Status::BadArgument)
    }
}

pub(super) fn done(mut c: C<'_>) -> Result<i32> {
    c.data_mut().done_calls += 1;
    status(Status::Ok)
}
