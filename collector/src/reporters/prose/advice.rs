//! A step of advice in words.

use crate::model::diagnose::{
    Advice, CapAdvice, Diagnosis, FragmentationAdvice, GrowthAdvice, Limit, OutsideAdvice,
    PressureAdvice, RequestAdvice,
};
use crate::names::units::{bytes as b, count};

use super::phrases::{cap_spec, holder_label, nouns};

/// `GPU 3`, or `the GPU` when the device is not known.
fn gpu(device: Option<u32>) -> String {
    device.map_or("the GPU".to_string(), |d| format!("GPU {d}"))
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// ` (train.py:42 in step)` after the thing it names, or nothing.
fn at(line: &Option<String>) -> String {
    line.as_deref().map_or(String::new(), |l| format!(" ({l})"))
}

/// Every step of `d`'s advice, in order.
pub fn advice(d: &Diagnosis) -> Vec<String> {
    d.advice.iter().map(advice_text).collect()
}

/// One step of advice, in a sentence or two.
pub fn advice_text(a: &Advice) -> String {
    match a {
        Advice::Growth(g) => growth(g),
        Advice::Request(r) => request(r),
        Advice::Fragmentation(f) => fragmentation(f),
        Advice::Pressure(p) => pressure(p),
        Advice::Outside(o) => outside(o),
        Advice::Cap(c) => cap(c),
        Advice::LargestBatch(x) => largest_batch(x),
        Advice::BoundKvCache { line } => format!(
            "The memory went to a KV cache ({line}), which grows with the batch and the sequence: bound them (a \
             maximum batch size or tokens per batch, max_new_tokens, a shorter context), or size the cache once \
             for the limit (a static or paged KV cache)."
        ),
    }
}

/// Growth: what grows, what keeps it, and why a larger limit only delays the error.
fn growth(a: &GrowthAdvice) -> String {
    match a {
        GrowthAdvice::GrowthKvCache { line } => format!(
            "The KV cache{} grows with the batch and the sequence: bound them (a maximum batch size or tokens \
             per batch, max_new_tokens, a shorter context), or use a cache sized once for the limit (a static \
             or paged KV cache); batches that grow until the memory runs out fail at the largest one.",
            at(line)
        ),
        GrowthAdvice::GrowthOptimizerState { line } => format!(
            "This is the optimizer's state{}, made at its first steps and then kept: it stops growing once \
             every parameter has its state. To make it smaller: an 8-bit or factored optimizer, or sharding it \
             (ZeRO, FSDP).",
            at(line)
        ),
        GrowthAdvice::GrowthNeverFreed { line } => format!(
            "Something allocated every step is never freed{}: free it at the end of the step, or reuse one \
             buffer across steps.",
            at(line)
        ),
        GrowthAdvice::GrowthKeptTensors { line } => format!(
            "Something keeps tensors alive across steps{}: outputs or losses stored in a list with their graph \
             (keep loss.item() or out.detach().cpu() instead), metrics or history kept as GPU tensors, a graph \
             retained (retain_graph=True) or a growing cache.",
            at(line)
        ),
        GrowthAdvice::GrowthHeldBy { holder: h } => held_by(h),
        GrowthAdvice::CyclesMayBeLoading { held } => format!(
            "Seen through the driver alone, a loop that keeps memory every round reads the same as a program \
             loading its weights piece by piece (a staging buffer freed after each): if this was loading, \
             nothing leaked and what it loads does not fit in what it could have ({} held when it failed).",
            b(*held)
        ),
        GrowthAdvice::TorchHistory => "To name the line that keeps them: vramtrace run --torch-history (PyTorch's \
                                 allocation history with Python stacks) and run again."
            .to_string(),
        GrowthAdvice::FixGrowthFirst {
            capped,
            per_step,
            noun,
            lasts,
        } => {
            let a = crate::names::units::article(noun);
            let rate = per_step.map_or(String::new(), |p| format!(" (about {} {a} {noun})", b(p)));
            let mut t = format!(
                "Fix what grows first: no cap, GPU or allocator setting fixes a growth{rate}; a larger {} or a \
                 smaller batch only moves the error to a later {noun}.",
                if *capped { "cap" } else { "GPU" },
            );
            let said: Vec<String> = lasts
                .iter()
                .map(|(l, n, whole)| {
                    let what = if *whole {
                        format!("the whole device ({})", b(*l))
                    } else if *capped {
                        format!("a cap of {}", b(*l))
                    } else {
                        format!("a GPU of {}", b(*l))
                    };
                    format!("{what} about {} more {}", count(*n), nouns(noun, *n))
                })
                .collect();
            if !said.is_empty() {
                t.push_str(&format!(" At this rate that buys {}.", said.join(", ")));
            }
            t
        }
    }
}

/// What the bridge's walk found holding what grew, named as the program names it, and how to let go of it.
fn held_by(h: &crate::model::holders::Holder) -> String {
    use crate::model::holders::HolderKind;
    let what = holder_label(h);
    let fix = match h.kind {
        HolderKind::Graph => {
            "it keeps the autograd graph, with every activation saved for backward, of each iteration it \
             adds up: accumulate loss.item() or loss.detach(), and run evaluation under torch.no_grad()"
        }
        HolderKind::Cycle => {
            "if it is a reference cycle, they stay until Python's garbage collector runs: break the cycle \
             (a weakref for the back reference) or call gc.collect() between steps; if gc.collect() frees \
             nothing, something deeper holds them"
        }
        HolderKind::Unreached => {
            "no Python object reaches them: native code, a graph kept through a tensor not named, or CUDA \
             graphs' pools hold them"
        }
        // A mapping that only grows is a cache that never evicts: that is the leak.
        _ if h.is_mapping() => {
            "a cache that never evicts is the leak: bound it (evict the oldest entries past a fixed \
             number, an LRU), or keep its entries on the CPU (t.cpu()) and move back what a request needs"
        }
        _ => {
            "store what you need across steps as Python numbers or CPU tensors (loss.item(), \
             out.detach().cpu()), or clear it each step"
        }
    };
    // Named as the program names it: its bytes, tensors and scope are on HELD BY's row and in the cause.
    let what = match h.kind {
        HolderKind::Variable if !h.name.is_empty() => format!("`{}`", h.name),
        HolderKind::Graph if !h.name.is_empty() => {
            format!("The autograd graph behind `{}`", h.name)
        }
        _ => what,
    };
    format!("{what}: {fix}.")
}

/// Host memory, or one request too large for any room that could be made.
fn request(a: &RequestAdvice) -> String {
    match a {
        RequestAdvice::HostMemory { requested } => format!(
            "This was host memory ({} pinned through cuMemCreate with a host location): check the host's free \
             memory and the process's limit on locked memory (ulimit -l, a container's memory limit). Freeing \
             or capping GPU memory does not help here.",
            b(*requested)
        ),
        RequestAdvice::SplitRequest {
            requested,
            device,
            limit,
        } => format!(
            "One allocation of {} cannot fit on {}, whatever else is freed: {} is smaller. Find the tensor (the \
             call site above) and split the work: a smaller batch or sequence for that operation, chunking it \
             (e.g. attention or the loss over chunks), or sharding the tensor across GPUs.",
            b(*requested),
            gpu(*device),
            match limit {
                Limit::Cap => "the cap",
                Limit::Device => "the device",
            }
        ),
        RequestAdvice::CheckShape => "A size this large is often a bug: a wrong shape, a broadcast that materialised, \
                               or units mixed up (elements for bytes). Check the shape at that line."
            .to_string(),
    }
}

/// Free memory broken up: PyTorch's cache settings, and pools in general.
fn fragmentation(a: &FragmentationAdvice) -> String {
    match a {
        FragmentationAdvice::CacheExpandableSegments => "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments grow in \
                                            place, so free memory between tensors can serve a large request \
                                            (PyTorch's own advice for this case)."
            .to_string(),
        FragmentationAdvice::CacheMaxSplitSize { mb } => format!(
            "Or PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{mb}: blocks larger than this are never split for \
             small tensors, so large ones stay available."
        ),
        FragmentationAdvice::CacheEmptyBetweenPhases => "torch.cuda.empty_cache() between phases (after evaluation, before \
                                            the next large allocation) returns cached segments that hold no \
                                            live tensor."
            .to_string(),
        FragmentationAdvice::CacheGcThreshold => "garbage_collection_threshold:0.8 (with \
                                     torch.cuda.set_per_process_memory_fraction) makes the allocator reclaim \
                                     cached blocks before it runs out."
            .to_string(),
        FragmentationAdvice::CachePersistentFirst => "Allocate large persistent buffers first, before the churn of \
                                         short-lived tensors breaks up the cache."
            .to_string(),
        FragmentationAdvice::ExpandableSegments => "PyTorch: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so segments \
                                       grow in place instead of needing new contiguous blocks."
            .to_string(),
        FragmentationAdvice::TrimPools => "Trim pools at phase boundaries: torch.cuda.empty_cache() (PyTorch), \
                              cuMemPoolTrimTo(pool, 0) for stream-ordered pools (or lower their \
                              CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)."
            .to_string(),
        FragmentationAdvice::PersistentFirst => "Allocate large persistent buffers first (weights, optimizer state, KV \
                                    cache), before the churn of short-lived ones breaks up the free memory."
            .to_string(),
    }
}

/// Pressure: how much to shed, and the usual ways of shedding it.
fn pressure(a: &PressureAdvice) -> String {
    match a {
        PressureAdvice::FrameworkLimit {
            framework,
            limit,
            needed,
            total,
            fragmented,
        } => framework_limit(*framework, *limit, *needed, *total, *fragmented),
        PressureAdvice::Shed {
            bytes,
            device,
            needed,
        } => format!(
            "Shed at least {} on {} ({} bytes, {} of the {} the job needed at its peak); more to leave room for \
             the allocator's rounding and caching.",
            b(*bytes),
            gpu(*device),
            count(*bytes),
            pct(*bytes, *needed),
            b(*needed)
        ),
        PressureAdvice::BoundInput { noun } => format!(
            "Bound what each {noun} takes in: a maximum length or tokens per batch, batches bucketed by length \
             (the longest tried first), or the longest that fits, found by vramtrace fit with the length as the \
             knob; a larger limit holds only until a longer input comes."
        ),
        PressureAdvice::FitCommand {
            command,
            batch,
            cap,
            device,
        } => {
            let cap = cap
                .map(|c| match device {
                    Some(d) => format!(" --cap {d}={}", cap_spec(c)),
                    None => format!(" --cap {}", cap_spec(c)),
                })
                .unwrap_or_default();
            let args: Vec<std::ffi::OsString> = command.iter().map(Into::into).collect();
            let cmd = crate::fit::command::shell_words(&args);
            match batch {
                Some(v) => format!(
                    "Find the largest batch that fits, from short runs: vramtrace fit{cap} --target {v} -- {cmd}"
                ),
                None => format!(
                    "Find the largest batch that fits, from short runs: vramtrace fit{cap} -- {cmd} (with {{}} \
                     for the batch size or length)"
                ),
            }
        }
        PressureAdvice::SmallerBatch => "Smaller batch, or micro-batching with gradient accumulation: the same \
                                 effective batch with activations for one micro-batch at a time."
            .to_string(),
        PressureAdvice::Checkpointing => "Activation checkpointing (torch.utils.checkpoint): recompute activations in \
                                  the backward pass instead of keeping them."
            .to_string(),
        PressureAdvice::MixedPrecision => "Mixed precision (bf16/fp16 autocast): halves activation memory (weights too \
                                   in bf16)."
            .to_string(),
        PressureAdvice::OffloadOptimizer => {
            "Offload optimizer state to host memory (DeepSpeed ZeRO-Offload, FSDP CPU offload).".to_string()
        }
        PressureAdvice::Shard => {
            "Shard parameters, gradients and optimizer state across GPUs (FSDP, DeepSpeed ZeRO).".to_string()
        }
        PressureAdvice::FixKeptFirst => "Bytes in use rose cycle over cycle before the event (see the leak finding): \
                                 fix what is kept across steps first (tensors stored in lists, losses \
                                 accumulated with their graph)."
            .to_string(),
    }
}

/// Memory held outside the job: who holds it, and where to go instead.
fn outside(a: &OutsideAdvice) -> String {
    match a {
        OutsideAdvice::HeldOutside {
            bytes,
            device,
            job_bytes,
        } => format!(
            "{} (estimated) on {} was held outside the job, by processes vramtrace did not trace: their pids \
             are unknown to it. Inside the job: none to blame (its processes held {} there).",
            bytes.map_or("memory".to_string(), b),
            gpu(*device),
            b(*job_bytes)
        ),
        OutsideAdvice::WhoHoldsTheGpu => {
            "Who holds the GPU: nvidia-smi --query-compute-apps=pid,used_memory --format=csv".to_string()
        }
        OutsideAdvice::MoveTheJob { device } => format!(
            "Move the job to a free GPU (CUDA_VISIBLE_DEVICES), or stop the other process on {}.",
            gpu(*device)
        ),
    }
}

/// The cap, and the allocator replayed under other settings.
fn cap(a: &CapAdvice) -> String {
    match a {
        CapAdvice::CapWouldFit {
            cap,
            needed,
            device,
        } => {
            let flag = match device {
                Some(d) => format!("{d}={}", cap_spec(*cap)),
                None => cap_spec(*cap),
            };
            format!(
                "A cap of at least {} (--cap {flag}), as a floor: the job's peak so far, or its bytes plus this \
                 request, came to {}; what later steps need is not in the trace.",
                b(*cap),
                b(*needed)
            )
        }
        CapAdvice::CapFitsHistory { cap, device } => {
            let flag = match device {
                Some(d) => format!("{d}={}", cap_spec(*cap)),
                None => cap_spec(*cap),
            };
            format!(
                "A cap of at least {} (--cap {flag}), as a floor: with it the settings it ran with serve the \
                 failed request (PyTorch's allocator replayed from its own history); what later steps need is \
                 not in the history.",
                b(*cap)
            )
        }
        CapAdvice::SettingGetsPast {
            conf,
            reserve,
            limit,
            complete,
        } => format!(
            "PYTORCH_CUDA_ALLOC_CONF={conf}: with it PyTorch's allocator serves the failed request in the same {}, \
             its reserve at most {} up to it (the allocator replayed from {}; `vramtrace whatif` tries more \
             settings). The history ends at this request: later steps may still need more.",
            b(*limit),
            b(*reserve),
            if *complete {
                "the process's whole history"
            } else {
                "the history PyTorch kept, which began late"
            }
        ),
        CapAdvice::NoSettingGetsPast { limit } => format!(
            "No allocator setting gets past the failed request in the same {} (PyTorch's allocator replayed \
             from its history under each): the tensors themselves must shrink.",
            b(*limit)
        ),
        CapAdvice::CapOverDevice { total } => format!(
            "That is more than the device's {}: the job itself must shed memory (smaller batch, checkpointing, \
             mixed precision, sharding).",
            b(*total)
        ),
        CapAdvice::CapModeWarn => "To measure first: --cap-mode warn lets over-cap allocations through and flags \
                                them in the trace."
            .to_string(),
        CapAdvice::FixGrowthBeforeCap => "But first: bytes in use rose step after step before the event (see the \
                                       leak finding), so a larger cap only delays it. Fix what is kept across \
                                       steps (outputs or losses stored with their graph: store loss.item() or \
                                       out.detach())."
            .to_string(),
    }
}

/// `--batch-size 9`, `batch 9`, or `9 (the command's argument 2)`.
fn knob_at(knob: &str, v: u64) -> String {
    if knob.starts_with("argument ") {
        format!("{v} (the command's {knob})")
    } else {
        format!("{knob} {v}")
    }
}

fn largest_batch(x: &crate::model::BatchAdvice) -> String {
    // The knob comes from the recorded command, the paths from the folder, the lines from a snapshot: none is
    // printed raw to a terminal.
    use crate::names::units::printable;
    let knob = printable(&x.knob);
    let beside = x
        .beside
        .iter()
        .map(|(p, v)| format!("{} ({})", knob_at(&knob, *v), printable(p)))
        .collect::<Vec<_>>()
        .join(" and ");
    let f = match &x.outcome {
        Err(why) => {
            return format!(
                "No largest {knob} is drawn from the run beside it at {beside}: {}.",
                printable(why)
            )
        }
        Ok(f) => f,
    };
    let Some(l) = f.largest else {
        return format!(
            "Not even {} fits in the {} the allocator could have had (the program replayed whole from this run \
             and {beside}): what does not shrink with the {} (weights, gradients, optimizer state) is too much; \
             shed that first.",
            knob_at(&knob, 1),
            b(x.limit),
            knob
        );
    };
    let mut t = format!(
        "{} fits where {} failed, in the {} the allocator could have had{}: the program replayed whole at each \
         value from this run and {beside}.",
        knob_at(&knob, l),
        x.value,
        b(x.limit),
        f.next_refused_at
            .as_ref()
            .map(|at| format!(", and {} is refused at {}", l + 1, printable(at)))
            .unwrap_or_default()
    );
    if let Some((steps, per)) = f.accumulate {
        let same = steps * per == x.value;
        t.push_str(&format!(
            " To keep the batch of {}: {} with {steps} steps of gradient accumulation{}.",
            x.value,
            knob_at(&knob, per),
            if same {
                String::new()
            } else {
                format!(" (an effective batch of {})", steps * per)
            }
        ));
    }
    if let Some((conf, v)) = &f.better {
        t.push_str(&format!(
            " With PYTORCH_CUDA_ALLOC_CONF={conf}, {} fits.",
            knob_at(&knob, *v)
        ));
    }
    if f.filled_from_kin + f.filled_in_proportion > 0 {
        let mut how = Vec::new();
        if f.filled_from_kin > 0 {
            how.push(format!(
                "{} as the requests it made that asked the same size in the other run (from the same line first): \
                 a guess",
                count(f.filled_from_kin)
            ));
        }
        if f.filled_in_proportion > 0 {
            how.push(format!(
                "{} in proportion to the {} (an upper bound for sizes that grow at most in proportion)",
                count(f.filled_in_proportion),
                knob
            ));
        }
        t.push_str(&format!(
            " This run failed before some of the program's requests that no earlier step of it repeats; they are \
             sized {}. A second run that finishes, at another value beside it, makes the answer exact.",
            how.join(", and ")
        ));
    }
    if f.own_requests > 0 {
        t.push_str(&format!(
            " The runs' code paths differ by {} requests from the same lines (libraries choose kernels by size): \
             which one the program takes between the runs is unknown, so the advice fits with both.",
            count(f.own_requests)
        ));
    }
    if f.guessed > 0 {
        t.push_str(&format!(
            " {} requests fit more than one shape in the {}: a run at a third value tells which.",
            count(f.guessed),
            knob
        ));
    }
    t
}

/// More of the GPU for the framework's own allocator (a share named when the GPU's size is known), or a
/// smaller step.
fn framework_limit(
    framework: vramtrace_format::Framework,
    limit: u64,
    needed: u64,
    total: Option<u64>,
    fragmented: bool,
) -> String {
    // The share that holds what it needed with a tenth to spare, in hundredths, when the GPU has it.
    let share = total
        .filter(|&t| t > 0)
        .map(|t| (needed as f64 * 1.1 / t as f64 * 100.0).ceil() / 100.0)
        .filter(|&f| f <= 0.95);
    let need = if fragmented {
        format!(
            "its {} had room for what it asked, but not as one block",
            b(limit)
        )
    } else {
        format!("it needed at least {} where it had {}", b(needed), b(limit))
    };
    match framework {
        vramtrace_format::Framework::Jax => format!(
            "Give JAX's pool more of the GPU ({need}): XLA_PYTHON_CLIENT_MEM_FRACTION={} (the default is 0.75), \
             or XLA_PYTHON_CLIENT_PREALLOCATE=false to take memory as it is needed{}. Or make the step smaller: \
             a smaller batch, jax.checkpoint (rematerialisation) on the largest blocks, bfloat16.",
            share.map_or("<a larger share>".to_string(), |f| format!("{f:.2}")),
            if fragmented {
                " (a pool that grows has fewer holes)"
            } else {
                ""
            }
        ),
        vramtrace_format::Framework::Torch => format!(
            "Raise the share torch.cuda.set_per_process_memory_fraction allows ({need}){}, or shed memory as \
             below.",
            share.map_or(String::new(), |f| format!(": {f:.2} of this GPU"))
        ),
    }
}
