//! warmroute: KV-cache-aware routing for LLM inference fleets, as a proxy-wasm filter.
//!
//! Only `filter` (the proxy-wasm contexts), `stats`, `phases` (a bench-only
//! build) and `host::Proxy` call the host; everything else is plain Rust,
//! unit-tested natively and inside wasm32.

pub mod config;
pub mod host;
pub mod index;
pub mod load;
pub mod openai;
pub mod policy;
pub mod prefix;
pub mod prometheus;
pub mod route;
pub mod router;
pub mod shared;
pub mod telemetry;

#[cfg(all(target_arch = "wasm32", not(test)))]
mod filter;
#[cfg(all(target_arch = "wasm32", not(test)))]
mod phases;
#[cfg(all(target_arch = "wasm32", not(test)))]
mod stats;
