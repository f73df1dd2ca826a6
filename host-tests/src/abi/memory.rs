//! The guest's linear memory: reading the (ptr, len) arguments of a host call and writing
//! its results into the guest's return slots. An out-of-bounds access traps.

use super::C;
use crate::headers::HeaderMap;
use wasmtime::{bail, Extern, Memory, Result};

fn memory(caller: &mut C<'_>) -> Result<Memory> {
    if let Some(m) = caller.data().memory {
        return Ok(m);
    }
    match caller.get_export("memory") {
        Some(Extern::Memory(m)) => {
            caller.data_mut().memory = Some(m);
            Ok(m)
        }
        _ => bail!("emulator: guest exports no linear memory named `memory`"),
    }
}

pub(super) fn read(caller: &mut C<'_>, ptr: i32, len: i32, what: &str) -> Result<Vec<u8>> {
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    if len == 0 {
        return Ok(Vec::new());
    }
    let mem = memory(caller)?;
    let data = mem.data(&*caller);
    match ptr.checked_add(len).and_then(|end| data.get(ptr..end)) {
        Some(b) => Ok(b.to_vec()),
        None => bail!(
            "emulator: invalid memory access reading {what}: ptr={ptr:#x} len={len} memory={}",
            data.len()
        ),
    }
}

pub(super) fn read_str(caller: &mut C<'_>, ptr: i32, len: i32, what: &str) -> Result<String> {
    let b = read(caller, ptr, len, what)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// Read serialized header pairs; `Ok(None)` if they do not parse.
pub(super) fn read_header_map(
    caller: &mut C<'_>, ptr: i32, len: i32, what: &str,
) -> Result<Option<HeaderMap>> {
    let b = read(caller, ptr, len, what)?;
    Ok(HeaderMap::deserialize(&b))
}

fn write(caller: &mut C<'_>, ptr: u32, bytes: &[u8], what: &str) -> Result<()> {
    let mem = memory(caller)?;
    if let Err(e) = mem.write(&mut *caller, ptr as usize, bytes) {
        bail!(
            "emulator: invalid memory access writing {what} at {ptr:#x} ({} bytes): {e}",
            bytes.len()
        );
    }
    Ok(())
}

pub(super) fn write_u32(caller: &mut C<'_>, ptr: i32, v: u32, what: &str) -> Result<()> {
    write(caller, ptr as u32, &v.to_le_bytes(), what)
}

pub(super) fn write_u64(caller: &mut C<'_>, ptr: i32, v: u64, what: &str) -> Result<()> {
    write(caller, ptr as u32, &v.to_le_bytes(), what)
}

/// Copy `data` into a fresh guest allocation and write (ptr, size) to the return slots.
pub(super) fn copy_out(
    caller: &mut C<'_>, data: &[u8], ptr_ptr: i32, size_ptr: i32, what: &str,
) -> Result<()> {
    let ptr = if data.is_empty() {
        0
    } else {
        let alloc = match caller.data().alloc.clone() {
            Some(a) => a,
            None => bail!(
                "emulator: guest does not export proxy_on_memory_allocate; cannot return {what}"
            ),
        };
        let p = alloc.call(&mut *caller, data.len() as u32)?;
        if p == 0 {
            bail!(
                "emulator: proxy_on_memory_allocate({}) returned null",
                data.len()
            );
        }
        write(caller, p, data, what)?;
        p
    };
    write_u32(caller, ptr_ptr, ptr, what)?;
    write_u32(caller, size_ptr, data.len() as u32, what)
}
