//! The report's layout: its one wrapping rule, at its width, and how many rows a process table shows.

use crate::reporters::text::WIDTH;

/// Word-wraps to the report's width (the one wrapping rule of every text output: text::wrap).
pub(super) fn wrap(o: &mut String, text: &str, indent: &str) {
    crate::reporters::text::wrap(o, text, indent, WIDTH);
}

/// Rows of a process table before the rest is summed up.
pub(super) const MAX_ROWS: usize = 32;
