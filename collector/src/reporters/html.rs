//! `--format html`: one self-contained page for a person to open (docs/EXPORTS.md): per device an
//! interactive timeline (uPlot, embedded: no network at all) of the job's bytes in use, stacked by process or
//! by call site, with the cap and the device's memory as lines and each out-of-memory error marked, its
//! post-mortem (`vramtrace oom`'s text) beside it; then the top call sites, what was live at the end, and the
//! processes.
//!
//! The timelines ride the replay's tap like the other exports (so they cannot disagree with `report`) and are
//! downsampled as they are built, keeping every bucket's maximum ([`stacked`]): the page's highest point is the
//! report's peak, per device and per process. Everything the page shows is one JSON object in a
//! `<script type="application/json">` (its `<` escaped), drawn by `assets/html/report.js`; the page's
//! Content-Security-Policy forbids every load from anywhere.

mod data;
pub mod stacked;
mod tap;
mod whatif;

use std::io::{self, Write};

pub use data::{DATA_VERSION, MAX_PROCESS_SERIES, MAX_SITE_SERIES};
pub use tap::{Html, MAX_OOM_MARKERS, MAX_SITE_KEYS};

use crate::model::Analysis;
use crate::reporters::json::print;
use crate::reporters::text::short_command;

const UPLOT_JS: &str = include_str!("../../assets/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/uplot/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../../assets/uplot/LICENSE");
/// uPlot's banner names its home page; the page names no address at all.
const UPLOT_BANNER_URL: &str = "https://github.com/leeoniya/uPlot";
const REPORT_JS: &str = include_str!("../../assets/html/report.js");
const REPORT_CSS: &str = include_str!("../../assets/html/report.css");

impl Html {
    /// Writes the page: the analysis `a` is the replay's that fed this tap.
    pub fn write<W: Write>(&mut self, a: &Analysis, w: W) -> io::Result<W> {
        let json = self.section(a, None);
        write_page(w, &short_command(&a.header.command), &[json])
    }

    /// This trace's part of a page, as the JSON the page's script draws: `host` names it among several traces
    /// of one job (its hostname, and where its clock starts on the job's).
    pub fn section(&mut self, a: &Analysis, host: Option<(&str, u64)>) -> String {
        for d in &mut self.devs {
            d.s.finish(a.end_ns);
        }
        self.devs.sort_by_key(|d| d.device.unwrap_or(u32::MAX));
        self.dev_ids = self
            .devs
            .iter()
            .enumerate()
            .map(|(i, d)| (d.device, i))
            .collect();
        self.last_dev = None;
        let json = print::compact(&self.data(a, host));
        // `<` only occurs inside strings: escaped, no `</script>` or `<!--` can end the data early.
        json.replace('<', "\\u003c")
    }
}

/// The page around its sections' data (one per trace, the first with the id the tests and tools look for).
pub fn write_page<W: Write>(mut w: W, command: &str, sections: &[String]) -> io::Result<W> {
    let title = format!("vramtrace: {command}");
    write!(
        w,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"vramtrace {}\">\n<title>{}</title>\n\
         <!-- The charts are drawn by uPlot 1.6.32, embedded below under its license:\n{}\n-->\n\
         <style>{}</style>\n<style>{}</style>\n</head>\n<body>\n\
         <noscript>This report is drawn by JavaScript (embedded in this file: it loads nothing).</noscript>\n\
         <main id=\"app\"></main>\n",
        env!("CARGO_PKG_VERSION"),
        html_escape(&title),
        UPLOT_LICENSE.trim_end(),
        UPLOT_CSS,
        REPORT_CSS,
    )?;
    for (i, json) in sections.iter().enumerate() {
        let which = if i == 0 {
            "id=\"vramtrace-data\""
        } else {
            "class=\"vramtrace-data\""
        };
        write!(w, "<script type=\"application/json\" {which}>")?;
        w.write_all(json.as_bytes())?;
        w.write_all(b"</script>\n")?;
    }
    write!(
        w,
        "<script>{}</script>\n<script>{}</script>\n</body>\n</html>\n",
        uplot_js(),
        REPORT_JS
    )?;
    Ok(w)
}

/// uPlot as shipped, its banner without its address.
fn uplot_js() -> String {
    UPLOT_JS.replacen(UPLOT_BANNER_URL, "github.com/leeoniya/uPlot", 1)
}

fn html_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_library_names_no_address_once_its_banner_is_rewritten() {
        assert_eq!(UPLOT_JS.matches("://").count(), 1, "a new address in uPlot");
        assert!(UPLOT_JS.starts_with(&format!("/*! {UPLOT_BANNER_URL} (v1.6.32) */")));
        let js = uplot_js();
        assert!(!js.contains("http://") && !js.contains("https://"));
        for s in [UPLOT_CSS, REPORT_JS, REPORT_CSS, UPLOT_LICENSE] {
            assert!(!s.contains("http://") && !s.contains("https://"));
        }
        // The license sits in an HTML comment: nothing in it may end one.
        assert!(!UPLOT_LICENSE.contains("--"));
        // Nothing in the scripts ends their <script> element early.
        assert!(!js.contains("</script") && !REPORT_JS.contains("</script"));
    }

    #[test]
    fn compact_json_escapes_what_could_end_the_script() {
        #[derive(serde::Serialize)]
        struct D {
            a: (u64, Option<u64>, bool),
            b: &'static str,
        }
        let s = print::compact(&D {
            a: (1, None, true),
            b: "x</script><!-- \"q\"\n",
        });
        assert_eq!(
            s,
            "{\"a\":[1,null,true],\"b\":\"x</script><!-- \\\"q\\\"\\n\"}"
        );
        assert!(!s.replace('<', "\\u003c").contains('<'));
    }
}
