//! Fitting text to the terminal's columns: labels cut where they say least, units kept whole across lines.

use std::fmt::Write;

use crate::names::units::fit;

/// Width of the report.
pub const WIDTH: usize = 100;
/// Characters of a device's sparkline.
pub const SPARK_COLUMNS: usize = 60;

/// A label within `width` characters, cut where it keeps what tells labels apart: a native frame's
/// `function at dir/file:line` keeps `file:line` (and `(inlined)`) whole and loses the start of the function's
/// name (its parameters first); a Python frame's `dir/file.py:line in function` keeps `file.py:line` and
/// loses the end of the function's name; a relation before it (`<- `, `via `) stays. Anything else keeps
/// both ends.
pub fn fit_label(s: &str, width: usize) -> String {
    let len = |x: &str| x.chars().count();
    if len(s) <= width {
        return s.to_string();
    }
    for lead in ["<- … <- ", "<- ", "via ", "at "] {
        if let Some(rest) = s.strip_prefix(lead) {
            if width > len(lead) + 8 {
                return format!("{lead}{}", fit_label(rest, width - len(lead)));
            }
        }
    }
    // Python: the location first.
    if let Some(j) = s.find(" in ") {
        let loc = &s[..j];
        if is_location(loc) {
            let file = len(&loc[file_start(loc)..]) + 1;
            let loc = shorten_dirs(loc, width.saturating_sub(10).max(file));
            if width > len(&loc) + 6 {
                return format!("{loc}{}", fit(&s[j..], width - len(&loc)));
            }
        }
    }
    // Native: the function, then where.
    if let Some(i) = s.rfind(" at ").or_else(|| s.rfind(" in ")) {
        const HEAD: usize = 6;
        let (head, tail) = (&s[..i], &s[i..]);
        let tail = match tail[1..].split_once(' ') {
            Some((word, rest)) if len(tail) + HEAD > width => {
                // The directories go first; the file and line stay whole while the name keeps 4 characters.
                let file = len(&rest[file_start(rest)..]) + 1;
                let room = width.saturating_sub(HEAD + len(word) + 2).max(file);
                format!(" {word} {}", shorten_dirs(rest, room))
            }
            _ => tail.to_string(),
        };
        if len(&tail) + 4 <= width {
            return format!(
                "{}{tail}",
                cut_start(&drop_parameters(head), width - len(&tail))
            );
        }
    }
    cut_middle(s, width)
}

/// `dir/file.py:12` or `file.rs:3`: ends in `:<digits>`.
pub(super) fn is_location(s: &str) -> bool {
    s.rsplit_once(':')
        .is_some_and(|(_, l)| !l.is_empty() && l.chars().all(|c| c.is_ascii_digit()))
}

/// A path (with what follows it) within `width`: its directories dropped from the left, `…/` in their place.
pub(super) fn shorten_dirs(s: &str, width: usize) -> String {
    let len = s.chars().count();
    if len <= width {
        return s.to_string();
    }
    let file_start = file_start(s);
    let file = &s[file_start..];
    if file_start > 0 && file.chars().count() < width {
        let keep = width - file.chars().count() - 1;
        let dirs: Vec<char> = s[..file_start].chars().collect();
        let tail: String = dirs[dirs.len().saturating_sub(keep)..].iter().collect();
        return format!("…{tail}{file}");
    }
    cut_start(s, width)
}

/// Where the file's name starts in a path followed by anything after a space.
pub(super) fn file_start(s: &str) -> usize {
    s.split(' ')
        .next()
        .unwrap_or(s)
        .rfind('/')
        .map_or(0, |i| i + 1)
}

/// `a::b(int, long)` -> `a::b(…)` (C++ names carry their parameters).
pub(super) fn drop_parameters(s: &str) -> String {
    if !s.ends_with(')') {
        return s.to_string();
    }
    let mut depth = 0i32;
    for (i, c) in s.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return if i == 0 {
                        s.to_string()
                    } else {
                        format!("{}(…)", &s[..i])
                    };
                }
            }
            _ => {}
        }
    }
    s.to_string()
}

/// The end of `s` in `width` characters, `…` first when cut.
pub(super) fn cut_start(s: &str, width: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= width {
        return s.to_string();
    }
    let keep = width.saturating_sub(1);
    std::iter::once('…')
        .chain(chars[chars.len() - keep..].iter().copied())
        .collect()
}

/// Both ends of `s` in `width` characters, `…` between them when cut.
pub(super) fn cut_middle(s: &str, width: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= width {
        return s.to_string();
    }
    let keep = width.saturating_sub(1);
    let (a, b) = (keep / 2, keep - keep / 2);
    chars[..a]
        .iter()
        .copied()
        .chain(std::iter::once('…'))
        .chain(chars[chars.len() - b..].iter().copied())
        .collect()
}

pub(super) const GLUE: char = '\u{e000}';

/// `8.00 GiB` -> `8.00<GLUE>GiB`, so that a size is never split across lines.
pub(super) fn glue_units(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut prev: Option<char> = None;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        if c == ' ' && prev.is_some_and(|p| p.is_ascii_digit()) {
            let unit = rest
                .split(|x: char| !x.is_ascii_alphabetic())
                .next()
                .unwrap_or("");
            if matches!(unit, "B" | "KiB" | "MiB" | "GiB" | "TiB" | "s") {
                out.push(GLUE);
                prev = Some(GLUE);
                continue;
            }
        }
        out.push(c);
        prev = Some(c);
    }
    out
}

/// Word-wraps `text` to `width` columns; lines after the first start with `indent`. Leading spaces of `text` are
/// kept; a size and its unit stay on one line.
pub fn wrap(o: &mut String, text: &str, indent: &str, width: usize) {
    let glued = glue_units(text);
    let text = glued.as_str();
    let lead = &text[..text.len() - text.trim_start().len()];
    let mut line = lead.to_string();
    let mut len = lead.chars().count();
    let mut words = 0;
    let flush = |o: &mut String, line: &str| {
        writeln!(o, "{}", line.replace(GLUE, " ")).ok();
    };
    for word in text.split_whitespace() {
        let wl = word.chars().count();
        if words > 0 && len + 1 + wl > width {
            flush(o, &line);
            line = indent.to_string();
            len = indent.chars().count();
            words = 0;
        } else if words > 0 {
            line.push(' ');
            len += 1;
        }
        line.push_str(word);
        len += wl;
        words += 1;
    }
    if words > 0 {
        flush(o, &line);
    }
}
