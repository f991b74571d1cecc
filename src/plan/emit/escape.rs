//! The one escaping function per emitted language. Every string that comes from a plan, a trace
//! or a config (model, cluster, tensor, layer and operator names, knob values) reaches an
//! exported file only through one of these:
//!
//! | target | function | what it guarantees |
//! |---|---|---|
//! | Python code | [`py_str`] | a `"…"` literal, ASCII only, that evaluates to exactly the string |
//! | `#` comments (Python, env, text files) | [`comment_text`] | one line of printable ASCII: no newline, `\r`, NUL or other control character can end the comment |
//! | env files (`set -a; . ./FILE.env`) | [`env_line`] / [`env_value`] | one `KEY=value` line; the value a POSIX-shell word that expands to exactly the string, nothing executed; control characters refused |
//! | one-record-per-line text (`byteps_partitions.txt`, `xla_clusters.txt`) | [`record_field`] | one whitespace-free field; [`parse_record_field`] is its inverse |
//! | TOML values (`torchtitan.toml`) | [`toml_str`] | a basic `"…"` string, ASCII only, that a TOML reader decodes to exactly the string |
//! | JSON files (`ds_config.json`) | [`json_text`] | serde_json's serialisation (quotes, backslashes and control characters escaped by construction), every non-ASCII character then written as `\uXXXX` |
//!
//! Never into a docstring: a docstring is a string literal whose delimiters a name could close,
//! so emitted docstrings are fixed text. Never into the first two lines of a Python file: a
//! comment there can declare the source encoding (PEP 263: `# coding: utf-7` would turn escaped
//! ASCII back into newlines), so every module starts with fixed text.
//!
//! **Invariant:** the output of [`py_str`], [`comment_text`], [`record_field`], [`toml_str`] and [`json_text`] is printable
//! ASCII (0x20–0x7e) — no control character, no non-ASCII line separator (U+0085, U+2028,
//! U+2029), nothing a terminal, a tokenizer or a line-based reader could take for a line break.
//! [`env_value`] refuses control characters instead (a shell word cannot escape them portably)
//! and otherwise keeps the text as it is, single-quoted.

use super::EmitError;

/// `c` as a backslash escape in Python's (and C's) notation: `\n`, `\r`, `\t`, `\\`, `\xNN`,
/// `\uNNNN`, `\UNNNNNNNN`; None when `c` is printable ASCII other than the backslash.
fn escaped(c: char) -> Option<String> {
    Some(match c {
        '\\' => "\\\\".into(),
        '\n' => "\\n".into(),
        '\r' => "\\r".into(),
        '\t' => "\\t".into(),
        ' '..='~' => return None,
        c if (c as u32) < 0x100 => format!("\\x{:02x}", c as u32),
        c if (c as u32) < 0x10000 => format!("\\u{:04x}", c as u32),
        c => format!("\\U{:08x}", c as u32),
    })
}

/// A Python string literal (double-quoted, ASCII only) that evaluates to exactly `s`: quotes,
/// backslashes, control characters (NUL included) and every non-ASCII character are escaped.
pub fn py_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match (c, escaped(c)) {
            ('"', _) => out.push_str("\\\""),
            (_, Some(e)) => out.push_str(&e),
            (c, None) => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A TOML basic string (double-quoted, ASCII only) that decodes to exactly `s`: `"` and `\`
/// escaped, `\n` `\r` `\t` in their short forms, every other control character and every
/// non-ASCII character as `\uXXXX` / `\UXXXXXXXX` (TOML has no `\xNN`). Written by hand rather
/// than with the `toml` crate's writer, which keeps non-ASCII text raw (U+2028, U+0085
/// included) and turns a newline into a multi-line string: valid TOML, but not one printable
/// line.
pub fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push_str(&format!("\\U{:08X}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Text to put after `#` on one comment line: backslashes, control characters and non-ASCII are
/// escaped as in [`py_str`] (quotes are harmless in a comment and kept), so the comment ends at
/// the emitter's newline and nowhere else. For humans reading the file; nothing parses it.
pub fn comment_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match escaped(c) {
            Some(e) => out.push_str(&e),
            None => out.push(c),
        }
    }
    out
}

/// One field of a whitespace-separated, one-record-per-line text file: a backslash, whitespace,
/// a control character, a non-ASCII character, and a `#` at the start (a comment line) are
/// written as escapes (`\\`, `\x20`, `\n`, `\x23`, `\xe9` …), and the empty string, which
/// would vanish between two separators, as `\e`. Everything else is kept, so ordinary names
/// (`layer1.0.conv1.weight`) read as they are. [`parse_record_field`] reads a field back.
pub fn record_field(s: &str) -> String {
    if s.is_empty() {
        return "\\e".into();
    }
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        match (c, escaped(c)) {
            (' ', _) => out.push_str("\\x20"),
            ('#', _) if i == 0 => out.push_str("\\x23"),
            (_, Some(e)) => out.push_str(&e),
            (c, None) => out.push(c),
        }
    }
    out
}

/// The inverse of [`record_field`]: None when `field` is not something it writes.
pub fn parse_record_field(field: &str) -> Option<String> {
    if field == "\\e" {
        return Some(String::new());
    }
    let mut out = String::with_capacity(field.len());
    let mut it = field.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            if !(' '..='~').contains(&c) || c == ' ' {
                return None;
            }
            out.push(c);
            continue;
        }
        let hex = |it: &mut std::str::Chars, n: usize| -> Option<char> {
            let h: String = it.by_ref().take(n).collect();
            if h.len() != n {
                return None;
            }
            char::from_u32(u32::from_str_radix(&h, 16).ok()?)
        };
        let d = match it.next()? {
            '\\' => '\\',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'x' => hex(&mut it, 2)?,
            'u' => hex(&mut it, 4)?,
            'U' => hex(&mut it, 8)?,
            _ => return None,
        };
        out.push(d);
    }
    Some(out)
}

/// The characters a shell word may hold unquoted in an env file (and that every `KEY=value`
/// reader takes literally).
fn shell_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-.,/:=+@%".contains(c)
}

/// `value` as one POSIX-shell word that expands to exactly `value` when the env file is sourced
/// (`set -a; . ./FILE.env`): kept bare when it is made of `[A-Za-z0-9_.,/:=+@%-]` only, else
/// single-quoted (`'` inside written as `'\''`), so `$`, backquotes, `;`, spaces and quotes are
/// plain text. A control character (newline, `\r`, NUL, ESC …) is refused: no portable shell
/// quoting keeps it on one line, and line-based env readers would split it.
pub fn env_value(value: &str) -> Result<String, EmitError> {
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(EmitError::Unsafe(format!(
            "an env value holds the control character U+{:04X}: {}",
            c as u32,
            py_str(&value.chars().take(80).collect::<String>())
        )));
    }
    if !value.is_empty() && value.chars().all(shell_safe) {
        return Ok(value.to_string());
    }
    Ok(format!("'{}'", value.replace('\'', "'\\''")))
}

/// One env line `KEY=value\n`: `key` must be `[A-Z_][A-Z0-9_]*` (an emitter's constant), the value
/// goes through [`env_value`].
pub fn env_line(key: &str, value: &str) -> Result<String, EmitError> {
    let ok_key = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && key
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if !ok_key {
        return Err(EmitError::Unsafe(format!(
            "{} is not an environment variable name",
            py_str(key)
        )));
    }
    Ok(format!("{key}={}\n", env_value(value)?))
}

/// `value` as pretty-printed JSON (two-space indent, keys in the map's order, a final newline),
/// printable ASCII and newlines only: serde_json escapes quotes, backslashes and C0 control
/// characters; any other character outside printable ASCII (DEL, non-ASCII: they can only
/// stand inside a string) is then written as `\uXXXX`, a UTF-16 surrogate pair above U+FFFF,
/// so U+2028 or an ANSI escape cannot reach the file raw.
pub fn json_text(value: &serde_json::Value) -> String {
    let pretty = serde_json::to_string_pretty(value).expect("a JSON value always serialises");
    let mut out = String::with_capacity(pretty.len() + 1);
    for c in pretty.chars() {
        if c == '\n' || (' '..='~').contains(&c) {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hostile fragments every test here runs through.
    pub(crate) const HOSTILE: [&str; 14] = [
        "plain.name",
        "",
        "\"\"\"\nimport os; os.system('touch PWNED')\n\"\"\"",
        "'''",
        "a\\",
        "\\x41\\n",
        "x\ry = __import__('os').system('touch PWNED')",
        "nul\0byte",
        "$(touch PWNED)`touch PWNED`; touch PWNED",
        "it's \"quoted\"",
        "# -*- coding: utf-7 -*-",
        "\u{1b}[31mred\u{1b}[0m",
        "é\u{2028}line\u{85}sep 😀",
        "tab\there",
    ];

    #[test]
    fn json_text_is_printable_ascii_and_reads_back() {
        let v = serde_json::json!({"k": HOSTILE, "del\u{7f}": 1});
        let t = json_text(&v);
        assert!(
            t.chars().all(|c| c == '\n' || (' '..='~').contains(&c)),
            "{t}"
        );
        assert!(t.contains("\\u2028") && t.contains("\\ud83d\\ude00") && t.contains("\\u007f"));
        assert_eq!(serde_json::from_str::<serde_json::Value>(&t).unwrap(), v);
        assert!(t.ends_with("}\n"));
    }

    #[test]
    fn py_str_is_printable_ascii_and_escapes_what_python_needs() {
        assert_eq!(py_str("abc"), "\"abc\"");
        assert_eq!(py_str("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(py_str("x\ny\r\0"), "\"x\\ny\\r\\x00\"");
        assert_eq!(py_str("é😀\u{2028}"), "\"\\xe9\\U0001f600\\u2028\"");
        for h in HOSTILE {
            let p = py_str(h);
            assert!(p.chars().all(|c| (' '..='~').contains(&c)), "{p}");
        }
    }

    #[test]
    fn comments_stay_on_one_printable_line() {
        assert_eq!(comment_text("bert-base \"x\""), "bert-base \"x\"");
        assert_eq!(comment_text("a\nb\rc\\"), "a\\nb\\rc\\\\");
        for h in HOSTILE {
            let c = comment_text(h);
            assert!(c.chars().all(|c| (' '..='~').contains(&c)), "{c}");
        }
    }

    #[test]
    fn record_fields_round_trip_and_hold_no_separator() {
        assert_eq!(
            record_field("layer1.0.conv1.weight"),
            "layer1.0.conv1.weight"
        );
        assert_eq!(record_field("a b"), "a\\x20b");
        assert_eq!(record_field("#x#"), "\\x23x#");
        assert_eq!(record_field(""), "\\e");
        for h in HOSTILE {
            let f = record_field(h);
            assert!(f.chars().all(|c| ('!'..='~').contains(&c)), "{f}");
            assert!(!f.starts_with('#'));
            assert_eq!(parse_record_field(&f).as_deref(), Some(h), "{f}");
        }
        assert_eq!(parse_record_field("a b"), None);
        assert_eq!(parse_record_field("a\\q"), None);
        assert_eq!(parse_record_field("a\\x4"), None);
    }

    #[test]
    fn toml_strings_are_printable_ascii_and_decode_exactly() {
        assert_eq!(toml_str("gpt"), "\"gpt\"");
        assert_eq!(toml_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
        assert_eq!(toml_str("\0é😀"), "\"\\u0000\\u00E9\\U0001F600\"");
        for h in HOSTILE {
            let t = toml_str(h);
            assert!(t.chars().all(|c| (' '..='~').contains(&c)), "{t}");
            // The `toml` crate (a dev-dependency) reads it back to the very string.
            let doc: toml::Table = format!("v = {t}\n")
                .parse()
                .unwrap_or_else(|e| panic!("{t}: {e}"));
            assert_eq!(doc["v"].as_str(), Some(h), "{t}");
        }
    }

    #[test]
    fn env_values_are_shell_words_or_refused() {
        assert_eq!(
            env_value("--tf_xla_auto_jit=2").unwrap(),
            "--tf_xla_auto_jit=2"
        );
        assert_eq!(env_value("a b").unwrap(), "'a b'");
        assert_eq!(env_value("it's").unwrap(), "'it'\\''s'");
        assert_eq!(env_value("$(x)").unwrap(), "'$(x)'");
        assert_eq!(env_value("").unwrap(), "''");
        assert!(env_value("a\nb").is_err());
        assert!(env_value("a\rb").is_err());
        assert!(env_value("a\0b").is_err());
        assert!(env_line("lower", "1").is_err());
        assert!(env_line("A B", "1").is_err());
        assert!(env_line("", "1").is_err());
        assert_eq!(
            env_line("HOROVOD_CYCLE_TIME", "2.5").unwrap(),
            "HOROVOD_CYCLE_TIME=2.5\n"
        );
    }
}
