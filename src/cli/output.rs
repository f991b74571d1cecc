//! Output helpers: what reaches the terminal, and number formatting for the human summaries
//! (safe file writes are in [`super::atomic`]).
//!
//! **Invariant:** nothing a trace, config or plan holds can drive the terminal. stdout and the
//! logs on stderr go through [`Clean`], which writes every control character other than a
//! newline or a tab — ESC (ANSI sequences), `\r`, NUL, DEL, the C1 controls — as `\uXXXX`
//! (which is also the JSON escape, so `--json` output stays valid and means the same); error
//! messages go through [`message`], which does the same and caps them at [`MAX_MESSAGE`]
//! characters.

use std::io::{self, Write};

/// Longest error message printed, characters (the rest is cut, with a count).
pub const MAX_MESSAGE: usize = 400;

/// A writer that escapes control characters (see the module docs); with `line_cap`, lines
/// longer than that many bytes are cut (for logs).
pub struct Clean<W: Write> {
    inner: W,
    /// A lead byte (0xC2) whose continuation has not arrived yet.
    pending: Option<u8>,
    line_cap: Option<usize>,
    line_len: usize,
}

impl<W: Write> Clean<W> {
    pub fn new(inner: W) -> Self {
        Clean {
            inner,
            pending: None,
            line_cap: None,
            line_len: 0,
        }
    }

    /// Lines longer than `cap` bytes are cut, with `…` (logs).
    pub fn with_line_cap(inner: W, cap: usize) -> Self {
        Clean {
            line_cap: Some(cap),
            ..Clean::new(inner)
        }
    }

    fn emit(&mut self, out: &mut Vec<u8>, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                self.line_len = 0;
                out.push(b);
                continue;
            }
            if let Some(cap) = self.line_cap {
                self.line_len += 1;
                if self.line_len > cap {
                    if self.line_len == cap + 1 {
                        out.extend_from_slice("…".as_bytes());
                    }
                    continue;
                }
            }
            out.push(b);
        }
    }
}

impl<W: Write> Write for Clean<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut out = Vec::with_capacity(buf.len() + 8);
        let mut i = 0;
        if let Some(lead) = self.pending.take() {
            match buf.first() {
                Some(&c) if (0x80..=0x9f).contains(&c) => {
                    let s = format!("\\u{:04x}", c);
                    self.emit(&mut out, s.as_bytes());
                    i = 1;
                }
                _ => self.emit(&mut out, &[lead]),
            }
        }
        let mut start = i;
        while i < buf.len() {
            let b = buf[i];
            let c0 = (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f;
            let c1_lead = b == 0xc2;
            if c0 {
                let chunk = buf[start..i].to_vec();
                self.emit(&mut out, &chunk);
                self.emit(&mut out, format!("\\u{:04x}", b).as_bytes());
                i += 1;
                start = i;
            } else if c1_lead {
                match buf.get(i + 1) {
                    Some(&c) if (0x80..=0x9f).contains(&c) => {
                        let chunk = buf[start..i].to_vec();
                        self.emit(&mut out, &chunk);
                        self.emit(&mut out, format!("\\u{:04x}", c).as_bytes());
                        i += 2;
                        start = i;
                    }
                    Some(_) => i += 1,
                    None => {
                        let chunk = buf[start..i].to_vec();
                        self.emit(&mut out, &chunk);
                        self.pending = Some(b);
                        i += 1;
                        start = i;
                    }
                }
            } else {
                i += 1;
            }
        }
        let chunk = buf[start..].to_vec();
        self.emit(&mut out, &chunk);
        self.inner.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Some(lead) = self.pending.take() {
            self.inner.write_all(&[lead])?;
        }
        self.inner.flush()
    }
}

/// stdout, through [`Clean`].
pub fn stdout() -> Clean<io::StdoutLock<'static>> {
    Clean::new(io::stdout().lock())
}

/// An error message as printed: control characters escaped, at most [`MAX_MESSAGE`]
/// characters (a 150 MB message from a corrupt model is cut, with how much was left out).
pub fn message(m: &str) -> String {
    let mut out = String::new();
    let mut n = 0;
    let mut chars = m.chars();
    for c in chars.by_ref() {
        if n >= MAX_MESSAGE {
            break;
        }
        if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
        n += 1;
    }
    let rest = chars.count();
    if rest > 0 {
        out.push_str(&format!(
            " … ({} more characters)",
            thousands(rest as u64 + 1)
        ));
    }
    out
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in GB (10⁹) with one decimal, the unit the papers report.
pub fn gb(bytes: u64) -> String {
    // Below 1 GB, MB: a small job's memory is never "0.0 GB".
    if bytes < 1_000_000_000 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.1} GB", bytes as f64 / 1e9)
    }
}

/// Nanoseconds as milliseconds, unrounded (round only when printing: [`dur`]).
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A duration of `ns` nanoseconds for people: see [`dur_ms`].
pub fn dur(ns: u64, decimals: usize) -> String {
    dur_ms(ms(ns), decimals)
}

/// A duration in milliseconds for people, with its unit — the one formatting of durations in
/// human output (issue 20, class 8): at least 3 significant digits and at least `decimals`
/// decimals (a column's usual precision) in ms from 1 ms up; in µs below 1 ms and in ns below
/// 1 µs, at 3 significant digits — so a 30 µs step is `30.0 µs`, never `0.000 ms`, and a
/// 1.234 ms one `1.23 ms` or, with 3 decimals, `1.234 ms`. Zero is `0 ms`; a non-finite value
/// `n/a`. Round here, never before: differences and ratios are computed from unrounded values.
pub fn dur_ms(v: f64, decimals: usize) -> String {
    dur_fmt(v, decimals, false)
}

/// [`dur_ms`] with a `+` on positive values (changes of time).
pub fn dur_ms_signed(v: f64, decimals: usize) -> String {
    dur_fmt(v, decimals, true)
}

fn dur_fmt(v: f64, decimals: usize, plus: bool) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    let sign = if v < 0.0 && a > 0.0 {
        "-"
    } else if plus && a > 0.0 {
        "+"
    } else {
        ""
    };
    // Decimals for 3 significant digits of x (≥ min).
    let sig = |x: f64, min: usize| -> usize {
        let mag = x.log10().floor() as i64;
        (2 - mag).max(min as i64) as usize
    };
    if a == 0.0 {
        "0 ms".into()
    } else if a >= 1.0 {
        format!("{sign}{a:.*} ms", sig(a, decimals))
    } else if a >= 1e-3 {
        let us = a * 1e3;
        format!("{sign}{us:.*} µs", sig(us, 0))
    } else {
        let ns = a * 1e6;
        format!("{sign}{ns:.*} ns", sig(ns, 0).min(3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_their_digits_and_pick_a_unit() {
        // Issue 20, class 8: 1.234 ms was "1.200 ms", 30 µs "0.000 ms".
        assert_eq!(dur(1_234_000, 3), "1.234 ms");
        assert_eq!(dur(1_234_000, 1), "1.23 ms");
        assert_eq!(dur(30_000, 3), "30.0 µs");
        assert_eq!(dur(97_000, 3), "97.0 µs");
        assert_eq!(dur(123_456, 1), "123 µs");
        assert_eq!(dur(500, 1), "500 ns");
        assert_eq!(dur(5, 1), "5.00 ns");
        assert_eq!(dur(0, 1), "0 ms");
        // A column's own precision is kept where it already shows enough digits.
        assert_eq!(dur(321_900_000, 1), "321.9 ms");
        assert_eq!(dur(30_225_000, 3), "30.225 ms");
        assert_eq!(dur(77_800_000, 1), "77.8 ms");
        assert_eq!(dur(8_296_400, 1), "8.30 ms");
        assert_eq!(dur(12_345_678_900, 0), "12346 ms");
        assert_eq!(dur_ms_signed(-0.085, 2), "-85.0 µs");
        assert_eq!(dur_ms_signed(175.03, 2), "+175.03 ms");
        assert_eq!(dur_ms_signed(0.0, 2), "0 ms");
        assert_eq!(dur_ms(f64::INFINITY, 1), "n/a");
        assert_eq!(dur_ms(f64::NAN, 1), "n/a");
    }

    fn clean(parts: &[&[u8]], cap: Option<usize>) -> String {
        let mut v = Vec::new();
        {
            let mut c = match cap {
                Some(n) => Clean::with_line_cap(&mut v, n),
                None => Clean::new(&mut v),
            };
            for p in parts {
                c.write_all(p).unwrap();
            }
            c.flush().unwrap();
        }
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(
            clean(&[b"a\x1b[31mred\tok\n"], None),
            "a\\u001b[31mred\tok\n"
        );
        assert_eq!(clean(&[b"\r\x00\x7f"], None), "\\u000d\\u0000\\u007f");
        // C1 (U+009B, CSI) split across two writes; other two-byte characters kept.
        assert_eq!(clean(&[b"x\xc2", b"\x9by \xc2\xb5s"], None), "x\\u009by µs");
        // A JSON string with a raw C1 character stays valid JSON with the same value.
        let j = serde_json::to_string("a\u{85}b\u{1b}").unwrap();
        let back: String = serde_json::from_str(&clean(&[j.as_bytes()], None)).unwrap();
        assert_eq!(back, "a\u{85}b\u{1b}");
        assert_eq!(clean(&[b"abcdef\nxy\n"], Some(3)), "abc…\nxy\n");
    }

    #[test]
    fn messages_are_escaped_and_capped() {
        assert_eq!(message("bad \u{1b}[2J name"), "bad \\u001b[2J name");
        let long = "x".repeat(150_000);
        let m = message(&long);
        assert!(m.starts_with(&"x".repeat(MAX_MESSAGE)), "{m}");
        assert!(m.ends_with(" … (149,600 more characters)"), "{m}");
        assert_eq!(message("short"), "short");
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
