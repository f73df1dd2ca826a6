//! Stateful proxy-wasm host emulator.
//!
//! Loads a proxy-wasm module (ABI 0.2.1, e.g. built with the Rust SDK 0.2.5 for
//! wasm32-wasip1) into wasmtime and plays Envoy's side of the ABI, deterministically:
//! virtual clock, captured logs/metrics/HTTP calls, several VM instances sharing one
//! shared-data store with real CAS semantics. Modelled after proxy-wasm-go-sdk's
//! `proxytest`, without globals: each test builds its own [`Host`].
//!
//! ```no_run
//! use host_tests::*;
//! let host = Host::load("../dist/warmroute.wasm").unwrap();
//! let vm = host.start_vm(r#"{"backends":[{"name":"a","address":"10.0.0.1:8000"}]}"#).unwrap();
//! assert!(vm.configured());
//! let s = vm.new_http_stream().unwrap();
//! s.request_headers(&[(":method", "GET"), (":path", "/")], true).unwrap();
//! println!("{:?}", s.request_header("x-gateway-destination-endpoint"));
//! ```

mod abi;
pub mod clock;
pub mod headers;
mod host;
pub mod http_call;
pub mod metrics;
pub mod shared_data;
mod state;
pub mod types;
mod vm;

pub use abi::IMPLEMENTED as IMPLEMENTED_HOST_CALLS;
pub use headers::HeaderMap;
pub use host::{Event, Host, HostOptions, VmOptions};
pub use http_call::{HttpCall, HttpCallReply};
pub use metrics::MetricValue;
pub use state::{LocalResponse, LogEntry};
pub use types::{Action, LogLevel, MetricType, Status, StreamType};
pub use vm::{HttpStream, Vm};
pub use wasmtime::{Error, Result};
