//! Host calls the emulator deliberately does not implement (gRPC, foreign functions,
//! `proxy_get_status`): they link, so a module importing them loads, and trap loudly
//! when called.

use super::memory::read_str;
use super::C;
use crate::state::VmState;
use wasmtime::{FuncType, Linker, Result, ValType};

fn unimplemented(name: &str) -> wasmtime::Error {
    wasmtime::format_err!(
        "emulator: host call {name} is not implemented by host-tests (the guest called it; \
         extend host-tests/src/abi/ if the filter really needs it)"
    )
}

/// Define `env::name`, taking `params` i32s and returning an i32, as a trap.
pub(super) fn define_trap(
    linker: &mut Linker<VmState>, name: &'static str, params: usize,
) -> Result<()> {
    let ty = FuncType::new(linker.engine(), vec![ValType::I32; params], [ValType::I32]);
    linker.func_new("env", name, ty, move |_, _, _| Err(unimplemented(name)))?;
    Ok(())
}

/// Names the function in the trap: which one the filter wanted says what to implement.
pub(super) fn call_foreign_function(
    mut c: C<'_>, np: i32, nl: i32, _ap: i32, _al: i32, _rp: i32, _rs: i32,
) -> Result<i32> {
    let name = read_str(&mut c, np, nl, "foreign function name")?;
    Err(unimplemented(&format!(
        "proxy_call_foreign_function({name:?})"
    )))
}
