//! Shared data (`proxy_get_shared_data`, `proxy_set_shared_data`) over the host-wide
//! [`SharedDataStore`], with the test hooks that
//! emulate a concurrent writer right before a set.

use super::memory::{copy_out, read, write_u32};
use super::{answer, outcome, C};
use crate::shared_data::SharedDataStore;
use crate::state::VmState;
use std::sync::MutexGuard;
use wasmtime::Result;

fn store(s: &VmState) -> MutexGuard<'_, SharedDataStore> {
    s.shared.shared_data.lock().expect("shared data lock")
}

pub(super) fn get(
    mut c: C<'_>, kp: i32, kl: i32, ptr_ptr: i32, size_ptr: i32, cas_ptr: i32,
) -> Result<i32> {
    let key = read(&mut c, kp, kl, "shared data key")?;
    let s = c.data();
    let r = store(s).get(&s.vm_id, &key);
    answer(r, |(value, cas)| {
        copy_out(&mut c, &value, ptr_ptr, size_ptr, "shared data value")?;
        write_u32(&mut c, cas_ptr, cas, "shared data cas")
    })
}

pub(super) fn set(mut c: C<'_>, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32) -> Result<i32> {
    let key = read(&mut c, kp, kl, "shared data key")?;
    let value = read(&mut c, vp, vl, "shared data value")?;
    run_shared_set_hooks(&mut c, &key);
    let s = c.data();
    outcome(store(s).set(&s.vm_id, &key, &value, cas as u32))
}

/// Run the hooks registered for this VM and a key like `key`, each at most its remaining
/// number of times.
fn run_shared_set_hooks(c: &mut C<'_>, key: &[u8]) {
    let (hooks, vm) = {
        let s = c.data();
        (s.hooks.0.clone(), s.index)
    };
    // Take matching hooks out first so a hook may drive other VMs (which may hit hooks too).
    let to_run: Vec<_> = hooks
        .borrow_mut()
        .extract_if(.., |h| {
            let vm_ok = h.vm.is_none_or(|v| v == vm);
            let key_ok = h.key_contains.is_empty()
                || key
                    .windows(h.key_contains.len())
                    .any(|w| w == h.key_contains.as_slice());
            if vm_ok && key_ok && h.remaining > 0 {
                h.remaining -= 1;
                true
            } else {
                false
            }
        })
        .collect();
    for mut h in to_run {
        (h.action)(key);
        // Hooks with remaining runs were only taken out for this run: put them back.
        if h.remaining > 0 {
            hooks.borrow_mut().push(h);
        }
    }
}
