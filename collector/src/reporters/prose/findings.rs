//! A finding in one sentence, and the allocator's settings in a few words.

use crate::model::diagnose::{AllocatorSettings, Finding};
use crate::model::LeakTrend;
use crate::names::units::{bytes, count};

use super::phrases::{growth_size, nouns};

/// One sentence for people.
pub fn finding(f: &Finding) -> String {
    match f {
        Finding::StepNeedRises(n) => step_need(n),
        Finding::Fit {
            needed_bytes,
            available_bytes,
            short_bytes,
            limited_by,
        } => fit(*needed_bytes, *available_bytes, *short_bytes, limited_by),
        Finding::LeakTrend(l) => leak(l),
        Finding::PoolCache {
            freed_bytes,
            shortfall_bytes,
        } => {
            let vs = match shortfall_bytes {
                Some(s) if freed_bytes >= s => {
                    format!(", at least the {} shortfall", bytes(*s))
                }
                Some(s) => format!(" (the shortfall was {})", bytes(*s)),
                None => String::new(),
            };
            format!(
                "The job freed {} with cuMemFreeAsync in the last second before the event{vs}; its \
                 stream-ordered pool may still have held that memory cached.",
                bytes(*freed_bytes)
            )
        }
        Finding::LedgerDiffers {
            ledger_bytes,
            trace_bytes,
        } => format!(
            "The cap's ledger counted {} for the job on this device, the trace {} (dropped events, or a dead \
             process's share not yet reclaimed); the ledger's figure was used.",
            bytes(*ledger_bytes),
            bytes(*trace_bytes)
        ),
        Finding::DroppedEvents { count } => format!(
            "{count} events were dropped by the shim before this point: the job's bytes from the trace can \
             be low."
        ),
        Finding::NoDriverFigures => "The driver could not say how much memory was free (no current \
                                     context): the cause was decided from the trace's figures alone."
            .to_string(),
        Finding::FrameworkFigures {
            allocated_bytes,
            reserved_bytes,
            inactive_split_bytes,
            largest_free_block_bytes,
            free_in_live_segments_bytes,
            alloc_retries,
            settings: s,
        } => {
            let mut t = format!(
                "PyTorch's allocator in this process: {} allocated in tensors, {} reserved ({} cached, \
                 {} of it inactive split)",
                bytes(*allocated_bytes),
                bytes(*reserved_bytes),
                bytes(reserved_bytes.saturating_sub(*allocated_bytes)),
                bytes(*inactive_split_bytes)
            );
            if let Some(l) = largest_free_block_bytes {
                t.push_str(&format!("; largest free block {}", bytes(*l)));
            }
            if let Some(f) = free_in_live_segments_bytes {
                t.push_str(&format!(
                    "; {} free inside segments that hold live tensors (it cannot give those back)",
                    bytes(*f)
                ));
            }
            t.push_str(&format!(
                "; {alloc_retries} cache flush{} and retr{}; settings: {}.",
                if *alloc_retries == 1 { "" } else { "es" },
                if *alloc_retries == 1 { "y" } else { "ies" },
                settings(s.as_ref())
            ));
            t
        }
        Finding::AllocatedLeakTrend(l) => format!(
            "Allocated bytes (PyTorch's own figure; its cache hides them from the driver) grew: {}",
            leak(l).trim_start_matches("Growth: ")
        ),
        Finding::AllocRetries { count } => format!(
            "PyTorch flushed its cache and retried {count} time{} before this error \
             (`num_alloc_retries`): it was already short of memory.",
            if *count == 1 { "" } else { "s" }
        ),
        Finding::BackwardThread { thread } => format!(
            "The failing allocation was made on autograd's backward thread ({thread}): the backward \
             pass ran out of memory, not the forward pass."
        ),
        Finding::RankAsymmetry {
            pid,
            rank,
            bytes: mine,
            peers,
            peers_median_bytes,
            peers_max_bytes,
        } => format!(
            "Rank {rank} (pid {pid}) held {} at the error; its {} running the same program held {} (median; at \
             most {}): {} more. Ranks doing the same work should hold about the same: what rank {rank} keeps \
             that they do not is the suspect.",
            bytes(*mine),
            if *peers == 1 {
                "peer".to_string()
            } else {
                format!("{} peers", count(*peers))
            },
            bytes(*peers_median_bytes),
            bytes(*peers_max_bytes),
            bytes(mine.saturating_sub(*peers_median_bytes))
        ),
    }
}

/// A step that needed more than those before it: the last one alone, or each more than the last.
fn step_need(n: &crate::model::StepNeed) -> String {
    let noun = n.unit.noun();
    if n.outgrew {
        format!(
            "The {noun} at the error needed more than any before it: {} held and asked, where every earlier \
             {noun} needed at most {}; its input was larger than theirs",
            crate::names::units::bytes(n.last_peak),
            crate::names::units::bytes(n.first_peak),
        )
    } else {
        format!(
            "Each {noun} needed more than the last: PyTorch's peak rose from {} at {noun} {} to {} at {noun} {}, \
             by more than what the {} kept; the work of each {noun} grows with its input (sequences sorted by \
             length, a curriculum, a generation's cache growing a token at a time), so the {noun} at the error \
             needed more than any before it",
            crate::names::units::bytes(n.first_peak),
            crate::names::units::count(n.first_step),
            crate::names::units::bytes(n.last_peak),
            crate::names::units::count(n.last_step),
            nouns(noun, 2),
        )
    }
}

/// What the job needed against what the cap or the device could give it.
fn fit(needed_bytes: u64, available_bytes: u64, short_bytes: u64, limited_by: &str) -> String {
    let what = if limited_by == "cap" {
        "the cap"
    } else {
        "the device"
    };
    if short_bytes == 0 {
        format!(
            "The job needed {} at most up to this point (its peak, or its bytes plus the request) \
             and {what} could give it {}: it fitted by the numbers.",
            bytes(needed_bytes),
            bytes(available_bytes)
        )
    } else {
        format!(
            "The job needed {} at most up to this point (its peak, or its bytes plus the request); \
             {what} could give it {}: {} short of fitting.",
            bytes(needed_bytes),
            bytes(available_bytes),
            bytes(short_bytes)
        )
    }
}

/// One sentence on a growth finding: its size, then what grew and where.
pub fn leak(l: &LeakTrend) -> String {
    let mut s = format!("Growth: {}.", growth_size(l));
    if !l.groups.is_empty() {
        let g: Vec<String> = l
            .groups
            .iter()
            .take(3)
            .map(|g| format!("{} x {} {}", g.count, bytes(g.bytes_each), g.api.name()))
            .collect();
        s.push_str(&format!(
            " Made during the rise and still live: {}.",
            g.join(", ")
        ));
    }
    if !l.sites.is_empty() {
        let g: Vec<String> = l
            .sites
            .iter()
            .take(3)
            .map(|g| format!("{} ({} in {})", g.label, bytes(g.bytes), count(g.count)))
            .collect();
        s.push_str(&format!(" Their call sites: {}.", g.join("; ")));
    }
    s
}

/// The allocator settings an out-of-memory record carried, in a few words (`None`: it sent no record).
pub fn settings(o: Option<&AllocatorSettings>) -> String {
    let Some(o) = o else {
        return "unknown (no out-of-memory record from the framework)".to_string();
    };
    let mut v = Vec::new();
    if let Some(b) = &o.backend {
        v.push(format!("backend {b}"));
    }
    v.push(match o.expandable_segments {
        Some(true) => "expandable segments on".to_string(),
        Some(false) | None => "expandable segments off".to_string(),
    });
    v.push(match o.max_split_size {
        Some(m) => format!("max split size {}", bytes(m)),
        None => "no max split size".to_string(),
    });
    if let Some(g) = &o.garbage_collection_threshold {
        v.push(format!("garbage collection threshold {g}"));
    }
    if let Some(c) = o.alloc_conf.as_deref().filter(|c| !c.is_empty()) {
        v.push(format!("PYTORCH_CUDA_ALLOC_CONF={c}"));
    }
    v.join(", ")
}
