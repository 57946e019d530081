//! Advice fitted to a diagnosis: what to do, first the step that fixes the cause.

use super::*;

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

pub(super) fn advice(a: &Analysis, s: &OomSnapshot, d: &Diagnosis) -> Vec<String> {
    let b = bytes;
    let mut v = Vec::new();
    let gpu = s
        .device
        .map_or("the GPU".to_string(), |d| format!("GPU {d}"));
    match d.cause {
        Cause::Growth => {
            let per = d
                .growth
                .as_ref()
                .and_then(|l| l.steps.filter(|&n| n > 0).map(|n| l.rise_bytes / n));
            let at = d.growth_line.as_ref().map(|g| g.label.clone());
            let kind = d.growth_line.as_ref().map_or(GrowthKind::Kept, |g| g.kind);
            let native = d.view == "driver";
            let here = at.as_deref().map_or(String::new(), |l| format!(" ({l})"));
            v.push(match kind {
                GrowthKind::KvCache => format!(
                    "The KV cache{here} grows with the batch and the sequence: bound them (a maximum batch \
                     size or tokens per batch, max_new_tokens, a shorter context), or use a cache sized once \
                     for the limit (a static or paged KV cache); batches that grow until the memory runs out \
                     fail at the largest one."
                ),
                GrowthKind::OptimizerState => format!(
                    "This is the optimizer's state{here}, made at its first steps and then kept: it stops \
                     growing once every parameter has its state. To make it smaller: an 8-bit or \
                     factored optimizer, or sharding it (ZeRO, FSDP)."
                ),
                GrowthKind::Kept if native => format!(
                    "Something allocated every step is never freed{here}: free it at the end of the step, \
                     or reuse one buffer across steps."
                ),
                GrowthKind::Kept => format!(
                    "Something keeps tensors alive across steps{here}: outputs or losses stored in a list \
                     with their graph (keep loss.item() or out.detach().cpu() instead), metrics or history \
                     kept as GPU tensors, a graph retained (retain_graph=True) or a growing cache."
                ),
            });
            if d.growth_line.is_none() && !native {
                v.push(
                    "To name the line that keeps them: vramtrace run --torch-history (PyTorch's allocation \
                     history with Python stacks) and run again."
                        .to_string(),
                );
            }
            let rate = per.map_or(String::new(), |p| format!(" (about {} a step)", b(p)));
            v.push(format!(
                "A larger {} or a smaller batch only moves the error to a later step while the growth goes \
                 on{rate}: fix what grows first.",
                if d.cap_bytes.is_some() { "cap" } else { "GPU" }
            ));
        }
        Cause::HostMemory => {
            v.push(format!(
                "This was host memory ({} pinned through cuMemCreate with a host location): check the host's \
                 free memory and the process's limit on locked memory (ulimit -l, a container's memory \
                 limit). Freeing or capping GPU memory does not help here.",
                b(s.requested_bytes)
            ));
        }
        Cause::RequestTooLarge => {
            let limit = if d
                .cap_bytes
                .is_some_and(|c| d.total_bytes.is_none_or(|t| c <= t))
            {
                "the cap"
            } else {
                "the device"
            };
            v.push(format!(
                "One allocation of {} cannot fit on {gpu}, whatever else is freed: {limit} is smaller. Find \
                 the tensor (the call site above) and split the work: a smaller batch or sequence for that \
                 operation, chunking it (e.g. attention or the loss over chunks), or sharding the tensor \
                 across GPUs.",
                b(s.requested_bytes)
            ));
            v.push(
                "A size this large is often a bug: a wrong shape, a broadcast that materialised, or units \
                 mixed up (elements for bytes). Check the shape at that line."
                    .to_string(),
            );
        }
        Cause::FragmentationCache => {
            let o = s.framework.as_ref();
            if o.and_then(|o| o.expandable_segments) != Some(true) {
                v.push(
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments grow in place, so free \
                     memory between tensors can serve a large request (PyTorch's own advice for this case)."
                        .to_string(),
                );
            }
            if o.is_none_or(|o| o.max_split_size.is_none()) {
                v.push(format!(
                    "Or PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{}: blocks larger than this are never split \
                     for small tensors, so large ones stay available.",
                    (s.requested_bytes >> 20).clamp(20, 1024)
                ));
            }
            v.push(
                "torch.cuda.empty_cache() between phases (after evaluation, before the next large \
                 allocation) returns cached segments that hold no live tensor."
                    .to_string(),
            );
            v.push(
                "garbage_collection_threshold:0.8 (with torch.cuda.set_per_process_memory_fraction) makes \
                 the allocator reclaim cached blocks before it runs out."
                    .to_string(),
            );
            v.push(
                "Allocate large persistent buffers first, before the churn of short-lived tensors breaks \
                 up the cache."
                    .to_string(),
            );
        }
        Cause::Pressure => {
            let shed = d
                .short_of_fitting_bytes
                .filter(|&x| x > 0)
                .or(d.shortfall_bytes)
                .unwrap_or(s.requested_bytes);
            v.push(format!(
                "Shed at least {} on {gpu} ({} bytes, {} of the {} the job needed at its peak); more to \
                 leave room for the allocator's rounding and caching.",
                b(shed),
                count(shed),
                pct(shed, d.needed_bytes),
                b(d.needed_bytes)
            ));
            v.push(
                "Smaller batch, or micro-batching with gradient accumulation: the same effective batch with \
                 activations for one micro-batch at a time."
                    .to_string(),
            );
            v.push(
                "Activation checkpointing (torch.utils.checkpoint): recompute activations in the backward pass \
                 instead of keeping them."
                    .to_string(),
            );
            v.push(
                "Mixed precision (bf16/fp16 autocast): halves activation memory, and weights too when kept \
                 in bf16."
                    .to_string(),
            );
            v.push(
                "Offload optimizer state to host memory (DeepSpeed ZeRO-Offload, FSDP CPU offload)."
                    .to_string(),
            );
            v.push(
                "Shard parameters, gradients and optimizer state across GPUs (FSDP, DeepSpeed ZeRO)."
                    .to_string(),
            );
            if s.leak.is_some() || s.framework_leak.is_some() {
                v.push(
                    "Bytes in use rose cycle over cycle before the event (see the leak finding): fix what \
                     is kept across steps first (tensors stored in lists, losses accumulated with their graph)."
                        .to_string(),
                );
            }
        }
        Cause::Fragmentation => {
            v.push(
                "PyTorch: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so segments grow in place instead \
                 of needing new contiguous blocks."
                    .to_string(),
            );
            v.push(
                "Trim pools at phase boundaries: torch.cuda.empty_cache() (PyTorch), cuMemPoolTrimTo(pool, 0) \
                 for stream-ordered pools (or lower their CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)."
                    .to_string(),
            );
            v.push(
                "Allocate large persistent buffers first (weights, optimizer state, KV cache), before the \
                 churn of short-lived ones breaks up the free memory."
                    .to_string(),
            );
        }
        Cause::External => {
            let held = d.outside_excess_bytes.map_or("memory".to_string(), b);
            v.push(format!(
                "{held} (estimated) on {gpu} was held outside the job, by processes vramtrace did not trace: \
                 their pids are unknown to it. Inside the job: none to blame (its processes held {} there).",
                b(d.job_live_bytes)
            ));
            v.push(
                "Who holds the GPU: nvidia-smi --query-compute-apps=pid,used_memory --format=csv"
                    .to_string(),
            );
            v.push(format!(
                "Move the job to a free GPU (CUDA_VISIBLE_DEVICES), or stop the other process on {gpu}."
            ));
        }
        Cause::Cap => {
            let flag = if a.devices.len() <= 1 {
                cap_spec(d.suggested_cap_bytes)
            } else {
                match s.device {
                    Some(dv) => format!("{dv}={}", cap_spec(d.suggested_cap_bytes)),
                    None => cap_spec(d.suggested_cap_bytes),
                }
            };
            v.push(format!(
                "A cap of {} would have fitted the job's peak so far ({} = the larger of its peak and its \
                 bytes plus the request, rounded up to 0.25 GiB): --cap {flag}",
                b(d.suggested_cap_bytes),
                b(d.needed_bytes)
            ));
            if let Some(t) = d.total_bytes {
                if d.suggested_cap_bytes > t {
                    v.push(format!(
                        "That is more than the device's {}: the job itself must shed memory (smaller batch, \
                         checkpointing, mixed precision, sharding).",
                        b(t)
                    ));
                }
            }
            v.push(
                "To measure first: --cap-mode warn lets over-cap allocations through and flags them in the \
                 trace."
                    .to_string(),
            );
            if s.framework_leak.is_some() || s.leak.is_some() {
                v.push(
                    "But first: bytes in use rose step after step before the event (see the leak finding), so \
                     a larger cap only delays it. Fix what is kept across steps (outputs or losses stored \
                     with their graph: store loss.item() or out.detach())."
                        .to_string(),
                );
            }
        }
    }
    // A KV cache behind a cause other than its own growth (a serving loop's batch or sequence outgrew the
    // memory): bounding them is the lasting fix, said second, after the cause's own first step.
    if d.cause != Cause::Growth {
        if let Some(line) = super::growth_line::kv_cache_line(a, s) {
            let at = v.len().min(1);
            v.insert(
                at,
                format!(
                    "The memory went to a KV cache ({line}), which grows with the batch and the sequence: \
                     bound them (a maximum batch size or tokens per batch, max_new_tokens, a shorter context), \
                     or size the cache once for the limit (a static or paged KV cache)."
                ),
            );
        }
    }
    v
}
