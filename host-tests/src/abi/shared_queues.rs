//! Shared queues (`proxy_register_shared_queue`, `proxy_resolve_shared_queue`,
//! `proxy_enqueue_shared_queue`, `proxy_dequeue_shared_queue`) over the host-wide
//! [`SharedQueues`].

use super::memory::{copy_out, read, read_str, write_u32};
use super::{answer, outcome, status, C};
use crate::shared_data::SharedQueues;
use crate::state::VmState;
use crate::types::Status;
use std::sync::MutexGuard;
use wasmtime::Result;

fn queues(s: &VmState) -> MutexGuard<'_, SharedQueues> {
    s.shared.queues.lock().expect("queue lock")
}

pub(super) fn register(mut c: C<'_>, np: i32, nl: i32, ret: i32) -> Result<i32> {
    let name = read_str(&mut c, np, nl, "queue name")?;
    let s = c.data();
    let id = queues(s).register(&s.vm_id, &name, s.index, s.effective_ctx);
    write_u32(&mut c, ret, id, "queue id")?;
    status(Status::Ok)
}

pub(super) fn resolve(mut c: C<'_>, vp: i32, vl: i32, np: i32, nl: i32, ret: i32) -> Result<i32> {
    let vm_id = read_str(&mut c, vp, vl, "vm id")?;
    let name = read_str(&mut c, np, nl, "queue name")?;
    let r = queues(c.data()).resolve(&vm_id, &name);
    answer(r, |id| write_u32(&mut c, ret, id, "queue id"))
}

pub(super) fn enqueue(mut c: C<'_>, id: i32, vp: i32, vl: i32) -> Result<i32> {
    let v = read(&mut c, vp, vl, "queue value")?;
    outcome(queues(c.data()).enqueue(id as u32, &v))
}

pub(super) fn dequeue(mut c: C<'_>, id: i32, ptr_ptr: i32, size_ptr: i32) -> Result<i32> {
    let r = queues(c.data()).dequeue(id as u32);
    answer(r, |v| {
        copy_out(&mut c, &v, ptr_ptr, size_ptr, "queue value")
    })
}
