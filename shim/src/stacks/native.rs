//! Native frames: unwinding from the hook (the shim's own frames skipped), and the cache of chains that lets a
//! repeated call path skip most of the unwind.

use super::*;

/// Where the shim's own code lies: executable segments of its image, found from its ELF header (no lock, no
/// loader call).
pub(super) fn own_text() -> &'static [(u64, u64)] {
    static TEXT: OnceLock<Vec<(u64, u64)>> = OnceLock::new();
    // SAFETY: `__ehdr_start` is the linker's symbol for the ELF header of the image this code is in, mapped by
    // the first PT_LOAD (file offset 0) for as long as the image is loaded; its program headers lie `e_phoff`
    // bytes on in that same mapping (where linkers put them, PT_PHDR), `e_phnum` of them.
    TEXT.get_or_init(|| unsafe {
        let ehdr = std::ptr::addr_of!(__ehdr_start);
        let base = ehdr as u64;
        let phdrs = std::slice::from_raw_parts(
            (base + (*ehdr).e_phoff) as usize as *const libc::Elf64_Phdr,
            (*ehdr).e_phnum as usize,
        );
        // The segment that maps the file's start holds the header: its vaddr says the bias.
        let bias = phdrs
            .iter()
            .find(|p| p.p_type == libc::PT_LOAD && p.p_offset == 0)
            .map_or(base, |p| base.wrapping_sub(p.p_vaddr));
        phdrs
            .iter()
            .filter(|p| p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_X != 0)
            .map(|p| {
                let start = bias.wrapping_add(p.p_vaddr);
                (start, start + p.p_memsz)
            })
            .collect()
    })
}

/// Where the unwinder writes.
pub(super) struct Unwound<'a> {
    ips: &'a mut [u64; MAX_FRAMES],
    n: usize,
    own: &'static [(u64, u64)],
    /// Still in the shim's own frames (the innermost ones).
    inside: bool,
    /// Every frame, own frames included, for the chain cache; `None`: not wanted.
    raw: Option<&'a mut Raw>,
}

/// Every frame of one unwinding, as the chain cache needs them.
pub(super) struct Raw {
    pub(super) ip: [u64; RAW_FRAMES],
    /// Where each return address lies.
    pub(super) slot: [u64; RAW_FRAMES],
    pub(super) n: usize,
    /// How many of the first frames are the shim's.
    pub(super) own: usize,
    /// Every frame's return address was where the x86-64 ABI puts it (just below its callee's CFA).
    pub(super) plain: bool,
}

/// The most frames of the shim's own a cached chain may start with.
pub(super) const OWN_FRAMES: usize = 16;
/// The first frame of an unwinding from [`capture_walk`] whose return address a chain keeps: frame 0 is
/// `unwind`, 1 `capture_walk`, 2 `capture`; frame 3's return address lies at the top of `capture`'s frame, live
/// while `capture` runs (frame 2's lies below it, in `capture_walk`'s, gone when `capture` checks its memo).
pub(super) const CHAIN_FROM: usize = 3;
pub(super) const RAW_FRAMES: usize = MAX_FRAMES + OWN_FRAMES;

unsafe extern "C" fn each_frame(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    let u = &mut *(arg as *mut Unwound);
    let ip = _Unwind_GetIP(ctx) as u64;
    if ip == 0 {
        return URC_NORMAL_STOP;
    }
    let own = u.inside && u.own.iter().any(|&(s, e)| ip >= s && ip < e);
    if let Some(raw) = u.raw.as_deref_mut() {
        if raw.n == RAW_FRAMES {
            raw.plain = false;
        } else {
            // While the callback runs, the context's CFA is still the callee's: the call that led here pushed
            // this frame's return address just below it. Checked (the stack is live) rather than assumed.
            let slot = (_Unwind_GetCFA(ctx) as u64).wrapping_sub(8);
            // Outer frames lie higher, all above this callback's own.
            let here = 0u64;
            let floor = if raw.n == 0 {
                std::ptr::addr_of!(here) as u64
            } else {
                raw.slot[raw.n - 1]
            };
            if raw.plain && (slot <= floor || read_stack(slot) != ip) {
                raw.plain = false;
            }
            raw.ip[raw.n] = ip;
            raw.slot[raw.n] = slot;
            raw.n += 1;
            if own {
                raw.own = raw.n;
            }
        }
    }
    if own {
        return URC_NO_REASON;
    }
    u.inside = false;
    u.ips[u.n] = ip;
    u.n += 1;
    if u.n == MAX_FRAMES {
        URC_NORMAL_STOP
    } else {
        URC_NO_REASON
    }
}

#[inline(always)]
pub(super) unsafe fn read_stack(addr: u64) -> u64 {
    std::ptr::read_volatile(addr as usize as *const u64)
}

/// The calling thread's return addresses outside the shim, innermost first, as the unwinder gives them (return
/// addresses: the instruction after each call). Returns how many. With `raw`, every frame is also kept there.
#[inline(never)]
pub(super) fn unwind(ips: &mut [u64; MAX_FRAMES], raw: Option<&mut Raw>) -> usize {
    let mut u = Unwound {
        ips,
        n: 0,
        own: own_text(),
        inside: true,
        raw,
    };
    // SAFETY: libgcc calls `each_frame` synchronously, on this thread, before returning, with `arg` = `&mut u`,
    // an `Unwound` that outlives the call and nothing else touches meanwhile.
    unsafe { _Unwind_Backtrace(each_frame, (&mut u as *mut Unwound).cast()) };
    u.n
}

/// The chain cache (x86-64). Unwinding with libgcc costs about 0.1 us a frame; allocations mostly repeat a few
/// call chains. A chain is remembered as the stack pointer of the capturing frame and, for every frame outward,
/// the address where its return address lies and the value it had. The same stack pointer and the same values
/// at every one of those addresses (read innermost first, stopping at the first difference, so only the live
/// stack is ever read) is the same chain: each frame's size is fixed by its code, so equal return addresses
/// put every outer frame where it was. Only chains whose every return address sat where the ABI puts it are
/// remembered (a signal frame is not).
#[derive(Default)]
#[repr(C)]
pub(super) struct Chains {
    pub(super) chains: Vec<Chain>,
    /// Each chain's `sp`, apart: a lookup scans these (a few hundred compares) before reading any stack.
    sps: Vec<u64>,
    next: usize,
}

/// Chains remembered per thread. A training step with PyTorch's cache off calls the driver from a few hundred
/// distinct call chains, the same ones every step: with 8 the cache missed nearly always and each miss unwound
/// some 60 frames (about 20 us in libtorch), +10% a step on an H200 (docs/GPU-RESULTS.md, issue 27). A chain is
/// a few hundred bytes of slots.
pub(super) const CHAINS: usize = 512;

impl Memo {
    /// Empty: what a thread starts with (all zero, as `.tbss`; the `thread_local!` elsewhere starts with this).
    #[allow(dead_code)]
    pub(crate) const EMPTY: Memo = Memo {
        sp: 0,
        owner: 0,
        id: 0,
        n: 0,
        slots: [(0, 0); MEMO_SLOTS],
    };

    /// Holds no chain (a new thread's, all zero).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.sp == 0 && self.owner == 0 && self.id == 0 && self.n == 0
    }

    /// The id of the memo's chain if it is the one live now above a capturing frame at `sp`, in the table at
    /// `owner`.
    #[inline(always)]
    pub(super) fn hit(&self, sp: u64, owner: usize) -> Option<u32> {
        if self.sp != sp || self.owner != owner || self.id == 0 {
            return None;
        }
        self.slots[..self.n as usize]
            .iter()
            // SAFETY: as in `Chains::find`: the slots of a chain remembered above a capturing frame at this same
            // `sp` on this thread, read innermost first, each only after every one below it matched.
            .all(|&(at, value)| unsafe { read_stack(at) } == value)
            .then_some(self.id)
    }
}

impl Chains {
    /// Copies chain `i` (with its id) into `memo` if it fits; else empties `memo`.
    #[link_section = ".vramtrace.hot"]
    pub(super) fn remember_last(&self, i: usize, memo: &mut Memo) {
        let c = &self.chains[i];
        if c.id == 0 || c.slots.len() > MEMO_SLOTS {
            memo.sp = 0;
            return;
        }
        if memo.sp == c.sp && memo.id == c.id && memo.owner == c.owner {
            return;
        }
        memo.slots[..c.slots.len()].copy_from_slice(&c.slots);
        memo.n = c.slots.len() as u32;
        (memo.sp, memo.owner, memo.id) = (c.sp, c.owner, c.id);
    }

    /// Forgets every chain, keeping the buffers. (A thread's memo is its own, not the chains': a thread that
    /// takes a finished thread's chains starts with an empty one.)
    pub(super) fn forget(&mut self) {
        for c in &mut self.chains {
            c.sp = 0;
            c.slots.clear();
            c.id = 0;
        }
        for s in &mut self.sps {
            *s = 0;
        }
        self.next = 0;
    }
}

pub(super) struct Chain {
    sp: u64,
    /// (address, value) of each return address from the capturing frame's outward.
    slots: Vec<(u64, u64)>,
    /// Where in `slots` the frames outside the shim start.
    native: usize,
    /// The id these frames were interned as, with no Python frames (0: not yet), in the table at `owner` (a
    /// forked child's table is another).
    pub(super) id: u32,
    pub(super) owner: usize,
}

impl Chains {
    /// The remembered chain that is live now, if any: the one whose return addresses are all still in place
    /// above a capturing frame at `sp`.
    #[link_section = ".vramtrace.hot"]
    pub(super) fn find(&self, sp: u64) -> Option<usize> {
        (0..self.sps.len()).find(|&i| {
            let c = &self.chains[i];
            self.sps[i] == sp
                && c.slots
                    .iter()
                    // SAFETY: each `at` was the 8-aligned slot of a return address on this thread's stack, above
                    // a capturing frame at this same `sp`, when the chain was remembered (a `Local` taken over by
                    // another thread has its chains forgotten). `all` reads innermost first and stops at the
                    // first difference: a slot is read only when every one below it held the same return address,
                    // which puts the same frames, of the same sizes, at the same places, so it lies in this
                    // thread's live stack. This assumes the thread's stack is not swapped for a shorter one under
                    // it at the same `sp` (user-level fibers); there a read past its top could fault.
                    .all(|&(at, value)| unsafe { read_stack(at) } == value)
        })
    }

    /// Chain `i`'s native frames into `ips`: how many.
    #[link_section = ".vramtrace.hot"]
    pub(super) fn frames(&self, i: usize, ips: &mut [u64; MAX_FRAMES]) -> usize {
        let c = &self.chains[i];
        for (d, &(_, v)) in ips.iter_mut().zip(&c.slots[c.native..]) {
            *d = v;
        }
        c.slots.len() - c.native
    }

    /// Remembers the chain of an unwinding done from the frame whose stack pointer is `sp` (frame 1 of `raw`:
    /// frame 0 is `unwind`'s own).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn remember(&mut self, sp: u64, raw: &Raw) -> Option<usize> {
        if !raw.plain || raw.own < CHAIN_FROM || raw.own > OWN_FRAMES || raw.n <= raw.own {
            return None;
        }
        // From the return address into `capture`'s caller outward.
        let slots = (CHAIN_FROM..raw.n).map(|j| (raw.slot[j], raw.ip[j]));
        // No remembered chain matched (`find` came first): a new one, in place of the oldest.
        let i = if self.chains.len() < CHAINS {
            self.chains.push(Chain {
                sp: 0,
                slots: Vec::with_capacity(raw.n - 2),
                native: 0,
                id: 0,
                owner: 0,
            });
            self.sps.push(0);
            self.chains.len() - 1
        } else {
            let i = self.next;
            self.next = (i + 1) % CHAINS;
            i
        };
        self.sps[i] = sp;
        let c = &mut self.chains[i];
        c.sp = sp;
        c.slots.clear();
        c.slots.extend(slots);
        c.native = raw.own - CHAIN_FROM;
        c.id = 0;
        Some(i)
    }
}

/// The native frames of a call chain no remembered one matches, unwound (and remembered, where the frames allow).
/// Their count, and the chain remembered. Inlined into `capture_walk`, whose frames `CHAIN_FROM` counts.
#[inline(always)]
pub(super) fn native(
    chains: &mut Chains,
    sp: u64,
    ips: &mut [u64; MAX_FRAMES],
) -> (usize, Option<usize>) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut raw = Raw {
            ip: [0; RAW_FRAMES],
            slot: [0; RAW_FRAMES],
            n: 0,
            own: 0,
            plain: true,
        };
        let n = unwind(ips, Some(&mut raw));
        (n, chains.remember(sp, &raw))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (chains, sp);
        (unwind(ips, None), None)
    }
}
