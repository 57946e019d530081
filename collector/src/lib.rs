//! The collector, in the order of its pipeline: `receive` (a job's processes into the trace), `model` (a trace
//! replayed into live sets, peaks, timelines, out-of-memory snapshots and their diagnosis), `whatif` and `fit`
//! (what other settings, caps and batches would do), `live` and `cap_check` (the running job's figures for
//! `--metrics` and `top`, and the cap's GPU check), `reporters` (one file per output format) and `verbs` (`run`,
//! `report`, `oom`, `export`, `demo`, `top`, ...). `callsites` is the vocabulary of call sites.
//!
//! The utilities, grouped by what they serve:
//! - `files`: files and folders (`out_file` written never through a link, `untrusted_file` opened only if
//!   regular, `runtime_dir` the job's private folder, `bridge_files` the Python bridge carried in the binary);
//! - `inputs`: what is read back beside a trace (`torch_snapshot` PyTorch's snapshot pickles, `pickle` the
//!   bounded reader under it; the trace file with them is `whatif/trace_file.rs`);
//! - `names`: names and units (`units` numbers for people, `symbols` and `frame_names` native frames, `ticks` the
//!   clock, `fasthash`);
//! - `process`: processes and signals (`exit` codes and one-line errors, `hangup`, `probe`, `fdlimit`).

pub mod callsites;
pub mod cap_check;
pub mod files;
pub mod fit;
pub mod inputs;
pub mod live;
pub mod model;
pub mod names;
pub mod process;
pub mod receive;
pub mod reporters;
pub mod verbs;
pub mod whatif;
