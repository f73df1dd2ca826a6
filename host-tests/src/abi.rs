//! Host side of the proxy-wasm ABI 0.2.1 (the imports of proxy-wasm Rust SDK 0.2.5),
//! linked into a `wasmtime::Linker`.
//!
//! Conventions (as in proxy-wasm-cpp-host):
//! * `usize`/pointers are i32, `u64`/`i64` are i64; return value is a `Status`;
//! * data returned to the guest is allocated with the guest's `proxy_on_memory_allocate`;
//!   an empty value is returned as (null, 0);
//! * an out-of-bounds pointer traps (cpp-host returns InvalidMemoryAccess, on which the SDK
//!   panics anyway) — loud either way;
//! * calls the emulator does not implement trap with "emulator: ... not implemented".

use crate::headers::{deserialize_pairs, HeaderMap};
use crate::http_call::HttpCall;
use crate::state::{LocalResponse, StreamState, VmState};
use crate::types::*;
use wasmtime::{bail, Caller, Extern, Linker, Memory, Result};

/// Names of every `env` import this emulator defines (implemented or deliberately trapping).
pub const IMPLEMENTED: &[&str] = &[
    "proxy_log",
    "proxy_get_log_level",
    "proxy_get_current_time_nanoseconds",
    "proxy_set_tick_period_milliseconds",
    "proxy_get_buffer_bytes",
    "proxy_set_buffer_bytes",
    "proxy_get_header_map_pairs",
    "proxy_set_header_map_pairs",
    "proxy_get_header_map_value",
    "proxy_replace_header_map_value",
    "proxy_remove_header_map_value",
    "proxy_add_header_map_value",
    "proxy_get_header_map_size",
    "proxy_get_property",
    "proxy_set_property",
    "proxy_get_shared_data",
    "proxy_set_shared_data",
    "proxy_register_shared_queue",
    "proxy_resolve_shared_queue",
    "proxy_dequeue_shared_queue",
    "proxy_enqueue_shared_queue",
    "proxy_continue_stream",
    "proxy_close_stream",
    "proxy_send_local_response",
    "proxy_http_call",
    "proxy_set_effective_context",
    "proxy_done",
    "proxy_define_metric",
    "proxy_get_metric",
    "proxy_record_metric",
    "proxy_increment_metric",
    "proxy_call_foreign_function",
    "proxy_grpc_call",
    "proxy_grpc_stream",
    "proxy_grpc_send",
    "proxy_grpc_cancel",
    "proxy_grpc_close",
    "proxy_get_status",
];

type C<'a> = Caller<'a, VmState>;

fn st(s: Status) -> i32 {
    s as u32 as i32
}

fn memory(caller: &mut C<'_>) -> Result<Memory> {
    if let Some(m) = caller.data().memory {
        return Ok(m);
    }
    match caller.get_export("memory") {
        Some(Extern::Memory(m)) => {
            caller.data_mut().memory = Some(m);
            Ok(m)
        }
        _ => bail!("emulator: guest exports no linear memory named `memory`"),
    }
}

pub(crate) fn read(caller: &mut C<'_>, ptr: i32, len: i32, what: &str) -> Result<Vec<u8>> {
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    if len == 0 {
        return Ok(Vec::new());
    }
    let mem = memory(caller)?;
    let data = mem.data(&*caller);
    match ptr.checked_add(len).and_then(|end| data.get(ptr..end)) {
        Some(b) => Ok(b.to_vec()),
        None => bail!(
            "emulator: invalid memory access reading {what}: ptr={ptr:#x} len={len} memory={}",
            data.len()
        ),
    }
}

fn read_str(caller: &mut C<'_>, ptr: i32, len: i32, what: &str) -> Result<String> {
    let b = read(caller, ptr, len, what)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

fn write(caller: &mut C<'_>, ptr: u32, bytes: &[u8], what: &str) -> Result<()> {
    let mem = memory(caller)?;
    if let Err(e) = mem.write(&mut *caller, ptr as usize, bytes) {
        bail!(
            "emulator: invalid memory access writing {what} at {ptr:#x} ({} bytes): {e}",
            bytes.len()
        );
    }
    Ok(())
}

fn write_u32(caller: &mut C<'_>, ptr: i32, v: u32, what: &str) -> Result<()> {
    write(caller, ptr as u32, &v.to_le_bytes(), what)
}

fn write_u64(caller: &mut C<'_>, ptr: i32, v: u64, what: &str) -> Result<()> {
    write(caller, ptr as u32, &v.to_le_bytes(), what)
}

/// Copy `data` into a fresh guest allocation and write (ptr, size) to the return slots.
fn copy_out(
    caller: &mut C<'_>,
    data: &[u8],
    ptr_ptr: i32,
    size_ptr: i32,
    what: &str,
) -> Result<()> {
    let ptr = if data.is_empty() {
        0
    } else {
        let alloc = match caller.data().alloc.clone() {
            Some(a) => a,
            None => bail!(
                "emulator: guest does not export proxy_on_memory_allocate; cannot return {what}"
            ),
        };
        let p = alloc.call(&mut *caller, data.len() as u32)?;
        if p == 0 {
            bail!(
                "emulator: proxy_on_memory_allocate({}) returned null",
                data.len()
            );
        }
        write(caller, p, data, what)?;
        p
    };
    write_u32(caller, ptr_ptr, ptr, what)?;
    write_u32(caller, size_ptr, data.len() as u32, what)
}

fn unimplemented(name: &str) -> wasmtime::Error {
    wasmtime::format_err!(
        "emulator: host call {name} is not implemented by host-tests (the guest called it; \
         extend host-tests/src/abi.rs if the filter really needs it)"
    )
}

/// Which header map the current context can see (None => BadArgument, as Envoy's getMap()
/// returning nullptr).
enum MapRef {
    Stream(u32, MapType),
    CallResponse(MapType),
}

fn map_ref(caller: &C<'_>, t: i32) -> Option<MapRef> {
    let ty = MapType::from_raw(t as u32)?;
    let s = caller.data();
    match ty {
        MapType::HttpCallResponseHeaders | MapType::HttpCallResponseTrailers => {
            match &s.call_response {
                Some(Some(_)) => Some(MapRef::CallResponse(ty)),
                _ => None,
            }
        }
        MapType::HttpRequestHeaders
        | MapType::HttpRequestTrailers
        | MapType::HttpResponseHeaders
        | MapType::HttpResponseTrailers => s
            .streams
            .contains_key(&s.effective_ctx)
            .then_some(MapRef::Stream(s.effective_ctx, ty)),
        _ => None,
    }
}

fn stream_map(s: &mut StreamState, ty: MapType) -> &mut HeaderMap {
    match ty {
        MapType::HttpRequestHeaders => &mut s.request_headers,
        MapType::HttpRequestTrailers => &mut s.request_trailers,
        MapType::HttpResponseHeaders => &mut s.response_headers,
        _ => &mut s.response_trailers,
    }
}

fn with_map<R>(caller: &mut C<'_>, r: &MapRef, f: impl FnOnce(&mut HeaderMap) -> R) -> R {
    let s = caller.data_mut();
    match r {
        MapRef::Stream(ctx, ty) => {
            let stream = s.streams.get_mut(ctx).expect("checked by map_ref");
            f(stream_map(stream, *ty))
        }
        MapRef::CallResponse(ty) => {
            let (h, _, t) = s
                .call_response
                .as_mut()
                .and_then(|r| r.as_mut())
                .expect("checked by map_ref");
            f(if *ty == MapType::HttpCallResponseHeaders {
                h
            } else {
                t
            })
        }
    }
}

/// The bytes of a buffer visible to the current context (None => NotFound).
fn buffer_get(s: &VmState, ty: BufferType) -> Option<Vec<u8>> {
    let stream = s.streams.get(&s.effective_ctx);
    match ty {
        BufferType::PluginConfiguration => Some(s.plugin_config.clone()),
        BufferType::VmConfiguration => Some(s.vm_config.clone()),
        BufferType::HttpRequestBody => stream.map(|x| x.request_body.clone()),
        BufferType::HttpResponseBody => stream.map(|x| x.response_body.clone()),
        BufferType::HttpCallResponseBody => match &s.call_response {
            Some(Some((_, b, _))) => Some(b.clone()),
            _ => None,
        },
        _ => None,
    }
}

pub(crate) fn add_to_linker(linker: &mut Linker<VmState>) -> Result<()> {
    // ---- logging, time, ticks ----
    linker.func_wrap(
        "env",
        "proxy_log",
        |mut c: C<'_>, level: i32, ptr: i32, len: i32| -> Result<i32> {
            let Some(level) = LogLevel::from_raw(level as u32) else {
                return Ok(st(Status::BadArgument));
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
                // Keep memory bounded in long runs: drop the oldest half of non-error logs.
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
            let context_id = s.effective_ctx;
            s.logs.push(crate::state::LogEntry {
                level,
                message,
                context_id,
                at_ms,
            });
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut c: C<'_>, ret: i32| -> Result<i32> {
            let lvl = c.data().log_level as u32;
            write_u32(&mut c, ret, lvl, "log level")?;
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ret: i32| -> Result<i32> {
            let now = c.data().shared.clock.now_ns();
            write_u64(&mut c, ret, now, "current time")?;
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: C<'_>, period: i32| -> Result<i32> {
            let s = c.data_mut();
            let period = period as u32;
            s.tick_period_ms = period;
            s.next_tick_ns =
                (period > 0).then(|| s.shared.clock.now_ns() + period as u64 * 1_000_000);
            Ok(st(Status::Ok))
        },
    )?;

    // ---- buffers ----
    linker.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: C<'_>, ty: i32, start: i32, max: i32, ptr_ptr: i32, size_ptr: i32| -> Result<i32> {
            let Some(ty) = BufferType::from_raw(ty as u32) else {
                return Ok(st(Status::BadArgument));
            };
            let (start, max) = (start as u32 as usize, max as u32 as usize);
            let Some(buf) = buffer_get(c.data(), ty) else {
                return Ok(st(Status::NotFound));
            };
            if start > buf.len() {
                return Ok(st(Status::BadArgument));
            }
            let end = start.saturating_add(max).min(buf.len());
            if end > start {
                copy_out(&mut c, &buf[start..end], ptr_ptr, size_ptr, "buffer bytes")?;
            }
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: C<'_>, ty: i32, start: i32, size: i32, ptr: i32, len: i32| -> Result<i32> {
            let Some(ty) = BufferType::from_raw(ty as u32) else {
                return Ok(st(Status::BadArgument));
            };
            let data = read(&mut c, ptr, len, "buffer data")?;
            let s = c.data_mut();
            let ctx = s.effective_ctx;
            let Some(stream) = s.streams.get_mut(&ctx) else {
                return Ok(st(Status::NotFound));
            };
            let buf = match ty {
                BufferType::HttpRequestBody => &mut stream.request_body,
                BufferType::HttpResponseBody => &mut stream.response_body,
                _ => return Ok(st(Status::NotFound)),
            };
            let start = (start as u32 as usize).min(buf.len());
            let end = start.saturating_add(size as u32 as usize).min(buf.len());
            buf.splice(start..end, data);
            Ok(st(Status::Ok))
        },
    )?;

    // ---- header maps ----
    linker.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: C<'_>, ty: i32, ptr_ptr: i32, size_ptr: i32| -> Result<i32> {
            let Some(r) = map_ref(&c, ty) else {
                return Ok(st(Status::BadArgument));
            };
            let bytes = with_map(&mut c, &r, |m| {
                if m.is_empty() {
                    Vec::new()
                } else {
                    m.serialize()
                }
            });
            copy_out(&mut c, &bytes, ptr_ptr, size_ptr, "header map pairs")?;
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: C<'_>, ty: i32, ptr: i32, len: i32| -> Result<i32> {
            let Some(r) = map_ref(&c, ty) else {
                return Ok(st(Status::BadArgument));
            };
            let bytes = read(&mut c, ptr, len, "header map pairs")?;
            let Some(pairs) = deserialize_pairs(&bytes) else {
                return Ok(st(Status::BadArgument));
            };
            with_map(&mut c, &r, |m| {
                *m = HeaderMap::new();
                for (k, v) in &pairs {
                    m.add(&String::from_utf8_lossy(k), v);
                }
            });
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: C<'_>, ty: i32, kp: i32, kl: i32, ptr_ptr: i32, size_ptr: i32| -> Result<i32> {
            let Some(r) = map_ref(&c, ty) else {
                return Ok(st(Status::BadArgument));
            };
            let key = read_str(&mut c, kp, kl, "header key")?;
            let v = with_map(&mut c, &r, |m| m.get_bytes(&key).map(|v| v.to_vec()));
            match v {
                None => Ok(st(Status::NotFound)),
                Some(v) => {
                    copy_out(&mut c, &v, ptr_ptr, size_ptr, "header value")?;
                    Ok(st(Status::Ok))
                }
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: C<'_>, ty: i32, kp: i32, kl: i32, vp: i32, vl: i32| -> Result<i32> {
            let Some(r) = map_ref(&c, ty) else {
                return Ok(st(Status::BadArgument));
            };
            let key = read_str(&mut c, kp, kl, "header key")?;
            let val = read(&mut c, vp, vl, "header value")?;
            with_map(&mut c, &r, |m| m.replace(&key, &val));
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: C<'_>, ty: i32, kp: i32, kl: i32, vp: i32, vl: i32| -> Result<i32> {
            let Some(r) = map_ref(&c, ty) else {
                return Ok(st(Status::BadArgument));
            };
            let key = read_str(&mut c, kp, kl, "header key")?;
            let val = read(&mut c, vp, vl, "header value")?;
            with_map(&mut c, &r, |m| m.add(&key, &val));
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: C<'_>, ty: i32, kp: i32, kl: i32| -> Result<i32> {
            let Some(r) = map_ref(&c, ty) else {
                return Ok(st(Status::BadArgument));
            };
            let key = read_str(&mut c, kp, kl, "header key")?;
            with_map(&mut c, &r, |m| m.remove(&key));
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_size",
        |mut c: C<'_>, ty: i32, ret: i32| -> Result<i32> {
            let Some(r) = map_ref(&c, ty) else {
                return Ok(st(Status::BadArgument));
            };
            let n = with_map(&mut c, &r, |m| m.serialize().len());
            write_u32(&mut c, ret, n as u32, "header map size")?;
            Ok(st(Status::Ok))
        },
    )?;

    // ---- properties ----
    linker.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: C<'_>, pp: i32, pl: i32, ptr_ptr: i32, size_ptr: i32| -> Result<i32> {
            let path = read(&mut c, pp, pl, "property path")?;
            let v = c.data().properties.get(&path).cloned();
            match v {
                None => Ok(st(Status::NotFound)),
                Some(v) => {
                    copy_out(&mut c, &v, ptr_ptr, size_ptr, "property value")?;
                    Ok(st(Status::Ok))
                }
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: C<'_>, pp: i32, pl: i32, vp: i32, vl: i32| -> Result<i32> {
            let path = read(&mut c, pp, pl, "property path")?;
            let v = read(&mut c, vp, vl, "property value")?;
            c.data_mut().properties.insert(path, v);
            Ok(st(Status::Ok))
        },
    )?;

    // ---- shared data ----
    linker.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: C<'_>,
         kp: i32,
         kl: i32,
         ptr_ptr: i32,
         size_ptr: i32,
         cas_ptr: i32|
         -> Result<i32> {
            let key = read(&mut c, kp, kl, "shared data key")?;
            let r = {
                let s = c.data();
                let store = s.shared.shared_data.lock().expect("shared data lock");
                store.get(&s.vm_id, &key)
            };
            match r {
                Err(status) => Ok(st(status)),
                Ok((value, cas)) => {
                    copy_out(&mut c, &value, ptr_ptr, size_ptr, "shared data value")?;
                    write_u32(&mut c, cas_ptr, cas, "shared data cas")?;
                    Ok(st(Status::Ok))
                }
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: C<'_>, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32| -> Result<i32> {
            let key = read(&mut c, kp, kl, "shared data key")?;
            let value = read(&mut c, vp, vl, "shared data value")?;
            run_shared_set_hooks(&mut c, &key);
            let s = c.data();
            let mut store = s.shared.shared_data.lock().expect("shared data lock");
            match store.set(&s.vm_id, &key, &value, cas as u32) {
                Ok(()) => Ok(st(Status::Ok)),
                Err(e) => Ok(st(e)),
            }
        },
    )?;

    // ---- shared queues ----
    linker.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: C<'_>, np: i32, nl: i32, ret: i32| -> Result<i32> {
            let name = read_str(&mut c, np, nl, "queue name")?;
            let id = {
                let s = c.data();
                let mut q = s.shared.queues.lock().expect("queue lock");
                q.register(&s.vm_id, &name, s.index, s.effective_ctx)
            };
            write_u32(&mut c, ret, id, "queue id")?;
            Ok(st(Status::Ok))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: C<'_>, vp: i32, vl: i32, np: i32, nl: i32, ret: i32| -> Result<i32> {
            let vm_id = read_str(&mut c, vp, vl, "vm id")?;
            let name = read_str(&mut c, np, nl, "queue name")?;
            let r = c
                .data()
                .shared
                .queues
                .lock()
                .expect("queue lock")
                .resolve(&vm_id, &name);
            match r {
                Ok(id) => {
                    write_u32(&mut c, ret, id, "queue id")?;
                    Ok(st(Status::Ok))
                }
                Err(e) => Ok(st(e)),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut c: C<'_>, id: i32, vp: i32, vl: i32| -> Result<i32> {
            let v = read(&mut c, vp, vl, "queue value")?;
            let r = c
                .data()
                .shared
                .queues
                .lock()
                .expect("queue lock")
                .enqueue(id as u32, &v);
            Ok(st(r.err().unwrap_or(Status::Ok)))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: C<'_>, id: i32, ptr_ptr: i32, size_ptr: i32| -> Result<i32> {
            let r = c
                .data()
                .shared
                .queues
                .lock()
                .expect("queue lock")
                .dequeue(id as u32);
            match r {
                Ok(v) => {
                    copy_out(&mut c, &v, ptr_ptr, size_ptr, "queue value")?;
                    Ok(st(Status::Ok))
                }
                Err(e) => Ok(st(e)),
            }
        },
    )?;

    // ---- stream control ----
    linker.func_wrap(
        "env",
        "proxy_continue_stream",
        |mut c: C<'_>, ty: i32| -> Result<i32> {
            let Some(ty) = StreamType::from_raw(ty as u32) else {
                return Ok(st(Status::BadArgument));
            };
            let s = c.data_mut();
            let ctx = s.effective_ctx;
            match s.streams.get_mut(&ctx) {
                Some(stream) => {
                    stream.continue_calls.push(ty);
                    Ok(st(Status::Ok))
                }
                None => Ok(st(Status::BadArgument)),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_close_stream",
        |mut c: C<'_>, ty: i32| -> Result<i32> {
            let Some(ty) = StreamType::from_raw(ty as u32) else {
                return Ok(st(Status::BadArgument));
            };
            let s = c.data_mut();
            let ctx = s.effective_ctx;
            match s.streams.get_mut(&ctx) {
                Some(stream) => {
                    stream.close_calls.push(ty);
                    Ok(st(Status::Ok))
                }
                None => Ok(st(Status::BadArgument)),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: C<'_>,
         status: i32,
         dp: i32,
         dl: i32,
         bp: i32,
         bl: i32,
         hp: i32,
         hl: i32,
         grpc: i32|
         -> Result<i32> {
            let details = read_str(&mut c, dp, dl, "local response details")?;
            let body = read(&mut c, bp, bl, "local response body")?;
            let hbytes = read(&mut c, hp, hl, "local response headers")?;
            let Some(pairs) = deserialize_pairs(&hbytes) else {
                return Ok(st(Status::BadArgument));
            };
            let headers = pairs
                .iter()
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).into_owned(),
                        String::from_utf8_lossy(v).into_owned(),
                    )
                })
                .collect();
            let s = c.data_mut();
            let ctx = s.effective_ctx;
            match s.streams.get_mut(&ctx) {
                Some(stream) => {
                    stream.local_response = Some(LocalResponse {
                        status: status as u32,
                        details,
                        body,
                        headers,
                        grpc_status: grpc,
                    });
                    Ok(st(Status::Ok))
                }
                None => Ok(st(Status::BadArgument)),
            }
        },
    )?;

    // ---- outgoing HTTP ----
    linker.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C<'_>,
         up: i32,
         ul: i32,
         hp: i32,
         hl: i32,
         bp: i32,
         bl: i32,
         tp: i32,
         tl: i32,
         timeout: i32,
         ret: i32|
         -> Result<i32> {
            let upstream = read_str(&mut c, up, ul, "http call upstream")?;
            let hbytes = read(&mut c, hp, hl, "http call headers")?;
            let body = read(&mut c, bp, bl, "http call body")?;
            let tbytes = read(&mut c, tp, tl, "http call trailers")?;
            let (Some(h), Some(t)) = (deserialize_pairs(&hbytes), deserialize_pairs(&tbytes))
            else {
                return Ok(st(Status::BadArgument));
            };
            let headers = HeaderMap::from_pairs(
                &h.iter()
                    .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
                    .collect::<Vec<_>>(),
            );
            let trailers = HeaderMap::from_pairs(
                &t.iter()
                    .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
                    .collect::<Vec<_>>(),
            );
            // Envoy rejects calls without :path, :method or :authority (BadArgument) and
            // unknown clusters (BadArgument).
            if headers.get(":path").is_none()
                || headers.get(":method").is_none()
                || headers.get(":authority").is_none()
            {
                return Ok(st(Status::BadArgument));
            }
            let s = c.data();
            if let Some(known) = &s.shared.known_clusters {
                if !known.contains(&upstream) {
                    return Ok(st(Status::BadArgument));
                }
            }
            let token = {
                let mut calls = s.shared.calls.lock().expect("calls lock");
                calls.next_token += 1;
                let token = calls.next_token;
                let call = HttpCall {
                    token,
                    vm: s.index,
                    context_id: s.effective_ctx,
                    upstream,
                    headers,
                    body,
                    trailers,
                    timeout_ms: timeout as u32,
                    dispatched_at_ms: s.now_ms(),
                };
                calls.history.push(call.clone());
                calls.pending.insert(token, call);
                token
            };
            write_u32(&mut c, ret, token, "http call token")?;
            Ok(st(Status::Ok))
        },
    )?;

    // ---- contexts ----
    linker.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: C<'_>, ctx: i32| -> Result<i32> {
            let s = c.data_mut();
            let ctx = ctx as u32;
            if ctx == s.root_id || s.streams.contains_key(&ctx) {
                s.effective_ctx = ctx;
                Ok(st(Status::Ok))
            } else {
                Ok(st(Status::BadArgument))
            }
        },
    )?;
    linker.func_wrap("env", "proxy_done", |mut c: C<'_>| -> Result<i32> {
        c.data_mut().done_calls += 1;
        Ok(st(Status::Ok))
    })?;

    // ---- metrics ----
    linker.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: C<'_>, ty: i32, np: i32, nl: i32, ret: i32| -> Result<i32> {
            let Some(ty) = MetricType::from_raw(ty as u32) else {
                return Ok(st(Status::BadArgument));
            };
            let name = read_str(&mut c, np, nl, "metric name")?;
            let r = c
                .data()
                .shared
                .metrics
                .lock()
                .expect("metrics lock")
                .define(ty, &name);
            match r {
                Ok(id) => {
                    write_u32(&mut c, ret, id, "metric id")?;
                    Ok(st(Status::Ok))
                }
                Err(e) => Ok(st(e)),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |c: C<'_>, id: i32, off: i64| -> Result<i32> {
            let r = c
                .data()
                .shared
                .metrics
                .lock()
                .expect("metrics lock")
                .increment(id as u32, off);
            Ok(st(r.err().unwrap_or(Status::Ok)))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_record_metric",
        |c: C<'_>, id: i32, v: i64| -> Result<i32> {
            let r = c
                .data()
                .shared
                .metrics
                .lock()
                .expect("metrics lock")
                .record(id as u32, v as u64);
            Ok(st(r.err().unwrap_or(Status::Ok)))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: C<'_>, id: i32, ret: i32| -> Result<i32> {
            let r = c
                .data()
                .shared
                .metrics
                .lock()
                .expect("metrics lock")
                .get(id as u32);
            match r {
                Ok(v) => {
                    write_u64(&mut c, ret, v, "metric value")?;
                    Ok(st(Status::Ok))
                }
                Err(e) => Ok(st(e)),
            }
        },
    )?;

    // ---- deliberately unimplemented: trap loudly ----
    linker.func_wrap(
        "env",
        "proxy_call_foreign_function",
        |mut c: C<'_>, np: i32, nl: i32, _ap: i32, _al: i32, _rp: i32, _rs: i32| -> Result<i32> {
            let name = read_str(&mut c, np, nl, "foreign function name")?;
            Err(unimplemented(&format!(
                "proxy_call_foreign_function({name:?})"
            )))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_call",
        |_c: C<'_>,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32|
         -> Result<i32> { Err(unimplemented("proxy_grpc_call")) },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_stream",
        |_c: C<'_>,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32|
         -> Result<i32> { Err(unimplemented("proxy_grpc_stream")) },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_send",
        |_c: C<'_>, _: i32, _: i32, _: i32, _: i32| -> Result<i32> {
            Err(unimplemented("proxy_grpc_send"))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_cancel",
        |_c: C<'_>, _: i32| -> Result<i32> { Err(unimplemented("proxy_grpc_cancel")) },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_close",
        |_c: C<'_>, _: i32| -> Result<i32> { Err(unimplemented("proxy_grpc_close")) },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_status",
        |_c: C<'_>, _: i32, _: i32, _: i32| -> Result<i32> {
            Err(unimplemented("proxy_get_status"))
        },
    )?;
    Ok(())
}

fn run_shared_set_hooks(c: &mut C<'_>, key: &[u8]) {
    let (hooks, vm) = {
        let s = c.data();
        (s.hooks.0.clone(), s.index)
    };
    // Take matching hooks out first so a hook may drive other VMs (which may hit hooks too).
    let mut to_run = Vec::new();
    {
        let mut hs = hooks.borrow_mut();
        let mut i = 0;
        while i < hs.len() {
            let h = &mut hs[i];
            let vm_ok = h.vm.is_none_or(|v| v == vm);
            let key_ok = h.key_contains.is_empty()
                || key
                    .windows(h.key_contains.len())
                    .any(|w| w == h.key_contains.as_slice());
            if vm_ok && key_ok && h.remaining > 0 {
                h.remaining -= 1;
                if h.remaining == 0 {
                    to_run.push((hs.remove(i), true));
                    continue;
                }
                // Hooks with remaining runs are temporarily removed and put back afterwards.
                to_run.push((hs.remove(i), false));
                continue;
            }
            i += 1;
        }
    }
    for (mut h, finished) in to_run {
        (h.action)(key);
        if !finished {
            hooks.borrow_mut().push(h);
        }
    }
}
