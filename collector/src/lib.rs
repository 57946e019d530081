//! The collector: one module per verb (`run`, `report`, `demo`), one per output format (`out_text`,
//! `out_json`), over `model`, which replays a trace into live sets, peaks and timelines.

pub mod demo;
pub mod exit;
pub mod model;
pub mod out_json;
pub mod out_text;
pub mod probe;
pub mod report;
pub mod run;
