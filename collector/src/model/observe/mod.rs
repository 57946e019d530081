//! What is drawn from the replay as it goes. The replay's core (`replay/`) applies records in order and keeps
//! only what it needs to apply the next one (live sets, routing, watermarks, open refusals); the figures are
//! observers it feeds, concrete types it calls directly (no dynamic call per event). `memory` fans each change
//! out to each device's peak (`peaks`) and timeline (`timeline`), each process's figures and driver-level
//! steps (`process`), the call sites' aggregates (`sites`) and recent asynchronous frees (`recent_frees`);
//! `calls` counts what the core decided of each call (releases matched or not, refusals, address space);
//! `leak` keeps what was live at each end, `framework` the bridge's figures (a framework's allocator, its
//! steps, its errors and what holds its tensors). The tap (`tap`) is the dynamic hook the exports and the live
//! metrics hear every change and decision through. Growth is read from them: in time (`growth`) and in the
//! program's steps (`steps`).

pub mod calls;
pub mod framework;
pub mod growth;
pub mod leak;
pub mod memory;
pub mod peaks;
pub mod process;
pub mod recent_frees;
pub mod sites;
pub mod steps;
pub mod tap;
pub mod timeline;
