//! The collector: the verbs (`verbs/`: `run`, `report`, `oom`, `export`, `demo`, `top`), the reporters (`reporters/`:
//! one file per output format), over `model`, which replays a trace into live sets, peaks, timelines, out-of-memory
//! snapshots and their diagnosis. Beside them: `receive` (a job's processes into the trace), `live` (the running
//! job's figures for `--metrics` and `top`), `callsites` and `symbols` (call sites, resolved offline),
//! `frame_names` (native frames named where the trace was recorded, kept in it), `ticks` (events' counter ticks to ns), `fdlimit` (room for a socket per process), `torch_snapshot` (PyTorch's
//! snapshot pickles), `bridge_files` (the Python bridge, carried in the binary), `untrusted_file` (opening only
//! regular files).

pub mod bridge_files;
pub mod callsites;
pub mod cap_check;
pub mod exit;
pub mod fasthash;
pub mod fdlimit;
pub mod fit;
pub mod frame_names;
pub(crate) mod hangup;
pub mod live;
pub mod model;
pub mod out_file;
pub mod pickle;
pub mod probe;
pub mod receive;
pub mod reporters;
pub mod runtime_dir;
pub mod symbols;
pub mod ticks;
pub mod torch_snapshot;
pub mod trace_file;
pub mod units;
pub mod untrusted_file;
pub mod verbs;
pub mod whatif;
