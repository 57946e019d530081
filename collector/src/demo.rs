//! `vramtrace demo`: being written.
use crate::exit::Code;

#[derive(clap::Args)]
pub struct DemoArgs {}

pub fn main(_args: DemoArgs) -> Code {
    0
}
