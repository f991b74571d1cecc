//! Outputs never destroy inputs (issue 20, class 6): before a command writes, every file it is
//! about to write is compared with every file it read and with its other outputs, and a clash
//! is a usage error (exit 2) naming both paths — `plan --cluster mine.yaml -o mine.yaml`,
//! `replay --trace t.json --timeline t.json`, `plan -o p.svg` (the plan and its picture).
//!
//! What "the same file" means: for a file that exists, the same device and inode (so a
//! symlink, a hard link or `./x` and `x` are caught); for one that does not exist yet, the same
//! canonical folder and name. The files read are the ones [`crate::input::open`] opened — every
//! input goes through it, those found implicitly too — plus paths a command names before it
//! reads them. A FIFO or a device (`/dev/null`, `/dev/stdout`) is written through, never
//! replaced, so it may be named twice.
//!
//! The one output that may be an input is `lower-bound --db`: the performance database is read,
//! updated and written back on purpose.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::CliError;

/// What a path is, for comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Id {
    /// An existing file or folder: (device, inode).
    Inode(u64, u64),
    /// A path that does not exist yet: its canonical folder joined with its name.
    Path(PathBuf),
    /// A FIFO, device or socket: written through, may repeat.
    Special,
}

fn id(p: &Path) -> Id {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() || m.is_dir() => Id::Inode(m.dev(), m.ino()),
        Ok(_) => Id::Special,
        Err(_) => {
            let parent = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            match (std::fs::canonicalize(parent), p.file_name()) {
                (Ok(dir), Some(name)) => Id::Path(dir.join(name)),
                _ => Id::Path(p.to_path_buf()),
            }
        }
    }
}

/// One file a command writes: what names it (`-o`, `--timeline`, "the plan's picture") and
/// where.
pub struct Output<'a> {
    pub what: String,
    pub path: &'a Path,
}

impl<'a> Output<'a> {
    pub fn new(what: impl Into<String>, path: &'a Path) -> Self {
        Output {
            what: what.into(),
            path,
        }
    }
}

/// Refuse (exit 2) an output that is a file this command read (through `input::open`, or
/// named in `named_inputs` as (what, path) before it is read) or another of its outputs.
/// `may_replace` lists inputs an output may legitimately rewrite (`lower-bound --db`).
pub fn check(
    outputs: &[Output<'_>],
    named_inputs: &[(&str, &Path)],
    may_replace: &[&Path],
) -> Result<(), CliError> {
    let ids: Vec<Id> = outputs.iter().map(|o| id(o.path)).collect();
    let allowed: Vec<Id> = may_replace.iter().map(|p| id(p)).collect();
    for (i, (o, oid)) in outputs.iter().zip(&ids).enumerate() {
        if *oid == Id::Special {
            continue;
        }
        for (other, other_id) in outputs[..i].iter().zip(&ids) {
            if other_id == oid {
                return Err(CliError::usage(format!(
                    "{} {} and {} {} are the same file: one would overwrite the other; choose different paths",
                    other.what,
                    other.path.display(),
                    o.what,
                    o.path.display()
                )));
            }
        }
        if allowed.contains(oid) {
            continue;
        }
        let Id::Inode(dev, ino) = *oid else { continue };
        let read = crate::input::opened_as(dev, ino)
            .map(|(p, kind)| (format!("the {}", kind.what()), p))
            .or_else(|| {
                named_inputs
                    .iter()
                    .find(|(_, p)| id(p) == *oid)
                    .map(|(w, p)| (w.to_string(), p.to_path_buf()))
            });
        if let Some((what, p)) = read {
            return Err(CliError::usage(format!(
                "{} {} is {what} {} this command reads: writing it would destroy the input; choose another path",
                o.what,
                o.path.display(),
                p.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("trainplan-distinct-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_same_file_under_any_name_is_caught() {
        let d = scratch("names");
        let a = d.join("a.yaml");
        std::fs::write(&a, "x").unwrap();
        std::os::unix::fs::symlink(&a, d.join("link.yaml")).unwrap();
        std::fs::hard_link(&a, d.join("hard.yaml")).unwrap();
        for other in ["link.yaml", "hard.yaml", "./a.yaml", "sub/../a.yaml"] {
            std::fs::create_dir_all(d.join("sub")).unwrap();
            let o = d.join(other);
            let e = check(&[Output::new("-o", &o)], &[("--cluster", &a)], &[]).unwrap_err();
            assert_eq!(e.code, super::super::exit::USAGE);
            assert!(e.message.contains("--cluster"), "{}", e.message);
            assert!(e.message.contains(&*a.to_string_lossy()), "{}", e.message);
        }
        // Two outputs that do not exist yet, named differently.
        let (x, y) = (d.join("new.svg"), d.join("sub/../new.svg"));
        let e = check(
            &[Output::new("-o", &x), Output::new("the plan's picture", &y)],
            &[],
            &[],
        )
        .unwrap_err();
        assert!(e.message.contains("are the same file"), "{}", e.message);
        // Allowed: a database rewritten in place; devices named twice; different files.
        check(&[Output::new("--db", &a)], &[], &[&a]).unwrap();
        let null = Path::new("/dev/null");
        check(
            &[Output::new("-o", null), Output::new("--timeline", null)],
            &[],
            &[],
        )
        .unwrap();
        check(
            &[Output::new("-o", &d.join("b.yaml"))],
            &[("--cluster", &a)],
            &[],
        )
        .unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_opened_as_input_is_caught_without_being_named() {
        let d = scratch("opened");
        let a = d.join("pass.yaml");
        std::fs::write(&a, "name: x\n").unwrap();
        crate::input::read_to_string(&a, crate::input::InputKind::PassFile).unwrap();
        let e = check(&[Output::new("--timeline", &a)], &[], &[]).unwrap_err();
        assert!(e.message.contains("the pass file"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&d);
    }
}
