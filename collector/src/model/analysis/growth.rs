//! A rise in bytes in use, as the answer keeps it: the trend of its minima, what its steps are (the program's
//! own, counted by the Python bridge, or the driver's cycles), and the steps that each needed more than the last.
//! The observers read them from the replay (`observe/growth.rs`, `observe/steps.rs`, `observe/framework.rs`).

use vramtrace_format::Api;

/// A low point of a device's bytes in use between two peaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minimum {
    pub t_ns: u64,
    pub bytes: u64,
}

/// Allocations of one (api, size), made between the first and last minima of a leak trend and still live at
/// the out-of-memory event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakGroup {
    pub api: Api,
    pub bytes_each: u64,
    pub count: u64,
    pub bytes: u64,
}

/// What a growth's steps are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrowthUnit {
    /// The program's own iterations, counted by the Python bridge.
    Steps(StepSource),
    /// Driver level, one process: each rise of its floor between frees is one cycle.
    Cycles,
    /// The device's timeline cut into wall-clock windows; steps are the timeline's cycles when it resolves them.
    Time,
}

/// Steps that each needed more than the one before: PyTorch's allocated peak read at their boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepNeed {
    pub unit: GrowthUnit,
    pub first_step: u64,
    pub first_peak: u64,
    pub last_step: u64,
    pub last_peak: u64,
    /// Not a rise over the latest iterations but one iteration, the one at the error, needing far more than
    /// any before it (a request much longer than the others): `first_*` is what the earlier ones needed at
    /// most (PyTorch's peak counter at the last boundary), `last_peak` what this one held and asked at the
    /// error.
    pub outgrew: bool,
}

/// Which of the program's iterations the bridge counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepSource {
    /// `optimizer.step()` (PyTorch's global step hook).
    Optimizer,
    /// Batches drawn from a `torch.utils.data.DataLoader`.
    Batches,
    /// Outermost `torch.no_grad` / `torch.inference_mode` scopes entered: the iterations of a loop with neither
    /// an optimizer nor a DataLoader (a serving loop's requests, an evaluation's or a generation's steps).
    Scopes,
    /// The tensors a container kept at the error holds (the bridge's walk), each one an iteration's, for a loop
    /// nothing counted.
    HeldEntries,
    /// The iterations an autograd graph kept at the error spans (the bridge's walk), for a loop with neither.
    GraphIterations,
}

impl GrowthUnit {
    /// The JSON name.
    pub fn key(self) -> &'static str {
        match self {
            GrowthUnit::Steps(StepSource::Optimizer) => "optimizer_steps",
            GrowthUnit::Steps(StepSource::Batches) => "dataloader_batches",
            GrowthUnit::Steps(StepSource::Scopes) => "no_grad_iterations",
            GrowthUnit::Steps(StepSource::HeldEntries) => "held_entries",
            GrowthUnit::Steps(StepSource::GraphIterations) => "graph_iterations",
            GrowthUnit::Cycles => "driver_cycles",
            GrowthUnit::Time => "time_windows",
        }
    }

    /// A step in words (`step`, `batch`, `cycle`).
    pub fn noun(self) -> &'static str {
        match self {
            GrowthUnit::Steps(StepSource::Optimizer) => "step",
            GrowthUnit::Steps(StepSource::Batches) => "batch",
            GrowthUnit::Steps(StepSource::Scopes) => "iteration",
            GrowthUnit::Steps(StepSource::HeldEntries) => "entry",
            GrowthUnit::Steps(StepSource::GraphIterations) => "iteration",
            GrowthUnit::Cycles | GrowthUnit::Time => "cycle",
        }
    }
}

/// Bytes in use rising across repeated cycles: the minima between peaks, each no lower than the one before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakTrend {
    /// The trailing run of non-decreasing minima (at least [`LEAK_MIN_MINIMA`]).
    pub minima: Vec<Minimum>,
    /// Last minimum - first.
    pub rise_bytes: u64,
    /// The repeating steps counted over the rise, when they could be told apart (a growth; see
    /// [`growth::growth`]).
    pub steps: Option<u64>,
    /// What `steps` counts: the program's own steps (the Python bridge's count), the driver-level cycles of one
    /// process, or the cycles of a timeline cut into wall-clock windows.
    pub unit: GrowthUnit,
    /// The process whose floor grew, when the growth was read per process (steps and cycles).
    pub pid: Option<u32>,
    /// Filled in out-of-memory snapshots only: the largest groups (at most 10), largest first.
    pub groups: Vec<LeakGroup>,
    /// Groups beyond those listed.
    pub more_groups: u64,
    /// Filled in out-of-memory snapshots of traces with stacks: the same allocations by call site, largest
    /// first (at most [`SITES_LISTED`]).
    pub sites: Vec<LeakSite>,
    /// Call sites beyond those listed.
    pub more_sites: u64,
}

/// Allocations of one call site made between the first and last minima of a leak trend and still live at the
/// out-of-memory event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakSite {
    /// An index into [`Analysis::call_sites`]`.sites`.
    pub site: usize,
    pub count: u64,
    pub bytes: u64,
    /// The call site in one line.
    pub label: String,
}
