//! One trace for each rule of the diagnosis and each branch of its advice (docs/OOM.md) that the fixtures and
//! traces.rs do not reach, so that a golden pins every sentence the diagnosis can say.

use super::traces::{
    growth_trace_at, keeping_loop, oom_at, oom_rec, refused, torch_oom, torch_oom_with,
};
use super::traces::{torch_sample, training};
use super::*;
use vramtrace_format::codec::{encode_header, put_record};
use vramtrace_format::{Api, EndKind, Oom, Record};

/// `records` under `header`, encoded.
fn traced(header: TraceHeader, records: &[Record]) -> Vec<u8> {
    let mut t = encode_header(&header);
    for r in records {
        put_record(&mut t, r);
    }
    t
}

/// A process whose PyTorch allocated bytes rise step after step (its cache, as the driver sees it, by a 256 MiB
/// segment a step, at a call site when `sites`) until a 2 GiB request fails on an 8 GiB device.
fn torch_growth(sites: bool) -> Vec<u8> {
    let mut recs = vec![hello(100, 0)];
    if sites {
        recs.push(stack(100, 1, vec![], vec![py("train.py", "forward", 51)]));
    }
    let mut evs = vec![alloc(1, 0, 0x1000, GIB)];
    for k in 0..20u64 {
        // A segment kept each step, and one for the step's temporaries, given back at its end.
        let e = alloc(10 + 50 * k, 0, 0x10_0000 + k * 0x1000, 256 * MIB);
        evs.push(if sites { with_stack(e, 1) } else { e });
        evs.push(alloc(20 + 50 * k, 0, 0x2000, 512 * MIB));
        evs.push(free(40 + 50 * k, 0x2000));
    }
    recs.push(events(100, evs));
    for k in 0..20u64 {
        let kept = 256 * MIB * k;
        recs.push(torch_sample(100, 12 + 50 * k, GIB + kept));
        recs.push(torch_sample(100, 30 + 50 * k, GIB + kept + 128 * MIB));
        recs.push(torch_sample(100, 45 + 50 * k, GIB + kept + 256 * MIB));
    }
    let mut e = refused(1_010, 0, 2 * GIB, 0);
    e.tid = 1;
    recs.push(events(100, vec![e]));
    recs.push(oom_rec(100, 1_010, 2 * GIB, GIB, 8 * GIB, None));
    recs.push(end(100, 1_020, EndKind::Vanished));
    trace(&recs)
}

/// One trace for each rule of the diagnosis and each branch of its advice that the fixtures and the traces
/// above do not reach, by name (`diag_<name>.vtrace`).
pub fn diagnosis_traces() -> Vec<(&'static str, Vec<u8>)> {
    use vramtrace_format::flags::CAP_REFUSED;
    let mut v = Vec::new();

    // Refused by the cap, the job's bytes from the cap's ledger.
    let mut o = oom_at(100, 30, 0, GIB, Some(70 * GIB), Some(80 * GIB));
    o.flags = CAP_REFUSED;
    o.cap_bytes = Some(8 * GIB);
    o.job_used_bytes = Some(7 * GIB + 512 * MIB);
    o.process_used_bytes = Some(7 * GIB + 512 * MIB);
    v.push((
        "cap_refused",
        traced(
            capped_header(8 * GIB, 80 * GIB),
            &[
                hello(100, 0),
                events(
                    100,
                    vec![
                        alloc(10, 0, 0xa000, 6 * GIB),
                        alloc(20, 0, 0xb000, GIB + 512 * MIB),
                        refused(30, 0, GIB, CAP_REFUSED),
                    ],
                ),
                Record::Oom(o),
                end(100, 40, EndKind::Vanished),
            ],
        ),
    ));

    // Over a cap that was not enforcing, on the second of two GPUs (the cap's flag names the device), and the
    // cap that would have fitted is more than the device has.
    let mut o = oom_at(100, 30, 1, 3 * GIB, Some(GIB), Some(11 * GIB));
    o.cap_bytes = Some(8 * GIB);
    o.job_used_bytes = Some(9 * GIB);
    v.push((
        "over_cap",
        trace(&[
            hello(100, 0),
            events(
                100,
                vec![
                    alloc(5, 0, 0x9000, GIB),
                    alloc(10, 1, 0xa000, 9 * GIB),
                    refused(30, 1, 3 * GIB, 0),
                ],
            ),
            Record::Oom(o),
        ]),
    ));

    // The job's own allocations fill the device.
    v.push((
        "pressure",
        trace(&[
            hello(100, 0),
            events(
                100,
                vec![
                    alloc(10, 0, 0xa000, 40 * GIB),
                    alloc(20, 0, 0xb000, 38 * GIB),
                    alloc(21, 0, 0xc000, 3 * MIB),
                    free(22, 0xc000),
                    refused(30, 0, 2 * GIB, 0),
                ],
            ),
            Record::Oom(oom_at(
                100,
                30,
                0,
                2 * GIB,
                Some(GIB + 512 * MIB),
                Some(80 * GIB),
            )),
            end(100, 31, EndKind::Goodbye),
        ]),
    ));

    // The driver had the bytes free.
    v.push((
        "free_at_least_request",
        trace(&[
            hello(100, 0),
            events(
                100,
                vec![alloc(10, 0, 0xa000, 60 * GIB), refused(30, 0, 4 * GIB, 0)],
            ),
            Record::Oom(oom_at(100, 30, 0, 4 * GIB, Some(10 * GIB), Some(80 * GIB))),
        ]),
    ));

    // The stream-ordered pool kept what was freed just before.
    let mut async_alloc = ev(10, Api::MemAllocAsync, 0, 0xd000, 2 * GIB);
    async_alloc.aux = 7;
    v.push((
        "pool_cached_async_frees",
        trace(&[
            hello(100, 0),
            events(
                100,
                vec![
                    alloc(5, 0, 0xa000, 50 * GIB),
                    async_alloc,
                    ev(20, Api::MemFreeAsync, 0, 0xd000, 0),
                    ev(2100, Api::MemAllocAsync, 0, 0xe000, GIB),
                    ev(2150, Api::MemAllocAsync, 0, 0xf000, 512 * MIB),
                    ev(2500, Api::MemFreeAsync, 0, 0xe000, 0),
                    ev(2900, Api::MemFreeAsync, 0, 0xf000, 0),
                    refused(3000, 0, 2 * GIB, 0),
                ],
            ),
            Record::Oom(oom_at(100, 3000, 0, 2 * GIB, Some(GIB), Some(80 * GIB))),
        ]),
    ));

    // Something else holds the device; an async free beside it, less than the shortfall.
    let mut async_alloc = ev(5, Api::MemAllocAsync, 0, 0xd000, 256 * MIB);
    async_alloc.aux = 7;
    v.push((
        "outside_excess",
        trace(&[
            hello(100, 0),
            events(
                100,
                vec![
                    alloc(10, 0, 0xa000, 2 * GIB),
                    async_alloc,
                    ev(20, Api::MemFreeAsync, 0, 0xd000, 0),
                    refused(30, 0, 4 * GIB, 0),
                ],
            ),
            Record::Oom(oom_at(100, 30, 0, 4 * GIB, Some(GIB), Some(80 * GIB))),
        ]),
    ));

    // Without the driver's figures: the device's size from the header.
    let mut sized = header();
    sized.extra = vec![("device_total.0".into(), (16 * GIB).to_string())];
    let blind = |req: u64, async_freed: u64| {
        let mut evs = vec![alloc(10, 0, 0xa000, 10 * GIB)];
        if async_freed > 0 {
            let mut a = ev(12, Api::MemAllocAsync, 0, 0xd000, async_freed);
            a.aux = 7;
            evs.extend([a, ev(20, Api::MemFreeAsync, 0, 0xd000, 0)]);
        }
        evs.push(refused(30, 0, req, 0));
        vec![
            hello(100, 0),
            events(100, evs),
            Record::Oom(oom_at(100, 30, 0, req, None, None)),
        ]
    };
    v.push((
        "no_driver_figures_fits_total",
        traced(sized.clone(), &blind(2 * GIB, 256 * MIB)),
    ));
    v.push((
        "no_driver_figures_pool",
        traced(sized.clone(), &blind(GIB, GIB + 512 * MIB)),
    ));
    v.push(("no_driver_figures", traced(sized, &blind(6 * GIB, 0))));
    // Nothing known at all.
    v.push(("nothing_known", trace(&blind(GIB, 0))));

    // The request alone is larger than the cap.
    let mut o = oom_at(100, 30, 0, 10 * GIB, Some(70 * GIB), Some(80 * GIB));
    o.flags = CAP_REFUSED;
    o.cap_bytes = Some(8 * GIB);
    v.push((
        "request_over_cap",
        traced(
            capped_header(8 * GIB, 80 * GIB),
            &[
                hello(100, 0),
                events(
                    100,
                    vec![
                        alloc(10, 0, 0xa000, GIB),
                        refused(30, 0, 10 * GIB, CAP_REFUSED),
                    ],
                ),
                Record::Oom(o),
                end(100, 40, EndKind::Vanished),
            ],
        ),
    ));

    // Pinned host memory could not be had.
    let mut host = failed(
        ev(10, Api::MemCreate, vramtrace_format::NO_DEVICE, 0, GIB),
        2,
    );
    host.tid = 1;
    v.push((
        "host_memory",
        trace(&[
            hello(100, 0),
            events(100, vec![alloc(5, 0, 0xa000, GIB), host]),
            Record::Oom(Oom {
                tid: 1,
                device: vramtrace_format::NO_DEVICE,
                api: Api::MemCreate as u8,
                device_free_bytes: None,
                device_total_bytes: None,
                ..oom_at(100, 10, 0, GIB, None, None)
            }),
            end(100, 30, EndKind::Vanished),
        ]),
    ));

    // Growth seen cycle over cycle beside pressure: the leak's groups, its advice.
    v.push(("leak_pressure", trace(&training(10, true))));

    // A buffer kept each step under a cap, by a program without a caching allocator.
    v.push((
        "growth_under_cap",
        traced(
            capped_header(6 * GIB, 80 * GIB),
            &keeping_loop(GIB, 256 * MIB, 1000, Some(6 * GIB), 80 * GIB),
        ),
    ));

    // Growth that decided the error, from transformers' KV cache and from an optimizer's state, named by
    // their call sites.
    let kv = "/venv/lib/python3.12/site-packages/transformers/cache_utils.py";
    let site = |file: &str, function: &str, line: u32, caller: &str| {
        vec![py(file, function, line), py(caller, "step", 30 + line)]
    };
    v.push((
        "growth_kv_cache",
        growth_trace_at(
            [
                site(kv, "DynamicLayer.update", 12, "/srv/app/serve.py"),
                site(kv, "DynamicLayer.update", 20, "/srv/app/serve.py"),
            ],
            512 * MIB,
            256 * MIB,
        ),
    ));
    let adam = "/venv/lib/python3.12/site-packages/torch/optim/adam.py";
    v.push((
        "growth_optimizer",
        growth_trace_at(
            [
                site(adam, "_init_group", 12, "train.py"),
                site(adam, "_init_group", 20, "train.py"),
            ],
            512 * MIB,
            256 * MIB,
        ),
    ));

    // A serving loop's request from a KV cache, whatever the cause: bounding it is said second.
    let kv = vec![
        py(
            "/venv/lib/python3.12/site-packages/transformers/cache_utils.py",
            "DynamicLayer.update",
            147,
        ),
        py("/srv/app/serve.py", "answer", 30),
    ];
    let mut e = refused(30, 0, 2 * GIB, 0);
    e.stack = 1;
    e.tid = 1;
    v.push((
        "kv_cache_request",
        trace(&[
            hello(100, 0),
            stack(100, 1, vec![], kv),
            events(100, vec![alloc(1, 0, 0xa000, 70 * GIB), e]),
            oom_rec(100, 30, 2 * GIB, GIB, 80 * GIB, None),
            end(100, 40, EndKind::Vanished),
        ]),
    ));

    // PyTorch's allocated bytes rising step after step with no line to name (no history, no call sites): the
    // advice says how to get one. With call sites on the driver's allocations: the code that grew the cache.
    v.push(("growth_no_line", torch_growth(false)));
    v.push(("growth_cache_sites", torch_growth(true)));

    // The job fills the device, PyTorch's figures beside the driver's: its tensors and its cache.
    let mut e = refused(10, 0, 9 * GIB, 0);
    e.tid = 1;
    v.push((
        "pressure_pytorch",
        trace(&[
            hello(100, 0),
            events(100, vec![alloc(1, 0, 0xa000, 70 * GIB), e]),
            torch_sample(100, 5, 68 * GIB),
            oom_rec(100, 10, 9 * GIB, 7 * GIB, 80 * GIB, None),
            torch_oom(100, 11, 9 * GIB, 68 * GIB, 70 * GIB),
            end(100, 20, EndKind::Vanished),
        ]),
    ));

    // More errors than snapshots are kept of: the rest are counted.
    let mut recs = vec![hello(100, 0), events(100, vec![alloc(1, 0, 0xa000, GIB)])];
    for i in 0..20u64 {
        recs.push(events(100, vec![refused(10 + i, 0, 2 * GIB, 0)]));
        recs.push(Record::Oom(oom_at(
            100,
            10 + i,
            0,
            2 * GIB,
            Some(GIB),
            Some(2 * GIB),
        )));
    }
    v.push(("many_errors", trace(&recs)));

    // Fragmentation of PyTorch's cache under a cap, the allocator already set for it (expandable segments, a
    // max split size): the advice skips those; its settings in full.
    let mut o = oom_at(100, 30, 0, 4 * GIB, Some(40 * GIB), Some(80 * GIB));
    o.tid = 1;
    o.flags = CAP_REFUSED;
    o.cap_bytes = Some(40 * GIB);
    v.push((
        "cache_fragmented_cap",
        traced(
            capped_header(40 * GIB, 80 * GIB),
            &[
                hello(100, 0),
                events(
                    100,
                    vec![alloc(10, 0, 0xa000, 38 * GIB), {
                        let mut e = refused(30, 0, 4 * GIB, CAP_REFUSED);
                        e.tid = 1;
                        e
                    }],
                ),
                Record::Oom(o),
                torch_oom_with(
                    100,
                    31,
                    4 * GIB,
                    20 * GIB,
                    38 * GIB,
                    &[
                        ("backend", "native"),
                        ("expandable_segments", "True"),
                        ("max_split_size", "536870912"),
                        ("garbage_collection_threshold", "0.8"),
                        (
                            "alloc_conf",
                            "expandable_segments:True,max_split_size_mb:512",
                        ),
                        ("largest_free_block", "1073741824"),
                        ("free_in_live_segments", "19327352832"),
                        ("thread", "MainThread"),
                    ],
                ),
                end(100, 40, EndKind::Vanished),
            ],
        ),
    ));
    v
}
