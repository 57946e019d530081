//! What reading a pickle may cost, counted as it is read and refused before it is spent (issue 36). A pickle's
//! cost is whatever its opcodes make the reader build, not its length: a value shared through the memo is
//! copied at each use (a few hundred kilobytes that refer to one list fifty thousand times build billions of
//! values), a one-byte NONE is a 32-byte value, and nesting a million deep would overflow the stack of any code
//! that walks or drops the value by recursion. So the reader counts every value, string, memo entry and copy
//! (never less: what it drops it may have held at once, and the count bounds its time too), every open MARK,
//! the stack and the memo, and this says when to stop.

/// Nesting deeper than this is refused (PyTorch's snapshots nest about 8 deep).
pub const MAX_DEPTH: usize = 200;
/// What the reader may build, in bytes (by [`VALUE_BYTES`] a value, and the rest below). A million-entry
/// allocation history (the what-if's benchmark, 148 MB of pickle, 20 M values) counts about 700 MB.
pub const BUDGET: u64 = 1 << 30;
/// Items on the stack at once, marks included. Python's pickler adds a container's items a thousand at a time
/// (APPENDS, SETITEMS), so a snapshot's stack holds a few thousand.
pub const MAX_STACK: usize = 1 << 20;
/// Memo entries. Python memoizes each container and string once (none at all in fast mode, as the bridge
/// writes): a snapshot of a million entries dumped by PyTorch has a few million.
pub const MAX_MEMO: usize = 1 << 22;
/// A value as the reader holds it (`V`: 32 bytes), before its own text or items.
pub(super) const VALUE_BYTES: u64 = 32;
/// A memo entry (its key and a copy's place, in a map).
pub(super) const MEMO_BYTES: u64 = 64;
/// An open MARK, counted as a stack of 128 values: the price issue 36 set when serde-pickle read snapshots,
/// kept so 100 MB of MARK is still refused by the budget before the stack's own limit.
const MARK_BYTES: u64 = 128 * VALUE_BYTES;

/// How deeply a value nests (0 for a scalar) and the bytes it stands for, its items' included.
pub(super) type Figures = (usize, u64);

/// The running count of one read.
#[derive(Default)]
pub(super) struct Bound {
    /// Bytes built so far.
    built: u64,
    /// MARKs open now.
    marks: u64,
    /// The deepest nesting seen.
    pub(super) deepest: usize,
}

impl Bound {
    /// `n` bytes about to be built: refused before they are when the budget would be passed.
    pub(super) fn spend(&mut self, n: u64) -> Result<(), String> {
        self.built = self.built.saturating_add(n);
        if self.over_budget() {
            return Err(budget_passed());
        }
        Ok(())
    }

    /// A MARK opened: it holds no value, but it is counted (see [`MARK_BYTES`]).
    pub(super) fn open_mark(&mut self) -> Result<(), String> {
        self.marks += 1;
        self.spend(0)
    }

    pub(super) fn close_mark(&mut self) {
        self.marks = self.marks.saturating_sub(1);
    }

    fn over_budget(&self) -> bool {
        self.built
            .saturating_add(self.marks.saturating_mul(MARK_BYTES))
            > BUDGET
    }

    /// An item of nesting `depth` is on top of the stack: a container only grows while it is on top, so this
    /// sees every nesting the value reaches.
    pub(super) fn nest(&mut self, depth: usize) -> Result<(), String> {
        self.deepest = self.deepest.max(depth);
        if self.deepest > MAX_DEPTH {
            return Err(format!("it nests more than {MAX_DEPTH} deep"));
        }
        Ok(())
    }

    /// The stack now holds `stack` items, marks included.
    pub(super) fn stack(&self, stack: usize) -> Result<(), String> {
        if stack > MAX_STACK {
            return Err(format!(
                "it holds more than {MAX_STACK} items on its stack at once"
            ));
        }
        Ok(())
    }

    /// The memo now holds `memo` entries.
    pub(super) fn memo(&self, memo: usize) -> Result<(), String> {
        if memo > MAX_MEMO {
            return Err(format!("it memoizes more than {MAX_MEMO} values"));
        }
        Ok(())
    }
}

fn budget_passed() -> String {
    format!(
        "it would take more than {} MiB to build once the values it shares are copied",
        BUDGET >> 20
    )
}
