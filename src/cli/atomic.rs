//! Safe output: the one way trainplan writes a file (plans, timelines, exported patches, the
//! performance database, GPU profiles).
//!
//! * **Atomic**: the content goes to a temporary file beside the target, is flushed and synced,
//!   and only then renamed over the target. On error the temporary file is removed and the
//!   target is untouched.
//! * **Unpredictable, exclusive temporary names**: `.NAME.tmp-<16 random hex digits>`, created
//!   with `O_CREAT | O_EXCL | O_NOFOLLOW`: a symlink or file planted at the temporary name makes
//!   the create fail (and a fresh name is tried); it is never followed or truncated.
//! * **Permissions kept**: a replaced file's mode (0600 stays 0600) is given to the new one;
//!   a new file gets the usual `0666 & ~umask`.
//! * **Symlinks and special files are written through, never replaced**: a target that is a
//!   symlink is resolved and the file it points to is replaced atomically (the link stays); a
//!   target that is (or points to) a FIFO, a character device or a socket (`/dev/stdout`,
//!   `/dev/null`, a pipe) is opened and written directly; a symlink to nothing is refused, so a
//!   planted dangling link cannot make trainplan create a file elsewhere, and a link someone else
//!   owns in a sticky world-writable folder (`/tmp`) is not followed at all (the kernel's
//!   `protected_symlinks` rule, whatever the sysctl says).
//! * **Several files as one** ([`write_dir_atomic`], `export`): a new folder is filled under a
//!   fresh temporary name beside it and renamed as a whole; into an existing folder (`-o .`
//!   included: it keeps its identity and the user's other files) every file is first written to
//!   its temporary name, then each is renamed over its target; a disk-full export leaves the
//!   old files as they were.
//! * **Ctrl-C**: every temporary file or folder is registered while it exists; the interrupt
//!   handler ([`install_interrupt_handler`]) removes them before exiting 130. A command that
//!   stops on its own at Ctrl-C (`plan` writes its best plan so far) registers its flag with
//!   [`interrupt_flag`]; a second Ctrl-C still exits at once, cleaning up.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Temporary files and folders that exist right now (removed on Ctrl-C).
static TEMPS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// The flag of a command that stops on its own at Ctrl-C (None: exit at once).
static GRACEFUL: Mutex<Option<&'static AtomicBool>> = Mutex::new(None);

/// Install the process's Ctrl-C handler (once, from `cli::main`): remove every temporary file
/// and exit 130, or, while a command has registered [`interrupt_flag`], set that flag the first
/// time.
pub fn install_interrupt_handler() {
    let _ = ctrlc::set_handler(|| {
        let flag = GRACEFUL.lock().ok().and_then(|g| *g);
        if let Some(f) = flag
            && !f.swap(true, Ordering::SeqCst)
        {
            return;
        }
        remove_temps();
        let _ = writeln!(io::stderr(), "interrupted");
        std::process::exit(i32::from(super::exit::INTERRUPTED));
    });
}

/// Ctrl-C sets `flag` (the command stops on its own) instead of exiting; a second one exits.
pub fn interrupt_flag(flag: &'static AtomicBool) {
    if let Ok(mut g) = GRACEFUL.lock() {
        *g = Some(flag);
    }
}

fn remove_temps() {
    if let Ok(t) = TEMPS.lock() {
        for p in t.iter() {
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// A registered temporary path: unregistered (and removed, unless kept) when dropped.
struct Temp {
    path: PathBuf,
    keep: bool,
}

impl Temp {
    fn register(path: PathBuf) -> Temp {
        if let Ok(mut t) = TEMPS.lock() {
            t.push(path.clone());
        }
        Temp { path, keep: false }
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.keep {
            if self.path.is_dir() {
                let _ = std::fs::remove_dir_all(&self.path);
            } else {
                let _ = std::fs::remove_file(&self.path);
            }
        }
        if let Ok(mut t) = TEMPS.lock() {
            t.retain(|p| p != &self.path);
        }
    }
}

/// `.NAME.tmp-<16 random hex digits>` in `dir`.
fn temp_name(dir: &Path, name: &std::ffi::OsStr) -> PathBuf {
    let mut n = OsString::from(".");
    n.push(name);
    n.push(format!(".tmp-{:016x}", rand::random::<u64>()));
    dir.join(n)
}

/// The folder and file name of `path` (a bare name is in `.`).
fn split(path: &Path) -> io::Result<(PathBuf, std::ffi::OsString)> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file path"))?;
    Ok((dir, name.to_os_string()))
}

/// Where writing `path` really goes.
enum Target {
    /// A regular file (existing, with its mode, or new) to replace atomically.
    File { path: PathBuf, mode: Option<u32> },
    /// A FIFO, character device or socket: written through.
    Special(PathBuf),
}

fn resolve(path: &Path) -> io::Result<Target> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Target::File {
                path: path.to_path_buf(),
                mode: None,
            });
        }
        Err(e) => return Err(e),
    };
    let (final_path, meta) = if meta.file_type().is_symlink() {
        if planted_in_shared_folder(path, &meta) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "a symlink someone else owns in a shared folder (sticky, world-writable): not followed",
            ));
        }
        let real = std::fs::canonicalize(path).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "a symlink to a file that does not exist: write to the target path itself",
            )
        })?;
        let m = std::fs::metadata(&real)?;
        (real, m)
    } else {
        (path.to_path_buf(), meta)
    };
    let ft = meta.file_type();
    if ft.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is a directory",
        ));
    }
    if ft.is_file() {
        Ok(Target::File {
            path: final_path,
            mode: Some(meta.mode() & 0o7777),
        })
    } else {
        Ok(Target::Special(final_path))
    }
}

/// The kernel's `protected_symlinks` rule, applied whatever the sysctl says: a symlink in a
/// sticky world-writable folder (`/tmp`) owned by neither us nor the folder's owner may have been
/// planted to redirect the write.
fn planted_in_shared_folder(link: &Path, meta: &std::fs::Metadata) -> bool {
    let dir = match link.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(d) = std::fs::metadata(dir) else {
        return false;
    };
    let shared = d.mode() & 0o1002 == 0o1002;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    shared && meta.uid() != me && meta.uid() != d.uid()
}

/// Create a fresh temporary file beside `target` (exclusive, never following a link).
fn create_temp(dir: &Path, name: &std::ffi::OsStr, mode: Option<u32>) -> io::Result<(File, Temp)> {
    for _ in 0..16 {
        let tmp = temp_name(dir, name);
        let mut o = OpenOptions::new();
        o.write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(if mode.is_some() { 0o600 } else { 0o666 });
        match o.open(&tmp) {
            Ok(f) => {
                let guard = Temp::register(tmp);
                if let Some(m) = mode {
                    f.set_permissions(std::fs::Permissions::from_mode(m))?;
                }
                return Ok((f, guard));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "could not create a temporary file beside the target",
    ))
}

/// Test hook (debug builds only): with `TRAINPLAN_TEST_HOLD_TEMP=FILE`, a write touches FILE
/// once its temporary file exists and waits there (up to a minute), so a test can interrupt it
/// deterministically.
fn test_hold() {
    #[cfg(debug_assertions)]
    if let Some(p) = std::env::var_os("TRAINPLAN_TEST_HOLD_TEMP") {
        let _ = std::fs::write(&p, b"");
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

/// Write `path` safely (see the module docs): atomically for a regular file, through for a
/// special file or a symlink to one.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    match resolve(path)? {
        Target::Special(p) => {
            let mut f = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(p)?;
            fill(&mut f)?;
            f.flush()
        }
        Target::File { path, mode } => {
            let (dir, name) = split(&path)?;
            let (mut f, mut tmp) = create_temp(&dir, &name, mode)?;
            test_hold();
            let mut w = io::BufWriter::with_capacity(1 << 16, &mut f);
            fill(&mut w)?;
            w.flush()?;
            drop(w);
            f.sync_all()?;
            std::fs::rename(&tmp.path, &path)?;
            tmp.keep = true;
            Ok(())
        }
    }
}

/// Write several files into the folder `dir` as one (see the module docs); `files` are
/// (name, content) with plain names. Returns the paths written.
pub fn write_dir_atomic(dir: &Path, files: &[(String, Vec<u8>)]) -> io::Result<Vec<PathBuf>> {
    for (n, _) in files {
        if n.is_empty() || n.contains('/') || n.starts_with('.') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a plain file name: {n:?}"),
            ));
        }
    }
    // A symlinked folder is written where it points.
    let dir = match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(dir)?,
        _ => dir.to_path_buf(),
    };
    let existing = match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => true,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "it exists and is not a folder",
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(e),
    };
    if existing {
        // An existing folder keeps its identity (`-o .` is the current folder, a shell may be
        // in it, it may hold the user's other files): every file is written to its temporary
        // name beside its target first — where a full disk fails, leaving everything as it
        // was — then each is renamed over its target.
        let mut staged = Vec::new();
        for (n, content) in files {
            let target = dir.join(n);
            let mode = match resolve(&target)? {
                Target::File { mode, .. } => mode,
                Target::Special(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{n} is not a regular file"),
                    ));
                }
            };
            let (mut f, tmp) = create_temp(&dir, n.as_ref(), mode)?;
            f.write_all(content)?;
            f.sync_all()?;
            staged.push((tmp, target));
        }
        test_hold();
        let mut out = Vec::new();
        for (mut tmp, target) in staged {
            std::fs::rename(&tmp.path, &target)?;
            tmp.keep = true;
            out.push(target);
        }
        return Ok(out);
    }
    // A new folder: filled under a fresh temporary name beside it, then renamed as a whole.
    let (parent, name) = split(&dir)?;
    let mut tmp_dir = None;
    for _ in 0..16 {
        let p = temp_name(&parent, &name);
        match std::fs::create_dir(&p) {
            Ok(()) => {
                tmp_dir = Some(Temp::register(p));
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    let mut tmp_dir = tmp_dir.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::AlreadyExists,
            "could not create a temporary folder",
        )
    })?;
    for (n, content) in files {
        let p = tmp_dir.path.join(n);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(0o666)
            .open(&p)?;
        f.write_all(content)?;
        f.sync_all()?;
    }
    test_hold();
    std::fs::rename(&tmp_dir.path, &dir)?;
    tmp_dir.keep = true;
    Ok(files.iter().map(|(n, _)| dir.join(n)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("trainplan-atomic-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_error_leaves_the_old_file_and_no_temporary() {
        let d = scratch("err");
        let p = d.join("out.json");
        std::fs::write(&p, "old").unwrap();
        let err = write_atomic(&p, |w: &mut dyn Write| {
            w.write_all(b"half")?;
            Err(io::Error::other("disk full"))
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(entries(&d), ["out.json"]);
        write_atomic(&p, |w: &mut dyn Write| w.write_all(b"new")).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn temporary_names_are_unpredictable() {
        let d = Path::new("/x");
        let a = temp_name(d, "plan.yaml".as_ref());
        let b = temp_name(d, "plan.yaml".as_ref());
        assert_ne!(a, b);
        let s = a.file_name().unwrap().to_str().unwrap();
        assert!(
            s.starts_with(".plan.yaml.tmp-") && s.len() == ".plan.yaml.tmp-".len() + 16,
            "{s}"
        );
    }

    #[test]
    fn permissions_are_kept_and_symlinks_written_through() {
        let d = scratch("perm");
        let p = d.join("plan.yaml");
        std::fs::write(&p, "old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&p, |w: &mut dyn Write| w.write_all(b"new")).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        // A symlink: the file it points to is replaced, the link stays a link.
        let link = d.join("link.yaml");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        write_atomic(&link, |w: &mut dyn Write| w.write_all(b"through")).unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "through");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        // A dangling symlink is refused, and nothing is created where it points.
        let dangling = d.join("dangling.yaml");
        std::os::unix::fs::symlink(d.join("elsewhere"), &dangling).unwrap();
        assert!(write_atomic(&dangling, |w: &mut dyn Write| w.write_all(b"x")).is_err());
        assert!(!d.join("elsewhere").exists());
        // A special file is written through: /dev/null stays a device.
        write_atomic(Path::new("/dev/null"), |w: &mut dyn Write| {
            w.write_all(b"x")
        })
        .unwrap();
        assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
        // A directory is refused.
        assert!(write_atomic(&d, |w: &mut dyn Write| w.write_all(b"x")).is_err());
        assert_eq!(entries(&d), ["dangling.yaml", "link.yaml", "plan.yaml"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_symlink_planted_by_someone_else_in_a_shared_folder_is_not_followed() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            crate::skip_note!("not root: cannot give a symlink to another user; skipping");
            return;
        }
        let d = scratch("sticky");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = d.join("plan.yaml");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let e = write_atomic(&link, |w: &mut dyn Write| w.write_all(b"x")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        // Our own link in the same folder is written through.
        std::os::unix::fs::lchown(&link, Some(0), Some(0)).unwrap();
        write_atomic(&link, |w: &mut dyn Write| w.write_all(b"mine")).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_planted_file_at_a_temporary_name_is_never_followed() {
        // Every temporary name is fresh and exclusive: planting links at guesses achieves
        // nothing, and the target is written.
        let d = scratch("plant");
        let victim = d.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        for i in 0..64 {
            std::os::unix::fs::symlink(&victim, d.join(format!(".out.tmp-{i:016x}"))).unwrap();
        }
        write_atomic(&d.join("out"), |w: &mut dyn Write| w.write_all(b"data")).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(d.join("out")).unwrap(), "data");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn folders_are_written_as_a_whole() {
        let d = scratch("dir");
        let out = d.join("trainplan-jax");
        let files = |tag: &str| {
            vec![
                ("a.env".to_string(), format!("A={tag}\n").into_bytes()),
                ("b.py".to_string(), format!("B = {tag:?}\n").into_bytes()),
            ]
        };
        write_dir_atomic(&out, &files("1")).unwrap();
        assert_eq!(entries(&out), ["a.env", "b.py"]);
        std::fs::set_permissions(out.join("a.env"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::create_dir(out.join("__pycache__")).unwrap();
        let inode = std::fs::metadata(&out).unwrap().ino();
        // Each file replaced: new content, modes kept, the folder the same folder.
        write_dir_atomic(&out, &files("2")).unwrap();
        assert_eq!(entries(&out), ["__pycache__", "a.env", "b.py"]);
        assert_eq!(std::fs::metadata(&out).unwrap().ino(), inode);
        assert_eq!(std::fs::read_to_string(out.join("a.env")).unwrap(), "A=2\n");
        assert_eq!(
            std::fs::metadata(out.join("a.env")).unwrap().mode() & 0o777,
            0o600
        );
        assert_eq!(entries(&d), ["trainplan-jax"], "no temporary folder left");
        // A folder with the user's own files: they stay.
        std::fs::write(out.join("mine.txt"), "mine").unwrap();
        write_dir_atomic(&out, &files("3")).unwrap();
        assert_eq!(entries(&out), ["__pycache__", "a.env", "b.py", "mine.txt"]);
        assert_eq!(
            std::fs::read_to_string(out.join("b.py")).unwrap(),
            "B = \"3\"\n"
        );
        // Names that are not plain are refused.
        assert!(write_dir_atomic(&out, &[("../x".into(), vec![])]).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
