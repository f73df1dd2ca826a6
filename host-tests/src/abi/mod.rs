//! Host side of the proxy-wasm ABI 0.2.1 (the imports of proxy-wasm Rust SDK 0.2.5),
//! linked into a `wasmtime::Linker`.
//!
//! Conventions (as in proxy-wasm-cpp-host):
//! * `usize`/pointers are i32, `u64`/`i64` are i64; return value is a `Status`;
//! * data returned to the guest is allocated with the guest's `proxy_on_memory_allocate`;
//!   an empty value is returned as (null, 0);
//! * an out-of-bounds pointer traps (cpp-host returns InvalidMemoryAccess, on which the SDK
//!   panics anyway) — loud either way;
//! * calls the emulator does not implement trap with "emulator: ... not implemented".
//!
//! The table below names every host call and the function implementing it; the functions
//! live in one module per group of calls, and [`memory`] reads the guest's arguments and
//! writes its results.

mod buffers;
mod contexts;
mod headers;
mod http_call;
mod logging_time;
mod memory;
mod metrics;
mod properties;
mod shared_data;
mod shared_queues;
mod stream_control;
mod unimplemented;

use crate::state::VmState;
use crate::types::Status;
use wasmtime::{Caller, Linker, Result};

/// Declares every `env` host call once: [`IMPLEMENTED`] lists them and [`add_to_linker`]
/// registers them, so the two cannot drift apart.
macro_rules! host_calls {
    (
        $($name:literal => $f:path,)*
        trapping: $($trap:literal($params:literal),)*
    ) => {
        /// Names of every `env` import this emulator defines (implemented or deliberately
        /// trapping).
        pub const IMPLEMENTED: &[&str] = &[$($name,)* $($trap,)*];

        pub(crate) fn add_to_linker(linker: &mut Linker<VmState>) -> Result<()> {
            $(linker.func_wrap("env", $name, $f)?;)*
            $(unimplemented::define_trap(linker, $trap, $params)?;)*
            Ok(())
        }
    };
}

host_calls! {
    "proxy_log" => logging_time::log,
    "proxy_get_log_level" => logging_time::get_log_level,
    "proxy_get_current_time_nanoseconds" => logging_time::get_current_time,
    "proxy_set_tick_period_milliseconds" => logging_time::set_tick_period,
    "proxy_get_buffer_bytes" => buffers::get,
    "proxy_set_buffer_bytes" => buffers::set,
    "proxy_get_header_map_pairs" => headers::get_pairs,
    "proxy_set_header_map_pairs" => headers::set_pairs,
    "proxy_get_header_map_value" => headers::get_value,
    "proxy_replace_header_map_value" => headers::replace_value,
    "proxy_remove_header_map_value" => headers::remove_value,
    "proxy_add_header_map_value" => headers::add_value,
    "proxy_get_header_map_size" => headers::get_size,
    "proxy_get_property" => properties::get,
    "proxy_set_property" => properties::set,
    "proxy_get_shared_data" => shared_data::get,
    "proxy_set_shared_data" => shared_data::set,
    "proxy_register_shared_queue" => shared_queues::register,
    "proxy_resolve_shared_queue" => shared_queues::resolve,
    "proxy_dequeue_shared_queue" => shared_queues::dequeue,
    "proxy_enqueue_shared_queue" => shared_queues::enqueue,
    "proxy_continue_stream" => stream_control::continue_stream,
    "proxy_close_stream" => stream_control::close_stream,
    "proxy_send_local_response" => stream_control::send_local_response,
    "proxy_http_call" => http_call::dispatch,
    "proxy_set_effective_context" => contexts::set_effective_context,
    "proxy_done" => contexts::done,
    "proxy_define_metric" => metrics::define,
    "proxy_get_metric" => metrics::get,
    "proxy_record_metric" => metrics::record,
    "proxy_increment_metric" => metrics::increment,
    "proxy_call_foreign_function" => unimplemented::call_foreign_function,
    // Deliberately unimplemented, with their number of i32 parameters: trap loudly.
    trapping:
    "proxy_grpc_call"(12),
    "proxy_grpc_stream"(9),
    "proxy_grpc_send"(4),
    "proxy_grpc_cancel"(1),
    "proxy_grpc_close"(1),
    "proxy_get_status"(3),
}

type C<'a> = Caller<'a, VmState>;

/// What a host call returns to the guest for `s`.
fn status(s: Status) -> Result<i32> {
    Ok(s as u32 as i32)
}

/// Answer with the host's result: on `Ok(v)` hand `v` to `out` (which writes it into the
/// guest's return slots) and return Ok; on `Err(s)` write nothing and return `s`.
fn answer<T>(r: std::result::Result<T, Status>, out: impl FnOnce(T) -> Result<()>) -> Result<i32> {
    match r {
        Ok(v) => {
            out(v)?;
            status(Status::Ok)
        }
        Err(s) => status(s),
    }
}

/// [`answer`] for a call with no results to write.
fn outcome(r: std::result::Result<(), Status>) -> Result<i32> {
    answer(r, |()| Ok(()))
}
