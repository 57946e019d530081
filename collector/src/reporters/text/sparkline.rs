//! A timeline as one line of block characters.

use crate::model::Timeline;

pub const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// `columns` characters over `[0, span)` ns: each the most bytes in use in its slice of time, scaled so that
/// `scale` is a full block. Nothing in use is a space. Empty when there is no time to show.
pub fn sparkline(tl: &Timeline, span: u64, scale: u64, columns: usize) -> String {
    if span == 0 || columns == 0 || tl.buckets.is_empty() {
        return String::new();
    }
    let after = tl.buckets.last().map_or(0, |b| b.last_bytes);
    (0..columns)
        .map(|c| {
            let from = (span as u128 * c as u128 / columns as u128) as u64;
            let to = ((span as u128 * (c as u128 + 1) / columns as u128) as u64).max(from + 1);
            let v = tl.max_between(from, to).unwrap_or(after);
            bar(v, scale)
        })
        .collect()
}

fn bar(v: u64, scale: u64) -> char {
    if v == 0 || scale == 0 {
        return ' ';
    }
    let level = (v as u128 * 8).div_ceil(scale as u128).clamp(1, 8);
    BARS[level as usize - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Bucket;

    #[test]
    fn scales_to_the_peak() {
        let tl = Timeline {
            bucket_ns: 10,
            buckets: (0..4)
                .map(|i| Bucket {
                    t_ns: i * 10,
                    max_bytes: [0, 1, 4, 8][i as usize],
                    last_bytes: [0, 1, 4, 8][i as usize],
                })
                .collect(),
        };
        assert_eq!(sparkline(&tl, 40, 8, 4), " ▁▄█");
        assert_eq!(sparkline(&tl, 40, 8, 8), "  ▁▁▄▄██");
        // Past the last bucket the last value holds.
        assert_eq!(sparkline(&tl, 80, 8, 4), "▁███");
        assert_eq!(sparkline(&tl, 0, 8, 4), "");
    }
}
