//! Numbers for people: sizes, durations, counts and dates.
//!
//! The one place sizes and times are written for people: the text reports, the JSON's human figures and the
//! HTML page all show what these functions show. The page's script (`assets/html/report.js`, `bytes` and `secs`)
//! follows the same rules, in integers as here: sizes in hundredths of their unit and times in milliseconds,
//! rounded half up, times from the run's start. `collector/tests/figures_golden.rs` checks that the three agree.

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// `10.50 GiB`, `3.00 MiB`, `512 B`: two decimals in the largest unit that fits, rounded half up.
pub fn bytes(b: u64) -> String {
    let (unit, name) = match b {
        b if b >= TIB => (TIB, "TiB"),
        b if b >= GIB => (GIB, "GiB"),
        b if b >= MIB => (MIB, "MiB"),
        b if b >= KIB => (KIB, "KiB"),
        _ => return format!("{b} B"),
    };
    let hundredths = (u128::from(b) * 100 + u128::from(unit / 2)) / u128::from(unit);
    format!("{}.{:02} {name}", hundredths / 100, hundredths % 100)
}

/// `0.98 GiB`, `12.3 GiB`, `512 MiB`: three figures at most, in the largest unit under which the figure
/// stays below 1000 (columns that must stay narrow: `top`).
pub fn bytes_short(b: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];
    if b < 1000 {
        return format!("{b} B");
    }
    // The smallest unit whose figure is below 1000.
    let (unit, name) = UNITS
        .iter()
        .rev()
        .copied()
        .find(|(u, _)| (b as f64 / *u as f64) < 999.5)
        .unwrap_or(UNITS[0]);
    let v = b as f64 / unit as f64;
    match v {
        v if v < 9.995 => format!("{v:.2} {name}"),
        v if v < 99.95 => format!("{v:.1} {name}"),
        v => format!("{v:.0} {name}"),
    }
}

/// `1,234,567`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let first = match digits.len() % 3 {
        0 => 3,
        r => r,
    };
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    out.push_str(&digits[..first]);
    for group in digits.as_bytes()[first..].chunks(3) {
        out.push(',');
        out.extend(group.iter().map(|&b| b as char));
    }
    out
}

/// The article before `noun` ("an iteration", "a step"): by its first letter, which serves the nouns of units.
pub fn article(noun: &str) -> &'static str {
    if noun.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// `1 event`, `12,345 events`.
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

/// `10.50 GiB (11,274,289,152 bytes)`.
pub fn bytes_exact(b: u64) -> String {
    if b < KIB {
        return bytes(b);
    }
    format!("{} ({} bytes)", bytes(b), count(b))
}

/// Seconds to the nearest millisecond (half up): `3.215 s`. Times in the reports are from the run's start.
pub fn secs(ns: u64) -> String {
    let ms = ns / 1_000_000 + u64::from(ns % 1_000_000 >= 500_000);
    format!("{}.{:03} s", ms / 1000, ms % 1000)
}

/// A span for people: `850 us`, `12.4 ms`, `3.215 s`.
pub fn duration(ns: u64) -> String {
    match ns {
        n if n < 1_000_000 => format!("{} us", n / 1_000),
        n if n < 1_000_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n => secs(n),
    }
}

/// `2026-03-21 12:34:56 UTC` from ns since the Unix epoch.
pub fn utc(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// A character that can break or restyle a terminal's line: a control character (a newline, an escape
/// sequence), or one that reorders what follows it (the bidirectional overrides and isolates, U+202E among
/// them: "Trojan Source"), a line or paragraph separator, or one that cannot be seen (zero-width characters, a
/// byte-order mark) and so hides what a line says.
pub fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// Unsafe characters ([`unsafe_char`]) shown escaped, so that text from the traced program cannot break,
/// restyle or reorder the report.
pub fn printable(s: &str) -> String {
    if !s.chars().any(unsafe_char) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if unsafe_char(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A path the user gave or a trace named, for a line on the terminal ([`printable`]).
pub fn shown_path(p: &std::path::Path) -> String {
    printable(&p.to_string_lossy())
}

/// At most `width` characters, the end replaced by `…` when cut.
pub fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * MIB), "3.00 MiB");
        assert_eq!(bytes(10 * GIB + GIB / 2), "10.50 GiB");
        assert_eq!(bytes_exact(GIB), "1.00 GiB (1,073,741,824 bytes)");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(article("iteration"), "an");
        assert_eq!(article("entry"), "an");
        assert_eq!(article("step"), "a");
        assert_eq!(article("batch"), "a");
        // Rounded half up, as the HTML page's script does, never cut short.
        assert_eq!(secs(3_215_999_999), "3.216 s");
        assert_eq!(secs(3_215_499_999), "3.215 s");
        assert_eq!(secs(3_215_500_000), "3.216 s");
        assert_eq!(secs(999_999_999), "1.000 s");
        assert_eq!(secs(0), "0.000 s");
        // Exactly half a hundredth: up (Rust's `{:.2}` would round this one down, JavaScript's `toFixed` up).
        assert_eq!(bytes(MIB + MIB / 8), "1.13 MiB");
        assert_eq!(bytes(MIB - 1), "1024.00 KiB");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            utc(1_709_251_200_000_000_000 + 3_723_000_000_000),
            "2024-03-01 01:02:03 UTC"
        );
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
        assert_eq!(printable("a\nb\u{1b}[31m"), "a\\nb\\u{1b}[31m");
    }

    #[test]
    fn short_sizes_keep_three_figures_under_a_thousand() {
        assert_eq!(bytes_short(512), "512 B");
        assert_eq!(bytes_short(1000), "0.98 KiB");
        assert_eq!(bytes_short(1004 << 20), "0.98 GiB");
        assert_eq!(bytes_short(512 << 20), "512 MiB");
        assert_eq!(bytes_short(12 * (1 << 30) + (300 << 20)), "12.3 GiB");
        assert_eq!(bytes_short(3 << 20), "3.00 MiB");
        assert_eq!(bytes_short(u64::MAX), "16777216 TiB");
    }
}
