//! One trace's what-if as the verb hands it to its reporters: apart from `answer` and `from_trace`, so that
//! neither the reporters nor the verb tie the two into a circle with the model.

use super::answer::WhatIf;
use super::from_trace::Loaded;

/// One trace's what-if, or why there is none.
pub struct Answered {
    pub file: std::path::PathBuf,
    pub loaded: Loaded,
    pub whatif: Option<WhatIf>,
}
