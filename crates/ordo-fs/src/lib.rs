//! ordo's file-system core.
//!
//! Layers, top to bottom: the library API ([`Fs`]), namespace and inode
//! operations, allocation, extents and directories, all of which describe
//! every metadata change as a typed [`update::Update`] on an operation
//! handle; the consistency [`protocol`] that consumes those updates and
//! decides which block images reach the device, when and with which
//! flushes; the [`cache`] of block images; and the block device
//! (`ordo-dev`). See `docs/DESIGN.md`.

mod alloc;
pub mod backlinks;
pub mod cache;
pub mod clock;
mod delalloc;
mod dir;
pub mod error;
mod exec;
pub mod extent;
mod file;
pub mod fs;
pub mod fsck;
mod inode;
pub mod layout;
pub mod mkfs;
pub mod mkfs_journal;
mod mount;
mod ops;
pub mod protocol;
pub mod random;
pub mod scan;
pub mod sched;
mod state;
pub mod stream;
pub mod types;
pub mod update;
pub mod waiting;
mod xattr;

pub use error::{FsError, Result};
pub use fs::Fs;
pub use mount::{recover_image, recover_image_with, recovered_view, recovered_view_with};
/// Fast-commit replay, as `protocol::fast_commit::replay`.
pub use protocol::fast_commit::replay as fc_replay;
/// JBD2 recovery (scan, replay), as `protocol::jbd2::recovery`.
pub use protocol::jbd2::recovery;
pub use protocol::{DataMode, DurabilityCalls, ProtocolKind};
pub use stream::StreamId;
pub use types::*;
