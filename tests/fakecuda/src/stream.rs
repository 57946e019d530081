//! Streams and events. Work completes as it is issued, so every stream is always idle and an event is
//! complete once recorded; event times are host times.

use std::ffi::{c_int, c_uint, c_void};
use std::time::Instant;

use crate::driver::{self, check_init, current, lock, Event, HandleKind, Stream};
use crate::types::*;
use crate::{put, rc};

fn create(ph: *mut CUstream, flags: c_uint, priority: c_int) -> Result<(), CUresult> {
    let dev = driver::current_device()?;
    if ph.is_null() || flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = current().map_or(0, |c| c.0);
    let mut g = lock();
    let h = g.new_handle(HandleKind::Stream);
    g.streams.insert(
        h,
        Stream {
            device: dev,
            ctx,
            flags,
            priority: priority.clamp(-5, 0),
        },
    );
    put(ph, h as CUstream)
}

fn destroy(h: CUstream) -> Result<(), CUresult> {
    check_init()?;
    lock()
        .streams
        .remove(&(h as usize))
        .map(|_| ())
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// A stream handle that exists (or a built-in one).
pub fn check_stream(h: CUstream) -> Result<(), CUresult> {
    check_init()?;
    let s = h as usize;
    if is_builtin_stream(s) {
        driver::current_device()?;
        return Ok(());
    }
    lock().stream_device(s).map(|_| ())
}

fn stream_info<T>(h: CUstream, f: impl FnOnce(Option<&Stream>) -> T) -> Result<T, CUresult> {
    check_stream(h)?;
    let g = lock();
    Ok(f(g.streams.get(&(h as usize))))
}

fn check_event(e: CUevent) -> Result<(), CUresult> {
    check_init()?;
    if lock().events.contains_key(&(e as usize)) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_HANDLE)
    }
}

fn event_create(ph: *mut CUevent, flags: c_uint) -> Result<(), CUresult> {
    driver::current_device()?;
    if ph.is_null() || flags > 0xf {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = lock();
    let h = g.new_handle(HandleKind::Event);
    g.events.insert(
        h,
        Event {
            flags,
            recorded: None,
        },
    );
    put(ph, h as CUevent)
}

fn event_record(e: CUevent, s: CUstream) -> Result<(), CUresult> {
    check_stream(s)?;
    match lock().events.get_mut(&(e as usize)) {
        Some(ev) => {
            ev.recorded = Some(Instant::now());
            Ok(())
        }
        None => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

fn event_destroy(e: CUevent) -> Result<(), CUresult> {
    check_init()?;
    lock()
        .events
        .remove(&(e as usize))
        .map(|_| ())
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> Result<(), CUresult> {
    check_init()?;
    if ms.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let g = lock();
    let (Some(a), Some(b)) = (
        g.events.get(&(start as usize)),
        g.events.get(&(end as usize)),
    ) else {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    };
    if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let (Some(ta), Some(tb)) = (a.recorded, b.recorded) else {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    };
    let d = if tb >= ta {
        tb.duration_since(ta).as_secs_f32()
    } else {
        -ta.duration_since(tb).as_secs_f32()
    };
    put(ms, d * 1000.0)
}

/// Runs the host function at once (the stream has nothing pending), outside the driver lock.
fn host_func(s: CUstream, f: CUhostFn, data: *mut c_void) -> Result<(), CUresult> {
    check_stream(s)?;
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: the caller's callback with the caller's data, as cuLaunchHostFunc promises.
    unsafe { f(data) };
    Ok(())
}

fn wait_event(s: CUstream, e: CUevent) -> Result<(), CUresult> {
    check_stream(s)?;
    check_event(e)
}

export! {
    fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) => rc(create(ph, flags, 0));
    fn cuStreamCreateWithPriority(ph: *mut CUstream, flags: c_uint, priority: c_int) => rc(create(ph, flags, priority));
    fn cuStreamDestroy(h: CUstream) => rc(destroy(h));
    fn cuStreamDestroy_v2(h: CUstream) => rc(destroy(h));
    fn cuStreamSynchronize(h: CUstream) => rc(check_stream(h));
    fn cuStreamSynchronize_ptsz(h: CUstream) => rc(check_stream(h));
    fn cuStreamQuery(h: CUstream) => rc(check_stream(h));
    fn cuStreamQuery_ptsz(h: CUstream) => rc(check_stream(h));
    fn cuStreamWaitEvent(h: CUstream, e: CUevent, _flags: c_uint) => rc(wait_event(h, e));
    fn cuStreamWaitEvent_ptsz(h: CUstream, e: CUevent, _flags: c_uint) => rc(wait_event(h, e));
    fn cuStreamGetFlags(h: CUstream, flags: *mut c_uint) => rc(stream_info(h, |s| s.map_or(0, |s| s.flags)).and_then(|f| put(flags, f)));
    fn cuStreamGetFlags_ptsz(h: CUstream, flags: *mut c_uint) => rc(stream_info(h, |s| s.map_or(0, |s| s.flags)).and_then(|f| put(flags, f)));
    fn cuStreamGetPriority(h: CUstream, priority: *mut c_int) => rc(stream_info(h, |s| s.map_or(0, |s| s.priority)).and_then(|p| put(priority, p)));
    fn cuStreamGetPriority_ptsz(h: CUstream, priority: *mut c_int) => rc(stream_info(h, |s| s.map_or(0, |s| s.priority)).and_then(|p| put(priority, p)));
    fn cuStreamGetCtx(h: CUstream, pctx: *mut CUcontext) => rc(stream_info(h, |s| s.map(|s| s.ctx)).and_then(|c| put(pctx, c.or(current().map(|c| c.0)).unwrap_or(0) as CUcontext)));
    fn cuStreamGetCtx_ptsz(h: CUstream, pctx: *mut CUcontext) => rc(stream_info(h, |s| s.map(|s| s.ctx)).and_then(|c| put(pctx, c.or(current().map(|c| c.0)).unwrap_or(0) as CUcontext)));
    fn cuLaunchHostFunc(h: CUstream, f: CUhostFn, data: *mut c_void) => rc(host_func(h, f, data));
    fn cuLaunchHostFunc_ptsz(h: CUstream, f: CUhostFn, data: *mut c_void) => rc(host_func(h, f, data));
    fn cuEventCreate(ph: *mut CUevent, flags: c_uint) => rc(event_create(ph, flags));
    fn cuEventRecord(e: CUevent, h: CUstream) => rc(event_record(e, h));
    fn cuEventRecord_ptsz(e: CUevent, h: CUstream) => rc(event_record(e, h));
    fn cuEventRecordWithFlags(e: CUevent, h: CUstream, _flags: c_uint) => rc(event_record(e, h));
    fn cuEventRecordWithFlags_ptsz(e: CUevent, h: CUstream, _flags: c_uint) => rc(event_record(e, h));
    fn cuEventSynchronize(e: CUevent) => rc(check_event(e));
    fn cuEventQuery(e: CUevent) => rc(check_event(e));
    fn cuEventDestroy(e: CUevent) => rc(event_destroy(e));
    fn cuEventDestroy_v2(e: CUevent) => rc(event_destroy(e));
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) => rc(elapsed(ms, start, end));
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) => rc(elapsed(ms, start, end));
}
