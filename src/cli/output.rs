//! Output helpers: atomic file writes (nothing the user has is overwritten half-way) and number
//! formatting for the human summaries.

use std::io::{self, Write};
use std::path::Path;

/// Write `path` atomically: the content goes to a temporary file in the same folder, which is
/// renamed over `path` only once it is complete and flushed. On error the temporary file is
/// removed and `path` is untouched.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file path"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        fill(&mut f)?;
        f.flush()?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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

/// Nanoseconds as milliseconds with one decimal.
pub fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e5).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn atomic_write_leaves_the_old_file_on_error() {
        let dir = std::env::temp_dir().join(format!("trainplan-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("out.json");
        std::fs::write(&p, "old").unwrap();
        let err = write_atomic(&p, |w: &mut dyn Write| {
            w.write_all(b"half")?;
            Err(io::Error::other("disk full"))
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "temporary file removed"
        );
        write_atomic(&p, |w: &mut dyn Write| w.write_all(b"new")).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
