//! Tests of the compiled filter, `dist/warmroute.wasm`, driven through the proxy-wasm ABI.
//! One test binary (the module is compiled once per process and shared by every `Host`).
//! Build the filter first: `make build`.

mod common;
mod config;
mod gate;
mod growth;
mod multi_vm;
mod robustness;
mod routing;
mod tick;
