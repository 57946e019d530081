//! Names and units: numbers for people, native frames named, the clock's ticks, the fast hash.

pub mod fasthash;
pub mod frame_names;
pub mod symbols;
pub mod ticks;
pub mod units;
