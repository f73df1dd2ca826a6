//! warmroute as a proxy-wasm filter: the glue between Envoy and
//! `warmroute_core`. Each callback reads what the host gave it, makes one call
//! into the core's [`Worker`], and hands back what the core decided; every
//! host call the core makes goes through [`Proxy`], the one implementation of
//! the core's `Host` trait over proxy-wasm. No decision is made here.
#![cfg(target_arch = "wasm32")]

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType, Status};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;
use warmroute_core::host::{Callout, HeaderPair, Host, HostError, MetricKind, Versioned};
use warmroute_core::worker::{Exchange, Step, Worker};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// The real host: proxy-wasm's host calls, statuses mapped to [`HostError`].
struct Proxy;

fn err(s: Status) -> HostError {
    match s {
        Status::CasMismatch => HostError::CasMismatch,
        other => HostError::Status(other as u32),
    }
}

fn clock() -> Option<Duration> {
    hostcalls::get_current_time()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
}

/// A string property of the current exchange (an absent one, or a failed read, is `None`).
fn property(path: &[&str]) -> Option<String> {
    let v = hostcalls::get_property(path.to_vec()).ok().flatten()?;
    Some(String::from_utf8_lossy(&v).into_owned())
}

impl Host for Proxy {
    fn now_ms(&self) -> u64 {
        clock().map_or(0, |d| d.as_millis() as u64)
    }

    fn now_ns(&self) -> u64 {
        clock().map_or(0, |d| d.as_nanos() as u64)
    }

    fn get_shared(&self, key: &str) -> Result<Versioned, HostError> {
        hostcalls::get_shared_data(key).map_err(err)
    }

    fn set_shared(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        hostcalls::set_shared_data(key, Some(value), cas).map_err(err)
    }

    fn request_headers(&self) -> Vec<HeaderPair> {
        hostcalls::get_map_bytes(MapType::HttpRequestHeaders).unwrap_or_default()
    }

    fn set_request_header(&self, name: &str, value: Option<&str>) -> Result<(), HostError> {
        hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value).map_err(err)
    }

    fn request_body(&self, size: usize) -> Option<Vec<u8>> {
        hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size)
            .ok()
            .flatten()
    }

    fn add_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value).map_err(err)
    }

    fn response_status(&self) -> Option<String> {
        hostcalls::get_map_value(MapType::HttpResponseHeaders, ":status")
            .ok()
            .flatten()
    }

    fn response_details(&self) -> Option<String> {
        property(&["response", "code_details"])
    }

    fn upstream_address(&self) -> Option<String> {
        property(&["upstream", "address"])
    }

    fn local_port(&self) -> Option<u16> {
        // An integer attribute: Envoy hands it over as its 8 little-endian bytes.
        let v = hostcalls::get_property(vec!["destination", "port"])
            .ok()
            .flatten()?;
        let bytes: [u8; 8] = v.as_slice().try_into().ok()?;
        u16::try_from(u64::from_le_bytes(bytes)).ok()
    }

    fn replace_request_body(&self, len: usize, body: &[u8]) -> Result<(), HostError> {
        hostcalls::set_buffer(BufferType::HttpRequestBody, 0, len, body).map_err(err)
    }

    fn response_body(&self, start: usize, size: usize) -> Option<Vec<u8>> {
        hostcalls::get_buffer(BufferType::HttpResponseBody, start, size)
            .ok()
            .flatten()
    }

    fn send_response(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        hostcalls::send_http_response(status, headers.to_vec(), Some(body)).map_err(err)
    }

    fn dispatch(&self, call: &Callout<'_>) -> Result<u32, HostError> {
        hostcalls::dispatch_http_call(
            call.cluster,
            call.headers.clone(),
            None,
            vec![],
            Duration::from_millis(call.timeout_ms),
        )
        .map_err(err)
    }

    fn callout_status(&self) -> Option<String> {
        hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
    }

    fn callout_body(&self, size: usize) -> Option<Vec<u8>> {
        hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size)
            .ok()
            .flatten()
    }

    fn define_metric(&self, kind: MetricKind, name: &str) -> Option<u32> {
        let kind = match kind {
            MetricKind::Counter => MetricType::Counter,
            MetricKind::Gauge => MetricType::Gauge,
        };
        hostcalls::define_metric(kind, name).ok()
    }

    fn increment_metric(&self, id: u32, by: i64) {
        let _ = hostcalls::increment_metric(id, by);
    }

    fn record_metric(&self, id: u32, value: u64) {
        let _ = hostcalls::record_metric(id, value);
    }

    fn set_tick_period_ms(&self, ms: u64) -> Result<(), HostError> {
        hostcalls::set_tick_period(Duration::from_millis(ms)).map_err(err)
    }

    fn register_queue(&self, name: &str) -> Result<u32, HostError> {
        hostcalls::register_shared_queue(name).map_err(err)
    }

    fn enqueue(&self, queue: u32, value: &[u8]) -> Result<(), HostError> {
        hostcalls::enqueue_shared_queue(queue, Some(value)).map_err(err)
    }

    fn dequeue(&self, queue: u32) -> Result<Option<Vec<u8>>, HostError> {
        hostcalls::dequeue_shared_queue(queue).map_err(err)
    }

    fn enter_context(&self, context: u32) -> Result<(), HostError> {
        hostcalls::set_effective_context(context).map_err(err)
    }

    fn resume_request(&self) -> Result<(), HostError> {
        hostcalls::resume_http_request().map_err(err)
    }

    fn set_filter_state(&self, key: &str, value: &str) -> Result<(), HostError> {
        hostcalls::set_property(vec![key], Some(value.as_bytes())).map_err(err)
    }
}

/// The worker every context of this VM shares.
type WorkerCell = Option<Rc<RefCell<Worker>>>;

/// Runs `f` on the worker, if configured. Callbacks never nest, so the borrow
/// always succeeds; if it ever did not, the callback does nothing rather
/// than panic the VM.
fn with<T>(worker: &WorkerCell, f: impl FnOnce(&mut Worker) -> T) -> Option<T> {
    let mut w = worker.as_ref()?.try_borrow_mut().ok()?;
    Some(f(&mut w))
}

fn action(step: Option<Step>) -> Action {
    match step {
        Some(Step::Pause | Step::Replied) => Action::Pause,
        Some(Step::Continue) | None => Action::Continue,
    }
}

#[derive(Default)]
struct Root {
    worker: WorkerCell,
}

impl Context for Root {
    fn on_done(&mut self) -> bool {
        with(&self.worker, |w| w.on_done(&Proxy));
        true
    }

    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _: usize) {
        with(&self.worker, |w| w.on_scrape(&Proxy, token, headers, body));
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        match Worker::configure(&Proxy, &config) {
            Ok(w) => {
                self.worker = Some(Rc::new(RefCell::new(w)));
                true
            }
            Err(e) => {
                log::error!("warmroute: invalid configuration: {e}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        with(&self.worker, |w| w.tick(&Proxy));
    }

    fn on_queue_ready(&mut self, queue: u32) {
        with(&self.worker, |w| w.on_wake(&Proxy, queue));
    }

    fn create_http_context(&self, id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http {
            worker: self.worker.clone(),
            exchange: Exchange::new(id),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    worker: WorkerCell,
    exchange: Exchange,
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let ex = &mut self.exchange;
        action(with(&self.worker, |w| {
            w.on_request_headers(&Proxy, ex, end_of_stream)
        }))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let ex = &mut self.exchange;
        action(with(&self.worker, |w| {
            w.on_request_body(&Proxy, ex, body_size, end_of_stream)
        }))
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        let ex = &mut self.exchange;
        action(with(&self.worker, |w| w.on_request_trailers(&Proxy, ex)))
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let ex = &mut self.exchange;
        with(&self.worker, |w| {
            w.on_response_headers(&Proxy, ex, end_of_stream)
        });
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let ex = &mut self.exchange;
        with(&self.worker, |w| {
            w.on_response_body(&Proxy, ex, body_size, end_of_stream)
        });
        Action::Continue
    }

    fn on_log(&mut self) {
        let ex = &mut self.exchange;
        with(&self.worker, |w| w.on_log(&Proxy, ex));
    }
}
