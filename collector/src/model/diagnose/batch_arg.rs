//! A job's batch size in its own command line (`--batch-size 32`, `--per_device_train_batch_size=8`,
//! `batch_size=16`): the value it ran with, and the command with `{}` in its place, which is how `vramtrace fit`
//! takes it, for the post-mortem's advice.

/// What `vramtrace fit` puts the knob's value in place of.
pub const PLACEHOLDER: &str = "{}";

/// Names of a batch-size argument, as training scripts and launchers spell them (compared without dashes and
/// underscores, ignoring case).
const BATCH_NAMES: &[&str] = &[
    "batch",
    "batchsize",
    "bs",
    "bsz",
    "perdevicetrainbatchsize",
    "traininbatchsize",
    "trainbatchsize",
    "microbatchsize",
    "microbatch",
    "localbatchsize",
    "perdevicebatchsize",
];

fn batch_flag(name: &str) -> bool {
    let n: String = name
        .trim_start_matches('-')
        .chars()
        .filter(|c| *c != '-' && *c != '_' && *c != '.')
        .flat_map(char::to_lowercase)
        .collect();
    // Any `..._batch_size` of training, not of evaluation (an evaluation's batch is rarely what a job is sized by).
    BATCH_NAMES.contains(&n.as_str())
        || (n.ends_with("batchsize")
            && !["eval", "val", "test", "infer"]
                .iter()
                .any(|x| n.contains(x)))
}

/// The recorded command with its batch size as `{}` (`--batch-size 32`, `--batch_size=32`, `batch_size=32`,
/// `--bs 32`), and the value it ran with; `None` when no argument names a batch size, or more than one does
/// with different values.
pub fn batch_template(argv: &[String]) -> Option<(Vec<String>, u64)> {
    let mut out = argv.to_vec();
    let mut found: Option<u64> = None;
    let mut i = 1;
    while i < argv.len() {
        let a = &argv[i];
        let hit = if let Some((name, v)) = a.split_once('=') {
            batch_flag(name)
                .then(|| v.parse::<u64>().ok())
                .flatten()
                .map(|v| (i, format!("{name}={{}}"), v))
        } else if a.starts_with('-') && batch_flag(a) {
            argv.get(i + 1)
                .and_then(|v| v.parse::<u64>().ok())
                .map(|v| (i + 1, PLACEHOLDER.to_string(), v))
        } else {
            None
        };
        if let Some((at, with, v)) = hit {
            if found.is_some_and(|f| f != v) {
                return None;
            }
            found = Some(v);
            out[at] = with;
            i = at + 1;
        } else {
            i += 1;
        }
    }
    found.filter(|&v| v > 0).map(|v| (out, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_batch_size_becomes_the_placeholder() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (cmd, b) = batch_template(&v(&[
            "python",
            "train.py",
            "--batch-size",
            "32",
            "--lr",
            "3",
        ]))
        .unwrap();
        assert_eq!(
            (cmd, b),
            (
                v(&["python", "train.py", "--batch-size", "{}", "--lr", "3"]),
                32
            )
        );
        let (cmd, b) =
            batch_template(&v(&["python", "t.py", "--per_device_train_batch_size=8"])).unwrap();
        assert_eq!(
            (cmd, b),
            (
                v(&["python", "t.py", "--per_device_train_batch_size={}"]),
                8
            )
        );
        let (cmd, b) =
            batch_template(&v(&["python", "t.py", "batch_size=16", "--bs", "16"])).unwrap();
        assert_eq!(
            (cmd, b),
            (v(&["python", "t.py", "batch_size={}", "--bs", "{}"]), 16)
        );
        assert!(batch_template(&v(&["python", "t.py", "--batch", "8", "--bs", "16"])).is_none());
        assert!(batch_template(&v(&["python", "t.py", "--lr", "32"])).is_none());
        assert!(batch_template(&v(&["python", "t.py", "--batch-size", "big"])).is_none());
        assert!(batch_template(&v(&["python", "t.py", "--eval-steps", "32"])).is_none());
    }
}
