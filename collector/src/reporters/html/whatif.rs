//! `vramtrace whatif`'s answers as the page draws them: a table of each setting's peak, smallest cap and first
//! refusal (docs/EXPORTS.md).

use serde::Serialize;

/// `vramtrace whatif`'s answers as the page draws them.
#[derive(Serialize, Debug)]
pub struct WhatIfTable {
    limit: Option<String>,
    rows: Vec<WhatIfRow>,
    best: Option<String>,
    histories: Vec<String>,
}

#[derive(Serialize, Debug)]
struct WhatIfRow {
    settings: String,
    peak_bytes: u64,
    smallest_cap_bytes: u64,
    fits: Option<bool>,
    first_refused: Option<String>,
}

impl WhatIfTable {
    pub fn of(w: &crate::whatif::answer::WhatIf, start_unix_us: u64) -> WhatIfTable {
        let rows = w
            .configs
            .iter()
            .enumerate()
            .map(|(i, c)| WhatIfRow {
                settings: if c.approximate {
                    format!("{} (lower bound)", c.label)
                } else {
                    c.label.clone()
                },
                peak_bytes: w.peak(i),
                smallest_cap_bytes: w.needs(i),
                fits: c.fits,
                first_refused: c.first_failure.as_ref().map(|f| {
                    let h = &w.histories[f.history];
                    format!(
                        "{} at {:.1} s, pid {}: {}",
                        crate::names::units::bytes(f.size),
                        f.t_us.saturating_sub(start_unix_us) as f64 / 1e6,
                        h.pid,
                        h.site(f.site).unwrap_or(if f.the_runs_own {
                            "the request the run failed"
                        } else {
                            "no Python line"
                        })
                    )
                }),
            })
            .collect();
        WhatIfTable {
            limit: w.limit.as_ref().map(|l| {
                let per: Vec<String> = l
                    .bytes
                    .iter()
                    .map(|(d, b)| format!("{} on GPU {d}", crate::names::units::bytes(*b)))
                    .collect();
                format!("{} ({})", l.what, per.join(", "))
            }),
            rows,
            best: w.best.map(|b| {
                format!(
                    "PYTORCH_CUDA_ALLOC_CONF={} needs {}, {} less than as run",
                    w.configs[b].conf,
                    crate::names::units::bytes(w.needs(b)),
                    crate::names::units::bytes(w.needs(0).saturating_sub(w.needs(b)))
                )
            }),
            histories: w
                .histories
                .iter()
                .zip(&w.checks)
                .map(|(h, c)| {
                    format!(
                        "pid {} GPU {}: {} entries{}; the model peaks at {}, PyTorch did at {}",
                        h.pid,
                        h.device,
                        h.entries.len(),
                        if h.complete() {
                            ""
                        } else {
                            " (a late history)"
                        },
                        crate::names::units::bytes(c.modelled_peak),
                        crate::names::units::bytes(c.recorded_peak)
                    )
                })
                .collect(),
        }
    }
}
