//! The floor under the architecture the Gateway API Inference Extension chose: an endpoint
//! picker that is an Envoy `ext_proc` gRPC service, sent the request body by Envoy. This picker
//! sends the messages the Inference Extension's picker (the EPP) sends in Envoy's
//! `FULL_DUPLEX_STREAMED` mode, in the same order, and decides nothing, so what it costs is what
//! the architecture charges before any picker does any work: the bench sets it beside warmroute.
//!
//! One gRPC stream per HTTP request, the messages in order (EPP `pkg/epp/handlers/server.go`,
//! `request.go`; Envoy requires each side's answers in the order headers, body, trailers):
//!
//! | Envoy sends                        | the picker answers                                        |
//! |------------------------------------|-----------------------------------------------------------|
//! | request headers, more to come      | nothing yet: the pick waits for the whole body            |
//! | request body chunk, not the last   | nothing: the chunk is kept                                |
//! | last request body chunk            | request-headers answer (the pick), then the whole body    |
//! | request headers, end of stream     | request-headers answer (the pick) at once                 |
//! | request trailers                   | as the last chunk if the body was open, then a trailers answer |
//! | response headers                   | an empty headers answer (the EPP's adds a debug header)   |
//! | response body chunk                | the same chunk back, streamed (end of stream as it came)  |
//! | response trailers                  | an empty trailers answer                                  |
//!
//! The pick is the EPP's answer with its scheduler left out: a header mutation setting
//! [`ENDPOINT_HEADER`] to one endpoint (and `content-length` to the body's length, as the EPP
//! does after re-encoding the body), `clear_route_cache`, and the same endpoint in the dynamic
//! metadata under `envoy.lb`, the Endpoint Picker Protocol's two channels. The endpoint is
//! chosen by body length, as bench/floor-filter chooses: it spreads requests without reading
//! the body's content. The EPP also re-encodes the body as JSON; this floor returns it as
//! received, so it stays below any real picker.

use std::collections::VecDeque;

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, BodyMutation, BodyResponse,
    CommonResponse, HeaderMutation, HeadersResponse, ProcessingRequest, ProcessingResponse,
    StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value, Struct, Value};

/// The header Envoy's `override_host` policy (or an `ORIGINAL_DST` cluster) routes on.
pub const ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";
/// The dynamic-metadata namespace the EPP writes the endpoint under.
pub const METADATA_NAMESPACE: &str = "envoy.lb";

/// One HTTP request's exchange: what Envoy has sent so far and what is owed back.
#[derive(Debug)]
pub struct Exchange<'a> {
    endpoints: &'a [String],
    body: Vec<u8>,
    picked: bool,
}

impl<'a> Exchange<'a> {
    /// `endpoints` must not be empty (the binary refuses to start without one).
    pub fn new(endpoints: &'a [String]) -> Self {
        Exchange {
            endpoints,
            body: Vec::new(),
            picked: false,
        }
    }

    /// The answers Envoy is owed for `req`, in the order they must be sent (none to three).
    pub fn on_message(&mut self, req: ProcessingRequest, out: &mut VecDeque<ProcessingResponse>) {
        use processing_request::Request as In;
        use processing_response::Response as Out;
        match req.request {
            Some(In::RequestHeaders(h)) if h.end_of_stream => out.push_back(self.pick(None)),
            // Headers with a body to come: the pick waits for the body's end.
            Some(In::RequestHeaders(_)) | None => {}
            Some(In::RequestBody(b)) => {
                if self.picked {
                    // A body after the pick cannot happen in order; pass it on rather than hang.
                    out.push_back(body_answer(true, b.body, b.end_of_stream));
                } else if b.end_of_stream {
                    let mut body = std::mem::take(&mut self.body);
                    if body.is_empty() {
                        body = b.body;
                    } else {
                        body.extend_from_slice(&b.body);
                    }
                    out.push_back(self.pick(Some(body.len())));
                    out.push_back(body_answer(true, body, true));
                } else {
                    self.body.extend_from_slice(&b.body);
                }
            }
            Some(In::RequestTrailers(_)) => {
                if !self.picked {
                    let body = std::mem::take(&mut self.body);
                    out.push_back(self.pick(Some(body.len())));
                    out.push_back(body_answer(true, body, false));
                }
                out.push_back(ProcessingResponse {
                    response: Some(Out::RequestTrailers(TrailersResponse::default())),
                    ..Default::default()
                });
            }
            Some(In::ResponseHeaders(_)) => out.push_back(ProcessingResponse {
                response: Some(Out::ResponseHeaders(HeadersResponse::default())),
                ..Default::default()
            }),
            Some(In::ResponseBody(b)) => {
                out.push_back(body_answer(false, b.body, b.end_of_stream));
            }
            Some(In::ResponseTrailers(_)) => out.push_back(ProcessingResponse {
                response: Some(Out::ResponseTrailers(TrailersResponse::default())),
                ..Default::default()
            }),
        }
    }

    /// The endpoint for a body of `len` bytes (a request without a body counts as 0).
    pub fn endpoint(&self, len: usize) -> &'a str {
        let n = self.endpoints.len().max(1);
        self.endpoints.get(len % n).map_or("", String::as_str)
    }

    /// The request-headers answer that carries the pick.
    fn pick(&mut self, body_len: Option<usize>) -> ProcessingResponse {
        self.picked = true;
        let endpoint = self.endpoint(body_len.unwrap_or(0));
        let mut set_headers = vec![header(ENDPOINT_HEADER, endpoint)];
        if let Some(len) = body_len.filter(|&l| l > 0) {
            // FULL_DUPLEX_STREAMED drops the client's content-length and the EPP sets it again
            // (Envoy 1.40 drops that too: the pod gets the body chunked either way).
            set_headers.push(header("content-length", &len.to_string()));
        }
        let inner = Struct {
            fields: [(
                ENDPOINT_HEADER.to_owned(),
                Value {
                    kind: Some(value::Kind::StringValue(endpoint.to_owned())),
                },
            )]
            .into(),
        };
        ProcessingResponse {
            response: Some(processing_response::Response::RequestHeaders(
                HeadersResponse {
                    response: Some(CommonResponse {
                        header_mutation: Some(HeaderMutation {
                            set_headers,
                            ..Default::default()
                        }),
                        clear_route_cache: true,
                        ..Default::default()
                    }),
                },
            )),
            dynamic_metadata: Some(Struct {
                fields: [(
                    METADATA_NAMESPACE.to_owned(),
                    Value {
                        kind: Some(value::Kind::StructValue(inner)),
                    },
                )]
                .into(),
            }),
            ..Default::default()
        }
    }
}

fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            raw_value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A streamed body answer (FULL_DUPLEX_STREAMED takes the body back as a streamed mutation).
fn body_answer(request: bool, body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let answer = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..Default::default()
                    },
                )),
            }),
            ..Default::default()
        }),
    };
    ProcessingResponse {
        response: Some(if request {
            processing_response::Response::RequestBody(answer)
        } else {
            processing_response::Response::ResponseBody(answer)
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, HttpTrailers};
    use processing_request::Request as In;
    use processing_response::Response as Out;

    fn endpoints() -> Vec<String> {
        vec![
            "127.0.0.1:1".into(),
            "127.0.0.1:2".into(),
            "127.0.0.1:3".into(),
        ]
    }

    fn send(x: &mut Exchange<'_>, r: In) -> Vec<ProcessingResponse> {
        let mut out = VecDeque::new();
        x.on_message(
            ProcessingRequest {
                request: Some(r),
                ..Default::default()
            },
            &mut out,
        );
        out.into()
    }

    fn headers(eos: bool) -> In {
        In::RequestHeaders(HttpHeaders {
            end_of_stream: eos,
            ..Default::default()
        })
    }

    fn chunk(b: &[u8], eos: bool) -> In {
        In::RequestBody(HttpBody {
            body: b.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        })
    }

    /// (endpoint header, content-length header, metadata endpoint) of a request-headers answer.
    fn pick_of(r: &ProcessingResponse) -> (String, Option<String>, String) {
        let Some(Out::RequestHeaders(h)) = &r.response else {
            panic!("not a request-headers answer: {r:?}");
        };
        let common = h.response.as_ref().expect("common response");
        assert!(common.clear_route_cache);
        let set = &common
            .header_mutation
            .as_ref()
            .expect("mutation")
            .set_headers;
        let get = |k: &str| {
            set.iter()
                .filter_map(|o| o.header.as_ref())
                .find(|h| h.key == k)
                .map(|h| String::from_utf8(h.raw_value.clone()).expect("utf8"))
        };
        let md = &r.dynamic_metadata.as_ref().expect("metadata").fields[METADATA_NAMESPACE];
        let Some(value::Kind::StructValue(s)) = &md.kind else {
            panic!("metadata not a struct");
        };
        let Some(value::Kind::StringValue(m)) = &s.fields[ENDPOINT_HEADER].kind else {
            panic!("metadata endpoint not a string");
        };
        (
            get(ENDPOINT_HEADER).expect("endpoint header"),
            get("content-length"),
            m.clone(),
        )
    }

    fn streamed(r: &ProcessingResponse) -> (bool, Vec<u8>, bool) {
        let (request, b) = match &r.response {
            Some(Out::RequestBody(b)) => (true, b),
            Some(Out::ResponseBody(b)) => (false, b),
            other => panic!("not a body answer: {other:?}"),
        };
        let m = b.response.as_ref().and_then(|c| c.body_mutation.as_ref());
        let Some(body_mutation::Mutation::StreamedResponse(s)) =
            m.and_then(|m| m.mutation.as_ref())
        else {
            panic!("not a streamed body mutation");
        };
        (request, s.body.clone(), s.end_of_stream)
    }

    #[test]
    fn the_pick_waits_for_the_whole_body_then_comes_before_it() {
        let eps = endpoints();
        let mut x = Exchange::new(&eps);
        assert!(send(&mut x, headers(false)).is_empty());
        assert!(send(&mut x, chunk(b"{\"model\":", false)).is_empty());
        let out = send(&mut x, chunk(b"\"m\"}", true));
        assert_eq!(out.len(), 2);
        let body = b"{\"model\":\"m\"}";
        assert_eq!(
            pick_of(&out[0]),
            (
                eps[body.len() % 3].clone(),
                Some(body.len().to_string()),
                eps[body.len() % 3].clone()
            )
        );
        assert_eq!(streamed(&out[1]), (true, body.to_vec(), true));
    }

    #[test]
    fn every_endpoint_is_picked_by_body_length() {
        let eps = endpoints();
        for len in 1..=6 {
            let mut x = Exchange::new(&eps);
            send(&mut x, headers(false));
            let out = send(&mut x, chunk(&vec![b'x'; len], true));
            assert_eq!(pick_of(&out[0]).0, eps[len % 3]);
        }
    }

    #[test]
    fn a_request_without_body_is_picked_at_its_headers() {
        let eps = endpoints();
        let mut x = Exchange::new(&eps);
        let out = send(&mut x, headers(true));
        assert_eq!(out.len(), 1);
        assert_eq!(pick_of(&out[0]), (eps[0].clone(), None, eps[0].clone()));
    }

    #[test]
    fn trailers_close_an_open_body() {
        let eps = endpoints();
        let mut x = Exchange::new(&eps);
        send(&mut x, headers(false));
        send(&mut x, chunk(b"abcd", false));
        let out = send(&mut x, In::RequestTrailers(HttpTrailers::default()));
        assert_eq!(out.len(), 3);
        assert_eq!(pick_of(&out[0]).0, eps[1]);
        assert_eq!(streamed(&out[1]), (true, b"abcd".to_vec(), false));
        assert!(matches!(out[2].response, Some(Out::RequestTrailers(_))));
    }

    #[test]
    fn the_response_passes_through_chunk_by_chunk() {
        let eps = endpoints();
        let mut x = Exchange::new(&eps);
        let out = send(&mut x, In::ResponseHeaders(HttpHeaders::default()));
        assert!(matches!(
            out[..],
            [ProcessingResponse {
                response: Some(Out::ResponseHeaders(_)),
                ..
            }]
        ));
        for (c, eos) in [
            (&b"data: a\n\n"[..], false),
            (&b"data: [DONE]\n\n"[..], true),
        ] {
            let out = send(
                &mut x,
                In::ResponseBody(HttpBody {
                    body: c.to_vec(),
                    end_of_stream: eos,
                    ..Default::default()
                }),
            );
            assert_eq!(out.len(), 1);
            assert_eq!(streamed(&out[0]), (false, c.to_vec(), eos));
        }
    }
}
