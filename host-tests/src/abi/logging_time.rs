//! Logging, the clock and the tick timer: `proxy_log`, `proxy_get_log_level`,
//! `proxy_get_current_time_nanoseconds`, `proxy_set_tick_period_milliseconds`.

use super::memory::{read_str, write_u32, write_u64};
use super::{status, C};
use crate::state::{LogEntry, VmState};
use crate::types::{LogLevel, Status};
use wasmtime::Result;

pub(super) fn log(mut c: C<'_>, level: i32, ptr: i32, len: i32) -> Result<i32> {
    let Some(level) = LogLevel::from_raw(level as u32) else {
        return status(Status::BadArgument);
    };
    let message = read_str(&mut c, ptr, len, "log message")?;
    let at_ms = c.data().now_ms();
    let s = c.data_mut();
    if s.echo_logs {
        eprintln!(
            "[vm{} {:?} t={}ms ctx={}] {}",
            s.index, level, at_ms, s.effective_ctx, message
        );
    }
    if s.logs.len() >= s.max_logs {
        make_room(s);
    }
    let context_id = s.effective_ctx;
    s.logs.push(LogEntry {
        level,
        message,
        context_id,
        at_ms,
    });
    status(Status::Ok)
}

/// Keep memory bounded in long runs: drop the oldest half of non-error logs.
fn make_room(s: &mut VmState) {
    let keep_from = s.logs.len() / 2;
    let (old, _) = s.logs.split_at(keep_from);
    let important: Vec<_> = old
        .iter()
        .filter(|l| l.level >= LogLevel::Warn)
        .cloned()
        .collect();
    s.dropped_logs += (keep_from - important.len()) as u64;
    let mut rest = s.logs.split_off(keep_from);
    s.logs = important;
    s.logs.append(&mut rest);
}

pub(super) fn get_log_level(mut c: C<'_>, ret: i32) -> Result<i32> {
    let lvl = c.data().log_level as u32;
    write_u32(&mut c, ret, lvl, "log level")?;
    status(Status::Ok)
}

pub(super) fn get_current_time(mut c: C<'_>, ret: i32) -> Result<i32> {
    let now = c.data().shared.clock.now_ns();
    write_u64(&mut c, ret, now, "current time")?;
    status(Status::Ok)
}

pub(super) fn set_tick_period(mut c: C<'_>, period: i32) -> Result<i32> {
    let s = c.data_mut();
    let period = period as u32;
    s.tick_period_ms = period;
    s.next_tick_ns = (period > 0).then(|| s.shared.clock.now_ns() + period as u64 * 1_000_000);
    status(Status::Ok)
}
