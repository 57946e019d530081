//! The collector: one module per verb (`run`, `report`, `oom`, `export`, `demo`), one per output format (`out_text`,
//! `out_json`, `out_oom_text`, `out_oom_json`), over `model`, which replays a trace into live sets, peaks,
//! timelines and out-of-memory snapshots.

pub mod bridge_files;
pub mod callsites;
pub mod demo;
pub mod exit;
pub mod export;
pub mod fleet;
pub mod live;
pub mod model;
pub mod oom;
pub mod out_json;
pub mod out_oom_json;
pub mod out_oom_text;
pub mod out_text;
pub mod probe;
pub mod receive;
pub mod report;
pub mod run;
pub mod symbols;
pub mod top;
pub mod torch_snapshot;
