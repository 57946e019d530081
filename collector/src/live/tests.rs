use super::*;
use vramtrace_format::codec;
use vramtrace_format::{flags, Api, Event, Hello, Record, NO_DEVICE};

fn header() -> TraceHeader {
    TraceHeader {
        start_unix_ns: 0,
        start_mono_ns: 0,
        command: vec!["t".into()],
        hostname: "h".into(),
        vramtrace_version: "t".into(),
        extra: vec![],
    }
}

/// A `Live` fed frames directly, each feed followed by every test process's promise (pids 10 to 12), as
/// the collector's ticks follow a quiet process: the replay applies what is older.
struct Fed(Arc<Live>);

impl Fed {
    fn new() -> Fed {
        Fed::of(&header())
    }

    fn of(header: &TraceHeader) -> Fed {
        let written = Arc::new(AtomicU64::new(0));
        Fed(Live::new(
            JobLabels::default(),
            header,
            None,
            0,
            written,
            true,
        ))
    }

    fn feed(&mut self, frames: &[u8], promise: u64) {
        let mut b = frames.to_vec();
        for pid in 10..=12 {
            codec::put_record(
                &mut b,
                &Record::Tick {
                    pid,
                    ts_ns: promise,
                },
            );
        }
        self.0.feed(&b);
    }

    fn figures(&self) -> Figures {
        self.0.figures()
    }

    fn device_used(&self, d: u32) -> u64 {
        self.0.device_used(d)
    }

    fn render(&self, labels: &JobLabels) -> String {
        self.figures().render(labels)
    }

    fn status(&self, labels: &JobLabels) -> Status {
        self.figures().status(labels)
    }
}

#[test]
fn a_command_is_its_program_by_name_and_its_arguments() {
    let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // A checkout's deep path must not hide the program's name from a 32-column table.
    assert_eq!(
        command_line(&argv(&["/check/work/main/target/debug/probe", "--x"])),
        "probe --x"
    );
    assert_eq!(
        command_line(&argv(&["python3", "train.py"])),
        "python3 train.py"
    );
    assert_eq!(command_line(&argv(&["/usr/bin/"])), "");
    assert_eq!(command_line(&[]), "");
    let long = argv(&["p", &"a".repeat(1000), "b"]);
    assert_eq!(command_line(&long).chars().count(), 256);
}

fn ev(api: Api, device: u32, addr: u64, size: u64) -> Event {
    Event {
        ts_ns: 1,
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

fn hello(pid: u32, rank: Option<u32>) -> Record {
    Record::Hello(Hello {
        pid,
        ppid: 1,
        ts_ns: 1,
        cmdline: vec!["x".into()],
        hostname: "h".into(),
        rank,
        local_rank: None,
        slurm_procid: None,
        shim_version: "t".into(),
        extra: vec![],
    })
}

#[test]
fn a_scrape_reads_back_as_the_figures_without_pids_unless_asked() {
    use crate::verbs::top::Sample;
    let mut b = Vec::new();
    for (pid, rank) in [(10u32, 0u32), (11, 1), (12, 1)] {
        let mut h = hello(pid, Some(rank));
        if let Record::Hello(h) = &mut h {
            h.cmdline = vec!["python3".into(), "secret-arg".into()];
        }
        codec::put_record(&mut b, &h);
        let e = ev(
            Api::MemAlloc,
            0,
            0x1000 * u64::from(pid),
            u64::from(pid) << 20,
        );
        codec::put_events(&mut b, pid, &[e]);
    }
    let mut st = Fed::new();
    st.feed(&b, 2);
    let mut labels = JobLabels {
        job: "j \"q\"".into(),
        host: "h".into(),
        ..Default::default()
    };
    for pids in [false, true] {
        labels.pids = pids;
        let om = st.render(&labels);
        assert_eq!(om.contains("pid=\"10\""), pids, "{om}");
        assert!(
            !om.contains("secret-arg") && !om.contains("python3"),
            "{om}"
        );
        for text in [om.clone(), http::classic_text(&om)] {
            let s = Sample::from_metrics(&text).unwrap();
            assert_eq!(s.job, "j \"q\"");
            assert_eq!(s.gpus["0"].used, 33 << 20);
            assert_eq!(s.gpus["0"].allocations, 3);
            let rows: Vec<(&str, &str, u64)> = s
                .procs
                .iter()
                .map(|((p, r, _), row)| (p.as_str(), r.as_str(), row.used))
                .collect();
            if pids {
                assert_eq!(
                    rows,
                    [
                        ("10", "0", 10 << 20),
                        ("11", "1", 11 << 20),
                        ("12", "1", 12 << 20)
                    ]
                );
            } else {
                // Ranks 1's two processes: one series, their sum.
                assert_eq!(rows, [("-", "0", 10 << 20), ("-", "1", 23 << 20)]);
            }
        }
    }
    assert!(Sample::from_metrics("<html>").is_err());
    assert!(Sample::from_metrics("other_metric 1\n").is_err());
}

/// The live metrics and the report read one trace alike: every kind of event that changes what is live
/// (a lost free, host memory, a refused release put back, a double free refused, a context torn down,
/// handles that outlive it), applied by the same core (`model/replay/book.rs`).
#[test]
fn the_live_metrics_and_the_report_agree() {
    let at = |ts: u64, tid: u32, api: Api, device: u32, addr: u64, size: u64| Event {
        ts_ns: ts,
        tid,
        ..ev(api, device, addr, size)
    };
    let refused = |mut e: Event| {
        e.result = 1;
        e.flags = flags::UNDONE;
        e
    };
    let mut frames = Vec::new();
    codec::put_record(&mut frames, &hello(10, Some(0)));
    codec::put_record(&mut frames, &hello(11, Some(1)));
    codec::put_record(
        &mut frames,
        &Record::Devices {
            pid: 10,
            ts_ns: 9,
            uuids: vec![(0, [0xa0; 16]), (1, [0xa1; 16])],
        },
    );
    codec::put_events(
        &mut frames,
        10,
        &[
            at(10, 1, Api::MemAlloc, 0, 0x1000, 100),
            // Its free was never recorded: replaced.
            at(11, 1, Api::MemAlloc, 0, 0x1000, 40),
            // Host memory: no GPU's.
            at(12, 1, Api::MemCreate, NO_DEVICE, 5, 1 << 20),
            at(13, 1, Api::MemCreate, 0, 6, 64),
            at(14, 2, Api::MemAlloc, 1, 0x2000, 70),
            // A release the driver refused after it was published: live again.
            at(15, 2, Api::MemFree, NO_DEVICE, 0x2000, 0),
            refused(at(16, 2, Api::MemFree, NO_DEVICE, 0x2000, 0)),
            // A double free, refused: nothing comes back.
            at(17, 1, Api::MemFree, NO_DEVICE, 0x9999, 0),
            refused(at(18, 1, Api::MemFree, NO_DEVICE, 0x9999, 0)),
            at(19, 1, Api::MemAlloc, 1, 0x3000, 8),
        ],
    );
    codec::put_events(
        &mut frames,
        11,
        &[
            at(20, 1, Api::MemAlloc, 0, 0x5000, 30),
            at(21, 1, Api::MemAlloc, 1, 0x6000, 9),
            at(22, 1, Api::MemCreate, 1, 8, 11),
        ],
    );
    // Process 11's contexts on GPU 1 are torn down: its pointers there go, its handle stays.
    codec::put_record(
        &mut frames,
        &Record::ContextGone {
            pid: 11,
            ts_ns: 23,
            device: 1,
            how: "cuDevicePrimaryCtxReset".into(),
        },
    );
    codec::put_events(&mut frames, 11, &[at(24, 1, Api::MemAlloc, 0, 0x7000, 3)]);
    for pid in [10, 11] {
        codec::put_record(&mut frames, &Record::Tick { pid, ts_ns: 100 });
    }

    let live = Fed::new();
    live.0.feed(&frames);
    let mut trace = codec::encode_header(&header());
    trace.extend_from_slice(&frames);
    let report = crate::model::analyze_reader(&trace[..]).unwrap();

    let mut gpus = 0;
    for d in report.devices.iter().filter(|d| !d.on_host) {
        let Some(g) = d.device else { continue };
        gpus += 1;
        assert_eq!(live.device_used(g), d.in_use_bytes_at_end, "GPU {g} in use");
        assert_eq!(live.figures().gpus()[&g].peak, d.peak_bytes, "GPU {g} peak");
        assert_eq!(
            live.figures().gpus()[&g].allocations,
            d.allocations,
            "GPU {g} allocations"
        );
    }
    assert_eq!(gpus, 2);
    let labels = JobLabels::default();
    let status = live.status(&labels);
    for g in &status.gpus {
        let d = report.device(g.gpu).unwrap();
        assert_eq!(d.uuid.as_deref(), Some(g.uuid.as_str()), "GPU {}", g.gpu);
    }
    // The figures themselves, worked out by hand: GPU 0 = 40 + 64 + 30 + 3, GPU 1 = 70 + 8 + 11.
    assert_eq!((live.device_used(0), live.device_used(1)), (137, 89));
    // The cap's own count, read as the frames came, says the same of each process.
    let counted = live.0.counted();
    let figures = live.figures();
    for p in &report.processes {
        let lp = figures.procs().iter().find(|lp| lp.pid == p.pid).unwrap();
        let live_total: u64 = lp.devices.values().map(|pd| pd.live).sum();
        assert_eq!(live_total, p.live_bytes_at_end, "pid {}", p.pid);
        let c = counted.iter().find(|c| c.pid == p.pid).unwrap();
        let cap_total: u64 = c.bytes.iter().map(|b| b.2).sum();
        assert_eq!(cap_total, p.live_bytes_at_end, "pid {}", p.pid);
    }
}

/// A GPU's cap and size follow the report's rule, whatever told them: the run's header, an out-of-memory
/// record, the driver's `cuMemGetInfo`; and a GPU the header names but no process used is served too.
#[test]
fn caps_and_totals_are_the_reports() {
    let mut h = header();
    for (k, v) in [
        ("cap_bytes.0", "1000"),
        ("device_total.0", "5000"),
        ("device_total.1", "8000"),
        ("cap_bytes.3", "77"),
    ] {
        h.extra.push((k.into(), v.into()));
    }
    let mut frames = Vec::new();
    codec::put_record(&mut frames, &hello(10, Some(0)));
    codec::put_events(
        &mut frames,
        10,
        &[
            ev(Api::MemAlloc, 0, 0x1000, 100),
            Event {
                ts_ns: 2,
                addr: 7000,
                size: 3000,
                ..ev(Api::MemGetInfo, 1, 0, 0)
            },
        ],
    );
    let mut o = oom(10, 3);
    if let Record::Oom(x) = &mut o {
        x.cap_bytes = Some(900);
        x.device_total_bytes = Some(6000);
    }
    codec::put_record(&mut frames, &o);
    codec::put_record(
        &mut frames,
        &Record::Tick {
            pid: 10,
            ts_ns: 100,
        },
    );
    let live = Fed::of(&h);
    live.0.feed(&frames);
    let mut trace = codec::encode_header(&h);
    trace.extend_from_slice(&frames);
    let report = crate::model::analyze_reader(&trace[..]).unwrap();
    let figures = live.figures();
    let gpus = figures.gpus();
    for g in [0, 1] {
        let d = report.device(g).unwrap();
        assert_eq!(
            (gpus[&g].cap, gpus[&g].total),
            (d.cap_bytes, d.total_bytes),
            "GPU {g}"
        );
    }
    // The header's cap over the record's; the record's size over the header's; the driver's over both.
    assert_eq!((gpus[&0].cap, gpus[&0].total), (Some(1000), Some(6000)));
    assert_eq!(gpus[&1].total, Some(7000));
    assert_eq!((gpus[&3].cap, gpus[&3].used), (Some(77), 0));
}

/// GPUs are named as their processes' drivers name them; an ordinal two processes see as different GPUs
/// names none for the job, while each process's own series keeps its own.
/// An exec'd image of a pid is another process: its GPU names are its own, not its predecessor's.
#[test]
fn an_execd_image_keeps_its_own_gpu_names() {
    let (x, y) = ([0xaa; 16], [0xbb; 16]);
    let mut b = Vec::new();
    for (ts, u, addr) in [(1u64, x, 0x1000u64), (10, y, 0x2000)] {
        let mut h = hello(10, None);
        if let Record::Hello(h) = &mut h {
            h.ts_ns = ts;
        }
        codec::put_record(&mut b, &h);
        codec::put_record(
            &mut b,
            &Record::Devices {
                pid: 10,
                ts_ns: ts + 1,
                uuids: vec![(0, u)],
            },
        );
        let e = Event {
            ts_ns: ts + 2,
            ..ev(Api::MemAlloc, 0, addr, 5)
        };
        codec::put_events(&mut b, 10, &[e]);
        // Its last word before the exec (its series stay until its connection's end is read).
        codec::put_record(
            &mut b,
            &Record::Goodbye {
                pid: 10,
                ts_ns: ts + 3,
            },
        );
    }
    let mut s = Fed::new();
    s.feed(&b, 20);
    let text = s.render(&JobLabels {
        pids: true,
        ..JobLabels::default()
    });
    for u in [x, y] {
        let want = format!("uuid=\"{}\",pid=\"10\"", vramtrace_format::gpu_uuid(&u));
        assert!(text.contains(&want), "{want}: {text}");
    }
}

#[test]
fn gpus_are_named_by_the_drivers_uuids() {
    let mut b = Vec::new();
    let (a0, a1, b1) = ([0xa0; 16], [0xa1; 16], [0xb1; 16]);
    for (pid, uuids) in [(10, vec![(0, a0), (1, a1)]), (11, vec![(0, a0), (1, b1)])] {
        codec::put_record(&mut b, &hello(pid, None));
        codec::put_record(
            &mut b,
            &Record::Devices {
                pid,
                ts_ns: 2,
                uuids,
            },
        );
        codec::put_events(
            &mut b,
            pid,
            &[
                ev(Api::MemAlloc, 0, 0x1000, 5),
                ev(Api::MemAlloc, 1, 0x2000, 7),
            ],
        );
    }
    let mut s = Fed::new();
    s.feed(&b, 3);
    let labels = JobLabels {
        job: "j".into(),
        host: "h".into(),
        uuids: vec!["GPU-env0".into(), "GPU-env1".into()],
        pids: true,
    };
    let st = s.status(&labels);
    let gpu = |d: u32| st.gpus.iter().find(|g| g.gpu == d).unwrap().uuid.clone();
    assert_eq!(
        gpu(0),
        vramtrace_format::gpu_uuid(&a0),
        "the drivers' word over the environment's"
    );
    assert_eq!(
        gpu(1),
        "GPU-env1",
        "two GPUs at one ordinal: the environment's, if any"
    );
    let text = s.render(&labels);
    let used = |pid: u32, d: u32, u: &[u8; 16]| {
        format!(
            "vramtrace_memory_used_bytes{{job=\"j\",host=\"h\",gpu=\"{d}\",uuid=\"{}\",pid=\"{pid}\",rank=\"\"}}",
            vramtrace_format::gpu_uuid(u)
        )
    };
    assert!(text.contains(&used(10, 1, &a1)), "{text}");
    assert!(text.contains(&used(11, 1, &b1)), "{text}");
    assert!(text.contains(&used(11, 0, &a0)), "{text}");
}

#[test]
fn live_bytes_follow_allocations_frees_and_ends() {
    let mut s = Fed::new();
    let mut b = Vec::new();
    codec::put_record(&mut b, &hello(10, Some(3)));
    codec::put_events(
        &mut b,
        10,
        &[
            ev(Api::MemAlloc, 0, 0x1000, 100),
            ev(Api::MemAlloc, 1, 0x2000, 50),
            ev(Api::MemCreate, 0, 7, 30),
            ev(Api::MemFree, NO_DEVICE, 0x1000, 0),
            ev(Api::MemAlloc, 0, 0x3000, 20),
        ],
    );
    codec::put_events(&mut b, 11, &[ev(Api::MemAlloc, 0, 0x1000, 5)]);
    let mut refused = ev(Api::MemAlloc, 0, 0, 1 << 40);
    refused.result = 2;
    refused.flags = flags::CAP_REFUSED;
    codec::put_events(&mut b, 11, &[refused]);
    codec::put_record(
        &mut b,
        &Record::Dropped {
            pid: 11,
            ts_ns: 2,
            count: 4,
        },
    );
    s.feed(&b, 3);
    assert_eq!(s.device_used(0), 30 + 20 + 5);
    assert_eq!(s.device_used(1), 50);
    assert_eq!(s.figures().gpus()[&0].peak, 130);
    let text = s.render(&JobLabels {
        job: "j".into(),
        host: "h".into(),
        uuids: vec![],
        pids: true,
    });
    assert!(
        text.contains(
            "vramtrace_memory_used_bytes{job=\"j\",host=\"h\",gpu=\"0\",uuid=\"\",pid=\"10\",rank=\"3\"} 50"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "vramtrace_memory_peak_bytes{job=\"j\",host=\"h\",gpu=\"0\",uuid=\"\",pid=\"10\",rank=\"3\"} 130"
        ),
        "{text}"
    );
    assert!(
        text.contains("vramtrace_cap_refusals_total{job=\"j\",host=\"h\",gpu=\"0\",uuid=\"\"} 1")
    );
    assert!(text.contains("vramtrace_events_dropped_total{job=\"j\",host=\"h\"} 4"));
    assert!(
        text.contains("vramtrace_allocations_total{job=\"j\",host=\"h\",gpu=\"0\",uuid=\"\"} 4")
    );
    assert!(text.ends_with("# EOF\n"));
    // The end of pid 10: its memory is given back and its series go.
    let mut e = Vec::new();
    codec::put_record(
        &mut e,
        &Record::ProcessEnd {
            pid: 10,
            ts_ns: 3,
            kind: vramtrace_format::EndKind::Goodbye,
        },
    );
    s.feed(&e, 20);
    assert_eq!(s.device_used(0), 5);
    assert_eq!(s.device_used(1), 0);
    let text = s.render(&JobLabels {
        pids: true,
        ..JobLabels::default()
    });
    assert!(!text.contains("pid=\"10\""), "{text}");
    assert!(text.contains("pid=\"11\""), "{text}");
}

fn oom(pid: u32, ts_ns: u64) -> Record {
    Record::Oom(vramtrace_format::Oom {
        pid,
        tid: 1,
        ts_ns,
        device: 0,
        api: Api::MemAlloc as u8,
        flags: 0,
        requested_bytes: 1 << 30,
        result: 2,
        device_free_bytes: None,
        device_total_bytes: None,
        cap_bytes: None,
        job_used_bytes: None,
        process_used_bytes: None,
        extra: vec![],
    })
}

/// Another user (a uid of nobody's) may take the attach folder's name first, open it to all, or plant links:
/// the folder is refused, and the file is never written through a link.
#[test]
fn the_attach_folder_and_file_are_ours_alone() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::Path;
    let base = std::env::temp_dir().join(format!("vt-attach-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let addr: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    // Made by us: 0700, and the file 0600.
    let ok = base.join("ours");
    let p = write_attach(ok.clone(), &addr, "j", "c", Path::new("t")).unwrap();
    assert_eq!(std::fs::metadata(&ok).unwrap().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
    // A link planted where our file goes: replaced, its target untouched.
    let victim = base.join("victim");
    std::fs::write(&victim, "theirs").unwrap();
    std::fs::remove_file(&p).unwrap();
    std::os::unix::fs::symlink(&victim, &p).unwrap();
    write_attach(ok.clone(), &addr, "j", "c", Path::new("t")).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "theirs");
    assert!(std::fs::symlink_metadata(&p).unwrap().is_file());
    // Open to others: refused.
    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = write_attach(open.clone(), &addr, "j", "c", Path::new("t")).unwrap_err();
    assert!(e.to_string().contains("open to others"), "{e}");
    // A link to a folder: refused.
    let link = base.join("link");
    std::os::unix::fs::symlink(&ok, &link).unwrap();
    let e = private_dir(link).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
    // Another user's folder (as root here, CI's case: give it to nobody): refused, nothing written in it.
    // SAFETY: no arguments and no preconditions; it cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let theirs = base.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = write_attach(theirs.clone(), &addr, "j", "c", Path::new("t")).unwrap_err();
        assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
        assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn refusals_recovered_from_are_not_errors_and_the_frameworks_figures_are_served() {
    let mut s = Fed::new();
    let mut b = Vec::new();
    codec::put_record(&mut b, &hello(10, Some(0)));
    codec::put_record(&mut b, &hello(11, Some(1)));
    // pid 10: refused, then its thread allocates again (a cache flush and a retry): recovered.
    codec::put_record(&mut b, &oom(10, 5));
    // Its thread allocates again after the refusal: recovered from.
    let after = |ts_ns, e| Event { ts_ns, ..e };
    codec::put_events(&mut b, 10, &[after(6, ev(Api::MemAlloc, 0, 0x1000, 100))]);
    // pid 11: refused twice, then PyTorch raises: one error, whatever the program does next.
    codec::put_record(&mut b, &oom(11, 5));
    codec::put_record(&mut b, &oom(11, 6));
    codec::put_record(
        &mut b,
        &Record::Bridge(vramtrace_format::Bridge {
            pid: 11,
            tid: 1,
            ts_ns: 7,
            what: "oom".into(),
            device: 0,
            ack: true,
            doc: "{}".into(),
        }),
    );
    codec::put_events(&mut b, 11, &[after(8, ev(Api::MemAlloc, 0, 0x2000, 10))]);
    codec::put_record(
        &mut b,
        &Record::FrameworkSample(vramtrace_format::FrameworkSample {
            pid: 11,
            ts_ns: 8,
            framework: vramtrace_format::Framework::Torch,
            device: 0,
            allocated: 7,
            reserved: 10,
            active: 7,
            inactive_split: 0,
            requested: 7,
            alloc_retries: 1,
            ooms: 1,
        }),
    );
    s.feed(&b, 9);
    let labels = JobLabels {
        job: "j".into(),
        host: "h".into(),
        uuids: vec![],
        pids: true,
    };
    let text = s.render(&labels);
    assert!(
        text.contains("vramtrace_oom_total{job=\"j\",host=\"h\",gpu=\"0\",uuid=\"\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("vramtrace_oom_refusals_total{job=\"j\",host=\"h\",gpu=\"0\",uuid=\"\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "vramtrace_framework_allocated_bytes{job=\"j\",host=\"h\",gpu=\"0\",uuid=\"\",pid=\"11\",rank=\"1\",framework=\"pytorch\"} 7"
        ),
        "{text}"
    );
    assert!(
        text.contains("vramtrace_framework_reserved_bytes{"),
        "{text}"
    );
    // A refusal still open when its process ends was an error (it died of it).
    let mut e = Vec::new();
    codec::put_record(&mut e, &oom(10, 9));
    codec::put_record(
        &mut e,
        &Record::ProcessEnd {
            pid: 10,
            ts_ns: 10,
            kind: vramtrace_format::EndKind::Vanished,
        },
    );
    s.feed(&e, 20);
    let text = s.render(&labels);
    assert!(
        text.contains("vramtrace_oom_total{job=\"j\",host=\"h\",gpu=\"0\",uuid=\"\"} 2\n"),
        "{text}"
    );
}

#[test]
fn a_release_the_driver_refused_is_live_again() {
    let mut s = Fed::new();
    let mut b = Vec::new();
    let mut undone = ev(Api::MemFree, NO_DEVICE, 0x1000, 0);
    undone.result = 1;
    undone.flags = flags::UNDONE;
    let mut wrong = undone;
    wrong.addr = 0x9000;
    codec::put_events(
        &mut b,
        10,
        &[
            ev(Api::MemAlloc, 0, 0x1000, 100),
            ev(Api::MemFree, NO_DEVICE, 0x1000, 0),
            undone,
            // A double free: nothing was live there, nothing comes back.
            ev(Api::MemFree, NO_DEVICE, 0x9000, 0),
            wrong,
        ],
    );
    s.feed(&b, 3);
    assert_eq!(s.device_used(0), 100);
    // Then freed for real.
    let mut f = Vec::new();
    let later = Event {
        ts_ns: 4,
        ..ev(Api::MemFree, NO_DEVICE, 0x1000, 0)
    };
    codec::put_events(&mut f, 10, &[later]);
    s.feed(&f, 5);
    assert_eq!(s.device_used(0), 0);
}

/// NCCL makes host buffers with `cuMemCreate` and a host location: the shim records them on no device.
/// They are no GPU's memory: no GPU's series moves, and no series names a GPU that does not exist.
#[test]
fn memory_on_no_gpu_is_in_no_gpu_series() {
    let mut s = Fed::new();
    let mut b = Vec::new();
    codec::put_record(&mut b, &hello(10, Some(0)));
    codec::put_events(
        &mut b,
        10,
        &[
            ev(Api::MemAlloc, 0, 0x1000, 100),
            ev(Api::MemCreate, NO_DEVICE, 9, 2 << 20),
        ],
    );
    s.feed(&b, 3);
    assert_eq!(s.device_used(0), 100);
    let text = s.render(&JobLabels::default());
    assert!(!text.contains(&NO_DEVICE.to_string()), "{text}");
    assert!(
        !text.contains("gpu=\"0\",uuid=\"\",pid=\"10\",rank=\"0\"} 2097252"),
        "{text}"
    );
    let mut b = Vec::new();
    let later = Event {
        ts_ns: 4,
        ..ev(Api::MemRelease, NO_DEVICE, 9, 0)
    };
    codec::put_events(&mut b, 10, &[later]);
    s.feed(&b, 5);
    assert_eq!(
        s.device_used(0),
        100,
        "its release takes nothing from GPU 0"
    );
}

#[test]
fn whole_prefix_stops_inside_a_frame() {
    let mut b = Vec::new();
    codec::put_record(&mut b, &hello(1, None));
    let one = b.len();
    codec::put_record(&mut b, &hello(2, None));
    assert_eq!(whole_prefix(&b), b.len());
    assert_eq!(whole_prefix(&b[..b.len() - 1]), one);
    assert_eq!(whole_prefix(&b[..3]), 0);
}
