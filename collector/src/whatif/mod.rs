//! What if (issue 28): from a job's allocations, say before rerunning which allocator settings and which cap it
//! fits in. `settings` reads and writes `PYTORCH_CUDA_ALLOC_CONF`; `native` and `async_pool` model PyTorch's two
//! CUDA allocators; `history` reads a process's tensor-level history from its snapshot; `sim` replays a job's
//! histories together against a limit. `trace_file` reads a trace whole: the replay's answer, the snapshots
//! kept beside it, and the allocator replayed from them up to each error.

pub mod answer;
pub mod answered;
pub mod args;
pub mod async_pool;
pub mod batch;
pub mod caveat;
pub mod from_trace;
pub mod history;
pub mod native;
pub mod postmortem;
pub mod settings;
pub mod sim;
pub mod trace_file;
