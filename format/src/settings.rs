//! The job's settings, sent by the collector to each process in answer to its hello: the cap the shim applies
//! comes from the collector, not from an environment the process can change (a child started with its own
//! `VRAMTRACE_CAP`, or without `VRAMTRACE_LEDGER`). One line of printable ASCII (never the bytes of the
//! out-of-memory answers that follow it on the same socket, `OOM_ACK`/`OOM_NAK`):
//!
//! ```text
//! VTSET<TAB>cap=<spec or empty><TAB>mode=enforce|warn<TAB>ledger=<path or empty><LF>
//! ```
//!
//! Values are percent-encoded: `%`, tab, newline, space, control and non-ASCII bytes as `%XX`.

/// What the job applies to every process. `cap: None`: no cap (whatever the process's environment says).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSettings {
    pub cap: Option<String>,
    pub warn: bool,
    /// The job's ledger (path bytes).
    pub ledger: Option<Vec<u8>>,
}

const MAGIC: &str = "VTSET";
/// The longest line a shim reads.
pub const MAX_LINE: usize = 8192;

fn escape(b: &[u8], out: &mut String) {
    for &c in b {
        if c.is_ascii_graphic() && c != b'%' {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
}

fn unescape(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            let h = std::str::from_utf8(s.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Some(out)
}

impl JobSettings {
    /// The line, newline included.
    pub fn encode(&self) -> String {
        let mut s = String::from(MAGIC);
        s.push_str("\tcap=");
        escape(self.cap.as_deref().unwrap_or("").as_bytes(), &mut s);
        s.push_str("\tmode=");
        s.push_str(if self.warn { "warn" } else { "enforce" });
        s.push_str("\tledger=");
        escape(self.ledger.as_deref().unwrap_or(b""), &mut s);
        s.push('\n');
        s
    }

    /// The settings of a line (without or with its newline); `None` if it is not one.
    pub fn decode(line: &[u8]) -> Option<JobSettings> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let mut parts = line.split(|b| *b == b'\t');
        if parts.next()? != MAGIC.as_bytes() {
            return None;
        }
        let mut s = JobSettings::default();
        let (mut cap, mut mode, mut ledger) = (false, false, false);
        for p in parts {
            let eq = p.iter().position(|b| *b == b'=')?;
            let (k, v) = (&p[..eq], unescape(&p[eq + 1..])?);
            match k {
                b"cap" => {
                    cap = true;
                    s.cap = (!v.is_empty())
                        .then(|| String::from_utf8(v))
                        .transpose()
                        .ok()?;
                }
                b"mode" => {
                    mode = true;
                    s.warn = match &v[..] {
                        b"warn" => true,
                        b"enforce" => false,
                        _ => return None,
                    };
                }
                b"ledger" => {
                    ledger = true;
                    s.ledger = (!v.is_empty()).then_some(v);
                }
                // Keys of a later version: passed over.
                _ => {}
            }
        }
        (cap && mode && ledger).then_some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_go_both_ways_and_never_carry_an_answer_byte() {
        let s = JobSettings {
            cap: Some("0=20GiB,1=50%".into()),
            warn: true,
            ledger: Some(b"/run/user/1000/vramtrace-x y\x06\x15\n/ledger-%41".to_vec()),
        };
        let line = s.encode();
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        assert!(!line
            .bytes()
            .any(|b| b == crate::OOM_ACK || b == crate::OOM_NAK));
        assert_eq!(JobSettings::decode(line.as_bytes()), Some(s));
        let none = JobSettings::default();
        assert_eq!(JobSettings::decode(none.encode().as_bytes()), Some(none));
        for bad in [
            &b"VTSET\tcap=1GiB"[..],
            b"HELLO\tcap=\tmode=warn\tledger=",
            b"VTSET\tcap=%G0\tmode=warn\tledger=",
        ] {
            assert_eq!(JobSettings::decode(bad), None, "{bad:?}");
        }
    }
}
