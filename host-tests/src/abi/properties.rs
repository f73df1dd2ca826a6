//! Properties (`proxy_get_property`, `proxy_set_property`): raw path -> raw value, per VM.

use super::memory::{copy_out, read};
use super::{answer, status, C};
use crate::types::Status;
use wasmtime::Result;

pub(super) fn get(mut c: C<'_>, pp: i32, pl: i32, ptr_ptr: i32, size_ptr: i32) -> Result<i32> {
    let path = read(&mut c, pp, pl, "property path")?;
    let v = c.data().properties.get(&path).cloned();
    answer(v.ok_or(Status::NotFound), |v| {
        copy_out(&mut c, &v, ptr_ptr, size_ptr, "property value")
    })
}

pub(super) fn set(mut c: C<'_>, pp: i32, pl: i32, vp: i32, vl: i32) -> Result<i32> {
    let path = read(&mut c, pp, pl, "property path")?;
    let v = read(&mut c, vp, vl, "property value")?;
    c.data_mut().properties.insert(path, v);
    status(Status::Ok)
}
