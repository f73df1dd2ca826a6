//! Per-VM store state and the host-wide shared state.

use crate::clock::VirtualClock;
use crate::headers::HeaderMap;
use crate::http_call::HttpCall;
use crate::metrics::Metrics;
use crate::shared_data::{SharedDataStore, SharedQueues};
use crate::types::{LogLevel, StreamType};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use wasmtime::{Memory, TypedFunc};
use wasmtime_wasi::p1::WasiP1Ctx;

/// One `proxy_log` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    pub level: LogLevel,
    pub message: String,
    /// Effective context when logged.
    pub context_id: u32,
    /// Virtual time, ms since host start.
    pub at_ms: u64,
}

/// A `proxy_send_local_response` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: u32,
    pub details: String,
    pub body: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub grpc_status: i32,
}

/// Host-side state of one HTTP stream (context).
#[derive(Clone, Debug, Default)]
pub struct StreamState {
    pub request_headers: HeaderMap,
    pub request_body: Vec<u8>,
    pub request_trailers: HeaderMap,
    pub response_headers: HeaderMap,
    pub response_body: Vec<u8>,
    pub response_trailers: HeaderMap,
    pub local_response: Option<LocalResponse>,
    pub continue_calls: Vec<StreamType>,
    pub close_calls: Vec<StreamType>,
    /// Whether the previous body callback returned Pause (Envoy then buffers: the next
    /// callback sees the accumulated body).
    pub request_buffering: bool,
    pub response_buffering: bool,
}

/// HTTP call bookkeeping (host-wide: tokens are unique across VMs).
#[derive(Debug, Default)]
pub struct CallRegistry {
    pub next_token: u32,
    pub pending: BTreeMap<u32, HttpCall>,
    pub history: Vec<HttpCall>,
}

/// State shared by every VM of one `Host` (what one Envoy process shares between workers).
#[derive(Debug)]
pub struct Shared {
    pub shared_data: Arc<Mutex<SharedDataStore>>,
    pub queues: Mutex<SharedQueues>,
    pub metrics: Mutex<Metrics>,
    pub clock: VirtualClock,
    pub calls: Mutex<CallRegistry>,
    /// If set, `proxy_http_call` to another cluster answers BadArgument (as Envoy does for
    /// an unknown cluster).
    pub known_clusters: Option<Vec<String>>,
}

/// Hook run right before a `proxy_set_shared_data` of a matching key is applied, to
/// emulate a concurrent writer (another worker) interleaving between the guest's get and set.
pub(crate) type HookFn = Box<dyn FnMut(&[u8])>;

pub(crate) struct SharedSetHook {
    pub vm: Option<usize>,
    pub key_contains: Vec<u8>,
    pub action: HookFn,
    pub remaining: usize,
}

/// Wrapper to keep test-only, single-threaded hooks inside a `Send` store.
///
/// Safety: a `Store<VmState>` lives inside a `Vm`, which is `!Send` (Rc), so the store
/// and these hooks never leave the thread that created them.
pub(crate) struct SendCell<T>(pub T);
unsafe impl<T> Send for SendCell<T> {}

pub(crate) struct VmState {
    pub wasi: WasiP1Ctx,
    pub shared: Arc<Shared>,
    pub index: usize,
    pub vm_id: String,
    pub root_id: u32,
    pub plugin_config: Vec<u8>,
    pub vm_config: Vec<u8>,
    pub properties: BTreeMap<Vec<u8>, Vec<u8>>,
    pub log_level: LogLevel,
    pub logs: Vec<LogEntry>,
    pub max_logs: usize,
    pub dropped_logs: u64,
    pub echo_logs: bool,
    pub tick_period_ms: u32,
    pub next_tick_ns: Option<u64>,
    pub effective_ctx: u32,
    pub streams: HashMap<u32, StreamState>,
    /// Set while `proxy_on_http_call_response` runs: Some(response) or None for a failure.
    pub call_response: Option<Option<(HeaderMap, Vec<u8>, HeaderMap)>>,
    pub done_calls: u32,
    pub memory: Option<Memory>,
    pub alloc: Option<TypedFunc<u32, u32>>,
    pub hooks: SendCell<Rc<RefCell<Vec<SharedSetHook>>>>,
}

impl VmState {
    pub fn now_ms(&self) -> u64 {
        self.shared.clock.elapsed_ms()
    }

    /// The HTTP stream of the effective context (None for the root context).
    pub fn effective_stream(&self) -> Option<&StreamState> {
        self.streams.get(&self.effective_ctx)
    }

    pub fn effective_stream_mut(&mut self) -> Option<&mut StreamState> {
        self.streams.get_mut(&self.effective_ctx)
    }
}
