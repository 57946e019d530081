//! The cap's specification, as `--cap` and `VRAMTRACE_CAP` write it. Parsed here, once, so the collector (which
//! refuses a bad one before starting anything) and the shim (which may be preloaded without the collector)
//! can never disagree about what a spec means.
//!
//! Grammar: a comma-separated list of entries; an entry is `AMOUNT` (every device) or `DEVICE=AMOUNT`.
//! AMOUNT is a size (`20GiB`, `512MiB`, `20G`, `1.5T`, `1073741824`) or a share of the device (`50%`).
//! K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB are powers of 1000; no unit is bytes.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    Bytes(u64),
    /// A share of the device's total memory, in (0, 100].
    Percent(f64),
}

impl Amount {
    /// Bytes on a device of `total` bytes.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            Amount::Bytes(b) => b,
            Amount::Percent(p) => ((total as f64) * p / 100.0) as u64,
        }
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Bytes(b) => write!(f, "{b} bytes"),
            Amount::Percent(p) => write!(f, "{p}%"),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CapSpec {
    /// The cap of every device not named below.
    pub all: Option<Amount>,
    /// Caps of named devices (CUDA ordinals).
    pub devices: Vec<(u32, Amount)>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapError {
    #[error("empty cap")]
    Empty,
    #[error(
        "'{0}' is not a size or a percentage (examples: 20GiB, 512MiB, 20G, 50%, 0=20GiB,1=10GiB)"
    )]
    BadAmount(String),
    #[error("unknown unit '{unit}' in '{entry}' (use B, K, M, G, T, KiB..TiB, KB..TB or %)")]
    BadUnit { entry: String, unit: String },
    #[error("a cap must be more than zero ('{0}')")]
    Zero(String),
    #[error("a share must be more than 0% and at most 100% ('{0}')")]
    BadPercent(String),
    #[error("'{0}' is not a device index")]
    BadDevice(String),
    #[error("device {0} is capped twice")]
    Duplicate(u32),
    #[error("'{0}' is too large")]
    TooLarge(String),
}

impl CapSpec {
    pub fn parse(s: &str) -> Result<CapSpec, CapError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(CapError::Empty);
        }
        let mut spec = CapSpec::default();
        for entry in s.split(',').map(str::trim) {
            if entry.is_empty() {
                return Err(CapError::Empty);
            }
            match entry.split_once('=') {
                Some((dev, amount)) => {
                    let d: u32 = dev
                        .trim()
                        .parse()
                        .map_err(|_| CapError::BadDevice(dev.trim().to_string()))?;
                    if spec.devices.iter().any(|(x, _)| *x == d) {
                        return Err(CapError::Duplicate(d));
                    }
                    spec.devices.push((d, parse_amount(amount.trim())?));
                }
                None => {
                    if spec.all.is_some() {
                        return Err(CapError::BadAmount(entry.to_string()));
                    }
                    spec.all = Some(parse_amount(entry)?);
                }
            }
        }
        Ok(spec)
    }

    /// The cap on `device`, if any.
    pub fn amount(&self, device: u32) -> Option<Amount> {
        self.devices
            .iter()
            .find(|(d, _)| *d == device)
            .map(|(_, a)| *a)
            .or(self.all)
    }

    /// The highest device index the spec names explicitly.
    pub fn max_device(&self) -> Option<u32> {
        self.devices.iter().map(|(d, _)| *d).max()
    }
}

fn parse_amount(entry: &str) -> Result<Amount, CapError> {
    let split = entry
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(entry.len());
    let (num, unit) = entry.split_at(split);
    let unit = unit.trim();
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(CapError::BadAmount(entry.to_string()));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| CapError::BadAmount(entry.to_string()))?;
    if unit == "%" {
        if !(value > 0.0 && value <= 100.0) {
            return Err(CapError::BadPercent(entry.to_string()));
        }
        return Ok(Amount::Percent(value));
    }
    let mult: f64 = match unit {
        "" | "B" | "b" => 1.0,
        "K" | "k" | "KiB" | "kiB" => 1024.0,
        "M" | "m" | "MiB" => 1024.0 * 1024.0,
        "G" | "g" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "t" | "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => {
            return Err(CapError::BadUnit {
                entry: entry.to_string(),
                unit: unit.to_string(),
            })
        }
    };
    let bytes = value * mult;
    if bytes >= u64::MAX as f64 {
        return Err(CapError::TooLarge(entry.to_string()));
    }
    let bytes = bytes.round() as u64;
    if bytes == 0 {
        return Err(CapError::Zero(entry.to_string()));
    }
    Ok(Amount::Bytes(bytes))
}

/// The cap's ledger file's size (the shim's `ledger::Shared`: a header, per device the job's bytes, per slot its
/// bytes per device), so that `run` reserves all of it before the job starts (the shim checks the two agree).
pub const LEDGER_BYTES: usize = 64 + 32 * 8 + 1024 * 32 * 8;

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn sizes_and_shares() {
        let one = |s: &str| CapSpec::parse(s).unwrap().all.unwrap();
        assert_eq!(one("20GiB"), Amount::Bytes(20 * GIB));
        assert_eq!(one("20G"), Amount::Bytes(20 * GIB));
        assert_eq!(one("512MiB"), Amount::Bytes(512 << 20));
        assert_eq!(one("1.5T"), Amount::Bytes(3 * (GIB << 10) / 2));
        assert_eq!(one("20GB"), Amount::Bytes(20_000_000_000));
        assert_eq!(one("1073741824"), Amount::Bytes(GIB));
        assert_eq!(one(" 50% "), Amount::Percent(50.0));
        assert_eq!(Amount::Percent(50.0).bytes(80 * GIB), 40 * GIB);
    }

    #[test]
    fn per_device() {
        let s = CapSpec::parse("0=20GiB,1=10GiB").unwrap();
        assert_eq!(s.all, None);
        assert_eq!(s.amount(0), Some(Amount::Bytes(20 * GIB)));
        assert_eq!(s.amount(1), Some(Amount::Bytes(10 * GIB)));
        assert_eq!(s.amount(2), None);
        assert_eq!(s.max_device(), Some(1));
        let mixed = CapSpec::parse("4GiB,1=50%").unwrap();
        assert_eq!(mixed.amount(0), Some(Amount::Bytes(4 * GIB)));
        assert_eq!(mixed.amount(1), Some(Amount::Percent(50.0)));
    }

    #[test]
    fn bad_specs_say_why() {
        assert!(matches!(
            CapSpec::parse("12XB"),
            Err(CapError::BadUnit { .. })
        ));
        assert!(matches!(CapSpec::parse("0"), Err(CapError::Zero(_))));
        assert!(matches!(CapSpec::parse("-1"), Err(CapError::BadAmount(_))));
        assert!(matches!(
            CapSpec::parse("150%"),
            Err(CapError::BadPercent(_))
        ));
        assert!(matches!(CapSpec::parse("0%"), Err(CapError::BadPercent(_))));
        assert!(matches!(CapSpec::parse(""), Err(CapError::Empty)));
        assert!(matches!(
            CapSpec::parse("x=1G"),
            Err(CapError::BadDevice(_))
        ));
        assert!(matches!(
            CapSpec::parse("0=1G,0=2G"),
            Err(CapError::Duplicate(0))
        ));
        assert!(matches!(
            CapSpec::parse("1G,2G"),
            Err(CapError::BadAmount(_))
        ));
        assert!(matches!(
            CapSpec::parse("1..5G"),
            Err(CapError::BadAmount(_))
        ));
        assert!(matches!(
            CapSpec::parse("99999999999T"),
            Err(CapError::TooLarge(_))
        ));
        assert!(CapSpec::parse("12XB")
            .unwrap_err()
            .to_string()
            .contains("XB"));
    }
}
