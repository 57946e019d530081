//! What kept the tensors alive (the bridge's walk), as both JSON reports carry it: on an error in `oom
//! --json`, at exit or on request in the report's `bridge.walks`.

use serde::Serialize;

use crate::model::holders::{Holder, Holders};
use crate::reporters::prose;

/// One walk.
#[derive(Serialize)]
pub struct HoldersJson<'a> {
    pid: u32,
    device: Option<u32>,
    time_ns: u64,
    /// `oom`, `exit` or `request`.
    at: &'static str,
    elapsed_ms: u64,
    objects: u64,
    tensors: u64,
    tensor_bytes: u64,
    /// Why the walk stopped short, when it did.
    partial: Option<&'a str>,
    holders: Vec<HolderJson<'a>>,
}

#[derive(Serialize)]
struct HolderJson<'a> {
    kind: &'static str,
    name: &'a str,
    scope: &'a str,
    what: &'a str,
    tensors: u64,
    bytes: u64,
    nodes: Option<u64>,
    batches: Option<u64>,
    /// Reached from a library's frame (a model's forward in progress), not the program's own names.
    library: bool,
    /// The holder in words, as the text reports say it.
    label: String,
}

impl<'a> HoldersJson<'a> {
    pub fn of(h: &'a Holders) -> Self {
        HoldersJson {
            pid: h.pid,
            device: h.device,
            time_ns: h.time_ns,
            at: h.at.key(),
            elapsed_ms: h.elapsed_ms,
            objects: h.objects,
            tensors: h.tensors,
            tensor_bytes: h.tensor_bytes,
            partial: h.partial.as_deref(),
            holders: h.holders.iter().map(holder).collect(),
        }
    }
}

fn holder(h: &Holder) -> HolderJson<'_> {
    HolderJson {
        kind: h.kind.key(),
        name: &h.name,
        scope: &h.scope,
        what: &h.what,
        tensors: h.tensors,
        bytes: h.bytes,
        nodes: h.nodes,
        batches: h.batches,
        library: h.library,
        label: prose::holder_label(h),
    }
}
