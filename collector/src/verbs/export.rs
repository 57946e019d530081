//! `vramtrace export TRACE --format memory-viz|perfetto|html --out FILE`: the trace in a viewer people already
//! use, or in a page of its own (docs/EXPORTS.md). The reporters are in `reporters/`, one file per format; they are
//! fed by the model's
//! replay ([`crate::model::observe::tap`]), so what they show is what `report` shows, in the same order.
//!
//! A trace that cannot be read, or an output that cannot be created, is one line on stderr and exit 2; an
//! existing output is kept unless `--force`. A trace cut short is exported up to where it stops (said on
//! stderr).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use crate::model::observe::tap::Tap;
use crate::model::{self, Analysis};
use crate::process::exit::{self, Code};
use crate::reporters::{html, memory_viz, perfetto};
use vramtrace_format::reader::TraceReader;
use vramtrace_format::TraceHeader;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A snapshot pickle for PyTorch's memory_viz (pytorch.org/memory_viz).
    MemoryViz,
    /// Perfetto's protobuf trace (ui.perfetto.dev): counters per device and per process, instants.
    Perfetto,
    /// One self-contained HTML page (no network): timelines per device, OOMs and their post-mortems, tables.
    Html,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::MemoryViz => "memory_viz snapshot",
            Format::Perfetto => "Perfetto trace",
            Format::Html => "HTML page",
        }
    }

    /// Where the user opens it.
    fn open_with(self) -> &'static str {
        match self {
            Format::MemoryViz => "drop it on pytorch.org/memory_viz",
            Format::Perfetto => "open it in ui.perfetto.dev",
            Format::Html => "open it in a browser (it needs no network)",
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The trace file written by `vramtrace run`; several traces of one job (one per node) go into one file, each
    /// host apart (its tracks, its section of the page, its devices), clocks aligned by the wall-clock starts.
    #[arg(required = true, num_args = 1..)]
    pub trace: Vec<PathBuf>,
    /// The viewer's format.
    #[arg(long, value_enum)]
    pub format: Format,
    /// Where to write it.
    #[arg(long)]
    pub out: PathBuf,
    /// Overwrite FILE if it exists; with several traces, also merge traces of different jobs.
    #[arg(long)]
    pub force: bool,
    /// memory-viz: the most events kept per device (the last ones; memory_viz struggles past about 600 k).
    #[arg(long, default_value_t = memory_viz::MAX_EVENTS, value_name = "N")]
    pub max_events: usize,
}

pub fn main(args: ExportArgs) -> Code {
    match export(&args) {
        Ok((a, notes)) => {
            // With several traces, the notes say which ones stop short.
            if let (Some(why), 1) = (&a.stopped, args.trace.len()) {
                crate::note!(
                    "vramtrace: partial trace, exported up to where it stops: {}",
                    crate::names::units::printable(why)
                );
            }
            for n in notes {
                crate::note!("vramtrace: note: {}", crate::names::units::printable(&n));
            }
            let size = std::fs::metadata(&args.out).map_or(0, |m| m.len());
            crate::note!(
                "vramtrace: wrote {} ({}, {}): {}",
                crate::names::units::shown_path(&args.out),
                crate::names::units::bytes(size),
                args.format.name(),
                args.format.open_with()
            );
            exit::OK
        }
        Err(Failed(code, msg)) => exit::fail(code, msg),
    }
}

/// Why an export failed: the exit code and the one line said.
#[derive(Debug)]
pub struct Failed(pub Code, pub String);

/// Writes the export, and returns the analysis and the notes for the reader; on any failure the output is
/// removed (nothing half-written is left behind).
pub fn export(args: &ExportArgs) -> Result<(Analysis, Vec<String>), Failed> {
    if args.trace.contains(&args.out) {
        return Err(Failed(exit::USAGE, "--out names a trace itself".into()));
    }
    // Checked before the output is created: several traces must be one job's.
    let order = if args.trace.len() > 1 {
        Some(job_order(&args.trace, args.force)?)
    } else {
        None
    };
    let mut pending = crate::files::out_file::OutFile::create(&args.out, args.force)
        .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
    let file = pending.file().try_clone().map_err(|e| {
        Failed(
            exit::FAILURE,
            format!("cannot write {}: {e}", args.out.display()),
        )
    })?;
    let w = BufWriter::with_capacity(1 << 20, file);
    let r = match order {
        Some(order) => match args.format {
            Format::Html => write_several_html(args, &order, w),
            Format::MemoryViz => write_several_memory_viz(args, &order, w),
            Format::Perfetto => write_several(args, &order, w),
        },
        None => write(args, w),
    };
    // Only a whole export takes the name; a failed one leaves what was there as it was (the temporary goes).
    let r = r?;
    pending
        .commit()
        .map_err(|e| Failed(exit::FAILURE, e.to_string()))?;
    Ok(r)
}

/// Several traces' headers, which can be read together (`fleet::check_together`), in the order of their wall-clock
/// starts, each with how
/// much later than the first it started (ns).
fn job_order(traces: &[PathBuf], force: bool) -> Result<Vec<(PathBuf, TraceHeader, u64)>, Failed> {
    let mut hs = Vec::new();
    for t in traces {
        let f = crate::files::untrusted_file::open_regular(t)
            .map_err(|e| Failed(exit::USAGE, format!("{}: {e}", t.display())))?;
        let (_, h) = TraceReader::open(io::BufReader::new(f))
            .map_err(|e| Failed(exit::USAGE, format!("{}: {e}", t.display())))?;
        hs.push((t.clone(), h, 0u64));
    }
    super::fleet::check_together(hs.iter().map(|(t, h, _)| (t.as_path(), h)), force)
        .map_err(|why| Failed(exit::USAGE, why))?;
    hs.sort_by_key(|(_, h, _)| h.start_unix_ns);
    let t0 = hs[0].1.start_unix_ns;
    for (_, h, off) in &mut hs {
        *off = h.start_unix_ns - t0;
    }
    Ok(hs)
}

/// Several traces into one Perfetto file: each replayed in turn into the same writer, its host's tracks apart,
/// its times placed on the first trace's clock by the wall-clock starts. Returns the first trace's analysis.
fn write_several(
    args: &ExportArgs,
    order: &[(PathBuf, TraceHeader, u64)],
    w: BufWriter<File>,
) -> Result<(Analysis, Vec<String>), Failed> {
    let mut tap = perfetto::Perfetto::new(w);
    let mut first = None;
    let mut slot_base = 0;
    let base_mono = order[0].1.start_mono_ns;
    let mut notes = Vec::new();
    for (i, (path, h, offset)) in order.iter().enumerate() {
        tap.next_host(i as u64, h.hostname.clone(), slot_base);
        let mut shifted = Shifted {
            inner: &mut tap,
            start_mono: base_mono + offset,
        };
        let a = model::analyze_tapped(path, &mut shifted)
            .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
        if let Some(why) = &a.stopped {
            notes.push(format!(
                "{}: partial trace, exported up to where it stops: {why}",
                path.display()
            ));
        }
        slot_base += a.processes.len() + 1;
        notes.push(format!(
            "{} (host {}) placed at +{:.3} s on the job's clock",
            path.display(),
            h.hostname,
            *offset as f64 / 1e9
        ));
        first.get_or_insert(a);
    }
    notes.extend(tap.notes());
    tap.end().map_err(|e| {
        Failed(
            exit::FAILURE,
            format!("cannot write {}: {e}", args.out.display()),
        )
    })?;
    Ok((first.expect("at least one trace"), notes))
}

/// Several traces into one page: a section per trace (its host), each on its own clock, with where that clock
/// starts on the first trace's. Returns the first trace's analysis.
fn write_several_html(
    args: &ExportArgs,
    order: &[(PathBuf, TraceHeader, u64)],
    w: BufWriter<File>,
) -> Result<(Analysis, Vec<String>), Failed> {
    let mut sections = Vec::with_capacity(order.len());
    let mut first = None;
    let mut notes = Vec::new();
    for (path, h, offset) in order {
        let mut tap = html::Html::new();
        let mut a = model::analyze_tapped(path, &mut tap)
            .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
        crate::whatif::trace_file::read_snapshots(&mut a, path);
        add_whatif(&mut tap, &a, path);
        if let Some(why) = &a.stopped {
            notes.push(format!(
                "{}: partial trace, exported up to where it stops: {why}",
                path.display()
            ));
        }
        notes.extend(
            tap.notes()
                .into_iter()
                .map(|n| format!("{} (host {}): {n}", path.display(), h.hostname)),
        );
        sections.push(tap.section(&a, Some((&h.hostname, *offset))));
        first.get_or_insert(a);
    }
    let a = first.expect("at least one trace");
    let command = crate::reporters::text::short_command(&a.header.command);
    html::write_page(w, &command, &sections)
        .and_then(|mut w| w.flush())
        .map_err(|e| {
            Failed(
                exit::FAILURE,
                format!("cannot write {}: {e}", args.out.display()),
            )
        })?;
    Ok((a, notes))
}

/// The what-if's table on a trace's page (its host's section), where processes kept their PyTorch history:
/// the default grid against the run's cap, if it had one.
fn add_whatif(tap: &mut html::Html, a: &Analysis, trace: &std::path::Path) {
    let loaded = crate::whatif::from_trace::load(a, trace);
    if loaded.histories.is_empty() {
        return;
    }
    let limit = (!loaded.run_cap.is_empty()).then(|| crate::whatif::answer::Limit {
        bytes: loaded.run_cap.clone(),
        what: "the run's cap".into(),
    });
    let w = crate::whatif::answer::answer(
        loaded.histories,
        loaded.outside,
        loaded.device_total,
        loaded.others,
        &crate::whatif::settings::default_grid(),
        limit,
    );
    tap.set_whatif(&w, loaded.start_unix_us);
}

/// Several traces into one snapshot: each trace's devices after the ones before (the pickle's `vramtrace.hosts`
/// says which are whose), its times on the first trace's clock. Returns the first trace's analysis.
fn write_several_memory_viz(
    args: &ExportArgs,
    order: &[(PathBuf, TraceHeader, u64)],
    w: BufWriter<File>,
) -> Result<(Analysis, Vec<String>), Failed> {
    let mut tap = memory_viz::MemoryViz::new(args.max_events);
    let mut first = None;
    let mut slot_base = 0;
    let mut notes = Vec::new();
    for (path, h, offset) in order {
        tap.next_host(&h.hostname, *offset, slot_base);
        let a = model::analyze_tapped(path, &mut tap)
            .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
        tap.add_torch_history(&a, path);
        if let Some(why) = &a.stopped {
            notes.push(format!(
                "{}: partial trace, exported up to where it stops: {why}",
                path.display()
            ));
        }
        slot_base += a.processes.len() + 1;
        first.get_or_insert(a);
    }
    let a = first.expect("at least one trace");
    notes.extend(tap.notes());
    tap.write(&a, w).and_then(|mut w| w.flush()).map_err(|e| {
        Failed(
            exit::FAILURE,
            format!("cannot write {}: {e}", args.out.display()),
        )
    })?;
    Ok((a, notes))
}

/// A tap that hands the writer each trace's header with its start moved onto the job's clock.
struct Shifted<'a, T: Tap> {
    inner: &'a mut T,
    start_mono: u64,
}

impl<T: Tap> Tap for Shifted<'_, T> {
    fn start(&mut self, header: &TraceHeader) {
        let mut h = header.clone();
        h.start_mono_ns = self.start_mono;
        self.inner.start(&h);
    }
    fn step(&mut self, s: &crate::model::observe::tap::Step) {
        self.inner.step(s);
    }
    fn oom(&mut self, o: &crate::model::observe::tap::OomStep) {
        self.inner.oom(o);
    }
    fn finish(&mut self, frames: &mut crate::model::observe::tap::Frames) {
        self.inner.finish(frames);
    }
}

fn write(args: &ExportArgs, w: BufWriter<File>) -> Result<(Analysis, Vec<String>), Failed> {
    let trace = &args.trace[0];
    let io_err = |e: io::Error| {
        Failed(
            exit::FAILURE,
            format!("cannot write {}: {e}", args.out.display()),
        )
    };
    match args.format {
        Format::MemoryViz => {
            let mut tap = memory_viz::MemoryViz::new(args.max_events);
            let a = model::analyze_tapped(trace, &mut tap)
                .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
            tap.add_torch_history(&a, trace);
            let mut w = tap.write(&a, w).map_err(io_err)?;
            w.flush().map_err(io_err)?;
            Ok((a, tap.notes()))
        }
        Format::Perfetto => {
            let mut tap = perfetto::Perfetto::new(w);
            let a = model::analyze_tapped(trace, &mut tap)
                .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
            let notes = tap.notes();
            tap.end().map_err(io_err)?;
            Ok((a, notes))
        }
        Format::Html => {
            let mut tap = html::Html::new();
            let mut a = model::analyze_tapped(trace, &mut tap)
                .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
            // The post-mortems beside the timelines are `vramtrace oom`'s: with the snapshots kept beside it.
            crate::whatif::trace_file::read_snapshots(&mut a, trace);
            add_whatif(&mut tap, &a, trace);
            let mut w = tap.write(&a, w).map_err(io_err)?;
            w.flush().map_err(io_err)?;
            Ok((a, tap.notes()))
        }
    }
}
