//! The live figures as they are served: OpenMetrics text for `/metrics`, and the typed status `top` reads.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::figures::{Dev, Figures, Proc};
use super::labels::{command_line, JobLabels};

/// A gauge's value: OpenMetrics gauges here are i64, and a figure past it (a trace's own nonsense) is shown at
/// the most, never as a negative.
fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A series' labels: the job's, then the GPU's, the process's or the framework's where they apply.
type L = Vec<(&'static str, String)>;

/// The families `/metrics` serves: filled from the figures, then registered in the order they are served.
#[derive(Default)]
struct Families {
    used: Family<L, Gauge>,
    peak: Family<L, Gauge>,
    dev_used: Family<L, Gauge>,
    dev_peak: Family<L, Gauge>,
    cap: Family<L, Gauge>,
    total: Family<L, Gauge>,
    allocs: Family<L, Counter>,
    refusals: Family<L, Counter>,
    ooms: Family<L, Counter>,
    oom_refusals: Family<L, Counter>,
    dropped: Family<L, Counter>,
    procs: Family<L, Gauge>,
    fw_allocated: Family<L, Gauge>,
    fw_reserved: Family<L, Gauge>,
}

/// The job's labels (`job`, `host`), then `extra`.
fn job(labels: &JobLabels, extra: &[(&'static str, String)]) -> L {
    let mut l = vec![("job", labels.job.clone()), ("host", labels.host.clone())];
    l.extend_from_slice(extra);
    l
}

impl Figures {
    /// The `uuid` label of the job's series on ordinal `d`: what the processes' drivers said, else what
    /// `CUDA_VISIBLE_DEVICES` named, else empty.
    fn uuid_of<'a>(&'a self, labels: &'a JobLabels, d: u32) -> &'a str {
        match self.uuids().get(&d) {
            Some(Some(u)) => u,
            _ => labels.uuid(d),
        }
    }

    /// ended has no series left.
    pub fn render(&self, labels: &JobLabels) -> String {
        let f = Families::default();
        self.process_series(labels, &f);
        self.device_series(labels, &f);
        let mut reg = Registry::default();
        f.register(&mut reg);
        let mut out = String::with_capacity(256 + 300 * self.processes());
        if encode(&mut out, &reg).is_err() {
            out.clear();
            let _ = writeln!(out, "# EOF");
        }
        out
    }

    /// Each process's series per GPU, summed where processes share their labels (no `pid` label).
    fn process_series(&self, labels: &JobLabels, f: &Families) {
        let mut pids: Vec<(u32, &Proc)> = self.procs().iter().map(|p| (p.pid, p)).collect();
        pids.sort_by_key(|(pid, _)| *pid);
        // Without `pid` labels, processes of one rank (or of none) on one GPU share a series: their sums (a peak
        // is then the most each held, added: a bound, not a moment).
        let mut sums: BTreeMap<L, [u64; 2]> = BTreeMap::new();
        let mut fw_sums: BTreeMap<L, [u64; 2]> = BTreeMap::new();
        for (pid, p) in pids {
            for (d, pd) in &p.devices {
                // A process's series name its own GPU: its ordinal may be another process's other GPU.
                let uuid = p
                    .uuids
                    .get(d)
                    .map_or(self.uuid_of(labels, *d), String::as_str);
                let mut l = job(
                    labels,
                    &[("gpu", d.to_string()), ("uuid", uuid.to_string())],
                );
                if labels.pids {
                    l.push(("pid", pid.to_string()));
                }
                l.push(("rank", p.rank.map_or(String::new(), |r| r.to_string())));
                let s = sums.entry(l.clone()).or_default();
                s[0] = s[0].saturating_add(pd.live);
                s[1] = s[1].saturating_add(pd.peak);
                if let Some((f, al, re)) = pd.framework {
                    let mut l = l.clone();
                    l.push(("framework", f.name().to_string()));
                    let s = fw_sums.entry(l).or_default();
                    s[0] = s[0].saturating_add(al);
                    s[1] = s[1].saturating_add(re);
                }
            }
        }
        for (l, [u, p]) in &sums {
            f.used.get_or_create(l).set(gauge(*u));
            f.peak.get_or_create(l).set(gauge(*p));
        }
        for (l, [a, r]) in &fw_sums {
            f.fw_allocated.get_or_create(l).set(gauge(*a));
            f.fw_reserved.get_or_create(l).set(gauge(*r));
        }
    }

    /// Each GPU's series, the counts that name no device (under gpu=""), the events dropped and the processes.
    fn device_series(&self, labels: &JobLabels, f: &Families) {
        let gpu = |d: u32| -> [(&'static str, String); 2] {
            [
                ("gpu", d.to_string()),
                ("uuid", self.uuid_of(labels, d).to_string()),
            ]
        };
        for (d, dv) in self.gpus() {
            let l = job(labels, &gpu(*d));
            f.dev_used.get_or_create(&l).set(gauge(dv.used));
            f.dev_peak.get_or_create(&l).set(gauge(dv.peak));
            if let Some(c) = dv.cap {
                f.cap.get_or_create(&l).set(gauge(c));
            }
            if let Some(t) = dv.total {
                f.total.get_or_create(&l).set(gauge(t));
            }
            f.allocs.get_or_create(&l).inc_by(dv.allocations);
            f.refusals.get_or_create(&l).inc_by(dv.cap_refusals);
            f.ooms.get_or_create(&l).inc_by(dv.errors);
            f.oom_refusals.get_or_create(&l).inc_by(dv.refusals);
        }
        // Counts that name no device (an out-of-memory record without one) still count, under gpu="".
        let on_devs = |of: fn(&Dev) -> u64| self.gpus().values().map(of).sum::<u64>();
        let unplaced = [
            (
                &f.allocs,
                self.allocations()
                    .saturating_sub(on_devs(|d| d.allocations)),
            ),
            (
                &f.refusals,
                self.cap_refusals()
                    .saturating_sub(on_devs(|d| d.cap_refusals)),
            ),
            (&f.ooms, self.errors().saturating_sub(on_devs(|d| d.errors))),
            (
                &f.oom_refusals,
                self.refusals().saturating_sub(on_devs(|d| d.refusals)),
            ),
        ];
        for (fam, n) in unplaced {
            if n > 0 {
                fam.get_or_create(&job(
                    labels,
                    &[("gpu", String::new()), ("uuid", String::new())],
                ))
                .inc_by(n);
            }
        }
        f.dropped
            .get_or_create(&job(labels, &[]))
            .inc_by(self.dropped());
        f.procs
            .get_or_create(&job(labels, &[]))
            .set(gauge(self.processes() as u64));
    }

    pub fn status(&self, labels: &JobLabels) -> Status {
        let mut processes: Vec<ProcStatus> = self
            .procs()
            .iter()
            .flat_map(|p| {
                let command = command_line(&p.cmdline);
                p.devices.iter().map(move |(d, pd)| ProcStatus {
                    pid: p.pid,
                    rank: p.rank,
                    command: command.clone(),
                    gpu: *d,
                    used: pd.live,
                    peak: pd.peak,
                })
            })
            .collect();
        processes.sort_by_key(|p| (p.pid, p.gpu));
        Status {
            job: labels.job.clone(),
            host: labels.host.clone(),
            gpus: self
                .gpus()
                .iter()
                .map(|(d, dv)| GpuStatus {
                    gpu: *d,
                    uuid: self.uuid_of(labels, *d).to_string(),
                    used: dv.used,
                    peak: dv.peak,
                    cap: dv.cap,
                    total: dv.total,
                    allocations: dv.allocations,
                })
                .collect(),
            processes,
            dropped: self.dropped(),
        }
    }
}

impl Families {
    /// Registers each family with its name, help and unit, in the order `/metrics` serves them.
    fn register(self, reg: &mut Registry) {
        reg.register_with_unit(
            "vramtrace_memory_used",
            "Device memory a process holds now, per GPU",
            Unit::Bytes,
            self.used,
        );
        reg.register_with_unit(
            "vramtrace_memory_peak",
            "The most device memory a process has held at once, per GPU",
            Unit::Bytes,
            self.peak,
        );
        reg.register_with_unit(
            "vramtrace_device_used",
            "Device memory the whole job holds now, per GPU",
            Unit::Bytes,
            self.dev_used,
        );
        reg.register_with_unit(
            "vramtrace_device_peak",
            "The most device memory the whole job has held at once, per GPU",
            Unit::Bytes,
            self.dev_peak,
        );
        reg.register_with_unit(
            "vramtrace_cap",
            "The job's cap on the GPU (vramtrace run --cap)",
            Unit::Bytes,
            self.cap,
        );
        reg.register_with_unit(
            "vramtrace_device_total",
            "The GPU's memory, as the driver reported it",
            Unit::Bytes,
            self.total,
        );
        reg.register(
            "vramtrace_allocations",
            "Successful device allocations (pointer allocations and cuMemCreate)",
            self.allocs,
        );
        reg.register(
            "vramtrace_cap_refusals",
            "Allocations the cap refused",
            self.refusals,
        );
        reg.register(
            "vramtrace_oom",
            "Out-of-memory errors: raised by the framework, or refusals a process never recovered from by \
             its end",
            self.ooms,
        );
        reg.register(
            "vramtrace_oom_refusals",
            "Allocations refused for lack of memory, recovered from or not (PyTorch flushes its cache and \
             retries)",
            self.oom_refusals,
        );
        reg.register(
            "vramtrace_events_dropped",
            "Events the processes could not record (their ring was full)",
            self.dropped,
        );
        reg.register_with_unit(
            "vramtrace_framework_allocated",
            "Bytes in the framework allocator's tensors (PyTorch's allocated, JAX's in use), per process and GPU",
            Unit::Bytes,
            self.fw_allocated,
        );
        reg.register_with_unit(
            "vramtrace_framework_reserved",
            "Bytes the framework allocator holds from the driver (PyTorch's reserved), per process and GPU",
            Unit::Bytes,
            self.fw_reserved,
        );
        reg.register(
            "vramtrace_processes",
            "Processes of the job traced now",
            self.procs,
        );
    }
}

/// The typed status `vramtrace top` reads (`<attach_dir>/<pid>.status.json`, the owner's alone): the figures
/// `/metrics` serves, with each process's pid and command.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default, Clone, PartialEq)]
pub struct Status {
    pub job: String,
    pub host: String,
    pub gpus: Vec<GpuStatus>,
    /// One row per process and GPU it holds memory on (or held).
    pub processes: Vec<ProcStatus>,
    /// Events the shims dropped, all processes.
    pub dropped: u64,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Default, Clone, PartialEq)]
pub struct GpuStatus {
    pub gpu: u32,
    pub uuid: String,
    pub used: u64,
    pub peak: u64,
    pub cap: Option<u64>,
    pub total: Option<u64>,
    pub allocations: u64,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Default, Clone, PartialEq)]
pub struct ProcStatus {
    pub pid: u32,
    pub rank: Option<u32>,
    /// The process's command line as its hello said it, its program by name (not path), at most 256 characters.
    pub command: String,
    pub gpu: u32,
    pub used: u64,
    pub peak: u64,
}
