//! `warmroute-extproc-floor --listen 127.0.0.1:0 --endpoints 127.0.0.1:8001,127.0.0.1:8002
//! [--threads N]`: the no-op ext_proc picker (see the library) as a plaintext gRPC server.
//!
//! Prints `listening <address>` once bound (port 0 picks a free one), so the bench reads the
//! port rather than racing for it. `--threads` sizes the Tokio runtime: 1 (the default) is a
//! single-threaded runtime, the least CPU a picker process can spend per request.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use warmroute_extproc_floor::Exchange;

struct Picker {
    endpoints: &'static [String],
}

/// The answers to one gRPC stream, produced as Envoy's messages arrive: no task or channel per
/// request, only the exchange's state beside the inbound stream.
struct Answers {
    inbound: Streaming<ProcessingRequest>,
    exchange: Exchange<'static>,
    owed: VecDeque<ProcessingResponse>,
}

impl Stream for Answers {
    type Item = Result<ProcessingResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(r) = self.owed.pop_front() {
                return Poll::Ready(Some(Ok(r)));
            }
            match Pin::new(&mut self.inbound).poll_next(cx) {
                Poll::Ready(Some(Ok(req))) => {
                    let this = &mut *self;
                    this.exchange.on_message(req, &mut this.owed);
                }
                // Envoy closed or reset its side (the request ended): nothing more is owed.
                Poll::Ready(Some(Err(_))) | Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        Ok(Response::new(Answers {
            inbound: request.into_inner(),
            exchange: Exchange::new(self.endpoints),
            owed: VecDeque::new(),
        }))
    }
}

struct Args {
    listen: SocketAddr,
    endpoints: Vec<String>,
    threads: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut listen = None;
    let mut endpoints = Vec::new();
    let mut threads = 1;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => {
                listen = Some(
                    value
                        .parse()
                        .map_err(|e| format!("--listen {value}: {e}"))?,
                )
            }
            "--endpoints" => {
                endpoints = value
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            }
            "--threads" => {
                threads = value
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| format!("--threads {value}: a whole number >= 1"))?
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let listen: SocketAddr = listen.ok_or("--listen ADDRESS is required")?;
    if !listen.ip().is_loopback() {
        return Err(format!(
            "--listen {listen}: the bench binds loopback addresses only"
        ));
    }
    if endpoints.is_empty() {
        return Err("--endpoints A,B,... needs at least one ip:port".into());
    }
    Ok(Args {
        listen,
        endpoints,
        threads,
    })
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("warmroute-extproc-floor: {e}");
            std::process::exit(2);
        }
    };
    let rt = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let result = rt.map_err(|e| e.to_string()).and_then(|rt| {
        rt.block_on(serve(args.listen, args.endpoints))
            .map_err(|e| e.to_string())
    });
    if let Err(e) = result {
        eprintln!("warmroute-extproc-floor: {e}");
        std::process::exit(1);
    }
}

async fn serve(
    listen: SocketAddr,
    endpoints: Vec<String>,
) -> Result<(), Box<dyn std::error::Error>> {
    // Envoy's gRPC messages are small and answered at once: Nagle's delay would add to each.
    let incoming = tonic::transport::server::TcpIncoming::bind(listen)?.with_nodelay(Some(true));
    println!("listening {}", incoming.local_addr()?);
    let picker = Picker {
        // Lives as long as the process; every stream borrows it.
        endpoints: Vec::leak(endpoints),
    };
    tonic::transport::Server::builder()
        .add_service(ExternalProcessorServer::new(picker))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}
