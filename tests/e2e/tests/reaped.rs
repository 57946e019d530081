//! A process that reaps its own children (torchrun's agent, a shell) tells the collector how they ended: its
//! shim reports each reap as a Reaped frame (kind 18), in its ring when it has one, else alone on a one-shot
//! connection. Here a socket this test owns stands in for the collector, and `tests/programs/c/reaper.c` reaps
//! children that exit(3), are SIGKILLed, exit(0), are SIGTERMed and exit(7) through `waitpid`, `wait4` with a
//! null status, `waitid`, `wait`, and `waitpid` in a SIGCHLD handler. The program checks its own view (results,
//! statuses, errno) is what it would be without the shim.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use vramtrace_e2e::traced::shim;
use vramtrace_e2e::*;
use vramtrace_format::codec::{self, kind};
use vramtrace_format::{ExitStatus, Record};
use vramtrace_test_wire::ring_records;

/// One connection the stand-in collector took: who the kernel says made it, what it sent, the descriptors
/// that came with it.
struct Conn {
    peer: u32,
    bytes: Vec<u8>,
    fds: Vec<i32>,
}

/// A listening socket standing in for the collector: it takes every connection and reads each to its end.
struct Stand {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    acceptor: JoinHandle<Vec<Conn>>,
}

impl Stand {
    fn listen(dir: &Path) -> Stand {
        let path = dir.join("c.sock");
        let l = UnixListener::bind(&path).expect("bind");
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let acceptor = std::thread::spawn(move || {
            let mut readers = Vec::new();
            loop {
                match l.accept() {
                    Ok((c, _)) => readers.push(std::thread::spawn(move || read_conn(c))),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if s.load(Ordering::Acquire) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
            readers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        Stand {
            path,
            stop,
            acceptor,
        }
    }

    /// Every connection made so far, read to its end (call once the programs are gone).
    fn finish(self) -> Vec<Conn> {
        self.stop.store(true, Ordering::Release);
        self.acceptor.join().unwrap()
    }
}

fn read_conn(c: UnixStream) -> Conn {
    c.set_nonblocking(false).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let fd = c.as_raw_fd();
    // SAFETY: a C struct of integers: all zeroes is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a local ucred and `len` its size, as SO_PEERCRED writes; the socket is open.
    let ok = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    assert_eq!(ok, 0, "SO_PEERCRED");
    let (mut bytes, mut fds) = (Vec::new(), Vec::new());
    loop {
        let mut data = [0u8; 4096];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: a C struct of integers and pointers: all zeroes (null pointers) is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // SAFETY: `msg` points at the local iovec and control buffer above, which outlive the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        assert!(n >= 0, "recvmsg: {}", std::io::Error::last_os_error());
        // SAFETY: `msg` was filled by recvmsg; the macro reads only its own fields.
        let mut cm = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        while !cm.is_null() {
            // SAFETY: `cm` is non-null and lies inside the control buffer recvmsg filled; CMSG_NXTHDR stays inside it.
            unsafe {
                if (*cm).cmsg_level == libc::SOL_SOCKET && (*cm).cmsg_type == libc::SCM_RIGHTS {
                    fds.push(libc::CMSG_DATA(cm).cast::<i32>().read_unaligned());
                }
                cm = libc::CMSG_NXTHDR(&msg, cm);
            }
        }
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&data[..n as usize]);
    }
    Conn {
        peer: cred.pid as u32,
        bytes,
        fds,
    }
}

/// A reap as reported: (reaper, child, status).
type Reap = (u32, u32, ExitStatus);

/// What the stand-in received: the reports that came alone on connections of their own (checked to carry only
/// that one frame, and the pid the kernel gave the connection), and those that came through rings (checked to
/// carry the pid of the ring's hello).
fn reports(conns: &[Conn]) -> (Vec<Reap>, Vec<Reap>) {
    let (mut alone, mut ringed) = (Vec::new(), Vec::new());
    for c in conns {
        let frames: Vec<(u8, &[u8])> = codec::frames(&c.bytes).collect();
        let Some(&(first, payload)) = frames.first() else {
            continue;
        };
        match codec::decode_record(first, payload).unwrap() {
            Some(Record::Reaped {
                pid, child, status, ..
            }) => {
                assert_eq!(first, kind::REAPED);
                assert_eq!(frames.len(), 1, "a report connection carries one frame");
                let whole: usize = frames.iter().map(|(_, p)| p.len() + 5).sum();
                assert_eq!(whole, c.bytes.len(), "nothing but whole frames");
                assert_eq!(pid, c.peer, "the reaper's word matches the kernel's");
                assert!(c.fds.is_empty());
                alone.push((pid, child, status));
            }
            Some(Record::Hello(h)) => {
                assert_eq!(h.pid, c.peer);
                let fd = *c.fds.first().expect("the ring came with the hello");
                for r in ring_records(fd) {
                    if let Record::Reaped {
                        pid, child, status, ..
                    } = r
                    {
                        assert_eq!(pid, h.pid, "a ring's reports are its process's");
                        ringed.push((pid, child, status));
                    }
                }
            }
            other => panic!("a connection began with {other:?}"),
        }
        for fd in &c.fds {
            // SAFETY: each descriptor came to this test by SCM_RIGHTS and is closed once, here.
            unsafe { libc::close(*fd) };
        }
    }
    alone.sort_by_key(|r| (r.0, r.1));
    ringed.sort_by_key(|r| (r.0, r.1));
    (alone, ringed)
}

/// The reaps the program says it made (`reaped <pid> exit|signal <n>`, `grandchild <pid> of <reaper> exit <n>`).
fn said(pid: u32, stdout: &str) -> Vec<Reap> {
    let status = |how: &str, n: &str| {
        let n: i32 = n.parse().unwrap();
        match how {
            "exit" => ExitStatus::Code(n),
            "signal" => ExitStatus::Signal {
                signal: n,
                core: false,
            },
            _ => panic!("{how}"),
        }
    };
    let mut out: Vec<Reap> = stdout
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["reaped", child, how, n] => Some((pid, child.parse().unwrap(), status(how, n))),
                ["grandchild", child, "of", reaper, how, n] => Some((
                    reaper.parse().unwrap(),
                    child.parse().unwrap(),
                    status(how, n),
                )),
                _ => None,
            }
        })
        .collect();
    out.sort_by_key(|r| (r.0, r.1));
    out
}

fn reaper() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../programs/c/reaper.c");
            let out = scratch_dir().join("reaper");
            compile_c(&src, &out, &["-O1", "-Wall", "-Werror"], &["-ldl"]);
            out
        })
        .clone()
}

/// Runs `program args` preloaded, with `VRAMTRACE_SOCKET` at `socket` (or unset): its pid and result.
fn run(fc: &FakeCuda, socket: Option<&Path>, program: &Path, args: &[&str]) -> (u32, RunResult) {
    let mut c = fc.command(program);
    c.args(args)
        .env("LD_PRELOAD", shim())
        .env_remove("VRAMTRACE_SOCKET");
    if let Some(s) = socket {
        c.env("VRAMTRACE_SOCKET", s);
    }
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the program");
    let pid = child.id();
    (
        pid,
        wait_with_timeout(child, Duration::from_secs(60), "reaper"),
    )
}

#[test]
fn a_process_that_never_touched_cuda_reports_each_child_it_reaped_on_its_own_connection() {
    let fc = FakeCuda::new();
    let stand = Stand::listen(fc.dir());
    let (pid, r) = run(&fc, Some(&stand.path), &reaper(), &[]);
    r.assert_success("reaper");
    assert!(r.stdout.contains("PASS"), "{}", r.stdout);
    assert!(r.stdout.contains(&format!("echild {}", libc::ECHILD)));
    let conns = stand.finish();
    let (alone, ringed) = reports(&conns);
    let want = said(pid, &r.stdout);
    // exit(3) by waitpid, SIGKILL by wait4 (null status), exit(0) by waitid, SIGTERM by wait, exit(7) in the
    // SIGCHLD handler, exit(5) by wait3: exactly those, each once (nothing for the peek, the stop, the continue,
    // the WNOHANG poll).
    assert_eq!(want.len(), 6, "{}", r.stdout);
    let codes: Vec<ExitStatus> = want.iter().map(|w| w.2).collect();
    for s in [
        ExitStatus::Code(3),
        ExitStatus::Signal {
            signal: 9,
            core: false,
        },
        ExitStatus::Code(0),
        ExitStatus::Signal {
            signal: 15,
            core: false,
        },
        ExitStatus::Code(7),
        ExitStatus::Code(5),
    ] {
        assert!(codes.contains(&s), "{s:?} in {codes:?}");
    }
    assert_eq!(alone, want, "{}", r.stdout);
    assert!(ringed.is_empty(), "no ring without a tracked call");
    assert_eq!(r.stderr, "", "the shim is silent");
}

#[test]
fn a_connected_process_reports_in_its_ring_and_its_forked_child_on_its_own() {
    let fc = FakeCuda::new();
    let stand = Stand::listen(fc.dir());
    let (pid, r) = run(&fc, Some(&stand.path), &reaper(), &["cuda"]);
    r.assert_success("reaper cuda");
    assert!(r.stdout.contains("PASS"), "{}", r.stdout);
    let conns = stand.finish();
    let (alone, ringed) = reports(&conns);
    let want = said(pid, &r.stdout);
    // The parent's six reaps (the five above and the child that reaped a grandchild) in its ring; the
    // grandchild's, by the forked child, which never made a ring of its own, alone: never in its parent's ring.
    let (mine, theirs): (Vec<Reap>, Vec<Reap>) = want.iter().partition(|w| w.0 == pid);
    assert_eq!(mine.len(), 7, "{}", r.stdout);
    assert_eq!(theirs.len(), 1, "{}", r.stdout);
    assert_eq!(theirs[0].2, ExitStatus::Code(4));
    assert_eq!(ringed, mine);
    assert_eq!(alone, theirs);
    assert_eq!(r.stderr, "", "the shim is silent");
}

#[test]
fn without_a_collector_the_program_sees_nothing_different() {
    let fc = FakeCuda::new();
    // Not under vramtrace, and a collector that is not there (every report's connect fails: errno is kept).
    for socket in [None, Some(fc.dir().join("nobody.sock"))] {
        let (_, r) = run(&fc, socket.as_deref(), &reaper(), &[]);
        r.assert_success("reaper without a collector");
        assert!(r.stdout.contains("PASS"), "{}", r.stdout);
        assert_eq!(r.stderr, "", "the shim is silent");
    }
}

#[test]
fn python_os_waitpid_of_a_sigkilled_subprocess_is_reported() {
    // The interpreter itself (`python3` may be a wrapper script, pyenv's: its own reaps would be reported too).
    let python = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| !p.is_empty());
    let Some(python) = python else {
        eprintln!("no python3: skipped");
        return;
    };
    let fc = FakeCuda::new();
    let stand = Stand::listen(fc.dir());
    let script = "import os, signal, subprocess\n\
                  p = subprocess.Popen(['sleep', '60'])\n\
                  os.kill(p.pid, signal.SIGKILL)\n\
                  pid, st = os.waitpid(p.pid, 0)\n\
                  assert pid == p.pid and os.WIFSIGNALED(st) and os.WTERMSIG(st) == 9, st\n\
                  print(pid, flush=True)\n";
    let (pid, r) = run(&fc, Some(&stand.path), Path::new(&python), &["-c", script]);
    r.assert_success("python3");
    let child: u32 = r.stdout.trim().parse().unwrap();
    let (alone, ringed) = reports(&stand.finish());
    assert!(ringed.is_empty());
    let about: Vec<&Reap> = alone.iter().filter(|a| a.1 == child).collect();
    assert_eq!(
        about,
        vec![&(
            pid,
            child,
            ExitStatus::Signal {
                signal: 9,
                core: false
            }
        )],
        "{alone:?}"
    );
}
