//! Builds traces in memory for the tests.
#![allow(dead_code)]

use vramtrace_format::codec::{encode_header, put_record};
use vramtrace_format::{flags, Api, EndKind, Event, Hello, Record, TraceHeader, NO_DEVICE};

pub const START: u64 = 1_000_000_000;
pub const MS: u64 = 1_000_000;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

pub fn header() -> TraceHeader {
    TraceHeader {
        start_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: START,
        command: vec!["python".into(), "train.py".into(), "--say \"hi\"\n".into()],
        hostname: "node7".into(),
        vramtrace_version: "test".into(),
        extra: vec![],
    }
}

/// An event at `ms` milliseconds after the trace start.
pub fn ev(ms: u64, api: Api, device: u32, addr: u64, size: u64) -> Event {
    Event {
        ts_ns: START + ms * MS,
        tid: 1,
        api,
        flags: 0,
        device,
        result: 0,
        addr,
        size,
        aux: 0,
        stack: 0,
    }
}

pub fn alloc(ms: u64, device: u32, addr: u64, size: u64) -> Event {
    ev(ms, Api::MemAlloc, device, addr, size)
}

pub fn free(ms: u64, addr: u64) -> Event {
    ev(ms, Api::MemFree, NO_DEVICE, addr, 0)
}

pub fn failed(mut e: Event, result: u32) -> Event {
    e.result = result;
    e.addr = 0;
    e
}

pub fn ptsz(mut e: Event) -> Event {
    e.flags |= flags::PTSZ;
    e
}

pub fn hello(pid: u32, ms: u64) -> Record {
    Record::Hello(Hello {
        pid,
        ppid: 1,
        ts_ns: START + ms * MS,
        cmdline: vec![format!("/usr/bin/worker{pid}"), "--x".into()],
        hostname: "node7".into(),
        rank: Some(pid % 10),
        local_rank: Some(0),
        slurm_procid: None,
        shim_version: "test".into(),
        extra: vec![],
    })
}

pub fn events(pid: u32, evs: Vec<Event>) -> Record {
    Record::Events { pid, events: evs }
}

pub fn end(pid: u32, ms: u64, kind: EndKind) -> Record {
    Record::ProcessEnd {
        pid,
        ts_ns: START + ms * MS,
        kind,
    }
}

pub fn tick(pid: u32, ms: u64) -> Record {
    Record::Tick {
        pid,
        ts_ns: START + ms * MS,
    }
}

pub fn trace(records: &[Record]) -> Vec<u8> {
    let mut t = encode_header(&header());
    for r in records {
        put_record(&mut t, r);
    }
    t
}
