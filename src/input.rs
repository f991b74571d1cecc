//! The one guarded way to open an input file. Every file trainplan reads — configs, pass files,
//! plans, the performance database, nccl-tests tables, ONNX models, Kineto / host-ET / Chakra
//! traces, named or found beside another — is opened by [`open`] (or [`read_to_string`] /
//! [`read_bytes`] on top of it):
//!
//! * **regular files only**: the file is opened non-blocking (a FIFO does not block the open)
//!   and `fstat`ed; a FIFO, a device (`/dev/zero`, `/dev/urandom`), a socket or a directory is
//!   refused with [`InputError::NotAFile`] naming what it is, before a byte is read;
//! * **a size cap per kind** ([`InputKind::max_file_bytes`]), checked on the size and again while
//!   reading (a file that grows is cut off with an error, never silently);
//! * **memory**: every 16 MiB read, the process's resident memory is checked against the ceiling
//!   ([`crate::limits::check`]), so an input that amplifies as it is parsed stops with "would
//!   need N GB" instead of an abort.
//!
//! Decompressed gzip streams get the same reader ([`decompressed`]) with the kind's
//! decompressed-size cap, and JSON traces a string-length bound ([`json_strings`]).
//!
//! Every file opened is recorded by device and inode ([`opened_as`]): outputs are checked
//! against it, so a command never writes over a file it read.
//!
//! Errors never hold the file's content (a file that is not what was expected is not echoed)
//! and do not name the path: the caller names it (`failed to read PATH: …`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

pub use crate::limits::InputKind;
use crate::limits::{self, MAX_JSON_STRING_BYTES, MemoryError};

/// Why an input cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Not a regular file.
    #[error("not a regular file (it is {0})")]
    NotAFile(&'static str),
    /// Larger than the kind allows.
    #[error("{} bytes, more than the {} limit on {}s (README, Limits)", thousands(*bytes), human(*limit), kind.what())]
    TooLarge {
        bytes: u64,
        limit: u64,
        kind: InputKind,
    },
    /// The gzip stream decompresses to more than the kind allows.
    #[error("it decompresses to more than the {} limit on {}s (README, Limits)", human(*limit), kind.what())]
    DecompressedTooLarge { limit: u64, kind: InputKind },
    /// A JSON string longer than [`MAX_JSON_STRING_BYTES`].
    #[error("a JSON string longer than {} at byte {} of the JSON (README, Limits)", human(MAX_JSON_STRING_BYTES), thousands(*at))]
    StringTooLong { at: u64 },
    /// Text expected, other bytes found.
    #[error("not UTF-8 text: not a {0}")]
    NotText(&'static str),
    /// The memory ceiling.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl InputError {
    /// The guard's error inside an `io::Error` a reader returned, if it is one.
    pub fn from_io(e: &io::Error) -> Option<&InputError> {
        e.get_ref()?.downcast_ref::<InputError>()
    }
}

impl From<InputError> for io::Error {
    fn from(e: InputError) -> io::Error {
        match e {
            InputError::Io(e) => e,
            e => io::Error::other(e),
        }
    }
}

fn thousands(n: u64) -> String {
    crate::units::thousands(n)
}

/// `16 MiB`, `2 GiB`, `300 bytes`.
pub fn human(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (u, name) in UNITS {
        if bytes >= u && bytes % u == 0 {
            return format!("{} {name}", bytes / u);
        }
    }
    format!("{} bytes", thousands(bytes))
}

/// Bytes read between two checks of the memory ceiling.
const CHECK_EVERY: u64 = 16 << 20;

/// A reader that refuses to deliver more than `limit` bytes and checks the memory ceiling as it
/// goes. What [`open`] returns; [`decompressed`] puts one after a decoder.
pub struct Guarded<R> {
    inner: R,
    read: u64,
    next_check: u64,
    limit: u64,
    kind: InputKind,
    /// The limit is on the decompressed stream.
    decompressed: bool,
}

impl<R> Guarded<R> {
    /// Bytes delivered so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }
}

impl<R: Read> Read for Guarded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // `read` ≤ `limit` here; one byte beyond the limit is enough to know.
        let room = (self.limit - self.read + 1).min(buf.len() as u64) as usize;
        let n = self.inner.read(&mut buf[..room])?;
        self.read += n as u64;
        if self.read > self.limit {
            return Err(if self.decompressed {
                InputError::DecompressedTooLarge {
                    limit: self.limit,
                    kind: self.kind,
                }
            } else {
                InputError::TooLarge {
                    bytes: self.read,
                    limit: self.limit,
                    kind: self.kind,
                }
            }
            .into());
        }
        if self.read >= self.next_check {
            self.next_check = self.read + CHECK_EVERY;
            let (kind, read, dec) = (self.kind, self.read, self.decompressed);
            limits::check(
                || {
                    format!(
                        "reading this {} ({} MB so far{})",
                        kind.what(),
                        read / 1_000_000,
                        if dec { ", decompressed" } else { "" }
                    )
                },
                0,
            )
            .map_err(InputError::from)?;
        }
        Ok(n)
    }
}

/// What a non-regular file is, in words.
fn file_type_name(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Every regular file [`open`] has opened in this process, by (device, inode): the path it was
/// opened by and its kind. A command compares what it is about to write with it
/// (`cli::distinct`), so no output replaces an input — found implicitly or named.
static OPENED: std::sync::Mutex<BTreeMap<(u64, u64), (PathBuf, InputKind)>> =
    std::sync::Mutex::new(BTreeMap::new());

/// The path and kind a file (device, inode) was opened as an input by, if it was and that path
/// is still that file (an input deleted since frees its inode for another file).
pub fn opened_as(dev: u64, ino: u64) -> Option<(PathBuf, InputKind)> {
    use std::os::unix::fs::MetadataExt;
    let (path, kind) = OPENED.lock().ok()?.get(&(dev, ino)).cloned()?;
    let m = std::fs::metadata(&path).ok()?;
    (m.dev() == dev && m.ino() == ino).then_some((path, kind))
}

/// Open `path` as an input of `kind`: a regular file (symlinks followed) no larger than the
/// kind's cap, read through a [`Guarded`] reader. Never blocks on a FIFO. The file is recorded
/// as an input of this process ([`opened_as`]).
pub fn open(path: &Path, kind: InputKind) -> Result<Guarded<File>, InputError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(InputError::NotAFile(file_type_name(&meta.file_type())));
    }
    if let Ok(mut o) = OPENED.lock() {
        o.entry((meta.dev(), meta.ino()))
            .or_insert_with(|| (path.to_path_buf(), kind));
    }
    let limit = kind.max_file_bytes();
    if meta.len() > limit {
        return Err(InputError::TooLarge {
            bytes: meta.len(),
            limit,
            kind,
        });
    }
    Ok(Guarded {
        inner: file,
        read: 0,
        next_check: CHECK_EVERY,
        limit,
        kind,
        decompressed: false,
    })
}

/// The whole file as bytes, through [`open`].
pub fn read_bytes(path: &Path, kind: InputKind) -> Result<Vec<u8>, InputError> {
    let mut g = open(path, kind)?;
    let mut out = Vec::with_capacity(g.inner.metadata().map_or(0, |m| m.len() as usize));
    g.read_to_end(&mut out).map_err(unwrap_io)?;
    Ok(out)
}

/// The whole file as UTF-8 text, through [`open`]. Invalid UTF-8 is refused without echoing
/// any of it.
pub fn read_to_string(path: &Path, kind: InputKind) -> Result<String, InputError> {
    String::from_utf8(read_bytes(path, kind)?).map_err(|_| InputError::NotText(kind.what()))
}

/// An `io::Error` from a guarded reader back into the guard's error.
pub fn unwrap_io(e: io::Error) -> InputError {
    if InputError::from_io(&e).is_some() {
        match e.into_inner().map(|b| b.downcast::<InputError>()) {
            Some(Ok(ie)) => *ie,
            Some(Err(other)) => InputError::Io(io::Error::other(other)),
            None => InputError::Io(io::Error::other("read error")),
        }
    } else {
        InputError::Io(e)
    }
}

/// A decompressed stream of a `kind` file, capped at the kind's decompressed size and checked
/// against the memory ceiling like a file.
pub fn decompressed<R: Read>(inner: R, kind: InputKind) -> Guarded<R> {
    Guarded {
        inner,
        read: 0,
        next_check: CHECK_EVERY,
        limit: kind
            .max_decompressed_bytes()
            .unwrap_or(kind.max_file_bytes()),
        kind,
        decompressed: true,
    }
}

/// A JSON text whose strings are at most [`MAX_JSON_STRING_BYTES`] long (between the quotes,
/// escapes counted as written). A parser buffers a string whole before it can refuse it; this
/// reader refuses first.
pub fn json_strings<R: Read>(inner: R) -> JsonStrings<R> {
    JsonStrings {
        inner,
        offset: 0,
        in_string: false,
        escape: false,
        len: 0,
    }
}

/// See [`json_strings`].
pub struct JsonStrings<R> {
    inner: R,
    offset: u64,
    in_string: bool,
    escape: bool,
    len: u64,
}

impl<R: Read> Read for JsonStrings<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let b = &buf[..n];
        let mut i = 0;
        while i < n {
            if self.escape {
                self.escape = false;
                self.len += 1;
                i += 1;
                continue;
            }
            if !self.in_string {
                match memchr::memchr(b'"', &b[i..]) {
                    Some(j) => {
                        i += j + 1;
                        self.in_string = true;
                        self.len = 0;
                    }
                    None => break,
                }
                continue;
            }
            match memchr::memchr2(b'"', b'\\', &b[i..]) {
                Some(j) => {
                    self.len += j as u64;
                    if b[i + j] == b'"' {
                        self.in_string = false;
                    } else {
                        self.escape = true;
                        self.len += 1;
                    }
                    i += j + 1;
                }
                None => {
                    self.len += (n - i) as u64;
                    i = n;
                }
            }
            if self.len > MAX_JSON_STRING_BYTES {
                return Err(InputError::StringTooLong {
                    at: self.offset + i as u64,
                }
                .into());
            }
        }
        self.offset += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("trainplan-input-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn special_files_are_refused_without_blocking() {
        let d = scratch("special");
        let fifo = d.join("fifo.yaml");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo has no other preconditions.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = open(&fifo, InputKind::Config).err().unwrap().to_string();
        assert_eq!(e, "not a regular file (it is a FIFO)");
        let e = read_bytes(Path::new("/dev/zero"), InputKind::Onnx)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "not a regular file (it is a character device)");
        let e = open(&d, InputKind::Plan).err().unwrap().to_string();
        assert!(e.contains("it is a directory"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn size_caps_before_and_while_reading() {
        let d = scratch("caps");
        let big = d.join("big.yaml");
        std::fs::write(&big, vec![b'#'; (4 << 20) + 1]).unwrap();
        let e = read_to_string(&big, InputKind::Config)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "4,194,305 bytes, more than the 4 MiB limit on config files (README, Limits)"
        );
        // A stream that delivers more than its cap.
        let mut g = decompressed(io::repeat(b' '), InputKind::HostEt);
        g.limit = 1000;
        let mut sink = Vec::new();
        let e = unwrap_io(g.read_to_end(&mut sink).unwrap_err());
        assert!(
            matches!(e, InputError::DecompressedTooLarge { limit: 1000, .. }),
            "{e}"
        );
        assert!(sink.len() <= 1000, "{}", sink.len());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn non_utf8_text_is_refused_without_its_content() {
        let d = scratch("utf8");
        let p = d.join("x.yaml");
        std::fs::write(&p, b"name: \xff\xfesecret").unwrap();
        let e = read_to_string(&p, InputKind::Config)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "not UTF-8 text: not a config file");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn json_strings_are_bounded_and_escapes_do_not_end_them() {
        let ok = br#"{"a":"x\"y\\","b":["",""]}"#;
        let mut out = Vec::new();
        json_strings(&ok[..]).read_to_end(&mut out).unwrap();
        assert_eq!(out, ok);
        // A string of MAX + 1 bytes made of escaped quotes.
        let mut long = b"[\"".to_vec();
        long.extend(
            std::iter::repeat_n(*b"\\\"", (MAX_JSON_STRING_BYTES as usize) / 2 + 1).flatten(),
        );
        long.extend(b"\"]");
        let e = unwrap_io(
            json_strings(&long[..])
                .read_to_end(&mut Vec::new())
                .unwrap_err(),
        );
        assert!(matches!(e, InputError::StringTooLong { .. }), "{e}");
        // Many short strings add up to more than the bound: fine.
        let many: Vec<u8> =
            std::iter::repeat_n(&b"\"abcdefgh\","[..], (MAX_JSON_STRING_BYTES as usize) / 8)
                .flatten()
                .copied()
                .collect();
        json_strings(&many[..])
            .read_to_end(&mut Vec::new())
            .unwrap();
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(16 << 20), "16 MiB");
        assert_eq!(human(2 << 30), "2 GiB");
        assert_eq!(human(1500), "1,500 bytes");
    }
}
