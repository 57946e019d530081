//! The interpreter's layouts: the 3.10 to 3.12 offsets from CPython's headers, and 3.13's from its own debug
//! offsets.

use super::*;

/// 3.10 (Include/cpython/pystate.h, cpython/frameobject.h, cpython/code.h, cpython/unicodeobject.h).
pub(super) const OFFSETS_310: Offsets = Offsets {
    shape: Shape::FrameObject,
    ts_frame: 24,
    ts_thread_id: 176,
    fr_previous: 24,
    fr_code: 32,
    fr_instr: 96,
    fr_owner: None,
    co_filename: 104,
    co_name: 112,
    co_code: 48,
    co_linetable: 120,
    co_firstlineno: 40,
    str_ascii_data: 48,
    str_compact_data: 72,
    str_ready_bit: true,
};

/// 3.11 (also internal/pycore_frame.h).
pub(super) const OFFSETS_311: Offsets = Offsets {
    shape: Shape::CFrame { current: 8 },
    ts_frame: 56,
    ts_thread_id: 152,
    fr_previous: 48,
    fr_code: 32,
    fr_instr: 56,
    fr_owner: None,
    co_filename: 112,
    co_name: 128,
    co_code: 184,
    co_linetable: 136,
    co_firstlineno: 72,
    str_ascii_data: 48,
    str_compact_data: 72,
    str_ready_bit: true,
};

/// 3.12 (the string's `wstr` is gone: its data moves 8 bytes up).
pub(super) const OFFSETS_312: Offsets = Offsets {
    shape: Shape::CFrame { current: 0 },
    ts_frame: 56,
    ts_thread_id: 136,
    fr_previous: 8,
    fr_code: 0,
    fr_instr: 56,
    fr_owner: Some(70),
    co_filename: 112,
    co_name: 128,
    co_code: 192,
    co_linetable: 136,
    co_firstlineno: 68,
    str_ascii_data: 40,
    str_compact_data: 56,
    str_ready_bit: false,
};

/// The offsets of 3.13+ from `_Py_DebugOffsets` read as 64-bit words. Its sections gain fields between minor
/// versions, so each section the walker needs is found by what it holds, then checked:
/// - thread state: `size, prev = 0, next = 8, interp = 16, current_frame, thread_id, ...`;
/// - interpreter frame: `size, previous = 8, executable = 0, instr_ptr, localsplus, owner, ...`;
/// - code object: `size, filename, name = filename + 8, qualname = name + 8, linetable, firstlineno, argcount,
///   localsplusnames, localspluskinds, co_code_adaptive, ...`;
/// - unicode object: `size, state = 32, length = 16, asciiobject_size = 40`.
pub(super) fn parse_debug_offsets(s: &[u64], version: u64) -> Result<Offsets, &'static str> {
    const BAD: &str =
        "Python frames unavailable: _PyRuntime's debug offsets do not read as expected (native \
                       stacks only)";
    if s.len() < 16 || s[0].to_ne_bytes() != *b"xdebugpy" {
        return Err(BAD);
    }
    if s[1] >> 16 != version >> 16 {
        return Err(BAD);
    }
    if s[2] != 0 {
        return Err(
            "Python frames unavailable: a free-threaded build of Python (native stacks only)",
        );
    }
    let find = |from: usize, width: usize, ok: &dyn Fn(&[u64]) -> bool| {
        (from..s.len().saturating_sub(width - 1)).find(|&i| ok(&s[i..i + width]))
    };
    let small = |v: u64, below: u64| v < below && v.is_multiple_of(8);
    let ts = find(3, 6, &|w| {
        (64..1 << 20).contains(&w[0]) && w[1] == 0 && w[2] == 8 && w[3] == 16
    })
    .ok_or(BAD)?;
    let ts_size = s[ts];
    let (ts_frame, ts_thread_id) = (s[ts + 4], s[ts + 5]);
    if !small(ts_frame, ts_size)
        || !small(ts_thread_id, ts_size)
        || ts_frame < 24
        || ts_thread_id < 24
    {
        return Err(BAD);
    }
    let fr = find(ts + 6, 6, &|w| {
        (24..4096).contains(&w[0]) && w[1] == 8 && w[2] == 0
    })
    .ok_or(BAD)?;
    let fr_size = s[fr];
    let (fr_instr, fr_owner) = (s[fr + 3], s[fr + 5]);
    if !small(fr_instr, fr_size) || fr_instr < 16 || fr_owner >= fr_size {
        return Err(BAD);
    }
    let co = find(fr + 6, 10, &|w| {
        (64..4096).contains(&w[0]) && w[1] >= 24 && w[2] == w[1] + 8 && w[3] == w[2] + 8
    })
    .ok_or(BAD)?;
    let co_size = s[co];
    let (co_filename, co_qualname, co_code) = (s[co + 1], s[co + 3], s[co + 9]);
    let (co_linetable, co_firstlineno) = (s[co + 4], s[co + 5]);
    if !small(co_qualname, co_size)
        || !small(co_linetable, co_size)
        || co_firstlineno >= co_size
        || !co_firstlineno.is_multiple_of(4)
        || co_code < co_qualname
        || co_code >= co_size
        || co_size - co_code > 32
    {
        return Err(BAD);
    }
    let uni = find(co + 10, 4, &|w| {
        (40..512).contains(&w[0])
            && w[1] == STR_STATE as u64
            && w[2] == STR_LENGTH as u64
            && w[3] == 40
    })
    .ok_or(BAD)?;
    let ascii = s[uni + 3] as usize;
    Ok(Offsets {
        shape: Shape::Direct,
        ts_frame: ts_frame as usize,
        ts_thread_id: ts_thread_id as usize,
        fr_previous: 8,
        fr_code: 0,
        fr_instr: fr_instr as usize,
        fr_owner: Some(fr_owner as usize),
        co_filename: co_filename as usize,
        co_name: co_qualname as usize,
        co_code: co_code as usize,
        co_linetable: co_linetable as usize,
        co_firstlineno: co_firstlineno as usize,
        str_ascii_data: ascii,
        // PyCompactUnicodeObject: PyASCIIObject, utf8_length, utf8.
        str_compact_data: ascii + 16,
        str_ready_bit: false,
    })
}
