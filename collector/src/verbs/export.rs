//! `vramtrace export TRACE --format memory-viz|perfetto|html --out FILE`: the trace in a viewer people already
//! use, or in a page of its own (docs/EXPORTS.md). The reporters are in `reporters/`, one file per format; they are fed by the model's
//! replay ([`crate::model::tap`]), so what they show is what `report` shows, in the same order.
//!
//! A trace that cannot be read, or an output that cannot be created, is one line on stderr and exit 2; an
//! existing output is kept unless `--force`. A trace cut short is exported up to where it stops (said on
//! stderr).

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use crate::exit::{self, Code};
use crate::model::{self, Analysis};
use crate::reporters::{html, memory_viz, perfetto};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A snapshot pickle for PyTorch's memory_viz (pytorch.org/memory_viz).
    MemoryViz,
    /// Perfetto's protobuf trace (ui.perfetto.dev): counters per device and per process, instants.
    Perfetto,
    /// One self-contained HTML page (no network): timelines per device, OOMs and their post-mortems, tables.
    Html,
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The trace file written by `vramtrace run`.
    pub trace: PathBuf,
    /// The viewer's format.
    #[arg(long, value_enum)]
    pub format: Format,
    /// Where to write it.
    #[arg(long)]
    pub out: PathBuf,
    /// Overwrite FILE if it exists.
    #[arg(long)]
    pub force: bool,
    /// memory-viz: the most events kept per device (the last ones; memory_viz struggles past about 600 k).
    #[arg(long, default_value_t = memory_viz::MAX_EVENTS, value_name = "N")]
    pub max_events: usize,
}

pub fn main(args: ExportArgs) -> Code {
    match export(&args) {
        Ok((a, notes)) => {
            if let Some(why) = &a.stopped {
                eprintln!("vramtrace: partial trace, exported up to where it stops: {why}");
            }
            for n in notes {
                eprintln!("vramtrace: note: {n}");
            }
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
    if args.out == args.trace {
        return Err(Failed(exit::USAGE, "--out names the trace itself".into()));
    }
    let file = crate::verbs::run::open_out(&args.out, args.force)
        .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
    let r = write(args, BufWriter::with_capacity(1 << 20, file));
    if r.is_err() {
        let _ = fs::remove_file(&args.out);
    }
    r
}

fn write(args: &ExportArgs, w: BufWriter<File>) -> Result<(Analysis, Vec<String>), Failed> {
    let io_err = |e: io::Error| {
        Failed(
            exit::FAILURE,
            format!("cannot write {}: {e}", args.out.display()),
        )
    };
    match args.format {
        Format::MemoryViz => {
            let mut tap = memory_viz::MemoryViz::new(args.max_events);
            let a = model::analyze_tapped(&args.trace, &mut tap)
                .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
            let mut w = tap.write(&a, w).map_err(io_err)?;
            w.flush().map_err(io_err)?;
            Ok((a, tap.notes()))
        }
        Format::Perfetto => {
            let mut tap = perfetto::Perfetto::new(w);
            let a = model::analyze_tapped(&args.trace, &mut tap)
                .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
            let notes = tap.notes();
            tap.end().map_err(io_err)?;
            Ok((a, notes))
        }
        Format::Html => {
            let mut tap = html::Html::new();
            let mut a = model::analyze_tapped(&args.trace, &mut tap)
                .map_err(|e| Failed(exit::USAGE, e.to_string()))?;
            // The post-mortems beside the timelines are `vramtrace oom`'s: with the snapshots kept beside it.
            model::read_snapshots(&mut a, &args.trace);
            let mut w = tap.write(&a, w).map_err(io_err)?;
            w.flush().map_err(io_err)?;
            Ok((a, tap.notes()))
        }
    }
}
