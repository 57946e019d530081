//! The process's loaded objects (the program and its shared libraries), so that the collector can turn a stack's
//! absolute addresses into files and offsets. Read with `dl_iterate_phdr`, only ever on the shim's sender thread:
//! before it sends a new stack, it checks whether the set changed since the objects it last sent (the loader's
//! `dlpi_adds`/`dlpi_subs` counters, a cheap look) and if so sends them again first.

use std::ffi::{c_int, c_void, CStr};

use vramtrace_format::Object;

/// The loader's counts of objects ever added and removed: equal counts, same set.
pub type Generation = (u64, u64);

/// The sender's memory of what it last sent.
#[derive(Default)]
pub struct Tracker {
    sent: Option<Generation>,
}

impl Tracker {
    /// The objects, if they changed since the last call that returned some (the first call always does).
    pub fn changed(&mut self) -> Option<Vec<Object>> {
        if self.sent.is_some() && self.sent == generation() {
            return None;
        }
        let (generation, objects) = list();
        self.sent = generation;
        Some(objects)
    }
}

/// The loader's counters, from the first object's info (the iteration stops there). `None` if this loader does
/// not keep them.
pub fn generation() -> Option<Generation> {
    let mut g: Option<Generation> = None;
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        *(data as *mut Option<Generation>) = counters(info, size);
        1
    }
    // SAFETY: `first` is called synchronously, on this thread, before dl_iterate_phdr returns, with `data` =
    // `&mut g`, an `Option<Generation>` that outlives the call and nothing else touches meanwhile.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut g as *mut Option<Generation>).cast()) };
    g
}

unsafe fn counters(info: *const libc::dl_phdr_info, size: usize) -> Option<Generation> {
    let end = std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + std::mem::size_of::<u64>();
    (size >= end).then(|| ((*info).dlpi_adds, (*info).dlpi_subs))
}

struct Listing {
    generation: Option<Generation>,
    objects: Vec<Object>,
}

/// Every loaded object, with the loader's counters at that moment (one iteration: they match the list).
pub fn list() -> (Option<Generation>, Vec<Object>) {
    let mut l = Listing {
        generation: None,
        objects: Vec::new(),
    };
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        let l = &mut *(data as *mut Listing);
        if l.objects.is_empty() {
            l.generation = counters(info, size);
        }
        l.objects.push(object(&*info));
        0
    }
    // SAFETY: `each` is called synchronously, on this thread, before dl_iterate_phdr returns, with `data` = `&mut
    // l`, a `Listing` that outlives the call and nothing else touches meanwhile.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut l as *mut Listing).cast()) };
    // The loader names the main program "": say which file it is.
    if let Some(main) = l.objects.first_mut().filter(|o| o.path.is_empty()) {
        if let Ok(p) = std::fs::read_link("/proc/self/exe") {
            main.path = p.to_string_lossy().into_owned();
        }
    }
    (l.generation, l.objects)
}

unsafe fn object(info: &libc::dl_phdr_info) -> Object {
    let path = if info.dlpi_name.is_null() {
        String::new()
    } else {
        CStr::from_ptr(info.dlpi_name)
            .to_string_lossy()
            .into_owned()
    };
    let bias = info.dlpi_addr;
    let phdrs: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize)
    };
    let loaded = |start: u64, len: u64| {
        phdrs.iter().any(|p| {
            p.p_type == libc::PT_LOAD
                && start >= p.p_vaddr
                && start.saturating_add(len) <= p.p_vaddr.saturating_add(p.p_memsz)
        })
    };
    let text = phdrs
        .iter()
        .filter(|p| p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_X != 0)
        .map(|p| {
            let start = bias.wrapping_add(p.p_vaddr);
            (start, start.wrapping_add(p.p_memsz))
        })
        .collect();
    let build_id = phdrs
        .iter()
        // Only notes inside a loaded segment are in memory.
        .filter(|p| p.p_type == libc::PT_NOTE && loaded(p.p_vaddr, p.p_memsz))
        .find_map(|p| {
            let notes = std::slice::from_raw_parts(
                bias.wrapping_add(p.p_vaddr) as usize as *const u8,
                p.p_memsz as usize,
            );
            gnu_build_id(notes, if p.p_align == 8 { 8 } else { 4 })
        })
        .unwrap_or_default();
    Object {
        path,
        bias,
        text,
        build_id,
    }
}

/// The descriptor of the `NT_GNU_BUILD_ID` note named "GNU" in a note segment, if any.
fn gnu_build_id(notes: &[u8], align: usize) -> Option<Vec<u8>> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(notes.get(at..at + 4)?.try_into().ok()?))
    };
    let up = |n: usize| n.checked_add(align - 1).map(|n| n & !(align - 1));
    let mut at = 0usize;
    while at + 12 <= notes.len() {
        let (namesz, descsz, kind) = (word(at)? as usize, word(at + 4)? as usize, word(at + 8)?);
        let name = at + 12;
        let desc = name.checked_add(up(namesz)?)?;
        let next = desc.checked_add(up(descsz)?)?;
        if desc.checked_add(descsz)? > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && notes.get(name..name + namesz)? == b"GNU\0" {
            return Some(notes[desc..desc + descsz].to_vec());
        }
        at = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_give_the_gnu_build_id() {
        let mut n = Vec::new();
        // Another note first (name "Go", 2 bytes padded to 4), then the build id.
        for (name, kind, desc) in [
            (&b"Go\0"[..], 4u32, &[9u8, 9, 9][..]),
            (b"GNU\0", 3, &[0xde, 0xad, 0xbe, 0xef, 1]),
        ] {
            n.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            n.extend_from_slice(&(desc.len() as u32).to_ne_bytes());
            n.extend_from_slice(&kind.to_ne_bytes());
            n.extend_from_slice(name);
            n.resize(n.len().next_multiple_of(4), 0);
            n.extend_from_slice(desc);
            n.resize(n.len().next_multiple_of(4), 0);
        }
        assert_eq!(gnu_build_id(&n, 4), Some(vec![0xde, 0xad, 0xbe, 0xef, 1]));
        assert_eq!(gnu_build_id(&n[..20], 4), None);
        assert_eq!(gnu_build_id(&[], 4), None);
    }

    #[test]
    fn this_process_lists_itself_first_with_code_and_a_counter() {
        let (generation, objects) = list();
        assert!(objects.len() > 1);
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(objects[0].path, exe.to_string_lossy());
        assert!(!objects[0].text.is_empty());
        let here = this_process_lists_itself_first_with_code_and_a_counter as *const () as u64;
        assert!(objects[0].text.iter().any(|&(s, e)| here >= s && here < e));
        assert!(objects.iter().any(|o| o.path.contains("libc.so")));
        assert_eq!(generation, super::generation());
        let mut t = Tracker::default();
        assert!(t.changed().is_some());
        assert!(t.changed().is_none());
    }
}
