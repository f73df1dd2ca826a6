//! The oracle router: for each request, every simulated pod's actual state, and the pod that
//! minimises the request's predicted time to first token. The bench's limit for an approximate
//! index (issue #34); it needs the simulator's debug endpoint (`warmroute-sim --debug-state`),
//! which no real engine has, so it is a bench instrument, never a router to ship.
//!
//! # Decision
//! Before a request is sent, each pod answers `POST /debug/state` for it (all pods at once): its
//! longest cached prefix now, and the time to the request's first token forecast by the pod's
//! own scheduler and cost model on its actual queue (uncached prefill + the queue ahead + the
//! step in flight: `warmroute_sim::engine::Prediction`). The pick is
//!
//! `argmin_pod predicted_ttft_ms`, ties (equal to 1e-9 ms) to fewer `running + waiting`,
//! then to the first pod in an order rotated by the request's sequence number
//!
//! (so idle pods share the cold traffic instead of all of it going to the first). A pod that
//! cannot answer counts as infinitely slow.
//!
//! Decisions are taken one at a time: a routing oracle holds its turn from the probes until the
//! picked pod has answered the request's headers (the simulator answers them once the request is
//! queued), so every decision sees the earlier ones in the pods' queues. Without it, requests
//! arriving together were each sent to the same idle-looking pod.
//!
//! # Exactness
//! The probe is the request as the pod will see it: the body rendered and tokenized by the
//! simulator's own functions (`warmroute_sim::api::probe_prompt`) and hashed into blocks of the
//! pods' own block size (read from them before the run) with the simulator's chained hash, all
//! before the run's clock starts. What it cannot know: requests that arrive at the pod between
//! the probe and this request, and blocks evicted in between.
//!
//! # Its own cost
//! The decision's wall time (`route_us`, probes sent to answers read) is recorded per request
//! and kept out of the request's TTFT and E2E, whose clock starts when the request is sent (as
//! is the wait for its turn):
//! the oracle is the limit of placement, not a proxy with a cost. Its load on the pods (one
//! forecast per pod per request, `predict_us` each) is not free; in shadow mode (probe, record,
//! but send through the gateway) a router under test pays the same, so a paired run with the
//! oracle compares placement alone.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Uri};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::runner::{get_text, HttpClient};
use crate::workload::{Api, Workload};

/// `max_tokens` of a request that sets none: the simulator's `--default-max-tokens` default
/// (every bench workload sets it).
const DEFAULT_MAX_TOKENS: usize = 16;

/// How long a probe may take before its pod counts as unanswering.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// One request's probe: its prompt's block hashes (little-endian u64s) and the query.
#[derive(Clone, Debug)]
pub struct ProbeBody {
    pub hashes: Bytes,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
}

/// The pods and what to do with their answers.
#[derive(Clone, Debug)]
pub struct Oracle {
    /// Each pod's base URL.
    pub pods: Vec<String>,
    /// Send each request to the pick (true) or only record the pick (shadow mode).
    pub route: bool,
    /// Per session, per request.
    pub probes: Vec<Vec<Arc<ProbeBody>>>,
}

/// A pod's answer for one request (`/debug/state`).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct PodView {
    pub replica: String,
    /// Simulated ms; `None`: it could not admit the request, or did not answer.
    pub predicted_ttft_ms: Option<f64>,
    pub cached_tokens: u64,
    /// Blocks of the prefix it holds now or held and evicted.
    pub held_blocks: u64,
    /// Tokens per block.
    #[serde(default)]
    pub block_size: u64,
    pub running: u64,
    pub waiting: u64,
    /// The pod's time for the forecast, µs.
    pub predict_us: f64,
}

/// The oracle's view of one request, recorded with it.
#[derive(Clone, Debug, Serialize)]
pub struct OracleRecord {
    /// Wall time of the decision (all probes), µs.
    pub route_us: f64,
    /// Index of the picked pod, `None` when no pod answered.
    pub pick: Option<usize>,
    /// Every pod's answer, in `pods` order (`None`: no answer).
    pub pods: Vec<Option<PodView>>,
}

/// The pick among `views` (module docs); `rotate` is the request's sequence number.
pub fn pick(views: &[Option<PodView>], rotate: usize) -> Option<usize> {
    let n = views.len();
    let key = |i: usize| {
        views[i].as_ref().map(|v| {
            (
                v.predicted_ttft_ms.unwrap_or(f64::INFINITY),
                v.running + v.waiting,
            )
        })
    };
    let mut best: Option<(usize, (f64, u64))> = None;
    for k in 0..n {
        let i = (rotate + k) % n;
        let Some(ki) = key(i) else { continue };
        let better = match best {
            None => true,
            Some((_, kb)) => ki.0 < kb.0 - 1e-9 || ((ki.0 - kb.0).abs() <= 1e-9 && ki.1 < kb.1),
        };
        if better {
            best = Some((i, ki));
        }
    }
    best.map(|(i, _)| i)
}

#[derive(Deserialize)]
struct BlockSize {
    block_size: usize,
}

/// The pods' block size, from their `/debug/state`; every pod must answer and agree.
pub async fn block_size(client: &HttpClient, pods: &[String]) -> Result<usize> {
    let mut size = None;
    for p in pods {
        let url = format!("{}/debug/state", p.trim_end_matches('/'));
        let text = get_text(client, &url, PROBE_TIMEOUT)
            .await
            .map_err(|e| anyhow::anyhow!("{url}: {e} (is the sim started with --debug-state?)"))?;
        let b: BlockSize = serde_json::from_str(&text).with_context(|| format!("{url}: {text}"))?;
        match size {
            Some(s) if s != b.block_size => {
                bail!("pods disagree on the block size ({s} vs {})", b.block_size)
            }
            _ => size = Some(b.block_size),
        }
    }
    size.context("no pod to probe")
}

/// Every request's probe, computed with the simulator's own rendering, tokenizer and hash.
pub fn probes(workload: &Workload, block_size: usize) -> Result<Vec<Vec<Arc<ProbeBody>>>> {
    workload
        .sessions
        .iter()
        .map(|s| {
            s.requests
                .iter()
                .map(|r| {
                    let (tokens, max_tokens) = warmroute_sim::api::probe_prompt(
                        &r.body,
                        r.api == Api::Chat,
                        DEFAULT_MAX_TOKENS,
                    )
                    .map_err(|e| anyhow::anyhow!("session {}: {e}", s.id))?;
                    let hashes: Vec<u8> = warmroute_sim::cache::block_hashes(&tokens, block_size)
                        .iter()
                        .flat_map(|h| h.to_le_bytes())
                        .collect();
                    Ok(Arc::new(ProbeBody {
                        hashes: Bytes::from(hashes),
                        prompt_tokens: tokens.len(),
                        max_tokens,
                    }))
                })
                .collect()
        })
        .collect()
}

async fn ask(client: HttpClient, uri: Uri, body: Bytes) -> Option<PodView> {
    let req = hyper::Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(CONTENT_TYPE, "application/octet-stream")
        .body(Full::new(body))
        .ok()?;
    let fut = async {
        let resp = client.request(req).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice::<PodView>(&bytes).ok()
    };
    tokio::time::timeout(PROBE_TIMEOUT, fut)
        .await
        .ok()
        .flatten()
}

/// Probes every pod for `probe` at once and picks (module docs).
pub async fn decide(
    client: &HttpClient,
    pods: &[String],
    probe: &ProbeBody,
    rotate: usize,
) -> OracleRecord {
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, p) in pods.iter().enumerate() {
        let url = format!(
            "{}/debug/state?prompt_tokens={}&max_tokens={}",
            p.trim_end_matches('/'),
            probe.prompt_tokens,
            probe.max_tokens
        );
        let (client, body) = (client.clone(), probe.hashes.clone());
        tasks.spawn(async move {
            let view = match url.parse::<Uri>() {
                Ok(uri) => ask(client, uri, body).await,
                Err(_) => None,
            };
            (i, view)
        });
    }
    let mut views: Vec<Option<PodView>> = vec![None; pods.len()];
    while let Some(done) = tasks.join_next().await {
        if let Ok((i, v)) = done {
            if let Some(slot) = views.get_mut(i) {
                *slot = v;
            }
        }
    }
    OracleRecord {
        route_us: t0.elapsed().as_secs_f64() * 1e6,
        pick: pick(&views, rotate),
        pods: views,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(ttft: Option<f64>, running: u64) -> Option<PodView> {
        Some(PodView {
            replica: String::new(),
            predicted_ttft_ms: ttft,
            cached_tokens: 0,
            held_blocks: 0,
            block_size: 16,
            running,
            waiting: 0,
            predict_us: 0.0,
        })
    }

    #[test]
    fn picks_the_least_predicted_ttft_then_the_least_loaded_then_in_turn() {
        assert_eq!(
            pick(&[view(Some(30.0), 0), view(Some(20.0), 5), None], 0),
            Some(1)
        );
        assert_eq!(
            pick(&[view(None, 0), None, view(Some(900.0), 9)], 0),
            Some(2)
        );
        assert_eq!(
            pick(&[view(Some(20.0), 2), view(Some(20.0), 1)], 0),
            Some(1)
        );
        let idle = [
            view(Some(20.0), 0),
            view(Some(20.0), 0),
            view(Some(20.0), 0),
        ];
        let picks: Vec<_> = (0..4).map(|r| pick(&idle, r)).collect();
        assert_eq!(picks, vec![Some(0), Some(1), Some(2), Some(0)]);
        assert_eq!(pick(&[None, None], 0), None);
    }
}
