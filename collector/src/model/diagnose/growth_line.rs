//! Where a growth came from, as a post-mortem names it, and what kind of thing grows (for the advice).

use crate::model::analysis::{Analysis, LeakTrend, OomSnapshot};

/// Where a growth came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrowthLine {
    /// The line (a call site's label).
    pub label: String,
    /// What the line's bytes are.
    pub source: LineSource,
    /// Bytes made there and live at the error: during the rise when `during_rise`, else (the history was armed
    /// after the rise, so it cannot say when they were made) all of the line's live bytes.
    pub bytes: u64,
    pub count: u64,
    pub during_rise: bool,
    /// What the line is, for the advice.
    pub kind: GrowthKind,
}

/// What a growth line's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineSource {
    /// The framework's live tensors allocated there (its allocation history).
    Tensors,
    /// The driver allocations made there (a program without a caching allocator).
    Driver,
    /// The code that grew a caching allocator's cache there: the bytes are whatever tensors live in it now, not
    /// necessarily its.
    Cache,
}

impl LineSource {
    /// The JSON name.
    pub fn key(self) -> &'static str {
        match self {
            LineSource::Tensors => "tensors",
            LineSource::Driver => "driver",
            LineSource::Cache => "cache",
        }
    }
}

/// What grows, as far as the line tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrowthKind {
    /// A KV cache (transformers' cache classes, a `past_key_values`): it grows with the batch and the sequence.
    KvCache,
    /// An optimizer's state: made once, at its first step.
    OptimizerState,
    /// Anything else kept across steps.
    Kept,
}

impl GrowthKind {
    /// What a holder the walk found is, by its name, scope and type.
    pub fn of_holder(h: &crate::model::holders::Holder) -> GrowthKind {
        GrowthKind::of(&format!("{} {} {}", h.name, h.scope, h.what))
    }

    pub fn key(self) -> &'static str {
        match self {
            GrowthKind::KvCache => "kv_cache",
            GrowthKind::OptimizerState => "optimizer_state",
            GrowthKind::Kept => "kept",
        }
    }

    /// From the words of a line and its stack.
    pub fn of(words: &str) -> GrowthKind {
        let w = words.to_ascii_lowercase();
        const KV: [&str; 7] = [
            "cache_utils",
            "past_key_value",
            "kv_cache",
            "kvcache",
            "dynamiccache",
            "key_cache",
            "dynamiclayer",
        ];
        const OPT: [&str; 4] = ["torch/optim/", "_init_group", "exp_avg", "optimizer"];
        if KV.iter().any(|k| w.contains(k)) {
            GrowthKind::KvCache
        } else if OPT.iter().any(|k| w.contains(k)) {
            GrowthKind::OptimizerState
        } else {
            GrowthKind::Kept
        }
    }
}

/// The line a growth came from: PyTorch's live tensors when its history was kept (allocated during the rise),
/// else the call site of the driver allocations made during the rise, labelled for what it is in a process
/// with a caching allocator.
pub(super) fn growth_line(a: &Analysis, s: &OomSnapshot, l: &LeakTrend) -> Option<GrowthLine> {
    if let Some(k) = s
        .framework
        .as_ref()
        .and_then(|f| f.snapshot.as_ref())
        .and_then(|r| {
            r.kept
                .iter()
                .filter(|k| k.during_rise_bytes > 0)
                .max_by_key(|k| k.during_rise_bytes)
                .or(r.kept.first())
        })
    {
        return Some(GrowthLine {
            label: k.label.clone(),
            source: LineSource::Tensors,
            bytes: if k.during_rise_bytes > 0 {
                k.during_rise_bytes
            } else {
                k.bytes
            },
            count: k.count,
            during_rise: k.during_rise_bytes > 0,
            kind: GrowthKind::of(&k.label),
        });
    }
    let g = s
        .driver_leak()
        .and_then(|d| d.sites.first())
        .or(l.sites.first())?;
    let site = a.call_sites.sites.get(g.site);
    let words: String = site.map_or(g.label.clone(), |x| {
        x.frames
            .iter()
            .map(|f| f.label())
            .chain(std::iter::once(g.label.clone()))
            .collect::<Vec<_>>()
            .join(" ")
    });
    let caching = site
        .and_then(|x| a.process(x.pid))
        .is_some_and(|p| !p.framework.is_empty());
    Some(GrowthLine {
        label: g.label.clone(),
        source: if caching {
            LineSource::Cache
        } else {
            LineSource::Driver
        },
        bytes: g.bytes,
        count: g.count,
        during_rise: true,
        kind: GrowthKind::of(&words),
    })
}

/// The KV cache's line, when the failing request or the tensors live at the error came from one (a serving loop
/// whose batches or sequences grow): the advice then says to bound them, whatever the cause.
/// The largest holder the bridge's walk found at the error (not weights, optimizer state or cache), when it is a
/// KV cache (transformers' cache code, a `past_key_values`).
pub(super) fn kv_cache_holder(s: &OomSnapshot) -> Option<&crate::model::holders::Holder> {
    s.holders
        .as_ref()?
        .suspects()
        .next()
        .filter(|h| GrowthKind::of_holder(h) == GrowthKind::KvCache)
}

pub(super) fn kv_cache_line(a: &Analysis, s: &OomSnapshot) -> Option<String> {
    let request = s
        .request_site
        .and_then(|i| a.call_sites.sites.get(i))
        .and_then(|x| {
            let words: Vec<String> = x.frames.iter().map(|f| f.label()).collect();
            (GrowthKind::of(&words.join(" ")) == GrowthKind::KvCache).then(|| x.label())
        });
    request.or_else(|| {
        let r = s.framework.as_ref()?.snapshot.as_ref()?;
        r.kept
            .iter()
            .take(3)
            .find(|k| GrowthKind::of(&k.label) == GrowthKind::KvCache)
            .map(|k| k.label.clone())
    })
}
