//! Typed errors of the core. Every error maps to the errno Linux ext4 returns.

use std::io;

/// The core's error type.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// A plain POSIX error (ENOENT, EEXIST, ENOTEMPTY, ...), as ext4 returns it.
    #[error("{}", errno_name(*.0))]
    Errno(i32),
    /// On-disk metadata failed validation. Maps to EUCLEAN (EFSCORRUPTED), as
    /// ext4 does; the message names the block and the field.
    #[error("corrupted metadata in block {block}: {field}: {detail}")]
    Corrupt {
        /// Block number (file-system blocks) holding the bad structure.
        block: u64,
        /// Which structure and field, e.g. "inode 12 i_block extent header magic".
        field: String,
        /// What was wrong.
        detail: String,
    },
    /// The image uses a feature ordo does not implement (EINVAL at mount).
    #[error("unsupported feature: {0}")]
    Unsupported(String),
    /// A bad argument or option (EINVAL).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The device failed (EIO).
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

/// The core's result type.
pub type Result<T> = std::result::Result<T, FsError>;

impl FsError {
    /// The errno to return to a caller (FUSE reply, library user).
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Errno(e) => *e,
            FsError::Corrupt { .. } => libc::EUCLEAN,
            FsError::Unsupported(_) => libc::EINVAL,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// Shorthand for a corruption error.
    pub fn corrupt(block: u64, field: impl Into<String>, detail: impl Into<String>) -> Self {
        FsError::Corrupt {
            block,
            field: field.into(),
            detail: detail.into(),
        }
    }
}

impl From<ordo_format::FormatError> for FsError {
    fn from(e: ordo_format::FormatError) -> Self {
        FsError::Corrupt {
            block: e.block,
            field: e.field.to_string(),
            detail: e.detail,
        }
    }
}

/// Shorthands: `Err(errno(ENOENT))`.
pub fn errno(e: i32) -> FsError {
    FsError::Errno(e)
}

fn errno_name(e: i32) -> String {
    let name = match e {
        libc::ENOENT => "ENOENT (no such file or directory)",
        libc::EEXIST => "EEXIST (file exists)",
        libc::ENOTEMPTY => "ENOTEMPTY (directory not empty)",
        libc::EISDIR => "EISDIR (is a directory)",
        libc::ENOTDIR => "ENOTDIR (not a directory)",
        libc::EINVAL => "EINVAL (invalid argument)",
        libc::ENAMETOOLONG => "ENAMETOOLONG (file name too long)",
        libc::ELOOP => "ELOOP (too many levels of symbolic links)",
        libc::EACCES => "EACCES (permission denied)",
        libc::EPERM => "EPERM (operation not permitted)",
        libc::ENOSPC => "ENOSPC (no space left on device)",
        libc::EMLINK => "EMLINK (too many links)",
        libc::EFBIG => "EFBIG (file too large)",
        libc::EROFS => "EROFS (read-only file system)",
        libc::EXDEV => "EXDEV (cross-device link)",
        libc::EBADF => "EBADF (bad file descriptor)",
        libc::ENXIO => "ENXIO (no such device or address)",
        libc::EOPNOTSUPP => "EOPNOTSUPP (operation not supported)",
        libc::EBUSY => "EBUSY (device or resource busy)",
        libc::EIO => "EIO (input/output error)",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}
