//! The verbs of `vramtrace`, one file each: `run` (start a job and write its trace), `report`, `oom`, `export`,
//! `demo`, `top` (a running job), `kernel` (a traced Jupyter kernel), `whatif` (with `whatif_knob` for a
//! program's knob, over the arguments both take: `whatif/args.rs`), and `fleet` (several traces of one job, for
//! `report` and `oom`). A verb reads its arguments, asks the model for an analysis and hands it to a reporter; it
//! holds no format of its own.

pub mod demo;
pub mod export;
pub mod fit;
pub mod fleet;
pub mod kernel;
pub mod oom;
pub mod oom_batch;
pub mod report;
pub mod run;
pub mod top;
pub mod whatif;
pub mod whatif_knob;
