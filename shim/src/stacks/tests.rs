use super::*;

/// What `local` gave a destructor that ran after the thread's own (1: a state, 2: none).
static LATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

extern "C" fn late_destructor(_: *mut c_void) {
    LATE.store(if local().is_some() { 1 } else { 2 }, Ordering::SeqCst);
}

#[test]
fn a_destructor_after_the_threads_own_takes_no_state_it_would_never_give_back() {
    std::thread::spawn(|| {
        assert!(local().is_some());
        // Created after `KEY`, so glibc runs its destructor after `thread_done` in each round.
        let mut k: libc::pthread_key_t = 0;
        assert_eq!(
            // SAFETY: `k` is a local the call writes; `late_destructor` is an `extern "C"` fn that ignores
            // its argument.
            unsafe { libc::pthread_key_create(&mut k, Some(late_destructor)) },
            0
        );
        // SAFETY: `k` was just made; the value is never dereferenced (`late_destructor` ignores it), only
        // non-null so that the destructor runs.
        unsafe { libc::pthread_setspecific(k, std::ptr::dangling::<c_void>()) };
    })
    .join()
    .unwrap();
    assert_eq!(
        LATE.load(Ordering::SeqCst),
        2,
        "a state taken after the thread's was handed back"
    );
}

fn frame(file: &str, function: &str, line: u32) -> PyFrame {
    PyFrame {
        file: file.into(),
        function: function.into(),
        line,
    }
}

#[test]
fn hashes_tell_frames_apart() {
    let a = hash(&[1, 2, 3], &[]);
    assert_eq!(a, hash(&[1, 2, 3], &[]));
    assert_ne!(a, hash(&[1, 2], &[]));
    assert_ne!(a, hash(&[1, 2, 3, 0], &[]));
    assert_ne!(a, hash(&[3, 2, 1], &[]));
    let p = hash(&[1], &[frame("a.py", "f", 1)]);
    assert_ne!(p, hash(&[1], &[frame("a.py", "f", 2)]));
    assert_ne!(p, hash(&[1], &[frame("a.py", "g", 1)]));
    assert_ne!(p, hash(&[1], &[frame("a.p", "yf", 1)]));
    assert_ne!(hash(&[], &[]), 0);
}

#[test]
fn the_unwinder_skips_the_shim_and_finds_its_caller() {
    // In a unit test the shim's code and its caller share one image: everything is "own", so nothing is
    // kept. What can be checked: it returns, within bounds.
    let mut ips = [0u64; MAX_FRAMES];
    assert!(unwind(&mut ips, None) <= MAX_FRAMES);
    assert!(!own_text().is_empty());
}

/// A training step calls the driver from a few hundred call chains in turn: each must still be remembered when
/// its turn comes again (with 8 remembered, the 9th evicted the 1st and every lookup missed).
/// A stand-in stack: three return-address slots, whose values name the chain that is "live".
#[cfg(target_arch = "x86_64")]
struct StandIn {
    stack: Box<[u64; 3]>,
}

#[cfg(target_arch = "x86_64")]
impl StandIn {
    fn new() -> StandIn {
        StandIn {
            stack: Box::new([0; 3]),
        }
    }

    fn at(&self, k: usize) -> u64 {
        self.stack.as_ptr() as u64 + 8 * k as u64
    }

    /// The stack pointer of a capturing frame below the slots.
    fn sp(&self) -> u64 {
        self.at(0) - 64
    }

    /// Makes chain `c` the live one.
    fn set(&self, c: u64) {
        for k in 0..3 {
            // SAFETY: writes to this stand-in's own array, read back through the same addresses.
            unsafe {
                std::ptr::write_volatile(self.at(k) as *mut u64, 0x1000 * (c + 1) + k as u64)
            };
        }
    }

    /// An unwinding that found chain `c` above the capturing frame.
    fn raw(&self, c: u64) -> Raw {
        let mut raw = Raw {
            ip: [0; RAW_FRAMES],
            slot: [0; RAW_FRAMES],
            n: CHAIN_FROM + 3,
            own: CHAIN_FROM,
            plain: true,
        };
        for k in 0..3 {
            raw.slot[CHAIN_FROM + k] = self.at(k);
            raw.ip[CHAIN_FROM + k] = 0x1000 * (c + 1) + k as u64;
        }
        raw
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn hundreds_of_chains_taken_in_turn_are_each_found_again() {
    let st = StandIn::new();
    let sp = st.sp();
    let mut chains = Chains::default();
    let chain = |c: u64| st.raw(c);
    let set = |c: u64| st.set(c);
    for c in 0..300u64 {
        set(c);
        assert_eq!(chains.find(sp), None, "chain {c} is new");
        chains.remember(sp, &chain(c)).unwrap();
    }
    for c in 0..300u64 {
        set(c);
        let i = chains
            .find(sp)
            .unwrap_or_else(|| panic!("chain {c} forgotten"));
        let mut ips = [0u64; MAX_FRAMES];
        assert_eq!(chains.frames(i, &mut ips), 3);
        assert_eq!(ips[0], 0x1000 * (c + 1));
    }
}

/// The memo answers only for the chain it copied, live now at the same stack pointer in the same table:
/// another chain at that stack pointer (one return address differs), another stack pointer, a forked child's
/// table, or a new thread's empty memo each go to the chains.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_memo_answers_only_for_its_own_chain() {
    let st = StandIn::new();
    let (at, sp) = (|k: usize| st.at(k), st.sp());
    let set = |c: u64| st.set(c);
    let raw = |c: u64| st.raw(c);
    let (owner, child) = (0x5000usize, 0x6000usize);
    let mut chains = Chains::default();
    let mut memo = Memo::EMPTY;
    assert_eq!(memo.hit(sp, owner), None, "empty");
    for (c, id) in [(0u64, 11u32), (1, 12)] {
        set(c);
        let i = chains.remember(sp, &raw(c)).unwrap();
        (chains.chains[i].id, chains.chains[i].owner) = (id, owner);
        chains.remember_last(i, &mut memo);
    }
    set(1);
    assert_eq!(memo.hit(sp, owner), Some(12), "the last chain, live");
    assert_eq!(memo.hit(sp + 16, owner), None, "another stack pointer");
    assert_eq!(memo.hit(sp, child), None, "a forked child's table");
    set(0);
    assert_eq!(
        memo.hit(sp, owner),
        None,
        "chain 0 is live: the memo holds chain 1"
    );
    let i = chains.find(sp).expect("chain 0 is remembered");
    assert_eq!(chains.chains[i].id, 11);
    chains.remember_last(i, &mut memo);
    assert_eq!(memo.hit(sp, owner), Some(11));
    // The outermost return address alone differs: another chain.
    // SAFETY: this test's own array.
    unsafe { std::ptr::write_volatile(at(2) as *mut u64, 0xdead) };
    assert_eq!(memo.hit(sp, owner), None);
    set(0);
    memo = Memo::EMPTY;
    chains.forget();
    assert_eq!(memo.hit(sp, owner), None, "a new thread's");
    // A chain longer than the memo is not copied: the memo empties.
    let mut long = raw(0);
    long.n = CHAIN_FROM + MEMO_SLOTS + 1;
    for j in 6..long.n {
        long.slot[j] = at(2);
        long.ip[j] = 0x1000 + 2;
    }
    let i = chains.remember(sp, &long).unwrap();
    (chains.chains[i].id, chains.chains[i].owner) = (13, owner);
    chains.remember_last(i, &mut memo);
    assert_eq!(memo.hit(sp, owner), None, "too long for the memo");
}
