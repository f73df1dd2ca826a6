//! Outgoing `proxy_http_call`s captured by the host, and the replies a test injects.

use crate::headers::HeaderMap;

/// One `dispatch_http_call` made by a VM.
#[derive(Clone, Debug)]
pub struct HttpCall {
    /// Host-wide unique token (what the guest received).
    pub token: u32,
    /// Index of the VM (in its `Host`) that dispatched the call.
    pub vm: usize,
    /// Context that will receive `proxy_on_http_call_response`.
    pub context_id: u32,
    /// Cluster / upstream name.
    pub upstream: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: HeaderMap,
    pub timeout_ms: u32,
    /// Virtual time (ms since host start) of dispatch.
    pub dispatched_at_ms: u64,
}

impl HttpCall {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name)
    }
    pub fn method(&self) -> Option<String> {
        self.header(":method")
    }
    pub fn path(&self) -> Option<String> {
        self.header(":path")
    }
    pub fn authority(&self) -> Option<String> {
        self.header(":authority")
    }
    /// Virtual time (ms since host start) at which the call times out (None: no timeout).
    pub fn deadline_ms(&self) -> Option<u64> {
        (self.timeout_ms > 0).then(|| self.dispatched_at_ms + self.timeout_ms as u64)
    }
}

/// What the emulated upstream answers.
#[derive(Clone, Debug)]
pub enum HttpCallReply {
    /// A response (headers should include `:status`; added if missing).
    Response {
        status: u32,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        trailers: Vec<(String, String)>,
    },
    /// Stream reset / connection failure: Envoy calls `onHttpCallFailure`, i.e.
    /// `proxy_on_http_call_response(token, 0, 0, 0)` with no response available.
    Reset,
    /// Envoy's async client turns a timeout into a local 504 reply
    /// (`upstream request timeout`) delivered as a normal response.
    Timeout,
}

impl HttpCallReply {
    pub fn ok(body: impl Into<Vec<u8>>) -> Self {
        HttpCallReply::Response {
            status: 200,
            headers: vec![("content-type".into(), "text/plain; version=0.0.4".into())],
            body: body.into(),
            trailers: vec![],
        }
    }

    pub fn status(status: u32, body: impl Into<Vec<u8>>) -> Self {
        HttpCallReply::Response {
            status,
            headers: vec![],
            body: body.into(),
            trailers: vec![],
        }
    }

    /// Materialize into (headers, body, trailers) as the guest will see them,
    /// or None for a reset.
    pub(crate) fn materialize(&self) -> Option<(HeaderMap, Vec<u8>, HeaderMap)> {
        match self {
            HttpCallReply::Reset => None,
            HttpCallReply::Timeout => {
                let body = b"upstream request timeout".to_vec();
                let h = HeaderMap::from_pairs(&[
                    (":status", "504"),
                    ("content-length", &body.len().to_string()),
                    ("content-type", "text/plain"),
                ]);
                Some((h, body, HeaderMap::new()))
            }
            HttpCallReply::Response {
                status,
                headers,
                body,
                trailers,
            } => {
                let mut h = HeaderMap::new();
                if !headers.iter().any(|(k, _)| k == ":status") {
                    h.add(":status", status.to_string().as_bytes());
                }
                for (k, v) in headers {
                    h.add(k, v.as_bytes());
                }
                if h.get("content-length").is_none() {
                    h.add("content-length", body.len().to_string().as_bytes());
                }
                Some((h, body.clone(), HeaderMap::from_pairs(trailers)))
            }
        }
    }
}
