//! What is drawn from the replay as it goes: each device's timeline (`timeline`), the changes the exports
//! stream (`tap`), a floor's growth in time (`growth`) and
//! in the program's steps (`steps`), and the minima it counts (`leak`).

pub mod growth;
pub mod leak;
pub mod steps;
pub mod tap;
pub mod timeline;
