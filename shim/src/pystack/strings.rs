//! Python strings read where they lie: hashed for a stack's key, decoded only for a stack new to the process.

use super::*;

/// A 64-bit hash of the characters of the `str` at `obj` (type already checked), read where [`decode_str`]
/// reads them, 8 bytes at a time, with no allocation; `None` when it does not read as a `str`.
pub(super) fn hash_str<M: Mem>(o: &Offsets, m: &M, obj: usize) -> Option<u64> {
    let len = m.word(obj + STR_LENGTH)? as isize;
    if len < 0 {
        return None;
    }
    let n = (len as usize).min(MAX_CHARS);
    let state = m.u32(obj + STR_STATE)?;
    let kind = ((state >> 2) & 7) as usize;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if o.str_ready_bit && state & (1 << 7) == 0 {
        return None;
    }
    if !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
        return None;
    }
    let data = match (compact, ascii) {
        (true, true) => obj + o.str_ascii_data,
        (true, false) => obj + o.str_compact_data,
        (false, _) => {
            let p = m.word(obj + o.str_compact_data)?;
            if p < 0x1000 {
                return None;
            }
            p
        }
    };
    let bytes = n * kind;
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ (bytes as u64) ^ ((kind as u64) << 56);
    let mut at = 0;
    while at < bytes {
        let take = (bytes - at).min(8);
        let mut w = [0u8; 8];
        if !m.copy(data + at, &mut w[..take]) {
            return None;
        }
        let v = u64::from_le_bytes(w);
        let x = ((h ^ v) as u128).wrapping_mul(0xe703_7ed1_a0b4_28db);
        h = (x as u64) ^ ((x >> 64) as u64);
        at += take;
    }
    Some(h)
}

/// The `str` object whose address is stored at `at`, as UTF-8 (cut to [`MAX_CHARS`]; characters that are not
/// Unicode scalar values become U+FFFD); `None` when it does not read as a `str`.
pub(super) fn string<M: Mem>(py: &Python, m: &M, at: usize) -> Option<String> {
    let obj = m.word(at)?;
    if !ptr_ok(obj) || m.word(obj + OB_TYPE)? != py.unicode_type {
        return None;
    }
    decode_str(&py.off, m, obj)
}

/// Decodes a `str` at `obj` (type already checked).
pub(super) fn decode_str<M: Mem>(o: &Offsets, m: &M, obj: usize) -> Option<String> {
    let len = m.word(obj + STR_LENGTH)? as isize;
    if len < 0 {
        return None;
    }
    let n = (len as usize).min(MAX_CHARS);
    let state = m.u32(obj + STR_STATE)?;
    let kind = (state >> 2) & 7;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if o.str_ready_bit && state & (1 << 7) == 0 {
        return None;
    }
    let data = match (compact, ascii) {
        (true, true) => obj + o.str_ascii_data,
        (true, false) => obj + o.str_compact_data,
        (false, _) => {
            let p = m.word(obj + o.str_compact_data)?;
            if p < 0x1000 {
                return None;
            }
            p
        }
    };
    match kind {
        1 if ascii => m.with_bytes(data, n, |b| match std::str::from_utf8(b) {
            Ok(s) => s.to_owned(),
            Err(_) => String::from_utf8_lossy(b).into_owned(),
        }),
        1 => m.with_bytes(data, n, |b| b.iter().map(|&c| c as char).collect()),
        2 if !ascii => m.with_bytes(data, n * 2, |b| {
            b.chunks_exact(2)
                .map(|c| u32::from(u16::from_ne_bytes([c[0], c[1]])))
                .map(|c| char::from_u32(c).unwrap_or('\u{fffd}'))
                .collect()
        }),
        4 if !ascii => m.with_bytes(data, n * 4, |b| {
            b.chunks_exact(4)
                .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .map(|c| char::from_u32(c).unwrap_or('\u{fffd}'))
                .collect()
        }),
        _ => None,
    }
}
