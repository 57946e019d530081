//! What if (issue 28): from a job's allocations, say before rerunning which allocator settings and which cap it
//! fits in. `settings` reads and writes `PYTORCH_CUDA_ALLOC_CONF`; `native` and `async_pool` model PyTorch's two
//! CUDA allocators.

pub mod native;
pub mod settings;
