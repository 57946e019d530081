//! What is drawn from the replay as it goes: each device's timeline (`timeline`), the changes the exports
//! stream (`tap`), a floor's growth (`growth`) and the minima it counts (`leak`).

pub mod growth;
pub mod leak;
pub mod tap;
pub mod timeline;
