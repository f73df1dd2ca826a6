//! One VM instance (one wasmtime `Store` + `Instance`), i.e. one Envoy worker's copy of the
//! plugin, and the HTTP streams running in it.

use crate::headers::HeaderMap;
use crate::host::FUEL_BUDGET;
use crate::http_call::HttpCallReply;
use crate::state::{LocalResponse, LogEntry, StreamState, VmState};
use crate::types::{Action, LogLevel, StreamType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use wasmtime::{bail, format_err, Func, Result, Store, WasmParams, WasmResults};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

pub(crate) struct VmInner {
    pub store: Store<VmState>,
    pub exports: HashMap<String, Func>,
    pub crashed: Option<String>,
    pub next_ctx: u32,
    pub vm_started: bool,
    pub configured: bool,
    pub stderr: MemoryOutputPipe,
    pub stdout: MemoryOutputPipe,
    pub ticks_suspended: bool,
}

/// Handle to one VM instance (cheap to clone; single-threaded).
#[derive(Clone)]
pub struct Vm {
    pub(crate) inner: Rc<RefCell<VmInner>>,
    pub(crate) index: usize,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vm#{}", self.index)
    }
}

impl VmInner {
    pub(crate) fn call<P: WasmParams, R: WasmResults>(
        &mut self, name: &str, ctx: u32, params: P,
    ) -> Result<Option<R>> {
        if let Some(c) = &self.crashed {
            bail!(
                "VM #{} crashed earlier; refusing to call {name}:\n{c}",
                self.store.data().index
            );
        }
        let Some(f) = self.exports.get(name).copied() else {
            return Ok(None);
        };
        self.store.data_mut().effective_ctx = ctx;
        let typed = f
            .typed::<P, R>(&self.store)
            .map_err(|e| format_err!("guest export {name} has an unexpected signature: {e}"))?;
        match typed.call(&mut self.store, params) {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                let report = self.crash_report(name, &e);
                self.crashed = Some(report.clone());
                bail!("{report}")
            }
        }
    }

    fn crash_report(&self, name: &str, e: &wasmtime::Error) -> String {
        let s = self.store.data();
        let mut out = format!("VM #{} trapped in {name}: {e:?}\n", s.index);
        let tail: Vec<_> = s.logs.iter().rev().take(20).collect();
        if !tail.is_empty() {
            out.push_str("last guest logs (newest last):\n");
            for l in tail.iter().rev() {
                out.push_str(&format!("  [{:?}] {}\n", l.level, l.message));
            }
        }
        let err = self.stderr.contents();
        if !err.is_empty() {
            out.push_str(&format!(
                "guest stderr:\n{}\n",
                String::from_utf8_lossy(&err)
            ));
        }
        out
    }
}

impl Vm {
    /// Index of this VM in its `Host` (creation order).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Root context id (1).
    pub fn root_id(&self) -> u32 {
        self.inner.borrow().store.data().root_id
    }

    /// Whether `proxy_on_vm_start` returned true.
    pub fn vm_started(&self) -> bool {
        self.inner.borrow().vm_started
    }

    /// Whether the last `proxy_on_configure` returned true.
    pub fn configured(&self) -> bool {
        self.inner.borrow().configured
    }

    /// If the VM trapped, the crash report.
    pub fn crashed(&self) -> Option<String> {
        self.inner.borrow().crashed.clone()
    }

    /// Takes the VM down as a crash would: Envoy calls nothing of it again, not
    /// `proxy_on_log` for its open streams, not `proxy_on_done`, not its tick.
    pub fn kill(&self, why: &str) {
        self.inner.borrow_mut().crashed = Some(format!("killed by the test: {why}"));
    }

    /// Push a new plugin configuration and call `proxy_on_configure` again.
    pub fn configure(&self, plugin_config: &[u8]) -> Result<bool> {
        let mut inner = self.inner.borrow_mut();
        let root = inner.store.data().root_id;
        inner.store.data_mut().plugin_config = plugin_config.to_vec();
        let ok = inner
            .call::<(u32, u32), u32>(
                "proxy_on_configure",
                root,
                (root, plugin_config.len() as u32),
            )?
            .unwrap_or(1)
            != 0;
        inner.configured = ok;
        Ok(ok)
    }

    /// Call `proxy_on_tick` on the root context now (the clock does not move).
    pub fn tick(&self) -> Result<()> {
        let mut inner = self.inner.borrow_mut();
        let root = inner.store.data().root_id;
        inner.call::<u32, ()>("proxy_on_tick", root, root)?;
        Ok(())
    }

    /// Tick period set by the guest (0 = none).
    pub fn tick_period_ms(&self) -> u32 {
        self.inner.borrow().store.data().tick_period_ms
    }

    pub(crate) fn next_tick_ns(&self) -> Option<u64> {
        let inner = self.inner.borrow();
        if inner.ticks_suspended {
            return None;
        }
        inner.store.data().next_tick_ns
    }

    /// Stop (or resume) this VM's tick timer in `Host::advance`, e.g. to emulate a worker
    /// that is gone or stuck. Resuming fires at the next period boundary.
    pub fn suspend_ticks(&self, suspended: bool) {
        let mut inner = self.inner.borrow_mut();
        inner.ticks_suspended = suspended;
        if !suspended {
            let s = inner.store.data_mut();
            let now = s.shared.clock.now_ns();
            let period = s.tick_period_ms as u64 * 1_000_000;
            if let (Some(t), true) = (s.next_tick_ns.as_mut(), period > 0) {
                while *t <= now {
                    *t += period;
                }
            }
        }
    }

    /// Fire a scheduled tick (reschedules first, like Envoy's timer, then calls on_tick).
    pub(crate) fn fire_scheduled_tick(&self, at_ns: u64) -> Result<()> {
        {
            let mut inner = self.inner.borrow_mut();
            let s = inner.store.data_mut();
            s.next_tick_ns =
                (s.tick_period_ms > 0).then(|| at_ns + s.tick_period_ms as u64 * 1_000_000);
        }
        self.tick()
    }

    /// Number of `proxy_done` calls made by the guest.
    pub fn done_calls(&self) -> u32 {
        self.inner.borrow().store.data().done_calls
    }

    /// Captured logs of this VM.
    pub fn logs(&self) -> Vec<LogEntry> {
        self.inner.borrow().store.data().logs.clone()
    }

    /// Whether any captured log line contains `needle`.
    pub fn logs_contain(&self, needle: &str) -> bool {
        self.inner
            .borrow()
            .store
            .data()
            .logs
            .iter()
            .any(|l| l.message.contains(needle))
    }

    /// Log lines at or above `level` containing `needle`.
    pub fn logs_matching(&self, level: LogLevel, needle: &str) -> Vec<LogEntry> {
        self.inner
            .borrow()
            .store
            .data()
            .logs
            .iter()
            .filter(|l| l.level >= level && l.message.contains(needle))
            .cloned()
            .collect()
    }

    /// All logs as text, one per line (for assertion messages).
    pub fn log_text(&self) -> String {
        self.inner
            .borrow()
            .store
            .data()
            .logs
            .iter()
            .map(|l| format!("[{:?}] {}", l.level, l.message))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn clear_logs(&self) {
        self.inner.borrow_mut().store.data_mut().logs.clear();
    }

    /// Print guest logs to stderr as they happen.
    pub fn set_echo_logs(&self, on: bool) {
        self.inner.borrow_mut().store.data_mut().echo_logs = on;
    }

    /// What the guest wrote to WASI stderr / stdout.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.inner.borrow().stderr.contents()).into_owned()
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.inner.borrow().stdout.contents()).into_owned()
    }

    /// Linear memory size in 64 KiB pages.
    pub fn memory_pages(&self) -> u64 {
        let inner = self.inner.borrow();
        inner
            .store
            .data()
            .memory
            .map(|m| m.size(&inner.store))
            .unwrap_or(0)
    }

    pub fn memory_bytes(&self) -> usize {
        let inner = self.inner.borrow();
        inner
            .store
            .data()
            .memory
            .map(|m| m.data_size(&inner.store))
            .unwrap_or(0)
    }

    /// Fuel the guest has burnt in this VM since it was instantiated, every callback
    /// included; `None` unless the host meters fuel (`HostOptions::fuel`). The cost of a span
    /// of calls is the difference of two readings.
    pub fn fuel_used(&self) -> Option<u64> {
        let inner = self.inner.borrow();
        let left = inner.store.get_fuel().ok()?;
        Some(FUEL_BUDGET - left)
    }

    /// Set a property visible to `proxy_get_property` (path segments joined by \0).
    pub fn set_property(&self, path: &[&str], value: &[u8]) {
        self.inner
            .borrow_mut()
            .store
            .data_mut()
            .properties
            .insert(path.join("\0").into_bytes(), value.to_vec());
    }

    pub fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.inner
            .borrow()
            .store
            .data()
            .properties
            .get(path.join("\0").as_bytes())
            .cloned()
    }

    /// Number of live HTTP stream contexts.
    pub fn live_streams(&self) -> usize {
        self.inner.borrow().store.data().streams.len()
    }

    /// Create an HTTP stream context (`proxy_on_context_create(id, root_id)`).
    pub fn new_http_stream(&self) -> Result<HttpStream> {
        let mut inner = self.inner.borrow_mut();
        let id = inner.next_ctx;
        inner.next_ctx += 1;
        let root = inner.store.data().root_id;
        inner
            .store
            .data_mut()
            .streams
            .insert(id, StreamState::default());
        inner.call::<(u32, u32), ()>("proxy_on_context_create", id, (id, root))?;
        Ok(HttpStream {
            vm: self.clone(),
            id,
        })
    }

    /// Deliver an HTTP call reply to `context_id` (used by `Host`).
    pub(crate) fn deliver_http_call(
        &self, context_id: u32, token: u32, reply: &HttpCallReply,
    ) -> Result<()> {
        let mut inner = self.inner.borrow_mut();
        let resp = reply.materialize();
        let (nh, nb, nt) = match &resp {
            Some((h, b, t)) => (h.len() as u32, b.len() as u32, t.len() as u32),
            None => (0, 0, 0),
        };
        inner.store.data_mut().call_response = Some(resp);
        let r = inner.call::<(u32, u32, u32, u32, u32), ()>(
            "proxy_on_http_call_response",
            context_id,
            (context_id, token, nh, nb, nt),
        );
        inner.store.data_mut().call_response = None;
        r.map(|_| ())
    }

    pub(crate) fn deliver_queue_ready(&self, context_id: u32, queue: u32) -> Result<()> {
        let mut inner = self.inner.borrow_mut();
        inner.call::<(u32, u32), ()>("proxy_on_queue_ready", context_id, (context_id, queue))?;
        Ok(())
    }

    fn with_stream<R>(&self, id: u32, f: impl FnOnce(&StreamState) -> R) -> R {
        let inner = self.inner.borrow();
        let s = inner
            .store
            .data()
            .streams
            .get(&id)
            .unwrap_or_else(|| panic!("stream {id} does not exist (already finished?)"));
        f(s)
    }

    fn with_stream_mut<R>(&self, id: u32, f: impl FnOnce(&mut StreamState) -> R) -> Result<R> {
        let mut inner = self.inner.borrow_mut();
        match inner.store.data_mut().streams.get_mut(&id) {
            Some(s) => Ok(f(s)),
            None => bail!("stream {id} does not exist (already finished?)"),
        }
    }
}

/// One HTTP request/response flowing through a VM's filter.
#[derive(Clone, Debug)]
pub struct HttpStream {
    vm: Vm,
    id: u32,
}

fn action(r: Option<u32>) -> Action {
    // A missing callback export means Envoy continues.
    r.map(Action::from_raw).unwrap_or(Action::Continue)
}

impl HttpStream {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn vm(&self) -> &Vm {
        &self.vm
    }

    /// `proxy_on_request_headers` with these headers (include `:method`, `:path`, ...).
    pub fn request_headers(&self, headers: &[(&str, &str)], end_of_stream: bool) -> Result<Action> {
        let n = headers.len() as u32;
        self.vm.with_stream_mut(self.id, |s| {
            s.request_headers = HeaderMap::from_pairs(headers)
        })?;
        let r = self.vm.inner.borrow_mut().call::<(u32, u32, u32), u32>(
            "proxy_on_request_headers",
            self.id,
            (self.id, n, end_of_stream as u32),
        )?;
        Ok(action(r))
    }

    /// `proxy_on_request_body`. If the previous body callback returned Pause, the chunk is
    /// appended to the buffered body (Envoy's StopIterationAndBuffer), else it replaces it.
    pub fn request_body(&self, chunk: &[u8], end_of_stream: bool) -> Result<Action> {
        let size = self.vm.with_stream_mut(self.id, |s| {
            if !s.request_buffering {
                s.request_body.clear();
            }
            s.request_body.extend_from_slice(chunk);
            s.request_body.len() as u32
        })?;
        let r = self.vm.inner.borrow_mut().call::<(u32, u32, u32), u32>(
            "proxy_on_request_body",
            self.id,
            (self.id, size, end_of_stream as u32),
        )?;
        let a = action(r);
        self.vm
            .with_stream_mut(self.id, |s| s.request_buffering = a == Action::Pause)?;
        Ok(a)
    }

    pub fn request_trailers(&self, trailers: &[(&str, &str)]) -> Result<Action> {
        let n = trailers.len() as u32;
        self.vm.with_stream_mut(self.id, |s| {
            s.request_trailers = HeaderMap::from_pairs(trailers)
        })?;
        let r = self.vm.inner.borrow_mut().call::<(u32, u32), u32>(
            "proxy_on_request_trailers",
            self.id,
            (self.id, n),
        )?;
        Ok(action(r))
    }

    pub fn response_headers(
        &self, headers: &[(&str, &str)], end_of_stream: bool,
    ) -> Result<Action> {
        let n = headers.len() as u32;
        self.vm.with_stream_mut(self.id, |s| {
            s.response_headers = HeaderMap::from_pairs(headers)
        })?;
        let r = self.vm.inner.borrow_mut().call::<(u32, u32, u32), u32>(
            "proxy_on_response_headers",
            self.id,
            (self.id, n, end_of_stream as u32),
        )?;
        Ok(action(r))
    }

    pub fn response_body(&self, chunk: &[u8], end_of_stream: bool) -> Result<Action> {
        let size = self.vm.with_stream_mut(self.id, |s| {
            if !s.response_buffering {
                s.response_body.clear();
            }
            s.response_body.extend_from_slice(chunk);
            s.response_body.len() as u32
        })?;
        let r = self.vm.inner.borrow_mut().call::<(u32, u32, u32), u32>(
            "proxy_on_response_body",
            self.id,
            (self.id, size, end_of_stream as u32),
        )?;
        let a = action(r);
        self.vm
            .with_stream_mut(self.id, |s| s.response_buffering = a == Action::Pause)?;
        Ok(a)
    }

    pub fn response_trailers(&self, trailers: &[(&str, &str)]) -> Result<Action> {
        let n = trailers.len() as u32;
        self.vm.with_stream_mut(self.id, |s| {
            s.response_trailers = HeaderMap::from_pairs(trailers)
        })?;
        let r = self.vm.inner.borrow_mut().call::<(u32, u32), u32>(
            "proxy_on_response_trailers",
            self.id,
            (self.id, n),
        )?;
        Ok(action(r))
    }

    /// Convenience: request headers then (if `body` is Some) the whole body in one chunk.
    /// Returns the actions of the headers and body callbacks.
    pub fn send_request(
        &self, headers: &[(&str, &str)], body: Option<&[u8]>,
    ) -> Result<(Action, Option<Action>)> {
        let h = self.request_headers(headers, body.is_none())?;
        let b = match body {
            Some(b) => Some(self.request_body(b, true)?),
            None => None,
        };
        Ok((h, b))
    }

    /// End of stream as Envoy does it: `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`.
    /// Pending HTTP calls dispatched from this context are cancelled.
    pub fn finish(&self) -> Result<()> {
        {
            let mut inner = self.vm.inner.borrow_mut();
            if !inner.store.data().streams.contains_key(&self.id) {
                bail!("stream {} already finished", self.id);
            }
            inner.call::<u32, ()>("proxy_on_log", self.id, self.id)?;
            inner.call::<u32, u32>("proxy_on_done", self.id, self.id)?;
            inner.call::<u32, ()>("proxy_on_delete", self.id, self.id)?;
            let s = inner.store.data_mut();
            s.streams.remove(&self.id);
            let vm = s.index;
            s.effective_ctx = s.root_id;
            let mut calls = s.shared.calls.lock().expect("calls lock");
            calls
                .pending
                .retain(|_, c| !(c.vm == vm && c.context_id == self.id));
        }
        Ok(())
    }

    /// First value of a request header (after the filter ran).
    pub fn request_header(&self, name: &str) -> Option<String> {
        self.vm
            .with_stream(self.id, |s| s.request_headers.get(name))
    }

    pub fn request_header_all(&self, name: &str) -> Vec<String> {
        self.vm
            .with_stream(self.id, |s| s.request_headers.get_all(name))
    }

    pub fn request_header_map(&self) -> HeaderMap {
        self.vm.with_stream(self.id, |s| s.request_headers.clone())
    }

    pub fn request_body_bytes(&self) -> Vec<u8> {
        self.vm.with_stream(self.id, |s| s.request_body.clone())
    }

    pub fn response_header(&self, name: &str) -> Option<String> {
        self.vm
            .with_stream(self.id, |s| s.response_headers.get(name))
    }

    pub fn response_header_map(&self) -> HeaderMap {
        self.vm.with_stream(self.id, |s| s.response_headers.clone())
    }

    pub fn response_body_bytes(&self) -> Vec<u8> {
        self.vm.with_stream(self.id, |s| s.response_body.clone())
    }

    /// The `proxy_send_local_response` made on this stream, if any.
    pub fn local_response(&self) -> Option<LocalResponse> {
        self.vm.with_stream(self.id, |s| s.local_response.clone())
    }

    /// `proxy_continue_stream` calls made on this stream.
    pub fn continue_calls(&self) -> Vec<StreamType> {
        self.vm.with_stream(self.id, |s| s.continue_calls.clone())
    }

    /// Whether the filter resumed the request (`resume_http_request`).
    pub fn request_resumed(&self) -> bool {
        self.continue_calls().contains(&StreamType::HttpRequest)
    }

    pub fn close_calls(&self) -> Vec<StreamType> {
        self.vm.with_stream(self.id, |s| s.close_calls.clone())
    }
}
