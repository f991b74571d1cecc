//! How numbers are written for people: durations with a unit and enough significant digits,
//! byte sizes, thousands separators. The one place human output formats them (the CLI's
//! summaries, the library's reports, the plan's picture and the exported files' comments), so
//! that no layer below the CLI reaches up into it (rust-analyzer's rule: layers depend
//! downward). `--json` output never goes through here: its numbers are unrounded.

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
}
