//! The allocator settings a what-if tries, as `PYTORCH_CUDA_ALLOC_CONF` spells them: parsed from the strings
//! users write (`--alloc-conf`), from what a snapshot says the run used (`allocator_settings`), and written back
//! as the string to set.

use std::fmt;

pub const MIB: u64 = 1 << 20;
/// `roundup_power2_divisions` is set per power-of-two interval of sizes, from 1 MiB up to 32 GiB (and beyond).
pub const ROUNDUP_INTERVALS: usize = 16;
/// PyTorch refuses a `max_split_size_mb` of 20 or less (its large segment size).
const MIN_MAX_SPLIT_MB: u64 = 21;

/// Which of PyTorch's CUDA allocators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    #[default]
    Native,
    /// `backend:cudaMallocAsync`: the driver's stream-ordered pool.
    CudaMallocAsync,
}

/// The settings of PyTorch's CUDA caching allocator that decide how much it reserves.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub backend: Backend,
    /// `max_split_size_mb`, in bytes; `None`: unlimited.
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb`, in bytes (default 20 MiB): how much larger than an oversize request a cached
    /// oversize block may be and still serve it.
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions`, per interval (index 0: up to 2 MiB, then one per power of two); 0 or 1:
    /// plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    pub expandable_segments: bool,
    /// `garbage_collection_threshold` (0 < t < 1); only acts with a memory fraction.
    pub garbage_collection_threshold: Option<f64>,
    /// `torch.cuda.set_per_process_memory_fraction`: not an allocator setting but it decides the GC and the
    /// allocator's own limit, so a what-if may set it (`per_process_memory_fraction:F`).
    pub memory_fraction: Option<f64>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backend: Backend::Native,
            max_split_size: None,
            max_non_split_rounding: 20 * MIB,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            expandable_segments: false,
            garbage_collection_threshold: None,
            memory_fraction: None,
        }
    }
}

/// A setting that could not be read, with what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfError(pub String);

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfError {}

fn bad(what: impl Into<String>) -> ConfError {
    ConfError(what.into())
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ConfError> {
    match v {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(bad(format!("{key}: expected True or False, not {v:?}"))),
    }
}

fn parse_fraction(key: &str, v: &str) -> Result<f64, ConfError> {
    match v.parse::<f64>() {
        Ok(x) if x > 0.0 && x < 1.0 => Ok(x),
        _ => Err(bad(format!(
            "{key}: expected a number between 0 and 1 (exclusive), not {v:?}"
        ))),
    }
}

fn parse_divisions(v: &str) -> Result<u64, ConfError> {
    match v.parse::<u64>() {
        Ok(n) if n == 0 || n.is_power_of_two() => Ok(n),
        _ => Err(bad(format!(
            "roundup_power2_divisions: expected a power of two, not {v:?}"
        ))),
    }
}

/// The interval of a size given in MiB (a power of two) in `roundup_power2_divisions:[256:1,...]`.
fn interval_of_mb(mb: u64) -> usize {
    (63 - mb.max(1).leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1)
}

impl Settings {
    /// Parses `PYTORCH_CUDA_ALLOC_CONF`'s syntax (`key:value,key:value`, a list value in brackets). Keys that
    /// do not change what the allocator reserves (`pinned_*`, `release_lock_on_cudamalloc`, ...) are accepted
    /// and ignored, as PyTorch accepts them.
    pub fn parse(conf: &str) -> Result<Settings, ConfError> {
        let mut s = Settings::default();
        for (key, value) in split_conf(conf)? {
            let v = value.as_str();
            match key.as_str() {
                "backend" => {
                    s.backend = match v {
                        "native" => Backend::Native,
                        "cudaMallocAsync" => Backend::CudaMallocAsync,
                        _ => {
                            return Err(bad(format!(
                                "backend: expected native or cudaMallocAsync, not {v:?}"
                            )))
                        }
                    }
                }
                "max_split_size_mb" => {
                    let mb: u64 = v
                        .parse()
                        .map_err(|_| bad(format!("max_split_size_mb: expected MiB, not {v:?}")))?;
                    if mb < MIN_MAX_SPLIT_MB {
                        return Err(bad(format!(
                            "max_split_size_mb: PyTorch refuses {mb}: it must be more than 20"
                        )));
                    }
                    s.max_split_size = Some(mb.saturating_mul(MIB));
                }
                "max_non_split_rounding_mb" => {
                    let mb: u64 = v.parse().map_err(|_| {
                        bad(format!(
                            "max_non_split_rounding_mb: expected MiB, not {v:?}"
                        ))
                    })?;
                    s.max_non_split_rounding = mb.saturating_mul(MIB);
                }
                "roundup_power2_divisions" => {
                    if let Some(list) = v.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
                        let mut last = 0usize;
                        for item in list.split(',').filter(|x| !x.trim().is_empty()) {
                            let (k, d) = item.split_once(':').ok_or_else(|| {
                                bad(format!(
                                    "roundup_power2_divisions: {item:?} is not SIZE:DIVISIONS"
                                ))
                            })?;
                            let d = parse_divisions(d.trim())?;
                            let k = k.trim();
                            if k == ">" {
                                for x in &mut s.roundup_power2_divisions[last..] {
                                    *x = d;
                                }
                                continue;
                            }
                            let mb: u64 = k.parse().ok().filter(|m: &u64| m.is_power_of_two()).ok_or_else(
                                || bad(format!("roundup_power2_divisions: size {k:?} is not a power of two in MiB")),
                            )?;
                            last = interval_of_mb(mb);
                            s.roundup_power2_divisions[last] = d;
                            last += 1;
                        }
                    } else {
                        s.roundup_power2_divisions = [parse_divisions(v)?; ROUNDUP_INTERVALS];
                    }
                }
                "expandable_segments" => s.expandable_segments = parse_bool(&key, v)?,
                "garbage_collection_threshold" => {
                    s.garbage_collection_threshold = Some(parse_fraction(&key, v)?)
                }
                "per_process_memory_fraction" => s.memory_fraction = Some(parse_fraction(&key, v)?),
                "pinned_num_register_threads"
                | "pinned_use_cuda_host_register"
                | "pinned_use_host_register"
                | "release_lock_on_cudamalloc"
                | "graph_capture_record_stream_reuse"
                | "expandable_segments_handle_type"
                | "pinned_reserve_segment_size_mb" => {}
                other => return Err(bad(format!("unknown allocator setting {other:?}"))),
            }
        }
        Ok(s)
    }

    /// The `PYTORCH_CUDA_ALLOC_CONF` string that sets these (empty for the defaults). A memory fraction is
    /// not part of it: [`Settings::fraction_note`] says how to set it.
    pub fn conf(&self) -> String {
        let mut parts = Vec::new();
        if self.backend == Backend::CudaMallocAsync {
            parts.push("backend:cudaMallocAsync".to_string());
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != 20 * MIB {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            ));
        }
        let d = &self.roundup_power2_divisions;
        if d.iter().any(|&x| x > 1) {
            if d.iter().all(|&x| x == d[0]) {
                parts.push(format!("roundup_power2_divisions:{}", d[0]));
            } else {
                let items: Vec<String> = d
                    .iter()
                    .enumerate()
                    .map(|(i, x)| format!("{}:{x}", 1u64 << i))
                    .collect();
                parts.push(format!("roundup_power2_divisions:[{}]", items.join(",")));
            }
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
        parts.join(",")
    }

    /// How a memory fraction the what-if assumed is set, when it assumed one.
    pub fn fraction_note(&self) -> Option<String> {
        self.memory_fraction
            .map(|f| format!("torch.cuda.set_per_process_memory_fraction({f})"))
    }

    /// A label for reports: the conf string, or "defaults".
    pub fn label(&self) -> String {
        let c = self.conf();
        let mut l = if c.is_empty() {
            "defaults".to_string()
        } else {
            c
        };
        if let Some(f) = self.memory_fraction {
            l.push_str(&format!(" (memory fraction {f})"));
        }
        l
    }

    /// The divisions for a (rounded to 512) request of `size` bytes.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.max(1).leading_zeros() as usize;
        let index = log.saturating_sub(20).min(ROUNDUP_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }
}

/// `key:value` pairs of a conf string, a bracketed value kept whole.
fn split_conf(conf: &str) -> Result<Vec<(String, String)>, ConfError> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    let mut items = Vec::new();
    for c in conf.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            items.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    items.push(cur);
    for item in items {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (k, v) = item
            .split_once(':')
            .ok_or_else(|| bad(format!("{item:?} is not key:value")))?;
        out.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(out)
}

/// The configurations tried when none is given: the usual advice, each alone, and two pairs.
pub fn default_grid() -> Vec<Settings> {
    [
        "",
        "expandable_segments:True",
        "max_split_size_mb:128",
        "max_split_size_mb:256",
        "max_split_size_mb:512",
        "max_split_size_mb:1024",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:8",
        "roundup_power2_divisions:16",
        "max_split_size_mb:256,roundup_power2_divisions:4",
        "backend:cudaMallocAsync",
    ]
    .iter()
    .map(|c| Settings::parse(c).expect("the default grid parses"))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_strings_parse_and_print_back() {
        for c in [
            "",
            "expandable_segments:True",
            "max_split_size_mb:256,roundup_power2_divisions:4",
            "backend:cudaMallocAsync",
            "max_split_size_mb:128,garbage_collection_threshold:0.8",
        ] {
            let s = Settings::parse(c).unwrap();
            // Printed in one order: parse what was printed and compare the settings.
            assert_eq!(Settings::parse(&s.conf()).unwrap(), s, "{c}");
        }
        let s = Settings::parse("max_split_size_mb:256, roundup_power2_divisions:4").unwrap();
        assert_eq!(s.max_split_size, Some(256 * MIB));
        assert_eq!(s.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
    }

    #[test]
    fn interval_lists_set_their_intervals_and_the_rest() {
        let s = Settings::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        let d = s.roundup_power2_divisions;
        assert_eq!((d[7], d[8], d[9], d[10], d[15]), (0, 1, 2, 4, 8));
        assert_eq!(d[10 - 3], 0);
        // A 300 MiB request is in the 256 MiB interval; 1.5 GiB in the 1 GiB one.
        assert_eq!(s.divisions_for(300 * MIB), 1);
        assert_eq!(s.divisions_for(1536 * MIB), 4);
        assert_eq!(s.divisions_for(100 * 1024 * MIB), 8);
        assert_eq!(Settings::parse(&s.conf()).unwrap(), s);
    }

    #[test]
    fn bad_settings_say_what_is_wrong() {
        for (c, says) in [
            ("max_split_size_mb:20", "more than 20"),
            ("expandable_segments:yes", "True or False"),
            ("roundup_power2_divisions:3", "power of two"),
            ("garbage_collection_threshold:1.5", "between 0 and 1"),
            ("backend:magic", "cudaMallocAsync"),
            ("fast_mode:on", "unknown allocator setting"),
            ("expandable_segments", "key:value"),
        ] {
            let e = Settings::parse(c).unwrap_err().to_string();
            assert!(e.contains(says), "{c}: {e}");
        }
        // Keys that change nothing the model sees are accepted.
        assert_eq!(
            Settings::parse("pinned_num_register_threads:8").unwrap(),
            Settings::default()
        );
    }

    #[test]
    fn the_default_grid_has_no_duplicates() {
        let g = default_grid();
        for (i, a) in g.iter().enumerate() {
            for b in &g[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(g[0].label(), "defaults");
    }
}
