//! A small HTTP/1.1 server on its own thread: `GET /metrics` answers the OpenMetrics text, anything else 404
//! (405 for other methods). One request per connection (`Connection: close`), handled in turn: a scrape is a
//! few hundred microseconds, and Prometheus scrapes one target at a time. std only.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::Live;

/// What a scrape's `Content-Type` says when the scraper accepts OpenMetrics (Prometheus does).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// ... and otherwise (curl, a browser, `promtool check metrics`): Prometheus's classic text format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

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

/// Binds `addr` and serves `live` on a thread of its own.
pub fn serve(addr: SocketAddr, live: Arc<Live>) -> io::Result<Server> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = thread::Builder::new()
        .name("vramtrace-metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Acquire) {
                    return;
                }
                if let Ok(s) = conn {
                    let _ = answer(s, &live);
                }
            }
        })?;
    Ok(Server {
        addr,
        stop,
        thread: Some(thread),
    })
}

fn answer(mut s: TcpStream, live: &Live) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let _ = s.set_nodelay(true);
    // The request line and headers, up to the blank line (at most 16 KiB).
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && !req.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
        if req.len() > 16 << 10 {
            return reply(
                &mut s,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"",
            );
        }
    }
    let line = req.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head = String::from_utf8_lossy(&req).to_ascii_lowercase();
    let openmetrics = head
        .lines()
        .any(|l| l.starts_with("accept:") && l.contains("application/openmetrics-text"));
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
            reply(&mut s, "200 OK", ctype, body.as_bytes())
        }
        ("GET" | "HEAD", _) => reply(
            &mut s,
            "404 Not Found",
            "text/plain; charset=utf-8",
            b"vramtrace serves /metrics only\n",
        ),
        _ => reply(
            &mut s,
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            b"GET /metrics\n",
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

fn reply(s: &mut TcpStream, status: &str, ctype: &str, body: &[u8]) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
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
    let text = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an HTTP answer"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an HTTP answer"))?;
    let ctype = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    Ok((code, ctype, body.to_string()))
}
