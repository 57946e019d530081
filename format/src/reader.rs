//! Reading a trace file: the header, then frames until the end, a cut or corruption. A trace cut short is the
//! normal state of a killed job's trace: the reader hands out every whole frame and then says where it stopped.

use std::io::{self, Read};

use crate::codec::{self, DecodeError, HEADER_PREFIX};
use crate::{Record, TraceHeader, MAX_FRAME};

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the file is empty (0 bytes): not a vramtrace trace")]
    Empty,
    #[error("not a vramtrace trace (it does not start with the trace magic)")]
    NotATrace,
    #[error("trace format version {found} is newer than this vramtrace reads (up to {supported}): upgrade vramtrace")]
    NewerVersion { found: u16, supported: u16 },
    #[error("the trace ends inside its header ({0} bytes): nothing was recorded")]
    TruncatedHeader(u64),
    #[error("the trace header is corrupt: {0}")]
    BadHeader(String),
}

/// Why reading stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Still reading.
    Reading,
    /// The file ended on a frame boundary.
    End,
    /// The file ends inside a frame: `offset` is where that frame starts, `have` how many of its bytes exist.
    Truncated { offset: u64, have: u64, want: u64 },
    /// A frame could not be decoded: `offset` is where it starts.
    Corrupt { offset: u64, why: String },
    /// An I/O error interrupted reading.
    Io { offset: u64, why: String },
}

impl Stop {
    pub fn is_clean(&self) -> bool {
        matches!(self, Stop::End)
    }

    /// One line for people, or `None` when the trace ended cleanly.
    pub fn describe(&self, frames: u64) -> Option<String> {
        match self {
            Stop::Reading | Stop::End => None,
            Stop::Truncated { offset, have, want } => Some(format!(
                "the trace is cut short: it ends {have} bytes into a {want}-byte frame at byte {offset}, after {frames} whole frames; everything after that point is missing"
            )),
            Stop::Corrupt { offset, why } => Some(format!(
                "the trace is corrupt at byte {offset} ({why}), after {frames} whole frames; nothing after that point was read"
            )),
            Stop::Io { offset, why } => Some(format!(
                "reading stopped at byte {offset} after {frames} whole frames: {why}"
            )),
        }
    }
}

pub struct TraceReader<R> {
    r: R,
    /// File offset of the next frame.
    offset: u64,
    frames: u64,
    unknown_frames: u64,
    /// Whole frames that did not decode, skipped; the first one's offset and why.
    bad_frames: u64,
    first_bad: Option<(u64, String)>,
    buf: Vec<u8>,
    stop: Stop,
    pub version: u16,
}

/// Reads as much as it can into `buf`; returns how many bytes it got (less than `buf.len()` only at EOF).
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

impl<R: Read> TraceReader<R> {
    pub fn open(mut r: R) -> Result<(Self, TraceHeader), OpenError> {
        let mut prefix = [0u8; HEADER_PREFIX];
        let got = read_full(&mut r, &mut prefix)?;
        if got == 0 {
            return Err(OpenError::Empty);
        }
        if got < 8 || prefix[..8] != crate::MAGIC {
            return Err(OpenError::NotATrace);
        }
        if got < HEADER_PREFIX {
            return Err(OpenError::TruncatedHeader(got as u64));
        }
        let (version, len) = codec::decode_header_prefix(&prefix).map_err(|e| match e {
            DecodeError::NewerVersion { found, supported } => {
                OpenError::NewerVersion { found, supported }
            }
            DecodeError::BadMagic => OpenError::NotATrace,
            other => OpenError::BadHeader(other.to_string()),
        })?;
        let mut body = vec![0u8; len as usize];
        let got = read_full(&mut r, &mut body)?;
        if got < body.len() {
            return Err(OpenError::TruncatedHeader((HEADER_PREFIX + got) as u64));
        }
        let header =
            codec::decode_header_body(&body).map_err(|e| OpenError::BadHeader(e.to_string()))?;
        Ok((
            TraceReader {
                r,
                offset: (HEADER_PREFIX + body.len()) as u64,
                frames: 0,
                unknown_frames: 0,
                bad_frames: 0,
                first_bad: None,
                buf: Vec::with_capacity(64 << 10),
                stop: Stop::Reading,
                version,
            },
            header,
        ))
    }

    /// The next whole frame as (kind, payload), or `None` once stopped (see `stop`).
    pub fn next_frame(&mut self) -> Option<(u8, &[u8])> {
        if self.stop != Stop::Reading {
            return None;
        }
        let mut len_bytes = [0u8; 4];
        let got = match read_full(&mut self.r, &mut len_bytes) {
            Ok(n) => n,
            Err(e) => {
                self.stop = Stop::Io {
                    offset: self.offset,
                    why: e.to_string(),
                };
                return None;
            }
        };
        if got == 0 {
            self.stop = Stop::End;
            return None;
        }
        if got < 4 {
            self.stop = Stop::Truncated {
                offset: self.offset,
                have: got as u64,
                want: 4,
            };
            return None;
        }
        let len = u32::from_le_bytes(len_bytes);
        if len == 0 || len > MAX_FRAME {
            self.stop = Stop::Corrupt {
                offset: self.offset,
                why: format!("impossible frame length {len}"),
            };
            return None;
        }
        self.buf.resize(len as usize, 0);
        let got = match read_full(&mut self.r, &mut self.buf) {
            Ok(n) => n,
            Err(e) => {
                self.stop = Stop::Io {
                    offset: self.offset,
                    why: e.to_string(),
                };
                return None;
            }
        };
        if got < len as usize {
            self.stop = Stop::Truncated {
                offset: self.offset,
                have: 4 + got as u64,
                want: 4 + len as u64,
            };
            return None;
        }
        self.offset += 4 + len as u64;
        self.frames += 1;
        Some((self.buf[0], &self.buf[1..]))
    }

    /// The next record this build knows, skipping frames of unknown kinds and whole frames that do not decode
    /// (counted, [`TraceReader::bad_frames`]): their length was sound, so the frames after them are whole.
    pub fn next_record(&mut self) -> Option<Record> {
        loop {
            let (kind, payload) = self.next_frame()?;
            match codec::decode_record(kind, payload) {
                Ok(Some(rec)) => return Some(rec),
                Ok(None) => self.unknown_frames += 1,
                Err(e) => self.mark_bad(e.to_string()),
            }
        }
    }

    /// The frame just returned by `next_frame` did not decode: it is skipped and counted (one bad frame, written
    /// by a faulty or hostile process, must not hide the rest of the trace). Its framing was sound, so reading
    /// goes on at the next frame.
    pub fn mark_bad(&mut self, why: String) {
        self.frames = self.frames.saturating_sub(1);
        self.bad_frames += 1;
        if self.first_bad.is_none() {
            self.first_bad = Some((self.frame_start(), why));
        }
    }

    /// Whole frames skipped because they did not decode, and the first one's offset and why.
    pub fn bad_frames(&self) -> (u64, Option<&(u64, String)>) {
        (self.bad_frames, self.first_bad.as_ref())
    }

    /// Marks the frame just returned by `next_frame` as undecodable (for callers that decode frames themselves).
    pub fn mark_corrupt(&mut self, why: String) {
        self.frames = self.frames.saturating_sub(1);
        self.stop = Stop::Corrupt {
            offset: self.frame_start(),
            why,
        };
    }

    fn frame_start(&self) -> u64 {
        self.offset - 4 - self.buf.len() as u64
    }

    pub fn stop(&self) -> &Stop {
        &self.stop
    }

    /// Whole frames read so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Frames skipped because a newer writer made them.
    pub fn unknown_frames(&self) -> u64 {
        self.unknown_frames
    }

    /// Bytes consumed so far, header included.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode_header, put_record};

    fn header() -> TraceHeader {
        TraceHeader {
            start_unix_ns: 1,
            start_mono_ns: 2,
            command: vec!["cmd".into()],
            hostname: "h".into(),
            vramtrace_version: "t".into(),
            extra: vec![],
        }
    }

    fn trace(n: u32) -> Vec<u8> {
        let mut t = encode_header(&header());
        for i in 0..n {
            put_record(&mut t, &Record::Tick { pid: i, ts_ns: 1 });
        }
        t
    }

    fn read_all(bytes: &[u8]) -> (Vec<Record>, Stop) {
        let (mut r, _) = TraceReader::open(bytes).unwrap();
        let mut v = Vec::new();
        while let Some(rec) = r.next_record() {
            v.push(rec);
        }
        (v, r.stop().clone())
    }

    #[test]
    fn clean_trace_reads_to_end() {
        let (recs, stop) = read_all(&trace(5));
        assert_eq!(recs.len(), 5);
        assert_eq!(stop, Stop::End);
    }

    #[test]
    fn every_cut_gives_the_whole_frames_before_it() {
        let full = trace(4);
        let hdr = encode_header(&header()).len();
        let frame = (full.len() - hdr) / 4;
        for cut in hdr + 1..full.len() {
            let (recs, stop) = read_all(&full[..cut]);
            assert_eq!(recs.len(), (cut - hdr) / frame, "cut at {cut}");
            if !(cut - hdr).is_multiple_of(frame) {
                assert!(
                    matches!(stop, Stop::Truncated { .. }),
                    "cut at {cut}: {stop:?}"
                );
                assert!(stop
                    .describe(recs.len() as u64)
                    .unwrap()
                    .contains("cut short"));
            }
        }
    }

    #[test]
    fn open_errors_are_distinct() {
        assert!(matches!(TraceReader::open(&b""[..]), Err(OpenError::Empty)));
        assert!(matches!(
            TraceReader::open(&b"hello world, not a trace"[..]),
            Err(OpenError::NotATrace)
        ));
        let t = trace(0);
        assert!(matches!(
            TraceReader::open(&t[..10]),
            Err(OpenError::TruncatedHeader(_))
        ));
        let mut newer = t.clone();
        newer[8] = 0xff;
        assert!(matches!(
            TraceReader::open(&newer[..]),
            Err(OpenError::NewerVersion { .. })
        ));
    }

    #[test]
    fn a_whole_frame_that_does_not_decode_is_skipped_and_counted() {
        let mut t = trace(3);
        let hdr = encode_header(&header()).len();
        // Corrupt the kind byte of the second frame into an events frame with garbage payload: its length is
        // sound, so the third frame is read (one bad frame must not hide the rest of the trace).
        let frame = (t.len() - hdr) / 3;
        t[hdr + frame + 4] = crate::codec::kind::EVENTS;
        let (mut r, _) = TraceReader::open(&t[..]).unwrap();
        let mut recs = Vec::new();
        while let Some(rec) = r.next_record() {
            recs.push(rec);
        }
        assert_eq!(recs.len(), 2);
        assert_eq!(r.stop(), &Stop::End);
        let (n, first) = r.bad_frames();
        assert_eq!(n, 1);
        assert_eq!(first.unwrap().0, (hdr + frame) as u64);
        // A length no writer makes is broken framing: reading stops there, at its offset.
        let mut t = trace(3);
        t[hdr + frame..hdr + frame + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let (recs, stop) = read_all(&t);
        assert_eq!(recs.len(), 1);
        assert!(matches!(stop, Stop::Corrupt { offset, .. } if offset == (hdr + frame) as u64));
    }
}
