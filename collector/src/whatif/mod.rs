//! What if (issue 28): from a job's allocations, say before rerunning which allocator settings and which cap it
//! fits in. So far the model of PyTorch's caching allocator (`allocator`), tested rule by rule on hand-made
//! histories; the verb, the histories from traces and the post-mortem's use of it are still to come.

pub mod allocator;
