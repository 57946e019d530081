//! What kept a process's CUDA tensors alive, as the Python bridge found it (a `holders` record: at an
//! out-of-memory error from PyTorch's observer, before the exception unwinds; at exit after a growth; on
//! request). bridge/vramtrace_bridge/_holders.py makes it; docs/OOM.md, "What holds the memory", says how.

use vramtrace_format::keys::bridge::{values, what};

use crate::model::analysis::bridge::doc;
use vramtrace_format::{Bridge, NO_DEVICE};

/// Holders kept from one record (the bridge sends at most 16).
pub const MAX_HOLDERS: usize = 16;
/// Walks kept at exit or on request, all processes together.
pub const MAX_WALKS: usize = 64;

/// When the walk ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkAt {
    /// At the process's `n`th out-of-memory error (1-based), before it unwound.
    Oom(u64),
    Exit,
    Request,
}

impl WalkAt {
    pub fn key(self) -> &'static str {
        match self {
            WalkAt::Oom(_) => what::OOM,
            WalkAt::Exit => what::EXIT,
            WalkAt::Request => values::AT_REQUEST,
        }
    }
}

/// What a holder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderKind {
    /// A name the program can reach: a global, a local, an attribute path, a container inside one.
    Variable,
    /// The tensors autograd saved for the backward pass of the graph behind a variable.
    Graph,
    /// A module's parameters and buffers.
    Parameters,
    /// An optimizer's state.
    Optimizer,
    /// A reference cycle awaiting Python's garbage collector.
    Cycle,
    /// Live tensors no Python object reaches (native code, a graph not named, CUDA graphs).
    Unreached,
    /// PyTorch's cache: reserved but free.
    Cache,
}

impl HolderKind {
    fn parse(s: &str) -> Option<HolderKind> {
        Some(match s {
            "variable" => HolderKind::Variable,
            "graph" => HolderKind::Graph,
            "parameters" => HolderKind::Parameters,
            "optimizer" => HolderKind::Optimizer,
            "cycle" => HolderKind::Cycle,
            "unreached" => HolderKind::Unreached,
            "cache" => HolderKind::Cache,
            _ => return None,
        })
    }

    pub fn key(self) -> &'static str {
        match self {
            HolderKind::Variable => "variable",
            HolderKind::Graph => "graph",
            HolderKind::Parameters => "parameters",
            HolderKind::Optimizer => "optimizer",
            HolderKind::Cycle => "cycle",
            HolderKind::Unreached => "unreached",
            HolderKind::Cache => "cache",
        }
    }

    /// Memory the program keeps on purpose (weights, optimizer state, the cache): never the suspect of a
    /// growth.
    pub fn expected(self) -> bool {
        matches!(
            self,
            HolderKind::Parameters | HolderKind::Optimizer | HolderKind::Cache
        )
    }
}

/// One holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub kind: HolderKind,
    /// The path the program reaches it by (`kept`, `trainer.outputs`), or what it is.
    pub name: String,
    /// `global of __main__`, `local of train() at train.py:42`; empty when none.
    pub scope: String,
    /// The container's type (`list`, `dict`, `Tensor`).
    pub what: String,
    pub tensors: u64,
    pub bytes: u64,
    /// For a graph: its nodes, and the iterations it spans when more than one.
    pub nodes: Option<u64>,
    pub batches: Option<u64>,
    /// Reached from a library's frame (a model's forward in progress), not from the program's own names.
    pub library: bool,
}

/// One walk of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holders {
    pub pid: u32,
    pub device: Option<u32>,
    /// Relative ns.
    pub time_ns: u64,
    pub at: WalkAt,
    pub elapsed_ms: u64,
    /// Python objects looked at, CUDA tensors found and their bytes (each storage once).
    pub objects: u64,
    pub tensors: u64,
    pub tensor_bytes: u64,
    /// Why the walk stopped short (its time bound), when it did: the holders are what it found by then.
    pub partial: Option<String>,
    /// Largest first.
    pub holders: Vec<Holder>,
}

impl Holder {
    /// The holder in words: `kept (list, global of __main__)`, `the autograd graph behind total (global of
    /// __main__), spanning 45 iterations`: what the reports name it by.
    /// Its type, as the walk names it, without a module path.
    fn type_name(&self) -> &str {
        self.what.rsplit('.').next().unwrap_or("")
    }

    /// Of a Python mapping type (a dict and its kin).
    fn mapping_type(&self) -> bool {
        matches!(
            self.type_name(),
            "dict" | "OrderedDict" | "defaultdict" | "Counter" | "ChainMap" | "WeakValueDictionary"
        )
    }

    /// A mapping, or anything named as a cache: what the advice tells to evict.
    pub fn is_mapping(&self) -> bool {
        self.mapping_type() || self.name.to_ascii_lowercase().contains("cache")
    }

    /// Of a Python container type: a sequence, a set or a mapping.
    pub fn is_container(&self) -> bool {
        matches!(self.type_name(), "list" | "deque" | "set" | "tuple") || self.mapping_type()
    }

    pub fn label(&self) -> String {
        let h = self;
        let scope = |h: &Holder| {
            let parts: Vec<&str> = [h.what.as_str(), h.scope.as_str()]
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect();
            if parts.is_empty() {
                String::new()
            } else {
                format!(" ({})", parts.join(", "))
            }
        };
        match h.kind {
            HolderKind::Variable => format!("{}{}", h.name, scope(h)),
            HolderKind::Graph => {
                let mut t = format!(
                    "the autograd graph behind {}{}",
                    h.name,
                    if h.scope.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", h.scope)
                    }
                );
                match (h.batches, h.nodes) {
                    (Some(n), _) => {
                        t.push_str(&format!(", spanning {} iterations", crate::names::units::count(n)))
                    }
                    (None, Some(n)) => t.push_str(&format!(", {}", crate::names::units::counted(n, "node", "nodes"))),
                    _ => {}
                }
                t
            }
            HolderKind::Parameters => {
                format!("the parameters and buffers of {}{}", h.name, scope(h))
            }
            HolderKind::Optimizer => format!("the state of optimizer {}{}", h.name, scope(h)),
            // The walk saw a referrer it did not reach from the program's names: a cycle, most often, but it
            // cannot tell one from an object held deeper than it went.
            HolderKind::Cycle => format!(
                "a {} the program's names do not reach (a reference cycle awaiting Python's garbage collector, \
                 or held deeper than the walk went)",
                if h.what.is_empty() { "container" } else { h.what.as_str() }
            ),
            HolderKind::Unreached => "tensors no Python object reaches".to_string(),
            HolderKind::Cache => "PyTorch's cache (reserved but free)".to_string(),
        }
    }
}

/// The most bytes a holder's figure may say (1 PiB): more is no GPU's.
pub const MAX_HOLDER_BYTES: u64 = 1 << 50;

impl Holders {
    /// Reads a `holders` record at relative time `t`; `None` when it says nothing usable.
    pub fn from_bridge(b: &Bridge, t: u64) -> Option<Holders> {
        let walk: doc::Holders = doc::read(&b.doc);
        let at = match walk.at.0.as_deref()? {
            what::OOM => WalkAt::Oom(walk.oom.or0()),
            what::EXIT => WalkAt::Exit,
            values::AT_REQUEST => WalkAt::Request,
            _ => return None,
        };
        let clean = |s: &doc::Text| {
            s.as_str()
                .chars()
                .filter(|&c| !crate::names::units::unsafe_char(c))
                .take(200)
                .collect::<String>()
        };
        let mut holders = Vec::new();
        for h in walk.holders.0.iter().take(MAX_HOLDERS) {
            // A kind this build does not know (a newer bridge's) is not shown.
            let Some(kind) = h.kind.0.as_deref().and_then(HolderKind::parse) else {
                continue;
            };
            // No GPU holds a petabyte: a figure past it is a process's forgery, and the holder is not shown.
            if h.bytes.get().is_some_and(|b| b > MAX_HOLDER_BYTES) {
                continue;
            }
            holders.push(Holder {
                kind,
                name: clean(&h.name),
                scope: clean(&h.scope),
                what: clean(&h.what),
                tensors: h.tensors.or0(),
                bytes: h.bytes.or0(),
                nodes: h.nodes.get(),
                batches: h.batches.get().filter(|&x| x > 1),
                library: h.lib.set(),
            });
        }
        holders.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.name.cmp(&b.name)));
        Some(Holders {
            pid: b.pid,
            device: (b.device != NO_DEVICE).then_some(b.device),
            time_ns: t,
            at,
            elapsed_ms: walk.elapsed_ms.or0(),
            objects: walk.objects.or0(),
            tensors: walk.tensors.or0(),
            tensor_bytes: walk
                .tensor_bytes
                .get()
                .filter(|&x| x <= MAX_HOLDER_BYTES)
                .unwrap_or(0),
            partial: walk.partial.set().then(|| match walk.partial_reason.0 {
                Some(_) => clean(&walk.partial_reason),
                None => "its time bound".to_string(),
            }),
            holders,
        })
    }

    /// The holders a growth can be blamed on: what the program keeps by name, a graph, a cycle, the
    /// unreached; not its weights, optimizer state or PyTorch's cache.
    pub fn suspects(&self) -> impl Iterator<Item = &Holder> {
        self.holders.iter().filter(|h| !h.kind.expected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `holders` record of device 0, from the flattened pairs of the bridges before the typed wire.
    fn rec(fields: &[(&str, &str)]) -> Bridge {
        crate::model::analysis::bridge::record(5, "holders", 0, fields)
    }

    /// The holder kinds read are the ones the schema lists (bridge/schema.json `values`), each both ways.
    #[test]
    fn holder_kinds_are_the_schemas() {
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../../../bridge/schema.json")).unwrap();
        let listed = schema["values"]["holders.holders.kind"].as_array().unwrap();
        assert_eq!(listed.len(), 7);
        for v in listed {
            let kind = HolderKind::parse(v.as_str().unwrap()).unwrap();
            assert_eq!(kind.key(), v.as_str().unwrap());
        }
    }

    #[test]
    fn a_record_reads_into_holders_largest_first() {
        let h = Holders::from_bridge(
            &rec(&[
                ("at", "oom"),
                ("oom", "2"),
                ("tensors", "60"),
                ("tensor_bytes", "5000"),
                ("h.0.kind", "parameters"),
                ("h.0.name", "model"),
                ("h.0.bytes", "1000"),
                ("h.1.kind", "variable"),
                ("h.1.name", "kept"),
                ("h.1.scope", "global of __main__"),
                ("h.1.what", "list"),
                ("h.1.tensors", "57"),
                ("h.1.bytes", "4000"),
                ("h.2.kind", "graph"),
                ("h.2.name", "total\u{202e}"),
                ("h.2.batches", "1"),
                ("h.3.kind", "nonsense"),
                ("h.4.kind", "variable"),
                ("h.4.name", "late"),
                ("h.4.bytes", "10"),
            ]),
            7,
        )
        .unwrap();
        assert_eq!(h.at, WalkAt::Oom(2));
        assert_eq!(h.device, Some(0));
        // A kind it does not know (a newer bridge's) is skipped; largest first.
        assert_eq!(h.holders.len(), 4);
        assert_eq!(h.holders[0].name, "kept");
        assert_eq!(h.holders[0].tensors, 57);
        assert_eq!(h.holders[1].kind, HolderKind::Parameters);
        assert_eq!(h.holders[2].name, "late");
        // Control characters (a right-to-left override) never reach a terminal; one batch is no span.
        assert_eq!(h.holders[3].name, "total");
        assert_eq!(h.holders[3].batches, None);
        assert_eq!(h.suspects().count(), 3);
        assert!(Holders::from_bridge(&rec(&[("at", "later")]), 0).is_none());
    }

    #[test]
    fn a_holder_of_a_forged_size_is_not_shown() {
        let h = Holders::from_bridge(
            &rec(&[
                ("at", "exit"),
                ("tensor_bytes", "18446744073709551615"),
                ("h.0.kind", "variable"),
                ("h.0.name", "huge"),
                ("h.0.bytes", "18446744073709551000"),
                ("h.1.kind", "variable"),
                ("h.1.name", "kept"),
                ("h.1.bytes", "4096"),
            ]),
            7,
        )
        .unwrap();
        let names: Vec<&str> = h.holders.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["kept"]);
        assert_eq!(h.tensor_bytes, 0);
    }
}
