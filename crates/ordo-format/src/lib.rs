//! ext4, JBD2 and fast-commit on-disk structures: encode, decode and
//! checksums. Pure: no I/O. Every decoder validates what it reads and
//! returns a [`FormatError`] naming the field; every encoder has a decoder.
//! See `docs/FORMAT.md` for the subset of ext4 ordo reads and writes.

pub mod bitmap;
pub mod csum;
pub mod dir;
pub mod extent;
pub mod fc;
pub mod features;
pub mod fuzzing;
pub mod group;
pub mod inode;
pub mod jbd2;
pub mod le;
pub mod superblock;
pub mod xattr;

pub use features::FeatureSet;
pub use fuzzing::decode_any;
pub use group::GroupDesc;
pub use inode::Inode;
pub use superblock::Superblock;

/// A structure failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("block {block}: {field}: {detail}")]
pub struct FormatError {
    /// Block the structure was read from (0 when the decoder was not told;
    /// callers fill it in with [`FormatError::at`]).
    pub block: u64,
    /// The structure and field, e.g. "superblock s_magic".
    pub field: &'static str,
    /// What was wrong.
    pub detail: String,
}

impl FormatError {
    /// A new error about `field`.
    pub fn new(field: &'static str, detail: impl Into<String>) -> Self {
        FormatError {
            block: 0,
            field,
            detail: detail.into(),
        }
    }
    /// The same error, located at `block`.
    pub fn at(mut self, block: u64) -> Self {
        self.block = block;
        self
    }
}

/// Result of decoding.
pub type Result<T> = std::result::Result<T, FormatError>;
