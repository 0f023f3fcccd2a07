//! The library API: an `Fs` is one mounted ordo file system.
//!
//! `Fs` is `Send + Sync`; every method takes `&self`. Inode numbers are
//! ext4's (root is [`ROOT_INO`](crate::types::ROOT_INO) = 2).
//!
//! Every public call that may change metadata runs as one operation handle
//! under the file-system lock. When it ends, the plans the protocol made are
//! taken out of the core, numbered, and executed *after* the lock is
//! released, strictly in the order of their numbers (the plan sequencer):
//! so a slow synchronous write of one caller does not stall the others, and
//! the order of device writes is exactly the order in which the protocol
//! asked for them. After each plan the lock is taken again to unpin its
//! blocks, mark them clean and tell the protocol.
//!
//! This file is the API; the handles and the plan sequencer with group
//! commit are in `exec.rs`, mount and unmount in `mount.rs`.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ordo_dev::{BlockDevice, Counters};
use ordo_format::Superblock;

use crate::cache::CacheStats;
use crate::error::{errno, Result};
use crate::exec::Shared;
use crate::file::DeferredRead;
use crate::protocol::{self, DurabilityCalls, WriteBackReason};
use crate::stream::{Caller, StreamId};
use crate::types::*;
use crate::update::OpKind;

/// Largest data write done in one operation handle; longer writes are split
/// (as the kernel splits a long write into page-sized journal handles), so
/// that the buffer cache can be relieved between the pieces.
const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// Most path components [`Fs::lookup_path`] visits: 40 symlinks (Linux's
/// `MAXSYMLINKS`) of at most a 4 KiB target each, over a `PATH_MAX` path.
const LOOKUP_PATH_STEPS_MAX: usize = 41 * 4096;

/// A mounted file system.
pub struct Fs {
    pub(crate) shared: Arc<Shared>,
    pub(crate) background: Mutex<Option<JoinHandle<()>>>,
    pub(crate) read_only: bool,
    /// `fsync=osync`: a plain fsync is an osync.
    pub(crate) fsync_is_osync: bool,
    /// Who may allocate the reserved blocks (`s_def_resuid`,
    /// `s_def_resgid`), fixed while mounted: read without the core lock.
    pub(crate) reserve_ids: ReserveIds,
    /// Bytes of a write taken per handle: an eighth of the cache bound,
    /// at least a block and at most `WRITE_CHUNK_BYTES`.
    pub(crate) write_chunk: usize,
}

/// `s_def_resuid` and `s_def_resgid` of a mounted file system.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReserveIds {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl ReserveIds {
    pub(crate) fn of(sbi: &Superblock) -> ReserveIds {
        ReserveIds {
            uid: u32::from(sbi.def_resuid),
            gid: u32::from(sbi.def_resgid),
        }
    }
}

/// A write's bytes per handle with a cache bound of `bound_bytes`.
pub(crate) fn write_chunk(bound_bytes: u64, block_size: u32) -> usize {
    ((bound_bytes / 8) as usize).clamp(block_size as usize, WRITE_CHUNK_BYTES)
}

impl Fs {
    fn mutating(&self) -> Result<()> {
        if self.read_only {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    /// Look up `name` in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        self.shared
            .read(|c| c.op_lookup(parent, name).map_err(|e| c.nofs_eio(e)))
    }

    /// Resolve an absolute path ("/a/b") without following a final symlink
    /// (intermediate symlinks are followed, up to 40 of them).
    pub fn lookup_path(&self, path: &str) -> Result<Attr> {
        self.shared.read(|c| {
            let mut todo: Vec<Vec<u8>> = path
                .as_bytes()
                .split(|&b| b == b'/')
                .filter(|s| !s.is_empty())
                .map(|s| s.to_vec())
                .rev()
                .collect();
            let mut cur = c.op_lookup(ROOT_INO, b".")?;
            let mut stack: Vec<Ino> = Vec::new();
            let mut links = 0;
            let mut steps = 0usize;
            while let Some(name) = todo.pop() {
                // Each step consumes a component and symlinks are capped,
                // yet a corrupted image should never be what keeps a walk
                // going: an explicit cap on the components visited.
                steps += 1;
                if steps > LOOKUP_PATH_STEPS_MAX {
                    return Err(errno(libc::ELOOP));
                }
                if cur.kind != FileType::Directory {
                    return Err(errno(libc::ENOTDIR));
                }
                let next = if name == b".." {
                    match stack.pop() {
                        Some(p) => c.op_lookup(p, b".")?,
                        None => c.op_lookup(ROOT_INO, b".")?,
                    }
                } else {
                    c.op_lookup(cur.ino, &name)?
                };
                if next.kind == FileType::Symlink && !todo.is_empty() {
                    links += 1;
                    if links > 40 {
                        return Err(errno(libc::ELOOP));
                    }
                    let target = c.op_readlink(next.ino)?;
                    for part in target.split(|&b| b == b'/').filter(|s| !s.is_empty()).rev() {
                        todo.push(part.to_vec());
                    }
                    if target.first() == Some(&b'/') {
                        stack.clear();
                        cur = c.op_lookup(ROOT_INO, b".")?;
                    }
                    continue;
                }
                if name != b".." {
                    stack.push(cur.ino);
                }
                cur = next;
            }
            Ok(cur)
        })
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.shared.read(|c| {
            let i = c.live_inode(ino)?;
            Ok(c.attr_of(&i))
        })
    }

    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        self.mutating()?;
        self.shared
            .with_handle(op_of_setattr(set), |c| c.op_setattr(ino, set, None))
    }

    /// `setattr` on behalf of `creds` (chmod drops S_ISGID when the caller
    /// is not in the file's group, as the kernel does).
    pub fn setattr_as(&self, ino: Ino, set: &SetAttr, creds: &Creds) -> Result<Attr> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared
            .with_handle_as(op_of_setattr(set), reserve, |c| {
                c.op_setattr(ino, set, Some(creds))
            })
    }

    /// The value of extended attribute `name` (full name, `user.x`) of
    /// `ino`; ACLs in the VFS's form. ENODATA when absent.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        self.shared.read(|c| c.op_getxattr(ino, name))
    }

    /// The NUL-terminated names of `ino`'s attributes (`trusted.` ones only
    /// for a `privileged` caller).
    pub fn listxattr(&self, ino: Ino, privileged: bool) -> Result<Vec<u8>> {
        self.shared.read(|c| c.op_listxattr(ino, privileged))
    }

    /// Set extended attribute `name` of `ino` to `value`; `flags` are
    /// `XATTR_CREATE` (1) and `XATTR_REPLACE` (2). One handle: the value,
    /// a mode change an access ACL implies and ctime are one atomic
    /// change. `creds`: the caller (an access ACL set by one outside the
    /// file's group drops S_ISGID).
    pub fn setxattr(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: u32,
        creds: &Creds,
    ) -> Result<()> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(OpKind::SetXattr, reserve, |c| {
            c.op_setxattr(ino, name, Some(value), flags, Some(creds))
        })
    }

    /// Remove extended attribute `name` of `ino` (ENODATA when absent).
    pub fn removexattr(&self, ino: Ino, name: &[u8], creds: &Creds) -> Result<()> {
        self.mutating()?;
        self.shared.with_handle_as(OpKind::SetXattr, true, |c| {
            c.op_setxattr(ino, name, None, 0, Some(creds))
        })
    }

    /// Whether `creds` may allocate the blocks reserved for root.
    fn may_use_reserve(&self, creds: &Creds) -> bool {
        may_use_reserve(self.reserve_ids, creds)
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
        self.mutating()?;
        let op = if kind == FileType::Regular {
            OpKind::Create
        } else {
            OpKind::Mknod
        };
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(op, reserve, |c| {
            c.op_create(parent, name, kind, perm, rdev, creds)
        })
    }
    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u16, creds: &Creds) -> Result<Attr> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(OpKind::Mkdir, reserve, |c| {
            c.op_mkdir(parent, name, perm, creds)
        })
    }
    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], creds: &Creds) -> Result<Attr> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(OpKind::Symlink, reserve, |c| {
            c.op_symlink(parent, name, target, creds)
        })
    }
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.shared.read(|c| c.op_readlink(ino))
    }
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.link_as(ino, newparent, newname, &Creds::root())
    }
    /// `link` on behalf of `creds` (who may or may not use the reserved
    /// blocks should the directory need one).
    pub fn link_as(&self, ino: Ino, newparent: Ino, newname: &[u8], creds: &Creds) -> Result<Attr> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(OpKind::Link, reserve, |c| {
            c.op_link(ino, newparent, newname)
        })
    }
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.mutating()?;
        self.shared
            .with_handle(OpKind::Unlink, |c| c.op_unlink(parent, name))
    }
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.mutating()?;
        self.shared
            .with_handle(OpKind::Rmdir, |c| c.op_rmdir(parent, name))
    }
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.rename_as(parent, name, newparent, newname, flags, &Creds::root())
    }
    /// `rename` on behalf of `creds` (see [`Fs::link_as`]).
    pub fn rename_as(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
        creds: &Creds,
    ) -> Result<()> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(OpKind::Rename, reserve, |c| {
            c.op_rename(parent, name, newparent, newname, flags)
        })
    }
    /// Note an open file handle on `ino` (keeps an unlinked inode alive).
    pub fn open(&self, ino: Ino) -> Result<()> {
        self.shared.read(|c| {
            c.live_inode(ino)?;
            *c.open_counts.entry(ino).or_insert(0) += 1;
            Ok(())
        })
    }
    /// Whether an inode without links lives on, kept by open handles (the
    /// orphan list is not empty): its space comes back at its last
    /// release.
    pub fn has_orphans(&self) -> Result<bool> {
        self.shared
            .read(|c| Ok(c.sb32(crate::layout::sb::LAST_ORPHAN)? != 0))
    }
    /// Drop an open handle; the last close of an unlinked inode frees it.
    pub fn release(&self, ino: Ino) -> Result<()> {
        self.release_n(ino, 1)
    }
    /// Drop `n` handles on `ino` at once (the FUSE adapter's lookup
    /// references, forgotten by the kernel in one FORGET). More than are
    /// held is EBADF, after dropping all that are: the inode is not kept
    /// alive by a count that went wrong.
    pub fn release_n(&self, ino: Ino, n: u64) -> Result<()> {
        let (evict, over) = self.shared.read(|c| {
            let held = c.open_counts.get(&ino).copied().unwrap_or(0);
            if held == 0 {
                return Err(errno(libc::EBADF));
            }
            if u64::from(held) <= n {
                c.open_counts.remove(&ino);
                Ok((unlinked_to_free(c, ino)?, u64::from(held) < n))
            } else {
                c.open_counts.insert(ino, held - n as u32);
                Ok((false, false))
            }
        })?;
        self.evict_if_unlinked(ino, evict)?;
        if over {
            return Err(errno(libc::EBADF));
        }
        Ok(())
    }
    /// Drop every open handle (the server of a mount whose kernel side is
    /// gone: no handle and no lookup outlives the session) and free the
    /// unlinked inodes they kept alive, as the kernel's ext4 frees them
    /// when the last user closes them before an unmount.
    pub fn release_all(&self) -> Result<()> {
        let held: Vec<Ino> = self.shared.read(|c| {
            let mut inos: Vec<Ino> = c.open_counts.keys().copied().collect();
            inos.sort_unstable();
            Ok(inos)
        })?;
        for ino in held {
            let evict = self.shared.read(|c| {
                if c.open_counts.remove(&ino).is_none() {
                    return Ok(false);
                }
                unlinked_to_free(c, ino)
            })?;
            self.evict_if_unlinked(ino, evict)?;
        }
        Ok(())
    }
    /// The last handle on `ino` went: free it if it has no links left.
    fn evict_if_unlinked(&self, ino: Ino, evict: bool) -> Result<()> {
        if evict {
            self.shared.with_handle(OpKind::Evict, |c| {
                // Opened again meanwhile? Then it stays.
                if c.open_counts.contains_key(&ino) {
                    return Ok(());
                }
                let i = c.read_inode(ino)?;
                if i.links == 0 && i.mode != 0 {
                    c.evict(ino)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }
    /// Read up to `size` bytes at `offset`. What the cache holds is copied
    /// under the core's lock; the uncached runs of file data are read from
    /// the device after the lock is released, so concurrent reads (the
    /// kernel's readahead keeps several in flight) and other operations
    /// overlap with the device. A block freed meanwhile may already hold
    /// another file's bytes, so if any block was freed since the lock was
    /// released the read is done again, wholly under the lock.
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.read_unlocked_then(ino, offset, size, || {})
    }

    /// [`Fs::read`] into `buf`, as many bytes as it holds; returns how many
    /// it filled. FUSE over io_uring lends the request's own buffer, so a
    /// read's bytes go from the device to the kernel with no copy between.
    pub fn read_into(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.read_into_unlocked_then(ino, offset, buf, || {})
    }

    /// [`Fs::read`], running `between` after the lock is released and
    /// before the device is read (tests put a racing operation there).
    #[doc(hidden)]
    pub fn read_unlocked_then(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        between: impl FnOnce(),
    ) -> Result<Vec<u8>> {
        let (mut out, runs, frees) = self.shared.read(|c| {
            c.file_read_deferred(ino, offset, size)
                .map_err(|e| c.nofs_eio(e))
        })?;
        if runs.is_empty() {
            return Ok(out);
        }
        between();
        self.read_runs(&runs, offset, &mut out)?;
        if self.shared.read(|c| Ok(c.frees()))? != frees {
            return self.shared.read(|c| c.file_read(ino, offset, size));
        }
        Ok(out)
    }

    /// [`Fs::read_into`], with `between` as in [`Fs::read_unlocked_then`].
    #[doc(hidden)]
    pub fn read_into_unlocked_then(
        &self,
        ino: Ino,
        offset: u64,
        buf: &mut [u8],
        between: impl FnOnce(),
    ) -> Result<usize> {
        let (n, runs, frees) = self.shared.read(|c| {
            c.file_read_deferred_into(ino, offset, buf)
                .map_err(|e| c.nofs_eio(e))
        })?;
        if runs.is_empty() {
            return Ok(n);
        }
        between();
        self.read_runs(&runs, offset, &mut buf[..n])?;
        if self.shared.read(|c| Ok(c.frees()))? != frees {
            return self.shared.read(|c| c.file_read_into(ino, offset, buf));
        }
        Ok(n)
    }

    /// Read a read's uncached runs from the device into `out`, the file's
    /// bytes from `offset` on.
    fn read_runs(&self, runs: &[DeferredRead], offset: u64, out: &mut [u8]) -> Result<()> {
        let bs = u64::from(self.shared.dev.block_size());
        // A long read is a wait the server may serve others during; a short
        // one (a small file's blocks) costs less than handing the requests
        // to another worker and back (`crate::waiting`).
        let bytes: u64 = runs.iter().map(|r| r.blocks * bs).sum();
        let _waiting =
            (bytes >= crate::waiting::READ_WAIT_BYTES).then(crate::waiting::Waiting::begin);
        let end = offset + out.len() as u64;
        let mut bounce = Vec::new();
        for r in runs {
            // The run's blocks wholly inside the reply are read straight
            // into it, in one device request; only a block cut by the
            // reply's start or end goes through a block-sized buffer.
            let whole_from = offset.saturating_sub(r.byte).div_ceil(bs).min(r.blocks);
            let whole_to = (end.saturating_sub(r.byte) / bs)
                .min(r.blocks)
                .max(whole_from);
            if whole_to > whole_from {
                let at = (r.byte + whole_from * bs - offset) as usize;
                let n = ((whole_to - whole_from) * bs) as usize;
                self.shared.dev.read(
                    r.pblk + whole_from,
                    &mut out[at..at + n],
                    ordo_dev::BlockClass::Data,
                )?;
            }
            for j in (0..whole_from).chain(whole_to..r.blocks) {
                bounce.resize(bs as usize, 0);
                self.shared
                    .dev
                    .read(r.pblk + j, &mut bounce, ordo_dev::BlockClass::Data)?;
                crate::state::Core::copy_out(bs, &bounce, r.byte + j * bs, offset, out);
            }
        }
        Ok(())
    }
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_as(ino, offset, data, &Creds::root())
    }
    /// `write` on behalf of `creds`: a caller who may not use the reserved
    /// blocks gets a short write, or ENOSPC, where root would not. A write
    /// that runs out of space returns the bytes it wrote (short write);
    /// ENOSPC only when it wrote none.
    pub fn write_as(&self, ino: Ino, offset: u64, data: &[u8], creds: &Creds) -> Result<u32> {
        self.write_inner(ino, offset, data, creds, false)
    }
    /// [`Fs::write_as`] by a caller without `CAP_FSETID` whose write must
    /// also drop the file's set-user-ID bit (and set-group-ID, by
    /// [`kill_suid_sgid`](crate::types::kill_suid_sgid)'s rule), in the same
    /// handle as the first bytes, so no crash keeps new bytes with the old
    /// privileges. This is FUSE's `FUSE_WRITE_KILL_SUIDGID`: on a direct-I/O
    /// handle the kernel leaves the clearing to the file system.
    pub fn write_killing_suid_as(
        &self,
        ino: Ino,
        offset: u64,
        data: &[u8],
        creds: &Creds,
    ) -> Result<u32> {
        self.write_inner(ino, offset, data, creds, true)
    }
    fn write_inner(
        &self,
        ino: Ino,
        offset: u64,
        data: &[u8],
        creds: &Creds,
        kill_suid: bool,
    ) -> Result<u32> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        if data.is_empty() {
            self.getattr(ino)?;
            return Ok(0);
        }
        let chunk = self.write_chunk;
        let mut done = 0usize;
        while done < data.len() {
            let end = (done + chunk).min(data.len());
            let r = self.shared.with_handle_as(OpKind::Write, reserve, |c| {
                if kill_suid && done == 0 {
                    c.kill_suid_for_write(ino, creds)?;
                }
                c.file_write(ino, offset + done as u64, &data[done..end])
            });
            match r {
                Ok(n) => {
                    let want = end - done;
                    done += n as usize;
                    // Out of space (after the commit and retry that frees
                    // held-back blocks), or at the largest file size.
                    if (n as usize) < want {
                        break;
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done as u32)
    }
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, flags: FallocFlags) -> Result<()> {
        self.fallocate_as(ino, offset, len, flags, &Creds::root())
    }
    /// `fallocate` on behalf of `creds` (see [`Fs::write_as`]).
    pub fn fallocate_as(
        &self,
        ino: Ino,
        offset: u64,
        len: u64,
        flags: FallocFlags,
        creds: &Creds,
    ) -> Result<()> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        let op = if flags.punch_hole {
            OpKind::PunchHole
        } else if flags.collapse_range {
            OpKind::CollapseRange
        } else if flags.insert_range {
            OpKind::InsertRange
        } else {
            OpKind::Fallocate
        };
        let shifts = matches!(op, OpKind::CollapseRange | OpKind::InsertRange);
        if shifts {
            // The blocks after the offset are about to be named at other
            // offsets. A block overwritten in place and not yet on disk
            // would, after a crash, show its old bytes at the new offset:
            // as ext4 writes the file's dirty pages out before it shifts,
            // the file's data is made durable first.
            self.fsync(ino, true)?;
        }
        self.shared
            .with_handle_as(op, reserve, |c| c.file_fallocate(ino, offset, len, flags))?;
        if shifts {
            // The blocks after the range now sit at other offsets, in
            // place: a write through the new mappings must not reach a
            // block while the old mappings are what the disk still holds
            // (a crash would show the new bytes at the old offsets). Make
            // the change durable before the call returns, as ext4 commits
            // before these modes under data=journal.
            self.fsync(ino, false)?;
        }
        Ok(())
    }
    pub fn seek(&self, ino: Ino, offset: u64, whence: SeekWhence) -> Result<u64> {
        self.shared.read(|c| c.file_seek(ino, offset, whence))
    }
    pub fn fsync(&self, ino: Ino, datasync: bool) -> Result<()> {
        let stream = self.getstream();
        if self.shared.streams().flags(stream) & crate::stream::IGNORE_FSYNC != 0 {
            // ccfs's IGNORE_FSYNC: the stream's order is what the caller
            // relies on; streamsync makes it durable. The inode must
            // still exist, as for a real fsync.
            return self.shared.read(|c| c.live_inode(ino).map(|_| ()));
        }
        if self.fsync_is_osync {
            return self.osync(ino);
        }
        self.commit_inode(ino, stream.0, true, |p, io, inos| {
            p.fsync_in(stream.0, inos, datasync, io)
        })
    }

    /// An ordering point for `ino` (OptFS): what was done before the call
    /// reaches the disk before what is done after it; it need not wait
    /// for durability. On protocols without a native osync
    /// ([`Fs::native_durability_calls`]) it is an fsync, which also makes
    /// the file durable. A no-op on a read-only mount, as fsync.
    pub fn osync(&self, ino: Ino) -> Result<()> {
        let native = self
            .native_durability_calls()
            .contains(DurabilityCalls::OSYNC);
        let stream = self.getstream().0;
        self.commit_inode(ino, stream, !native, |p, io, inos| {
            if native {
                p.osync(ino, io)
            } else {
                p.fsync_in(stream, inos, false, io)
            }
        })
    }

    /// Make `ino` durable (OptFS's dsync): an fsync on the protocols
    /// without a native one. A no-op on a read-only mount, as fsync.
    pub fn dsync(&self, ino: Ino) -> Result<()> {
        let native = self
            .native_durability_calls()
            .contains(DurabilityCalls::DSYNC);
        let stream = self.getstream().0;
        self.commit_inode(ino, stream, !native, |p, io, inos| {
            if native {
                p.dsync(ino, io)
            } else {
                p.fsync_in(stream, inos, false, io)
            }
        })
    }

    /// Make every change made in stream `stream` durable (ccfs): a full
    /// sync on the protocols without a native one. EINVAL for a stream
    /// the mount does not know; a no-op on a read-only mount, as sync.
    pub fn streamsync(&self, stream: StreamId) -> Result<()> {
        if !self.shared.streams().exists(stream) {
            return Err(errno(libc::EINVAL));
        }
        if self.read_only {
            return Ok(());
        }
        // As sync: the summary counters go into the superblock first, so
        // that the fallback is exactly a sync.
        self.shared
            .with_handle(OpKind::Internal, |c| c.update_sb_counters())?;
        self.shared
            .plan(|c| c.plan_with(|p, io| p.streamsync(stream.0, io)))
    }

    /// Put the calling thread in stream `name` (made on first use) and
    /// return its id: every later operation of the thread runs in it.
    /// ENAMETOOLONG past [`STREAM_NAME_MAX_BYTES`](crate::stream::STREAM_NAME_MAX_BYTES)
    /// bytes, EINVAL for an empty name or one with a NUL.
    pub fn setstream(&self, name: &[u8]) -> Result<StreamId> {
        let mut s = self.shared.streams();
        let id = s.intern(name)?;
        s.set(Caller::current_thread(), id)?;
        Ok(id)
    }

    /// The calling thread's stream ([`StreamId::DEFAULT`] until set).
    pub fn getstream(&self) -> StreamId {
        self.shared.streams().of(Caller::current_thread())
    }

    /// Put the calling thread in stream `id`, known already (EINVAL
    /// otherwise). For a server that serves requests of other callers on
    /// its threads (the FUSE adapter): it keeps its own map from
    /// requester to stream and sets the serving thread's stream before
    /// each request, so the handles of the request record the
    /// requester's stream.
    pub fn set_thread_stream(&self, id: StreamId) -> Result<()> {
        self.shared.streams().set(Caller::current_thread(), id)
    }

    /// Set the flags of stream `id` ([`IGNORE_FSYNC`](crate::stream::IGNORE_FSYNC));
    /// EINVAL for an unknown stream or flag.
    pub fn set_stream_flags(&self, id: StreamId, flags: u32) -> Result<()> {
        self.shared.streams().set_flags(id, flags)
    }

    /// The flags of stream `id` (0 for a stream the mount does not know).
    pub fn stream_flags(&self, id: StreamId) -> u32 {
        self.shared.streams().flags(id)
    }

    /// The id of stream `name`, made on first use (same errors as
    /// [`Fs::setstream`]), without changing any caller's stream.
    pub fn stream_id(&self, name: &[u8]) -> Result<StreamId> {
        self.shared.streams().intern(name)
    }

    /// The id of stream `name` if the mount knows it.
    pub fn find_stream(&self, name: &[u8]) -> Option<StreamId> {
        self.shared.streams().find(name)
    }

    /// The name of stream `id`, if the mount knows it.
    pub fn stream_name(&self, id: StreamId) -> Option<Vec<u8>> {
        self.shared.streams().name(id).map(<[u8]>::to_vec)
    }

    /// How many operation handles have run in stream `id` since the mount
    /// (`None` for a stream the mount does not know): what the protocol
    /// was told in [`HandleInfo::stream`](crate::update::HandleInfo::stream).
    pub fn stream_handles(&self, id: StreamId) -> Option<u64> {
        self.shared.streams().handles(id)
    }

    /// Which of osync, dsync and streamsync the mount's protocol
    /// implements natively; the others fall back to fsync or sync.
    pub fn native_durability_calls(&self) -> DurabilityCalls {
        self.shared.lock().proto.native_durability_calls()
    }

    /// Commit for one inode through `call` (fsync, osync, dsync), from
    /// `stream`. With `group`, on the protocols whose commits cover
    /// everything before them (or, with `group_commit_per_stream`,
    /// everything of the caller's stream), the call shares the commit of
    /// concurrent callers (of its stream): only for calls whose guarantee
    /// is an fsync's, since a waiter returns when another caller's commit
    /// is done. `call` gets the files of every caller the commit serves,
    /// the leader's first.
    fn commit_inode(
        &self,
        ino: Ino,
        stream: u32,
        group: bool,
        call: impl Fn(&mut dyn protocol::Protocol, &mut protocol::Io, &[Ino]) -> Result<()>,
    ) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        // The commit's writes, or another caller's commit, are waited for.
        let _waiting = crate::waiting::Waiting::begin();
        let Some((group, cv)) = self.shared.group.as_ref().filter(|_| group) else {
            return self.shared.plan(|c| {
                c.live_inode(ino)?;
                c.plan_with(|p, io| call(p, io, &[ino]))
            });
        };
        // The caller's own errors first: a leader's commit must not fail
        // for a reason that is not its waiters'.
        self.shared.read(|c| c.live_inode(ino).map(|_| ()))?;
        let mut gs = group.lock().unwrap_or_else(|e| e.into_inner());
        // Every change this caller made is in the cache now; a commit that
        // *starts* later (number > arrival) covers them, and names its file.
        let arrival = gs.of(stream).started;
        loop {
            let g = gs.of(stream);
            if g.done > arrival {
                return match g.done_errno {
                    None => Ok(()),
                    Some(e) => Err(errno(e)),
                };
            }
            if !g.leading {
                break;
            }
            g.waiting += 1;
            g.inodes.push(ino);
            gs = cv.wait(gs).unwrap_or_else(|e| e.into_inner());
            gs.of(stream).waiting -= 1;
        }
        let g = gs.of(stream);
        g.leading = true;
        g.started += 1;
        let me = g.started;
        let mut inos = std::mem::take(&mut g.inodes);
        inos.retain(|&i| i != ino);
        inos.sort_unstable();
        inos.dedup();
        inos.insert(0, ino);
        drop(gs);
        let r = self
            .shared
            .plan(|c| c.plan_with(|p, io| call(p, io, &inos)));
        let mut gs = group.lock().unwrap_or_else(|e| e.into_inner());
        let g = gs.of(stream);
        debug_assert!(g.leading && g.started == me);
        g.leading = false;
        g.done = me;
        g.done_errno = r.as_ref().err().map(|e| e.errno());
        cv.notify_all();
        r
    }
    /// How many fsyncs are waiting for a group commit led by another one
    /// (always 0 for the protocols without group commit).
    pub fn fsync_waiters(&self) -> usize {
        self.shared.group.as_ref().map_or(0, |(g, _)| {
            let g = g.lock().unwrap_or_else(|e| e.into_inner());
            g.by_key.values().map(|g| g.waiting).sum()
        })
    }
    pub fn sync(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.shared
            .with_handle(OpKind::Internal, |c| c.update_sb_counters())?;
        self.shared.plan(|c| c.plan_with(|p, io| p.sync(io)))
    }
    pub fn statfs(&self) -> Result<StatFs> {
        self.shared.read(|c| {
            let (free_blocks, free_inodes) = c.free_totals()?;
            // Blocks written and not placed yet are used (ext4 counts its
            // delayed blocks so too).
            let free_blocks = free_blocks.saturating_sub(c.delayed.blocks());
            let s = &c.sbi;
            let mut overhead = s.first_data_block as u64;
            for g in 0..s.groups_count() {
                overhead += s.super_overhead_blocks(g) + 2 + s.inode_table_blocks() as u64;
            }
            let journal = if s.journal_inum != 0 {
                let ji = s.journal_inum;
                c.read_inode(ji)
                    .map(|i| i.sectors / (c.bs as u64 / 512))
                    .unwrap_or(0)
            } else {
                0
            };
            let s = &c.sbi;
            let blocks = s.blocks_count.saturating_sub(overhead + journal);
            Ok(StatFs {
                block_size: c.bs,
                blocks,
                blocks_free: free_blocks,
                blocks_avail: free_blocks.saturating_sub(s.r_blocks_count),
                files: s.inodes_count as u64,
                files_free: free_inodes,
                name_max: crate::ops::NAME_MAX as u32,
            })
        })
    }
    /// Entries of directory `ino` after cookie `offset` (0 = from the start,
    /// including "." and ".."), at most `max` of them.
    pub fn readdir(&self, ino: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        self.shared.read(|c| {
            c.live_dir(ino)?;
            c.dir_read(ino, offset, max).map_err(|e| c.nofs_eio(e))
        })
    }
    /// Check `mask` (R_OK=4, W_OK=2, X_OK=1) for `creds` as the kernel does.
    pub fn access(&self, ino: Ino, mask: u32, creds: &Creds) -> Result<()> {
        let attr = self.getattr(ino)?;
        if mask & 2 != 0
            && self.read_only
            && attr.kind != FileType::CharDevice
            && attr.kind != FileType::BlockDevice
            && attr.kind != FileType::Fifo
            && attr.kind != FileType::Socket
        {
            return Err(errno(libc::EROFS));
        }
        let perm = attr.perm as u32;
        if creds.uid == 0 {
            // Root may read and write anything; execute needs some x bit
            // (or a directory).
            if mask & 1 != 0 && attr.kind != FileType::Directory && perm & 0o111 == 0 {
                return Err(errno(libc::EACCES));
            }
            return Ok(());
        }
        let in_group = |g: u32| creds.gid == g || creds.groups.contains(&g);
        // An access ACL decides when there is one (posix_acl_permission),
        // as it does for the kernel through `FUSE_POSIX_ACL`.
        if let Ok(v) = self.getxattr(ino, ordo_format::xattr::ACL_ACCESS_NAME) {
            let acl = ordo_format::xattr::Acl::from_xattr(&v)?;
            if acl_permits(&acl, attr.uid, attr.gid, creds, (mask & 7) as u16) {
                return Ok(());
            }
            return Err(errno(libc::EACCES));
        }
        let bits = if creds.uid == attr.uid {
            perm >> 6
        } else if in_group(attr.gid) {
            perm >> 3
        } else {
            perm
        } & 7;
        if bits & mask != mask & 7 {
            return Err(errno(libc::EACCES));
        }
        Ok(())
    }
    /// Run the protocol's periodic write-back now (what the timer does).
    pub fn write_back(&self) -> Result<()> {
        self.shared.write_back(WriteBackReason::Timer)
    }
    /// The device's counters.
    pub fn counters(&self) -> Counters {
        self.shared.dev.counters()
    }
    /// The protocol's name and statistics (with backlinks, the checks'
    /// and the scanners' figures too).
    pub fn protocol_stats(&self) -> (String, Vec<(String, u64)>) {
        let c = self.shared.lock();
        let mut stats = c.proto.stats();
        if c.backlinks {
            stats.extend(c.nofs.pairs());
            stats.push(("nofs_scan_pending".into(), u64::from(c.scan_needed)));
            // The metadata scanner's progress: the next inode it examines,
            // of the last.
            stats.push(("nofs_scan_next_inode".into(), u64::from(c.meta_scan_next())));
            stats.push(("nofs_scan_last_inode".into(), u64::from(c.sbi.inodes_count)));
        }
        if c.delalloc_on {
            stats.push(("delayed_blocks".into(), c.delayed.blocks()));
            stats.push(("delayed_blocks_placed".into(), c.delayed.settled_blocks));
        }
        (c.proto.name().to_string(), stats)
    }

    /// Run the scanners to completion now, if this mount needs them (an
    /// unclean image under a protocol with backlinks); a no-op otherwise.
    /// They otherwise run when the first operation that may allocate
    /// starts.
    pub fn scan_to_end(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let plans = {
            let mut c = self.shared.lock();
            c.scan_if_needed()?;
            self.shared.take_plans(&mut c)
        };
        self.shared.run(plans)
    }

    /// Run the metadata scanner over at most `budget` more inodes, as the
    /// background thread does between operations (it writes nothing; the
    /// rest of the scan runs at [`Fs::scan_to_end`] or the first operation
    /// that may allocate). Returns whether every inode has been examined
    /// (true, too, when no scan is needed).
    pub fn scan_step(&self, budget: u64) -> Result<bool> {
        if self.read_only {
            return Ok(true);
        }
        self.shared.lock().meta_scan_step(budget)
    }

    /// Whether the scanners still have to run on this mount.
    pub fn scan_pending(&self) -> bool {
        self.shared.lock().scan_needed
    }

    /// Set up the owner table at mount (backlinks): create it as reserved
    /// inode 5 if the image has none, hand it to the protocol, rebuild the
    /// records (and backlinks) if the protocol does not trust it, and
    /// decide whether the scanners must run.
    pub(crate) fn attach_owner_table(&self, before: (u32, u32), was_clean: bool) -> Result<()> {
        let (created, blocks, now) = {
            let plans;
            let r = {
                let mut c = self.shared.lock();
                c.begin(crate::update::OpKind::Internal, 0);
                let r = c.ensure_owner_table(was_clean);
                let e = c.end();
                plans = self.shared.take_plans(&mut c);
                let r = r.and_then(|v| e.map(|()| v));
                r.and_then(|(created, blocks)| {
                    let mnt = c.sb32(crate::layout::sb::MNT_COUNT)? & 0xffff;
                    let mtime = c.sb32(crate::layout::sb::MTIME)?;
                    Ok((created, blocks, (mnt, mtime)))
                })
            };
            self.shared.run(plans)?;
            r?
        };
        if blocks.is_empty() {
            return Ok(());
        }
        let trusted = {
            let mut c = self.shared.lock();
            let dev = self.shared.dev.clone();
            c.proto
                .attach_owner_table(&blocks, before, now, dev.as_ref())?
        };
        if !trusted || created {
            self.shared
                .with_handle(crate::update::OpKind::Internal, |c| {
                    c.rebuild_owner_records()?;
                    c.rebuild_backlinks()
                })?;
            self.sync()?;
        }
        {
            let mut c = self.shared.lock();
            c.scan_needed = !was_clean && !c.proto.trusts_allocation_state();
        }
        // Nothing orders the superblock's "not clean" mark before the
        // writes that follow: it is made durable now, before any, or a
        // crash image could look cleanly unmounted and skip the scanners.
        self.sync()
    }
    /// Buffer-cache figures (cached, peak and bound bytes, dirty blocks).
    pub fn cache_stats(&self) -> CacheStats {
        self.shared.lock().cache.stats()
    }
    /// Directory-index figures: names held now, the bound on them, and
    /// indexes dropped to stay within it.
    pub fn dir_index_stats(&self) -> (usize, usize, u64) {
        let c = self.shared.lock();
        (c.dir_names, c.dir_names_bound, c.dir_index_evictions)
    }
    /// Delayed allocation (`delalloc.rs`): blocks delayed now, blocks
    /// given their places since mount, and the settlings that placed any.
    pub fn delalloc_stats(&self) -> (u64, u64, u64) {
        let c = self.shared.lock();
        (
            c.delayed.blocks(),
            c.delayed.settled_blocks,
            c.delayed.settles,
        )
    }
    /// Block size of the file system in bytes.
    /// Data blocks mapped by regular file `ino` (written and unwritten
    /// extents; not the extent tree's own blocks): what FIEMAP adds up.
    pub fn mapped_blocks(&self, ino: Ino) -> Result<u64> {
        self.shared.read(|c| c.file_mapped_blocks(ino))
    }
    pub fn block_size(&self) -> u32 {
        self.shared.lock().bs
    }
}

/// The kernel's `posix_acl_permission` for a caller other than root: the
/// owner entry for the owner, a named user entry (under the mask), any
/// matching group entry that grants `want` (under the mask), else other.
fn acl_permits(
    acl: &ordo_format::xattr::Acl,
    owner: u32,
    group: u32,
    creds: &Creds,
    want: u16,
) -> bool {
    use ordo_format::xattr::acl_tag as tag;
    let mask = acl
        .entries
        .iter()
        .find(|e| e.tag == tag::MASK)
        .map_or(7, |e| e.perm);
    let in_group = |g: u32| creds.gid == g || creds.groups.contains(&g);
    let grants = |perm: u16| perm & want == want;
    if creds.uid == owner {
        return acl
            .entries
            .iter()
            .any(|e| e.tag == tag::USER_OBJ && grants(e.perm));
    }
    if let Some(e) = acl
        .entries
        .iter()
        .find(|e| e.tag == tag::USER && e.id == creds.uid)
    {
        return grants(e.perm & mask);
    }
    let groups: Vec<u16> = acl
        .entries
        .iter()
        .filter(|e| {
            (e.tag == tag::GROUP_OBJ && in_group(group)) || (e.tag == tag::GROUP && in_group(e.id))
        })
        .map(|e| e.perm & mask)
        .collect();
    if !groups.is_empty() {
        return groups.into_iter().any(grants);
    }
    acl.entries
        .iter()
        .any(|e| e.tag == tag::OTHER && grants(e.perm))
}

/// Whether `creds` may allocate the blocks reserved with `mkfs -m`
/// (`s_r_blocks_count`): root, the reserved uid (`s_def_resuid`) or a
/// member of the reserved group (`s_def_resgid`, when it is not root's),
/// as ext4's `ext4_has_free_clusters`.
fn may_use_reserve(ids: ReserveIds, creds: &Creds) -> bool {
    creds.uid == 0
        || creds.uid == ids.uid
        || (ids.gid != 0 && (creds.gid == ids.gid || creds.groups.contains(&ids.gid)))
}

/// Whether `ino`, whose last handle just went, is an unlinked inode to
/// free now (a read-only mount frees nothing: the next read-write mount's
/// orphan processing does).
fn unlinked_to_free(c: &mut crate::state::Core, ino: Ino) -> Result<bool> {
    let i = c.read_inode(ino)?;
    Ok(i.links == 0 && i.mode != 0 && !c.read_only)
}

fn op_of_setattr(set: &SetAttr) -> OpKind {
    if set.size.is_some() {
        OpKind::Truncate
    } else {
        OpKind::SetAttr
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        self.stop_background();
    }
}
