//! warmroute: KV-cache-aware routing for LLM inference fleets, as a proxy-wasm filter.
//!
//! Everything but `filter` (the proxy-wasm glue) and `host` (the one place that
//! calls the host) is plain Rust, unit-tested natively and inside wasm32.

pub mod config;
pub mod index;
pub mod load;
pub mod openai;
pub mod policy;
pub mod prefix;
pub mod prometheus;
