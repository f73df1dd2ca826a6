//! Header and trailer maps of the current stream or HTTP call response:
//! `proxy_{get,set}_header_map_pairs`, `proxy_{get,replace,add,remove}_header_map_value`,
//! `proxy_get_header_map_size`.

use super::memory::{copy_out, read, read_header_map, read_str, write_u32};
use super::{answer, status, C};
use crate::headers::HeaderMap;
use crate::state::StreamState;
use crate::types::{MapType, Status};
use wasmtime::Result;

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
            .effective_stream()
            .is_some()
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

pub(super) fn get_pairs(mut c: C<'_>, ty: i32, ptr_ptr: i32, size_ptr: i32) -> Result<i32> {
    let Some(r) = map_ref(&c, ty) else {
        return status(Status::BadArgument);
    };
    let bytes = with_map(&mut c, &r, |m| {
        if m.is_empty() {
            Vec::new()
        } else {
            m.serialize()
        }
    });
    copy_out(&mut c, &bytes, ptr_ptr, size_ptr, "header map pairs")?;
    status(Status::Ok)
}

pub(super) fn set_pairs(mut c: C<'_>, ty: i32, ptr: i32, len: i32) -> Result<i32> {
    let Some(r) = map_ref(&c, ty) else {
        return status(Status::BadArgument);
    };
    let Some(map) = read_header_map(&mut c, ptr, len, "header map pairs")? else {
        return status(Status::BadArgument);
    };
    with_map(&mut c, &r, |m| *m = map);
    status(Status::Ok)
}

pub(super) fn get_value(
    mut c: C<'_>, ty: i32, kp: i32, kl: i32, ptr_ptr: i32, size_ptr: i32,
) -> Result<i32> {
    let Some(r) = map_ref(&c, ty) else {
        return status(Status::BadArgument);
    };
    let key = read_str(&mut c, kp, kl, "header key")?;
    let v = with_map(&mut c, &r, |m| m.get_bytes(&key).map(|v| v.to_vec()));
    answer(v.ok_or(Status::NotFound), |v| {
        copy_out(&mut c, &v, ptr_ptr, size_ptr, "header value")
    })
}

pub(super) fn replace_value(c: C<'_>, ty: i32, kp: i32, kl: i32, vp: i32, vl: i32) -> Result<i32> {
    put_value(c, ty, (kp, kl), (vp, vl), HeaderMap::replace)
}

pub(super) fn add_value(c: C<'_>, ty: i32, kp: i32, kl: i32, vp: i32, vl: i32) -> Result<i32> {
    put_value(c, ty, (kp, kl), (vp, vl), HeaderMap::add)
}

/// Read a key and a value from the guest and `put` them into map `ty`.
fn put_value(
    mut c: C<'_>, ty: i32, (kp, kl): (i32, i32), (vp, vl): (i32, i32),
    put: fn(&mut HeaderMap, &str, &[u8]),
) -> Result<i32> {
    let Some(r) = map_ref(&c, ty) else {
        return status(Status::BadArgument);
    };
    let key = read_str(&mut c, kp, kl, "header key")?;
    let val = read(&mut c, vp, vl, "header value")?;
    with_map(&mut c, &r, |m| put(m, &key, &val));
    status(Status::Ok)
}

pub(super) fn remove_value(mut c: C<'_>, ty: i32, kp: i32, kl: i32) -> Result<i32> {
    let Some(r) = map_ref(&c, ty) else {
        return status(Status::BadArgument);
    };
    let key = read_str(&mut c, kp, kl, "header key")?;
    with_map(&mut c, &r, |m| m.remove(&key));
    status(Status::Ok)
}

pub(super) fn get_size(mut c: C<'_>, ty: i32, ret: i32) -> Result<i32> {
    let Some(r) = map_ref(&c, ty) else {
        return status(Status::BadArgument);
    };
    let n = with_map(&mut c, &r, |m| m.serialize().len());
    write_u32(&mut c, ret, n as u32, "header map size")?;
    status(Status::Ok)
}
