//! A framework's `oom` record read into a [`FrameworkOom`]: the allocator's figures and settings at the error,
//! and JAX's request, which only its error's words say.

use vramtrace_format::keys;
use vramtrace_format::{Bridge, Framework, NO_DEVICE};

use super::doc;
use crate::model::analysis::framework::{Figures, FrameworkOom};

impl FrameworkOom {
    pub(in crate::model) fn from_bridge(b: &Bridge, o: &doc::Oom, t: u64) -> FrameworkOom {
        let framework = match o.framework.as_str() {
            keys::bridge::values::JAX => Framework::Jax,
            _ => Framework::Torch,
        };
        let figures = if framework == Framework::Jax {
            Figures {
                allocated: o.bytes_in_use.or0(),
                // JAX's BFC allocator says 0 reserved while its pool, taken whole at start (its default) or
                // grown up to its limit, is what it holds from the driver.
                reserved: o
                    .bytes_reserved
                    .get()
                    .filter(|&r| r > 0)
                    .or(o.bytes_limit.get())
                    .unwrap_or(0),
                ..Figures::default()
            }
        } else {
            Figures {
                allocated: o.allocated.or0(),
                reserved: o.reserved.or0(),
                active: o.active.or0(),
                inactive_split: o.inactive_split.or0(),
                requested: o.requested_current.or0(),
                alloc_retries: o.alloc_retries.or0(),
                ooms: o.ooms.or0(),
            }
        };
        // PyTorch reports "unlimited" as SIZE_MAX (or -1 through a signed cast, which reads as no count).
        let max_split = o
            .max_split_size
            .get()
            .filter(|&v| v > 0 && v < i64::MAX as u64);
        FrameworkOom {
            framework,
            time_ns: t,
            pid: b.pid,
            tid: b.tid,
            device: (b.device != NO_DEVICE).then_some(b.device),
            thread: o.thread.some(),
            // JAX's record names the request only in its error's words; its own limit is its pool's.
            requested_bytes: o
                .requested
                .get()
                .or_else(|| (framework == Framework::Jax).then(|| jax_request(o.error.as_str()))?)
                .unwrap_or(0),
            allowed_or_total_bytes: o.allowed_or_total.get().or_else(|| {
                (framework == Framework::Jax)
                    .then(|| o.bytes_limit.get())
                    .flatten()
            }),
            device_free_bytes: o.device_free.get(),
            figures,
            backend: o.backend.some(),
            alloc_conf: o.alloc_conf.some(),
            expandable_segments: o
                .expandable_segments
                .0
                .as_deref()
                .map(|v| v.trim().eq_ignore_ascii_case("true"))
                .or(o.segments_expandable.get()),
            garbage_collection_threshold: o.garbage_collection_threshold.some(),
            max_split_size: max_split,
            segments: o.segments.get(),
            largest_free_block: o.largest_free_block.get(),
            free_in_live_segments: o.free_in_live_segments.get(),
            snapshot_path: o.snapshot.some(),
            snapshot: None,
            replay: None,
            batch: None,
        }
    }
}

/// The bytes JAX's error says it tried to allocate: "Out of memory while trying to allocate 1.00GiB" (XLA's
/// readable size: B, KiB, MiB, ... with two decimals) or "... allocate 1073741824 bytes". `None` when it says
/// neither, or a size past 1 PiB (no GPU's: a forged record's).
pub fn jax_request(error: &str) -> Option<u64> {
    let rest = error.split("trying to allocate ").nth(1)?;
    let n = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (num, unit) = rest.split_at(n);
    let num: f64 = num.parse().ok()?;
    let unit = unit.trim_start();
    let shift = ["KiB", "MiB", "GiB", "TiB"]
        .iter()
        .position(|u| unit.starts_with(u))
        .map_or(0, |i| 10 * (i as i32 + 1));
    if shift == 0 && !(unit.starts_with('B') || unit.starts_with("bytes")) {
        return None;
    }
    let bytes = (num * 2f64.powi(shift)).round();
    (bytes.is_finite() && bytes <= (1u64 << 50) as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::jax_request;

    #[test]
    fn jax_says_its_request_in_words() {
        let e = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB with allocator GPU_0_bfc on \
                 device 0. [executable_name='jit_broadcast_in_dim']";
        assert_eq!(jax_request(e), Some(1 << 30));
        assert_eq!(
            jax_request("... trying to allocate 512.50MiB."),
            Some(537_395_200)
        );
        assert_eq!(
            jax_request("... trying to allocate 1073741824 bytes."),
            Some(1 << 30)
        );
        assert_eq!(jax_request("... trying to allocate 96B"), Some(96));
        for none in [
            "",
            "Out of memory",
            "trying to allocate lots",
            "trying to allocate 1.5 parsecs",
            "trying to allocate 9e99GiB",
            "trying to allocate 5000TiB",
        ] {
            assert_eq!(jax_request(none), None, "{none}");
        }
    }
}
