//! What held the memory at an error: the holders' walk, the lines of the live tensors, the live bytes by site.

use std::fmt::Write;

use super::layout::wrap;
use crate::model::{Analysis, OomSnapshot};
use crate::names::units::{bytes, count, printable};
use crate::reporters::prose;
use crate::reporters::text::{fit_label, oom_place, site_lines, WIDTH};

/// The one screen's view of what held the memory, the best the trace can say: what kept the tensors alive (the
/// bridge's walk at the error), else the lines that allocated the live tensors (PyTorch's allocation history),
/// else the call sites holding the most bytes live on the device then (for a process under a caching allocator,
/// the code that grew its cache). One line each, no two alike; a library's frame gives way to the program's own
/// when both hold memory. Whatever the cause, the first question after an out-of-memory error is what was
/// using the memory.
pub(super) fn held_by(o: &mut String, a: &Analysis, s: &OomSnapshot) {
    if let Some(h) = s.holders.as_ref().filter(|h| !h.holders.is_empty()) {
        holders(o, h, HELD_BY_HOLDERS, HELD_BY_LINES);
        return;
    }
    // A history kept at this error that could not be read is said, not passed over: what follows is from the
    // call sites instead.
    if let Some(e) = s
        .framework
        .as_ref()
        .and_then(|f| f.snapshot.as_ref())
        .and_then(|r| r.error.as_ref())
    {
        wrap(
            o,
            &format!(
                "  PyTorch's allocation history kept at this error could not be read, so the lines below are \
                 the driver's call sites: {}",
                printable(&e.to_string())
            ),
            "    ",
        );
    }
    if let Some(r) = s
        .framework
        .as_ref()
        .and_then(|f| f.snapshot.as_ref())
        .filter(|r| r.error.is_none() && !r.kept.is_empty())
    {
        writeln!(
            o,
            "  HELD BY (the live tensors by the line that allocated them: PyTorch's allocation history)"
        )
        .ok();
        for k in r.kept.iter().take(HELD_BY_LISTED) {
            let lead = format!("    {:>11}  {:>7} live  ", bytes(k.bytes), count(k.count));
            let room = WIDTH.saturating_sub(lead.len());
            writeln!(o, "{lead}{}", fit_label(&printable(&k.label), room)).ok();
        }
        if r.no_frames_bytes > 0 {
            writeln!(
                o,
                "    {:>11}  {:>12}  without a line (allocated before the history was armed)",
                bytes(r.no_frames_bytes),
                ""
            )
            .ok();
        }
        o.push('\n');
        return;
    }
    if !a.call_sites.present || s.by_site.is_empty() {
        return;
    }
    // One row per label as the screen shows it (two sites that differ only deeper read the same); a library's
    // frame only when no site of the program's own holds memory.
    let mut rows: Vec<(String, u64, u64, bool)> = Vec::new();
    for b in &s.by_site {
        let Some(site) = a.call_sites.sites.get(b.site) else {
            continue;
        };
        let label = site_lines(a, b.site, "")
            .into_iter()
            .next()
            .unwrap_or_default();
        let own = site
            .site_frame()
            .is_some_and(crate::callsites::policy::own_frame);
        match rows.iter_mut().find(|r| r.0 == label) {
            Some(r) => {
                r.1 = r.1.saturating_add(b.bytes);
                r.2 = r.2.saturating_add(b.count);
            }
            None => rows.push((label, b.bytes, b.count, own)),
        }
    }
    if rows.iter().any(|r| r.3) {
        rows.retain(|r| r.3);
    }
    rows.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    let cache = a.caching_allocator(s.pid);
    wrap(
        o,
        &format!(
            "  HELD BY (the call sites holding the most bytes live on {} then{})",
            oom_place(s),
            if cache {
                ": for PyTorch, the code that grew its cache, not necessarily what holds the tensors in it now"
            } else {
                ""
            }
        ),
        "    ",
    );
    for (label, b, n, _) in rows.iter().take(HELD_BY_LISTED) {
        let lead = format!("    {:>11}  {:>7} live  ", bytes(*b), count(*n));
        let room = WIDTH.saturating_sub(lead.len());
        writeln!(o, "{lead}{}", fit_label(label.trim_start(), room)).ok();
    }
    o.push('\n');
}

/// Holders listed on the one screen.
pub(super) const HELD_BY_HOLDERS: usize = 5;
/// Lines of holders on the one screen (a long name wraps under itself).
pub(super) const HELD_BY_LINES: usize = 5;

/// What kept the tensors alive, as the bridge's walk found it: `limit` holders, largest first, one line each.
pub(crate) fn holders(
    o: &mut String,
    h: &crate::model::holders::Holders,
    limit: usize,
    max_lines: usize,
) {
    let partial = h
        .partial
        .as_ref()
        .map_or(String::new(), |r| format!("; partial: {r}"));
    // The walk counts the tensors it reached as Python objects; a graph's row also counts those it saved (C++
    // autograd nodes hold them), so the rows can add up to more (an H200 training step: 1.83 GiB here, a graph
    // of 3.03 GiB below). Said, so that the rows do not read as a miscount.
    let rows: u64 = h
        .holders
        .iter()
        .filter(|x| x.kind != crate::model::holders::HolderKind::Cache)
        .map(|x| x.bytes)
        .fold(0, u64::saturating_add);
    let saved = rows > h.tensor_bytes
        && h.holders
            .iter()
            .any(|x| x.kind == crate::model::holders::HolderKind::Graph);
    let at = match h.at {
        crate::model::holders::WalkAt::Oom(_) => " at the error",
        crate::model::holders::WalkAt::Exit => " at exit",
        crate::model::holders::WalkAt::Request => " when asked",
    };
    let tensors = format!(
        "{} CUDA tensor{}, {}",
        count(h.tensors),
        if h.tensors == 1 { "" } else { "s" },
        bytes(h.tensor_bytes)
    );
    // With the graphs' saved tensors said, the walk's time gives way: the header stays one line.
    let head = if saved {
        format!("  HELD BY (what kept the tensors alive{at}: {tensors} + graphs' saved{partial})")
    } else {
        format!(
            "  HELD BY (what kept the tensors alive{at}: {tensors}, found in {} ms{partial})",
            count(h.elapsed_ms)
        )
    };
    if head.chars().count() <= WIDTH {
        writeln!(o, "{head}").ok();
    } else {
        wrap(o, &head, "    ");
    }
    let mut seen: Vec<String> = Vec::new();
    let mut used = 0;
    for x in &h.holders {
        let label = printable(&prose::holder_label(x));
        if seen.contains(&label) {
            continue;
        }
        seen.push(label.clone());
        if seen.len() > limit {
            break;
        }
        let n = if x.tensors > 0 {
            format!(
                "{} tensor{}",
                count(x.tensors),
                if x.tensors == 1 { "" } else { "s" }
            )
        } else {
            String::new()
        };
        let lead = format!("    {:>11}  {n:>12}  ", bytes(x.bytes));
        // The figures stay in their columns; only a long label wraps, under itself.
        let room = WIDTH.saturating_sub(lead.len()).max(20);
        let mut rows = Vec::new();
        let mut line = lead.clone();
        for w in label.split(' ') {
            if line.len() > lead.len() && line.len() + 1 + w.len() > lead.len() + room {
                rows.push(std::mem::replace(&mut line, " ".repeat(lead.len())));
            }
            if line.len() > lead.len() {
                line.push(' ');
            }
            line.push_str(w);
        }
        rows.push(line);
        // The first holder always shows, however long its name.
        if used > 0 && used + rows.len() > max_lines {
            break;
        }
        used += rows.len();
        for r in rows {
            writeln!(o, "{r}").ok();
        }
    }
    o.push('\n');
}

/// Call sites on the one screen (`held_by`).
pub(super) const HELD_BY_LISTED: usize = 3;

pub(super) fn live_by_site(o: &mut String, a: &Analysis, s: &OomSnapshot) {
    if !a.call_sites.present || s.live_count == 0 {
        return;
    }
    writeln!(
        o,
        "  LIVE BY CALL SITE ON {} (where the live bytes were allocated)",
        oom_place(s)
    )
    .ok();
    for b in &s.by_site {
        let lead = format!("    {:>11}  {:>7} live  ", bytes(b.bytes), count(b.count));
        for line in site_lines(a, b.site, &lead) {
            writeln!(o, "{line}").ok();
        }
    }
    for (v, what) in [
        (s.by_site_unlisted_bytes, "(other call sites)"),
        (
            s.no_site_bytes,
            crate::reporters::text::no_site_label(a).as_str(),
        ),
    ] {
        if v > 0 {
            writeln!(o, "    {:>11}  {:>12}  {what}", bytes(v), "").ok();
        }
    }
    o.push('\n');
}
