//! The one reader of the pickles vramtrace is given: PyTorch's allocator snapshots (`report`, `oom`, `whatif`,
//! `export`, `run`'s post-mortem). A small pickle machine for the opcodes Python 3 writes for plain data
//! (protocols 2 to 5: dicts, lists, tuples, sets, strings, numbers, the memo), with every string interned once,
//! so a million history entries cost neither a string nor a map each.
//!
//! The input is untrusted (issue 36). Every value the machine would build is counted before it is built, in
//! the same walk ([`bound`]): nesting past [`MAX_DEPTH`], more than [`BUDGET`] bytes once shared values are
//! copied, more than [`MAX_STACK`] stack items or [`MAX_MEMO`] memo entries end the read with why. Every
//! length and stack access is checked: anything else ends in an error, never a panic. Objects (`GLOBAL`,
//! `REDUCE`, ...) and protocol 0's text opcodes are refused: a snapshot has none.

mod bound;
mod doc;
mod read;
#[cfg(test)]
mod tests;

pub use bound::{BUDGET, MAX_DEPTH, MAX_MEMO, MAX_STACK};
pub use doc::{Doc, V};
pub use read::read;

/// (Tests) What Python's pickle writes for `v` after `program` (protocol 4): in fast mode (no memo, as the bridge
/// writes), or `shared` (the memo: a value used twice is written once and referred to, as PyTorch's own
/// `_dump_snapshot` writes).
#[cfg(test)]
pub(crate) fn python_written(program: &str, shared: bool) -> Vec<u8> {
    let dump = if shared {
        "sys.stdout.buffer.write(pickle.dumps(v, protocol=4))"
    } else {
        "p = pickle.Pickler(sys.stdout.buffer, protocol=4)\np.fast = True\np.dump(v)"
    };
    let out = std::process::Command::new("python3")
        .args(["-c", &format!("import pickle,sys\n{program}\n{dump}")])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
