//! What if the batch were smaller (issue 39): from two or three runs of one program at different values of a
//! knob (the batch size, the sequence length), each with its PyTorch history, the requests matched one for one
//! (`align`), each one's size fitted in the knob (`fit`), a history synthesized at another value (`synth`) and
//! replayed through the allocator's model under each configuration (`answer`): the peaks there, and the largest
//! value that fits a limit.

pub mod addresses;
pub mod align;
pub mod answer;
pub mod answered;
pub mod beside;
pub mod fit;
pub mod paths;
pub mod postmortem;
pub mod steps;
pub mod synth;
#[cfg(test)]
mod tests;

pub use align::{align, KnobError, KnobRun};
pub use answer::{answer, KnobAnswer, KnobJob};
