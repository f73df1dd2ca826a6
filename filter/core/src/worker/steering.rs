//! How a decision reaches Envoy: which headers to write, and which client
//! headers to strip so a client can never pick its upstream.

use crate::config::{Backend, Config, RouteMode, BACKEND_HEADER, ENDPOINT_HEADER};

/// Envoy's pseudo-header for the request authority.
pub const AUTHORITY: &str = ":authority";

/// Headers a client may not send: every header any route mode reads.
pub fn forbidden_client_headers(cfg: &Config) -> Vec<&str> {
    let mut v = vec![ENDPOINT_HEADER, BACKEND_HEADER];
    if cfg.route.mode != RouteMode::Authority && !v.contains(&cfg.route.header.as_str()) {
        v.push(cfg.route.header.as_str());
    }
    // Routes may match on the published model: only the body says which it is.
    if let Some(h) = &cfg.route.model_header {
        v.push(h.as_str());
    }
    v
}

/// Whether `model` (from the request body) may be published in `route.model_header`:
/// not when it holds a control character. The JSON body can carry any of them escaped
/// (`"a\r\nx-injected: 1"`). Envoy 1.40 refuses such a header value when it encodes the
/// request and answers 503 itself, so the request never reaches a pod; a hop that does not
/// check would pass the CR LF on, ending the header there and starting one of the client's
/// choosing. HTAB and DEL are refused as well: no served model name has them.
pub fn publishable_model(model: &str) -> bool {
    !model.bytes().any(|b| b.is_ascii_control())
}

/// The headers (name, value) that steer Envoy to `order[0]` (then the
/// fallbacks), slots being indices into `fleet`; none for an empty slot.
///
/// Authority mode writes the backend's name in [`BACKEND_HEADER`] beside the
/// `:authority`: a client can send any `Host`, and one naming a pod would pick
/// it whenever the filter does not run (fails open). A per-pod route that also
/// matches the backend header, which Envoy strips from clients, is reached only
/// by the filter's choice.
pub fn route_headers<'c>(
    cfg: &'c Config,
    fleet: &[Option<Backend>],
    order: &[usize],
) -> Vec<(&'c str, String)> {
    let slot = |b: usize| fleet.get(b).and_then(Option::as_ref);
    let Some(primary) = order.first().and_then(|&b| slot(b)) else {
        return Vec::new();
    };
    match cfg.route.mode {
        RouteMode::Endpoint => {
            let list: Vec<&str> = order
                .iter()
                .take(1 + cfg.route.fallbacks)
                .filter_map(|&b| slot(b).map(|x| x.address.as_str()))
                .collect();
            vec![(cfg.route.header.as_str(), list.join(","))]
        }
        RouteMode::Header => vec![(cfg.route.header.as_str(), primary.name.clone())],
        RouteMode::Authority => vec![
            (AUTHORITY, primary.host.clone()),
            (BACKEND_HEADER, primary.name.clone()),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn cfg(route: &str) -> Config {
        Config::parse(
            format!(
                r#"{{"backends":[{{"name":"a","address":"10.0.0.1:8000","host":"a.svc:8000"}},{{"name":"b","address":"10.0.0.2:8000"}},{{"name":"c","address":"10.0.0.3:8000"}}],"route":{route}}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    fn fleet(c: &Config) -> Vec<Option<Backend>> {
        c.backends.iter().cloned().map(Some).collect()
    }

    fn route(mode: &str, order: &[usize]) -> Vec<(String, String)> {
        let c = cfg(mode);
        route_headers(&c, &fleet(&c), order)
            .into_iter()
            .map(|(h, v)| (h.to_string(), v))
            .collect()
    }

    fn pair(h: &str, v: &str) -> (String, String) {
        (h.to_string(), v.to_string())
    }

    #[test]
    fn endpoint_mode_lists_fallbacks() {
        let c = cfg(r#"{"mode":"endpoint","fallbacks":1}"#);
        assert_eq!(
            route_headers(&c, &fleet(&c), &[2, 0, 1]),
            vec![(ENDPOINT_HEADER, "10.0.0.3:8000,10.0.0.1:8000".to_string())]
        );
    }

    #[test]
    fn header_and_authority_modes() {
        assert_eq!(
            route(r#"{"mode":"header"}"#, &[1]),
            vec![pair(BACKEND_HEADER, "b")]
        );
        // The name beside the authority: what a per-pod route matches besides the Host.
        assert_eq!(
            route(r#"{"mode":"authority"}"#, &[0]),
            vec![pair(AUTHORITY, "a.svc:8000"), pair(BACKEND_HEADER, "a")]
        );
        assert_eq!(route(r#"{"mode":"header"}"#, &[]), vec![]);
        // An empty slot steers nowhere.
        let c = cfg(r#"{"mode":"endpoint"}"#);
        let mut f = fleet(&c);
        f[1] = None;
        assert_eq!(route_headers(&c, &f, &[1, 0]), vec![]);
        assert_eq!(
            route_headers(&c, &f, &[0, 1, 2]),
            vec![(ENDPOINT_HEADER, "10.0.0.1:8000,10.0.0.3:8000".to_string())]
        );
    }

    #[test]
    fn a_model_with_a_control_character_is_never_published() {
        for ok in ["llama-3.1-8b", "org/model:v2", "modèle", ""] {
            assert!(publishable_model(ok), "{ok:?}");
        }
        for bad in [
            "a\r\nx-injected: 1",
            "a\nb",
            "a\rb",
            "a\tb",
            "a\0b",
            "a\x7fb",
            "\x1b[0m",
        ] {
            assert!(!publishable_model(bad), "{bad:?}");
        }
    }

    #[test]
    fn clients_cannot_set_any_routing_header() {
        let c = cfg(r#"{"mode":"header","header":"x-pod"}"#);
        let f = forbidden_client_headers(&c);
        assert!(
            f.contains(&"x-pod") && f.contains(&ENDPOINT_HEADER) && f.contains(&BACKEND_HEADER)
        );
    }
}
