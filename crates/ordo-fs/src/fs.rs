//! The library API: an `Fs` is one mounted ordo file system.
//!
//! `Fs` is `Send + Sync`; every method takes `&self`. Inode numbers are
//! ext4's (root is [`ROOT_INO`](crate::types::ROOT_INO) = 2).

use std::sync::Arc;

use ordo_dev::{BlockDevice, Counters};

use crate::error::Result;
use crate::types::*;

/// A mounted file system.
pub struct Fs {
    _dev: Arc<dyn BlockDevice>,
}

#[allow(unused_variables)]
impl Fs {
    /// Mount the image on `dev`: validate the superblock (refusing
    /// unsupported incompatible features by name), run the protocol's
    /// recovery, process the orphan list, and start the protocol.
    pub fn mount(dev: Arc<dyn BlockDevice>, opts: MountOptions) -> Result<Fs> {
        unimplemented!("Fs::mount")
    }
    /// Make everything durable, mark the image clean, and release it.
    pub fn unmount(self) -> Result<()> {
        unimplemented!()
    }
    /// Look up `name` in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        unimplemented!()
    }
    /// Resolve an absolute path ("/a/b") without following a final symlink.
    pub fn lookup_path(&self, path: &str) -> Result<Attr> {
        unimplemented!()
    }
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        unimplemented!()
    }
    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        unimplemented!()
    }
    /// Create a regular file (or, with another `kind`, a device node, FIFO or
    /// socket: mknod). `perm` is `mode & 0o7777` after the umask.
    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileType,
        perm: u16,
        rdev: u32,
        creds: &Creds,
    ) -> Result<Attr> {
        unimplemented!()
    }
    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u16, creds: &Creds) -> Result<Attr> {
        unimplemented!()
    }
    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], creds: &Creds) -> Result<Attr> {
        unimplemented!()
    }
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        unimplemented!()
    }
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        unimplemented!()
    }
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        unimplemented!()
    }
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        unimplemented!()
    }
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        unimplemented!()
    }
    /// Note an open file handle on `ino` (keeps an unlinked inode alive).
    pub fn open(&self, ino: Ino) -> Result<()> {
        unimplemented!()
    }
    /// Drop an open handle; the last close of an unlinked inode frees it.
    pub fn release(&self, ino: Ino) -> Result<()> {
        unimplemented!()
    }
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>> {
        unimplemented!()
    }
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<u32> {
        unimplemented!()
    }
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, flags: FallocFlags) -> Result<()> {
        unimplemented!()
    }
    pub fn seek(&self, ino: Ino, offset: u64, whence: SeekWhence) -> Result<u64> {
        unimplemented!()
    }
    pub fn fsync(&self, ino: Ino, datasync: bool) -> Result<()> {
        unimplemented!()
    }
    pub fn sync(&self) -> Result<()> {
        unimplemented!()
    }
    pub fn statfs(&self) -> Result<StatFs> {
        unimplemented!()
    }
    /// Entries of directory `ino` after cookie `offset` (0 = from the start,
    /// including "." and ".."), at most `max` of them.
    pub fn readdir(&self, ino: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        unimplemented!()
    }
    /// Check `mask` (R_OK=4, W_OK=2, X_OK=1) for `creds` as the kernel does.
    pub fn access(&self, ino: Ino, mask: u32, creds: &Creds) -> Result<()> {
        unimplemented!()
    }
    /// Run the protocol's periodic write-back now (what the timer does).
    pub fn write_back(&self) -> Result<()> {
        unimplemented!()
    }
    /// The device's counters.
    pub fn counters(&self) -> Counters {
        unimplemented!()
    }
    /// The protocol's name and statistics.
    pub fn protocol_stats(&self) -> (String, Vec<(String, u64)>) {
        unimplemented!()
    }
}
