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

/// Longest error message printed, characters (the rest is cut, with a count): room for the
/// zoo's whole list of model names after an unknown one, and far below what a corrupt input
/// could otherwise echo.
pub const MAX_MESSAGE: usize = 1000;

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

// How numbers are written for people lives below the CLI, in `crate::units` (the library's
// reports use it too); re-exported here for the commands.
pub use crate::units::{dur, dur_ms, dur_ms_signed, gb, ms, thousands};

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(m.ends_with(" … (149,000 more characters)"), "{m}");
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
