//! What is read back beside a trace: PyTorch's snapshot pickles, and the bounded pickle reader under them (the
//! trace file itself with them: `whatif/trace_file.rs`).

pub mod pickle;
pub mod torch_snapshot;
