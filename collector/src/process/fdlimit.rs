//! The collector's descriptor limit. `vramtrace run` holds one socket for every live process of the job, and
//! takes each process's ring as a descriptor passed with its hello: at the usual soft limit of 1,024, a job with
//! a thousand processes alive at once would have its later ones turned away, or their rings lost in transit
//! (`MSG_CTRUNC`). So the collector raises its soft limit to the hard one, as Go's runtime does, and gives the
//! command the limit it had: the job runs with the environment it would have had without vramtrace (a program
//! that uses `select` breaks past descriptor 1,023).

/// The soft limit before [`raise`], to give back to the command (`None`: unchanged, nothing to restore).
#[derive(Clone, Copy)]
pub struct Original(libc::rlimit);

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit. The limit it had, if it changed.
pub fn raise() -> Option<Original> {
    // SAFETY: a C struct of integers (and padding): all zeroes is a valid value.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur >= lim.rlim_max
    {
        return None;
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
    (unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0).then_some(Original(lim))
}

impl Original {
    /// Puts the soft limit back. Async-signal-safe (one system call): for the command's `pre_exec`.
    pub fn restore(&self) {
        // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.0) };
    }
}

/// This process's soft limit on descriptors (for messages).
pub fn soft() -> Option<u64> {
    // SAFETY: a C struct of integers (and padding): all zeroes is a valid value.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim.rlim_cur as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get() -> libc::rlimit {
        // SAFETY: a C struct of integers (and padding): all zeroes is a valid value.
        let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        lim
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one_and_given_back() {
        // In a child process: the limit is the whole test process's.
        // SAFETY: in a test: the child only makes system calls on locals before `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let hard = get().rlim_max;
            let low = libc::rlimit {
                rlim_cur: 64.min(hard),
                rlim_max: hard,
            };
            // SAFETY: the rlimit is a local the call reads or writes; nothing else is touched.
            let ok = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) } == 0
                && match raise() {
                    Some(orig) => {
                        let up = get().rlim_cur == hard;
                        orig.restore();
                        up && get().rlim_cur == low.rlim_cur && raise().is_some()
                    }
                    // Only when the hard limit is itself 64 or less.
                    None => hard <= 64,
                }
                && soft() == Some(hard)
                && raise().is_none();
            // SAFETY: in the forked test child: `_exit` ends it at once, running nothing of the parent's state.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: `status` is a local int the call writes; the pid is an integer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
    }
}
