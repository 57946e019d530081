//! What the knob's what-if hands its reporters (`reporters/whatif_knob_{text,json}.rs`): the answer with the
//! runs it came from. Here, below the verb, so that the reporters need not import the verb that calls them.

use std::path::PathBuf;

use crate::whatif::batch::{KnobAnswer, KnobJob};

/// What the verb hands its reporters.
pub struct KnobAnswered {
    pub knob: String,
    pub files: Vec<(PathBuf, u64)>,
    pub job: KnobJob,
    pub answer: KnobAnswer,
    /// How much the runs' reserves move with each other's segment addresses.
    pub addresses: Option<crate::whatif::batch::addresses::Spread>,
    pub notes: Vec<String>,
}
