//! What kept a process's CUDA tensors alive, as the Python bridge found it (a `holders` record: at an
//! out-of-memory error from PyTorch's observer, before the exception unwinds; at exit after a growth; on
//! request). bridge/vramtrace_bridge/_holders.py makes it; docs/OOM.md, "What holds the memory", says how.

use vramtrace_format::keys::bridge::{values, what};

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
    pub(super) fn parse(s: &str) -> Option<HolderKind> {
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

impl Holders {
    /// The holders a growth can be blamed on: what the program keeps by name, a graph, a cycle, the
    /// unreached; not its weights, optimizer state or PyTorch's cache.
    pub fn suspects(&self) -> impl Iterator<Item = &Holder> {
        self.holders.iter().filter(|h| !h.kind.expected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
