//! Why a data directory cannot be used.

use std::path::{Path, PathBuf};

/// A data directory the engine refuses to open (or `rewind data check`
/// found broken). Nothing was changed on disk, except that a new directory
/// may have been created.
///
/// I/O errors keep their kind and message rather than the `io::Error`
/// itself, so the error can be cloned and compared like the rest of
/// [`ConfigError`](crate::ConfigError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DataDirError {
    /// A file operation failed.
    #[error("{}: {op}: {message}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done ("open", "map", "write header", ...).
        op: &'static str,
        /// The kind of the I/O error (`StorageFull` for a full disk).
        kind: std::io::ErrorKind,
        /// The I/O error's message.
        message: String,
    },
    /// Another process (or another engine in this one) has the directory
    /// open.
    #[error(
        "{} is locked by another process: another rewind serves this data directory; \
         stop it or choose another data_dir",
        path.display()
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The pool file is not a Rewind pool file.
    #[error("{} is not a Rewind pool file (it starts with {found:02x?})", path.display())]
    BadMagic {
        /// The pool file.
        path: PathBuf,
        /// Its first eight bytes.
        found: [u8; 8],
    },
    /// The pool file has a format this build does not read.
    #[error(
        "{} has format version {found}; this build reads version {expected} \
         (use the rewind release that wrote it, or start with a new data_dir)",
        path.display()
    )]
    Version {
        /// The pool file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The version this build writes and reads.
        expected: u32,
    },
    /// Both copies of the pool file's header fail their checksum.
    #[error(
        "{}: both copies of the header fail their checksum; the file is damaged \
         (move it away to start empty)",
        path.display()
    )]
    HeaderDamaged {
        /// The pool file.
        path: PathBuf,
    },
    /// The pool file was made for another pool shape than the
    /// configuration asks for.
    #[error(
        "{} holds a pool of {found}, but the configuration asks for {wanted}; start with the \
         settings that made it (global_bytes, max_segment_bytes, max_event_bytes) or with a \
         new data_dir",
        path.display()
    )]
    LayoutMismatch {
        /// The pool file.
        path: PathBuf,
        /// The shape in the file.
        found: String,
        /// The shape the configuration asks for.
        wanted: String,
    },
    /// The pool file is shorter than its header says.
    #[error(
        "{} is {len} bytes, shorter than the {needed} bytes its header announces: truncated",
        path.display()
    )]
    Truncated {
        /// The pool file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length it must have.
        needed: u64,
    },
    /// The boot counter cannot grow any more (2^24 boots).
    #[error("{}: the boot counter is exhausted; start with a new data_dir", path.display())]
    BootsExhausted {
        /// The pool file.
        path: PathBuf,
    },
}

impl DataDirError {
    pub(crate) fn io(path: &Path, op: &'static str, e: std::io::Error) -> DataDirError {
        DataDirError::Io {
            path: path.to_owned(),
            op,
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}
