//! Metrics (`proxy_define_metric`, `proxy_increment_metric`, `proxy_record_metric`,
//! `proxy_get_metric`) over the host-wide [`Metrics`] store.

use super::memory::{read_str, write_u32, write_u64};
use super::{answer, outcome, status, C};
use crate::metrics::Metrics;
use crate::state::VmState;
use crate::types::{MetricType, Status};
use std::sync::MutexGuard;
use wasmtime::Result;

fn metrics(s: &VmState) -> MutexGuard<'_, Metrics> {
    s.shared.metrics.lock().expect("metrics lock")
}

pub(super) fn define(mut c: C<'_>, ty: i32, np: i32, nl: i32, ret: i32) -> Result<i32> {
    let Some(ty) = MetricType::from_raw(ty as u32) else {
        return status(Status::BadArgument);
    };
    let name = read_str(&mut c, np, nl, "metric name")?;
    let r = metrics(c.data()).define(ty, &name);
    answer(r, |id| write_u32(&mut c, ret, id, "metric id"))
}

pub(super) fn increment(c: C<'_>, id: i32, offset: i64) -> Result<i32> {
    outcome(metrics(c.data()).increment(id as u32, offset))
}

pub(super) fn record(c: C<'_>, id: i32, value: i64) -> Result<i32> {
    outcome(metrics(c.data()).record(id as u32, value as u64))
}

pub(super) fn get(mut c: C<'_>, id: i32, ret: i32) -> Result<i32> {
    let r = metrics(c.data()).get(id as u32);
    answer(r, |v| write_u64(&mut c, ret, v, "metric value"))
}
