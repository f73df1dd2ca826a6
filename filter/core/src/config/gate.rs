//! The `gate` section as validated: the knee and the priority classes
//! ([`crate::gate`] holds the queue they order).

/// Most classes one gate orders.
pub const MAX_CLASSES: usize = 8;

/// When a pod is past its knee; `None` fields are not checked.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Knee {
    /// Requests on the pod (this gateway's in flight plus other gateways' seen in its scrape).
    pub requests: Option<f64>,
    /// Work on the pod, in typical requests ([`crate::routing::work`]).
    pub work: Option<f64>,
    /// Requests the pod's scrape shows waiting.
    pub waiting: Option<f64>,
    /// KV cache usage, 0..1, in the pod's scrape.
    pub kv_usage: Option<f64>,
}

impl Knee {
    /// How many more typical requests the pod takes before its knee (`≤ 0`:
    /// past it; `∞`: no count-like bound set). `waiting`/`kv_usage` are from
    /// a fresh scrape, or `None`.
    pub fn headroom(&self, load: f64, work: f64, waiting: Option<f64>, kv: Option<f64>) -> f64 {
        let queued = matches!((self.waiting, waiting), (Some(k), Some(w)) if w >= k);
        let full = matches!((self.kv_usage, kv), (Some(k), Some(u)) if u >= k);
        if queued || full {
            return 0.0;
        }
        let by_requests = self.requests.map_or(f64::INFINITY, |k| k - load);
        let by_work = self.work.map_or(f64::INFINITY, |k| k - work);
        by_requests.min(by_work)
    }
}

/// One priority class, as configured (rank = position, 0 the highest).
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    /// Name (stats, the priority header's value).
    pub name: String,
    /// Other header values that mean this class (lower-case).
    pub aliases: Vec<String>,
    /// Longest a request of this class is held.
    pub max_wait_ms: u64,
    /// Most requests of this class held at once, gateway-wide.
    pub max_queue: u32,
}

/// The validated `gate` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct GateConfig {
    /// When a pod is past its knee.
    pub knee: Knee,
    /// Classes, highest first.
    pub classes: Vec<Class>,
    /// Rank of a request without a (known) class.
    pub default_class: usize,
    /// Header naming the class (lower-case).
    pub class_header: String,
    /// The Gateway API Inference Extension's objectives
    /// ([`crate::config::OBJECTIVE_HEADER`]) and the class rank each stands
    /// for: an objective carries an integer priority set on its
    /// `InferenceObjective`, not a class name, so the operator maps them.
    pub objectives: Vec<(String, usize)>,
    /// Header carrying the client's deadline, in milliseconds from arrival.
    pub deadline_header: String,
    /// Share of releases that go to a lower class while a higher one waits.
    pub lower_share: f64,
    /// Period of the gate's own check (expiry, missed wake-ups).
    pub check_ms: u64,
    /// `Retry-After` of a shed request, in seconds.
    pub retry_after_s: u32,
    /// Most request-body bytes held at the gate, over every class and VM.
    pub max_held_bytes: u64,
}

impl GateConfig {
    /// The class rank of a request whose class header reads `class` (a class
    /// name or alias) or, without a known one, whose objective header reads
    /// `objective` (a name in `objectives`), and its deadline relative to arrival.
    pub fn classify(
        &self,
        class: Option<&str>,
        objective: Option<&str>,
        deadline: Option<&str>,
    ) -> (usize, u64) {
        let by_class = class.map(|v| v.trim().to_ascii_lowercase()).and_then(|v| {
            self.classes
                .iter()
                .position(|c| c.name == v || c.aliases.contains(&v))
        });
        let by_objective = || {
            let o = objective?.trim();
            self.objectives
                .iter()
                .find(|(name, _)| name == o)
                .map(|&(_, rank)| rank)
        };
        let rank = by_class.or_else(by_objective).unwrap_or(self.default_class);
        let max_wait = self.classes.get(rank).map_or(0, |c| c.max_wait_ms);
        let asked = deadline.and_then(|d| d.trim().parse::<u64>().ok());
        (rank, asked.map_or(max_wait, |d| d.min(max_wait)))
    }

    /// Releases between two that go to a lower class (0: never).
    pub fn lower_every(&self) -> u64 {
        if self.lower_share <= 0.0 {
            0
        } else {
            (1.0 / self.lower_share).round().max(1.0) as u64
        }
    }
}
