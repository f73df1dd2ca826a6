//! Shared helpers for the warmroute tests.
#![allow(dead_code)]

use host_tests::*;
use serde_json::{json, Value};
use std::path::PathBuf;

pub const ENDPOINT: &str = "x-gateway-destination-endpoint";
pub const BACKEND_HEADER: &str = "x-warmroute-backend";
pub const DEBUG: &str = "x-warmroute";

pub fn wasm_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dist/warmroute.wasm")
}

/// A fresh emulated Envoy loaded with dist/warmroute.wasm. Fails (never skips) if missing.
pub fn host() -> Host {
    let p = wasm_path();
    if !p.exists() {
        panic!(
            "{} does not exist: run `make build` first (cargo build -p warmroute-filter \
             --target wasm32-wasip1 --release && cp target/wasm32-wasip1/release/warmroute.wasm dist/)",
            p.display()
        );
    }
    Host::load(&p).unwrap_or_else(|e| panic!("loading {}: {e:?}", p.display()))
}

/// [`host`] metering wasmtime fuel: work per call, deterministic (not a timed assertion).
pub fn fuel_host() -> Host {
    Host::load_with(
        wasm_path(),
        HostOptions {
            fuel: true,
            ..HostOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("loading {}: {e:?}", wasm_path().display()))
}

pub fn addr(i: usize) -> String {
    format!("10.0.0.{}:8000", i + 1)
}

pub fn backends(n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"name": format!("vllm-{i}"), "address": addr(i), "host": format!("vllm-{i}.vllm.ns.svc:8000")}))
            .collect(),
    )
}

/// A config with `n` backends, merged with `extra` (top-level keys).
pub fn config(n: usize, extra: Value) -> String {
    let mut c = json!({ "backends": backends(n) });
    if let (Some(m), Some(e)) = (c.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            m.insert(k.clone(), v.clone());
        }
    }
    c.to_string()
}

/// Start a VM and insist it configured.
pub fn start(host: &Host, cfg: &str) -> Vm {
    let vm = host
        .start_vm(cfg)
        .unwrap_or_else(|e| panic!("start failed: {e:?}"));
    assert!(
        vm.configured(),
        "on_configure returned false for {cfg}:\n{}",
        vm.log_text()
    );
    vm
}

pub fn chat(prompt: &str) -> Vec<u8> {
    json!({"model": "m", "messages": [{"role": "user", "content": prompt}]})
        .to_string()
        .into_bytes()
}

/// A deterministic pseudo-random text of `len` bytes, distinct per `seed`.
pub fn text(seed: u64, len: usize) -> String {
    const WORDS: &[&str] = &[
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra",
        "tango",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut s = format!("[{seed}] ");
    while s.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        s.push(' ');
    }
    s.truncate(len);
    s
}

/// Result of one routed request.
pub struct Routed {
    pub stream: HttpStream,
    pub header_action: Action,
    pub body_action: Option<Action>,
}

impl Routed {
    pub fn header(&self, name: &str) -> Option<String> {
        self.stream.request_header(name)
    }
    /// The endpoint-mode header (all values joined, must be exactly one header).
    pub fn endpoint(&self) -> String {
        let all = self.stream.request_header_all(ENDPOINT);
        assert_eq!(
            all.len(),
            1,
            "expected exactly one {ENDPOINT} header, got {all:?}"
        );
        all[0].clone()
    }
    /// Index of the primary backend from the endpoint header.
    pub fn backend(&self) -> usize {
        let e = self.endpoint();
        let first = e.split(',').next().unwrap_or_default().to_string();
        backend_of(&first).unwrap_or_else(|| panic!("{ENDPOINT}={e:?} is not a configured backend"))
    }
    /// Run the response phase and finish the stream (releases in-flight accounting).
    pub fn finish(&self) {
        self.stream
            .response_headers(&[(":status", "200")], false)
            .unwrap();
        self.stream.response_body(b"{}", true).unwrap();
        self.stream.finish().unwrap();
    }
    pub fn debug(&self) -> Option<String> {
        self.stream.response_header(DEBUG)
    }
}

pub fn backend_of(address: &str) -> Option<usize> {
    (0..1024).find(|&i| addr(i) == address)
}

/// POST /v1/chat/completions with `body` (headers, then the body in one chunk).
pub fn post(vm: &Vm, path: &str, body: &[u8], extra_headers: &[(&str, &str)]) -> Routed {
    let stream = vm.new_http_stream().unwrap();
    let len = body.len().to_string();
    let mut h = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", "gateway"),
        (":scheme", "http"),
        ("content-type", "application/json"),
        ("content-length", len.as_str()),
    ];
    h.extend_from_slice(extra_headers);
    let header_action = stream
        .request_headers(&h, body.is_empty())
        .unwrap_or_else(|e| panic!("request headers: {e:?}"));
    let body_action = if body.is_empty() {
        None
    } else {
        Some(
            stream
                .request_body(body, true)
                .unwrap_or_else(|e| panic!("request body: {e:?}")),
        )
    };
    Routed {
        stream,
        header_action,
        body_action,
    }
}

pub fn chat_request(vm: &Vm, prompt: &str) -> Routed {
    post(vm, "/v1/chat/completions", &chat(prompt), &[])
}

/// Route a request and finish it immediately; returns the backend index.
pub fn route_and_finish(vm: &Vm, prompt: &str) -> usize {
    let r = chat_request(vm, prompt);
    let b = r.backend();
    r.finish();
    b
}

/// vLLM Prometheus exposition with the given queue numbers.
pub fn vllm_metrics(running: u32, waiting: u32, kv: f64) -> String {
    format!(
        "# HELP vllm:num_requests_running Number of requests currently running on GPU.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"m\"}} {running}.0\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}.0\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{model_name=\"m\"}} {kv}\n"
    )
}

/// Which backend (index) a scrape call targets, from its x-gateway-destination-endpoint.
pub fn scrape_target(c: &HttpCall) -> usize {
    let a = c
        .header(ENDPOINT)
        .unwrap_or_else(|| panic!("scrape without {ENDPOINT}: {c:?}"));
    backend_of(&a).unwrap_or_else(|| panic!("scrape to unknown address {a}"))
}
