//! The floor under any body-routing Wasm filter: hold the request headers,
//! buffer the body, read it into the VM once, write the routing header. No
//! parsing, no shared data, no stats. Envoy charges this much to every filter
//! that routes on the body, so the overhead benchmark reports warmroute's cost
//! both from no filter and from this floor.
//!
//! Configuration: warmroute's own JSON (only `backends[].address` is read), so
//! the bench hands both filters the same gateway config. The backend is picked
//! by body length, which spreads requests without reading the body's content.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use std::rc::Rc;

/// The header Envoy's override_host policy reads (as warmroute's endpoint mode).
const ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

#[derive(Default)]
struct Root {
    addresses: Rc<Vec<String>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let cfg: serde_json::Value = self
            .get_plugin_configuration()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let addresses: Vec<String> = cfg["backends"]
            .as_array()
            .map(|bs| {
                bs.iter()
                    .filter_map(|b| b["address"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if addresses.is_empty() {
            log::error!("floor: configuration has no backends[].address");
            return false;
        }
        self.addresses = Rc::new(addresses);
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http {
            addresses: self.addresses.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    addresses: Rc<Vec<String>>,
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        if let Some(a) = self.addresses.get(body.len() % self.addresses.len().max(1)) {
            self.set_http_request_header(ENDPOINT_HEADER, Some(a));
        }
        Action::Continue
    }
}
