//! `vramtrace run`: being written.
use crate::exit::Code;

#[derive(clap::Args)]
pub struct RunArgs {
    /// The command to run, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub fn main(_args: RunArgs) -> Code {
    0
}
