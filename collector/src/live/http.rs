//! A small HTTP/1.1 server: `GET /metrics` answers the OpenMetrics text, anything else 404 (405 for other
//! methods). Only what Prometheus scrapes: a TCP port is open to every local user (loopback too), so the
//! job's command lines and pids are not served here (`top` reads them from the owner's private status file). One
//! request per connection (`Connection: close`). Each connection is answered on a thread of its
//! own (at most [`MAX_CLIENTS`] at once) within one deadline for the whole exchange ([`DEADLINE`]): a client
//! that sends a byte now and then, or never reads, can neither hold a scrape up nor keep `run` from ending
//! (connection threads are never waited for). When every place is taken, the connection that has waited
//! longest without sending its whole request is closed for the newcomer: a flood of idle connections, opened
//! again as fast as they are closed, cannot keep a scraper out (a scraper sends its request at once, and one
//! that has sent it is never closed for another). Requests and answers are parsed by `httparse`
//! (hyper's parser). The server crates on offer (tiny_http and its kin) give neither a deadline for a whole
//! exchange nor a bound on threads: a slow or flooding client would hold threads without end.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What a scrape's `Content-Type` says when the scraper accepts OpenMetrics (Prometheus does).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// ... and otherwise (curl, a browser, `promtool check metrics`): Prometheus's classic text format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The longest one exchange (request read, answer written) may take.
pub const DEADLINE: Duration = Duration::from_secs(3);
/// Connections answered at once; past it, the longest waiting one that has sent no whole request gives way (a
/// new one is closed unanswered only when all have sent theirs). Enough that a flood must open this many
/// connections in the millisecond a scraper takes to send its request to push the scraper out; an idle one
/// costs a thread's committed stack (a few KiB) until the request deadline.
pub const MAX_CLIENTS: usize = 256;
/// The longest a connection may take to send its whole request.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(1);

/// A connection being answered.
struct Place {
    id: u64,
    since: Instant,
    /// A second handle on its socket, to close it under its thread.
    stream: TcpStream,
    /// Its whole request has come: it is never closed for another.
    asked: Arc<AtomicBool>,
}

/// The connections being answered.
#[derive(Default)]
struct Places {
    list: Mutex<Vec<Place>>,
}

impl Places {
    /// A place for a new connection: free, or made by closing the longest waiting one that has not asked.
    /// `None`: every place is answering a whole request.
    fn take(&self, id: u64, s: &TcpStream) -> Option<Arc<AtomicBool>> {
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() >= MAX_CLIENTS {
            let idle = l
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.asked.load(Ordering::Acquire))
                .min_by_key(|(_, p)| p.since)
                .map(|(i, _)| i)?;
            let p = l.swap_remove(idle);
            // Its thread's read ends at once and gives the thread back.
            let _ = p.stream.shutdown(std::net::Shutdown::Both);
        }
        let asked = Arc::new(AtomicBool::new(false));
        l.push(Place {
            id,
            since: Instant::now(),
            stream: s.try_clone().ok()?,
            asked: asked.clone(),
        });
        Some(asked)
    }

    fn give_back(&self, id: u64) {
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        l.retain(|p| p.id != id);
    }
}

/// A running server; stops when dropped.
pub struct Server {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the server answers `GET /metrics` with: the OpenMetrics text as it is now (the job's `Live`).
pub trait Metrics: Send + Sync + 'static {
    fn render(&self) -> String;
}

/// Binds `addr` and serves `live` on a thread of its own.
pub fn serve<M: Metrics>(addr: SocketAddr, live: Arc<M>) -> io::Result<Server> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = thread::Builder::new()
        .name("vramtrace-metrics".into())
        .spawn(move || {
            let places = Arc::new(Places::default());
            for (id, conn) in (0u64..).zip(listener.incoming()) {
                if stop2.load(Ordering::Acquire) {
                    return;
                }
                let Ok(s) = conn else { continue };
                let Some(asked) = places.take(id, &s) else {
                    continue;
                };
                let (live, places2) = (live.clone(), places.clone());
                let spawned = thread::Builder::new()
                    .name("vramtrace-scrape".into())
                    .spawn(move || {
                        let _ = answer(s, &*live, &asked);
                        places2.give_back(id);
                    });
                if spawned.is_err() {
                    places.give_back(id);
                }
            }
        })?;
    Ok(Server {
        addr,
        stop,
        thread: Some(thread),
    })
}

/// What is left of `deadline`, as a socket timeout; an error once it has passed.
fn left(deadline: Instant) -> io::Result<Option<Duration>> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "past the exchange's deadline",
        ));
    }
    Ok(Some(d))
}

fn answer(mut s: TcpStream, live: &impl Metrics, asked: &AtomicBool) -> io::Result<()> {
    let start = Instant::now();
    let deadline = start + DEADLINE;
    let _ = s.set_nodelay(true);
    // The request line and headers, up to the blank line (at most 16 KiB), all within the deadline: a timeout
    // per read alone would let a byte every second hold the connection for ever. Parsed by httparse.
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    let head = loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Request::new(&mut headers);
        match r.parse(&req) {
            Ok(httparse::Status::Complete(_)) => {
                let openmetrics = r.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("accept")
                        && String::from_utf8_lossy(h.value).contains("application/openmetrics-text")
                });
                break Some((
                    r.method.unwrap_or("").to_string(),
                    r.path.unwrap_or("").to_string(),
                    openmetrics,
                ));
            }
            Ok(httparse::Status::Partial) => {}
            // Not HTTP (or more headers than we read): answered as a bad request.
            Err(_) => break None,
        }
        if req.len() > 16 << 10 {
            return reply(
                &mut s,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"",
                deadline,
            );
        }
        s.set_read_timeout(left(start + REQUEST_DEADLINE)?)?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            break None;
        }
        req.extend_from_slice(&buf[..n]);
    };
    asked.store(true, Ordering::Release);
    let Some((method, target, openmetrics)) = head else {
        return reply(
            &mut s,
            "400 Bad Request",
            "text/plain; charset=utf-8",
            b"GET /metrics\n",
            deadline,
        );
    };
    let method = method.as_str();
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let mut body = live.render();
            let ctype = if openmetrics {
                CONTENT_TYPE
            } else {
                body = classic_text(&body);
                CONTENT_TYPE_TEXT
            };
            let body = if method == "HEAD" { "" } else { body.as_str() };
            reply(&mut s, "200 OK", ctype, body.as_bytes(), deadline)
        }
        ("GET" | "HEAD", _) => reply(
            &mut s,
            "404 Not Found",
            "text/plain; charset=utf-8",
            b"vramtrace serves /metrics\n",
            deadline,
        ),
        _ => reply(
            &mut s,
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            b"GET /metrics\n",
            deadline,
        ),
    }
}

/// OpenMetrics text as Prometheus's classic text format (0.0.4): a counter's `# HELP`/`# TYPE` name its
/// `_total` series, and there is no `# UNIT` or `# EOF`.
pub fn classic_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for l in om.lines() {
        if l.starts_with("# UNIT ") || l == "# EOF" {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .iter()
            .find_map(|p| l.strip_prefix(p).map(|rest| (p, rest)));
        if let Some((p, rest)) = meta {
            let name = rest.split(' ').next().unwrap_or("");
            if counters.contains(name) {
                out.push_str(p);
                out.push_str(name);
                out.push_str("_total");
                out.push_str(&rest[name.len()..]);
                out.push('\n');
                continue;
            }
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// Writes the answer in pieces, each within what is left of `deadline`: a client that reads slowly or not at
/// all is dropped at the deadline.
fn reply(
    s: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    for part in [head.as_bytes(), body] {
        for chunk in part.chunks(16 << 10) {
            s.set_write_timeout(left(deadline)?)?;
            s.write_all(chunk)?;
        }
    }
    s.flush()
}

/// `GET http://addr/path`: status code and body (for `vramtrace top` and tests). std only.
pub fn get(addr: &str, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
    get_with(addr, path, None, timeout).map(|(c, _, b)| (c, b))
}

/// [`get`] with an `Accept` header; also returns the answer's `Content-Type`.
pub fn get_with(
    addr: &str,
    path: &str,
    accept: Option<&str>,
    timeout: Duration,
) -> io::Result<(u16, String, String)> {
    use std::net::ToSocketAddrs;
    let sa = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address"))?;
    let mut s = TcpStream::connect_timeout(&sa, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{}Connection: close\r\n\r\n",
        accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"))
    )?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "not an HTTP answer");
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(at) = r.parse(&resp).map_err(|_| bad())? else {
        return Err(bad());
    };
    let code = r.code.ok_or_else(bad)?;
    let ctype = r
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-type"))
        .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
        .unwrap_or_default();
    let body = String::from_utf8_lossy(&resp[at..]).into_owned();
    Ok((code, ctype, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figures as a job's would read: the server's part is only to serve them.
    struct Fixed;

    impl Metrics for Fixed {
        fn render(&self) -> String {
            "# TYPE vramtrace_processes gauge\nvramtrace_processes 0\n# EOF\n".to_string()
        }
    }

    fn live() -> Arc<Fixed> {
        Arc::new(Fixed)
    }

    /// Issue 25: a client that sends a byte every half second (a slow-loris), and one that never reads, hold
    /// neither a real scrape nor the server's end.
    #[test]
    fn slow_clients_hold_neither_a_scrape_nor_the_end() {
        let server = serve("127.0.0.1:0".parse().unwrap(), live()).unwrap();
        let addr = server.addr;
        let loris = thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            for _ in 0..12 {
                if s.write_all(b"G").is_err() {
                    return true;
                }
                thread::sleep(Duration::from_millis(500));
            }
            // Dropped by the deadline: the server closed it.
            let mut b = [0u8; 64];
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            matches!(s.read(&mut b), Ok(0) | Err(_))
        });
        // A dozen silent connections beside it.
        let silent: Vec<TcpStream> = (0..12).map(|_| TcpStream::connect(addr).unwrap()).collect();
        thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let (code, body) = get(&addr.to_string(), "/metrics", Duration::from_secs(2)).unwrap();
        assert_eq!(code, 200);
        assert!(body.contains("vramtrace_processes"), "{body}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        // The end: not held by any of them.
        let t = Instant::now();
        drop(server);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert!(loris.join().unwrap());
        drop(silent);
    }

    /// What is not HTTP, or is malformed on purpose, gets a 400 and nothing else; a well-formed request for
    /// `/metrics` still gets its answer.
    #[test]
    fn malformed_requests_get_a_bad_request() {
        let server = serve("127.0.0.1:0".parse().unwrap(), live()).unwrap();
        let ask = |raw: &[u8]| {
            let mut s = TcpStream::connect(server.addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
            s.write_all(raw).unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        };
        for raw in [
            &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"[..],
            b"GET /metrics HTTP/1.1\r\nHo st: x\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            b"GET\x00/metrics HTTP/1.1\r\n\r\n",
        ] {
            let answer = ask(raw);
            assert!(answer.starts_with("HTTP/1.1 400 "), "{raw:?}: {answer}");
            assert!(!answer.contains("vramtrace_processes"));
        }
        let ok = ask(
            b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text\r\n\r\n",
        );
        assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
        assert!(ok.contains(CONTENT_TYPE), "{ok}");
    }

    /// Issue 25: more idle connections than there are places, opened again as they are closed, keep no scrape
    /// out (with 16 places and no eviction, a dozen idle connections kept every scrape out).
    #[test]
    fn a_flood_of_idle_connections_keeps_no_scrape_out() {
        let server = serve("127.0.0.1:0".parse().unwrap(), live()).unwrap();
        let addr = server.addr;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        // The flood: more idle connections than there are places, and each one closed is opened again.
        let flood = thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            while !stop2.load(Ordering::Acquire) {
                held.retain(|s| {
                    let mut b = [0u8; 1];
                    s.set_nonblocking(true).ok();
                    !matches!((&*s).read(&mut b), Ok(0))
                });
                while held.len() < MAX_CLIENTS + 50 {
                    match TcpStream::connect(addr) {
                        Ok(s) => held.push(s),
                        Err(_) => break,
                    }
                }
                thread::sleep(Duration::from_millis(5));
            }
        });
        thread::sleep(Duration::from_millis(300));
        for _ in 0..5 {
            let t = Instant::now();
            let (code, body) = get(&addr.to_string(), "/metrics", Duration::from_secs(2)).unwrap();
            assert_eq!(code, 200);
            assert!(body.contains("vramtrace_processes"));
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
            thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Release);
        flood.join().unwrap();
    }
}
