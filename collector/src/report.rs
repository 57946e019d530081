//! `vramtrace report`: being written.
use crate::exit::Code;
use std::path::Path;

pub fn main(_file: &Path, _json: bool) -> Code {
    0
}
