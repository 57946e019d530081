//! What is read back: a trace and what was kept beside it, PyTorch's snapshot pickles, the bounded pickle reader.

pub mod pickle;
pub mod torch_snapshot;
pub mod trace_file;
