//! The FUSE floor: a file system that stores nothing, served exactly as
//! ordo is served, so that a benchmark can show what any FUSE file system
//! pays per request before it does any work of its own.
//!
//! [`FloorFs`] is mounted by the same function as ordo ([`crate::session`]:
//! the same mount options, `default_permissions`, worker threads and cloned
//! descriptors), asks the kernel for the same capabilities at `init`
//! ([`crate::request_capabilities`]: atomic O_TRUNC, readdirplus, parallel
//! dirops, POSIX ACLs, DONT_MASK), gives the same attribute and entry TTL,
//! answers a missing name with a negative entry (node 0) as ordo does, and
//! answers FLUSH with ENOSYS as ordo does, so that the kernel sends it the
//! same requests it sends ordo.
//!
//! What it keeps is what the answers need and nothing else: the namespace
//! (parent and name to inode, inode to type, mode, owner, link count, size
//! and times) in memory, behind one lock. File data is discarded: a write
//! answers with its length and grows the size, a read answers with zeros up
//! to the size. There are no extended attributes (getxattr answers ENODATA,
//! listxattr an empty list, setxattr EOPNOTSUPP). Nothing survives the
//! mount.
//!
//! Inode numbers are never reused (a counter), so generation numbers are
//! all 0. An inode lives while it has a name or an open handle, as in
//! ordo.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, Session, TimeOrNow, WriteFlags,
};
use ordo_fs::SeekWhence;

use crate::{
    falloc_flags, name_bytes, negative_entry_attr, rename_flags, request_capabilities, seek_whence,
    session, xattr_reply, MountConfig, NAME_MAX_BYTES,
};

/// The subtype of a floor mount (`fuse.ordo-floor` in `/proc/mounts`).
pub const FLOOR_SUBTYPE: &str = "ordo-floor";
/// The source shown in `/proc/mounts`.
pub const FLOOR_FSNAME: &str = "fuse-floor";

/// FUSE's node id of the root, used as its inode number too.
const ROOT: u64 = 1;
/// The block size reported by `stat` and `statfs`.
const BLOCK_SIZE: u32 = 4096;
/// The size of a directory, as ext4 shows an empty one.
const DIR_SIZE: u64 = 4096;
/// The largest file size (ext4's with 4 KiB blocks, 16 TiB); a write or
/// fallocate beyond it gets EFBIG.
const MAX_FILE_BYTES: u64 = 1 << 44;
/// ext4's link limit; a link beyond it gets EMLINK.
const MAX_LINKS: u32 = 65_000;
/// What `statfs` reports: 1 TiB of 4 KiB blocks, all free (nothing is
/// stored), and 2^32 inodes.
const STATFS_BLOCKS: u64 = 1 << 28;
const STATFS_FILES: u64 = 1 << 32;
/// The cookies of "." and ".." in a directory listing; names get cookies
/// from `FIRST_COOKIE` up, in the order they were added.
const DOT_COOKIE: u64 = 1;
const DOTDOT_COOKIE: u64 = 2;
const FIRST_COOKIE: u64 = 3;
/// Zeros for reads (a read is at most `max_read`, 128 KiB by default;
/// larger ones get a buffer of their own).
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

type Res<T> = Result<T, Errno>;

/// The entries of a directory. Each name gets a cookie when it is added:
/// a listing resumes after the cookie it stopped at, so names removed or
/// added while a directory is listed do not make others be skipped.
#[derive(Debug)]
struct Dir {
    /// The parent directory (the root is its own).
    parent: u64,
    /// Name -> (inode, cookie).
    names: HashMap<Box<[u8]>, (u64, u64)>,
    /// Cookie -> (name, inode), for listing in a stable order.
    order: BTreeMap<u64, (Box<[u8]>, u64)>,
    next_cookie: u64,
}

impl Dir {
    fn new(parent: u64) -> Dir {
        Dir {
            parent,
            names: HashMap::new(),
            order: BTreeMap::new(),
            next_cookie: FIRST_COOKIE,
        }
    }

    fn get(&self, name: &[u8]) -> Option<u64> {
        self.names.get(name).map(|&(ino, _)| ino)
    }

    fn insert(&mut self, name: &[u8], ino: u64) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.names.insert(name.into(), (ino, cookie));
        self.order.insert(cookie, (name.into(), ino));
    }

    fn remove(&mut self, name: &[u8]) -> Option<u64> {
        let (ino, cookie) = self.names.remove(name)?;
        self.order.remove(&cookie);
        Some(ino)
    }

    /// Point `name` at `ino` in place (rename's exchange).
    fn repoint(&mut self, name: &[u8], ino: u64) {
        if let Some((i, cookie)) = self.names.get_mut(name) {
            *i = ino;
            if let Some((_, j)) = self.order.get_mut(cookie) {
                *j = ino;
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// One inode: what `stat` shows, and a directory's entries or a symlink's
/// target.
#[derive(Debug)]
struct Node {
    kind: FileType,
    perm: u16,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    rdev: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    crtime: SystemTime,
    /// Open handles not yet released.
    open: u32,
    /// The kernel's references (entries given and not yet forgotten),
    /// counted only when the kernel opens files itself
    /// ([`FloorFs`]'s `kernel_opens`), where they keep an unlinked inode
    /// alive as open handles do otherwise. Atomic: taken under the
    /// namespace's read lock.
    refs: AtomicU64,
    /// The entries, for a directory.
    dir: Option<Box<Dir>>,
    /// The target, for a symlink.
    target: Box<[u8]>,
}

impl Node {
    fn attr(&self, ino: u64) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size: self.size,
            blocks: self.size.div_ceil(512),
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.crtime,
            kind: self.kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            blksize: BLOCK_SIZE,
            flags: 0,
        }
    }

    fn is_dir(&self) -> bool {
        self.dir.is_some()
    }

    fn touch(&mut self, now: SystemTime) {
        self.mtime = now;
        self.ctime = now;
    }
}

/// What a new inode is.
struct NewNode<'a> {
    kind: FileType,
    perm: u16,
    uid: u32,
    gid: u32,
    rdev: u32,
    target: &'a [u8],
}

/// A `setattr` request.
#[derive(Default)]
struct SetAttr {
    perm: Option<u16>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
    ctime: Option<SystemTime>,
}

/// The whole file system: every inode by number.
#[derive(Debug)]
struct Namespace {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

fn time_of(t: TimeOrNow, now: SystemTime) -> SystemTime {
    match t {
        TimeOrNow::Now => now,
        TimeOrNow::SpecificTime(t) => t,
    }
}

impl Namespace {
    /// An empty root directory owned by `uid`/`gid`.
    fn new(uid: u32, gid: u32) -> Namespace {
        let now = SystemTime::now();
        let root = Node {
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid,
            gid,
            size: DIR_SIZE,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            open: 0,
            refs: AtomicU64::new(0),
            dir: Some(Box::new(Dir::new(ROOT))),
            target: Box::default(),
        };
        Namespace {
            nodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
        }
    }

    fn node(&self, ino: u64) -> Res<&Node> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Res<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn attr(&self, ino: u64) -> Res<FileAttr> {
        Ok(self.node(ino)?.attr(ino))
    }

    fn dir(&self, ino: u64) -> Res<&Dir> {
        self.node(ino)?.dir.as_deref().ok_or(Errno::ENOTDIR)
    }

    fn dir_mut(&mut self, ino: u64) -> Res<&mut Dir> {
        self.node_mut(ino)?.dir.as_deref_mut().ok_or(Errno::ENOTDIR)
    }

    /// A directory that may get new names: it exists and is not removed.
    fn live_dir(&self, ino: u64) -> Res<&Dir> {
        let node = self.node(ino)?;
        let dir = node.dir.as_deref().ok_or(Errno::ENOTDIR)?;
        if node.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        Ok(dir)
    }

    /// The inode `name` names in `parent` ("." and ".." included).
    fn lookup(&self, parent: u64, name: &[u8]) -> Res<u64> {
        let dir = self.dir(parent)?;
        match name {
            b"." => Ok(parent),
            b".." => Ok(dir.parent),
            _ => dir.get(name).ok_or(Errno::ENOENT),
        }
    }

    /// A name in `parent` other than "." and "..".
    fn child(&self, parent: u64, name: &[u8]) -> Res<u64> {
        let dir = self.dir(parent)?;
        if name == b"." || name == b".." {
            return Err(Errno::EINVAL);
        }
        dir.get(name).ok_or(Errno::ENOENT)
    }

    /// Forget an inode with neither a name nor an open handle.
    fn maybe_drop(&mut self, ino: u64) {
        if ino == ROOT {
            return;
        }
        if let Some(n) = self.nodes.get(&ino) {
            if n.nlink == 0 && n.open == 0 && n.refs.load(Ordering::Relaxed) == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    /// Touch a directory's mtime and ctime and add `delta` to its link
    /// count.
    fn dir_changed(&mut self, ino: u64, delta: i32, now: SystemTime) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.touch(now);
            n.nlink = n.nlink.saturating_add_signed(delta);
        }
    }

    /// Make `name` in `parent`; its number.
    fn make(&mut self, parent: u64, name: &[u8], new: NewNode) -> Res<u64> {
        let now = SystemTime::now();
        let p = self.node(parent)?;
        let dir = self.live_dir(parent)?;
        if name == b"." || name == b".." || dir.get(name).is_some() {
            return Err(Errno::EEXIST);
        }
        let is_dir = new.kind == FileType::Directory;
        if is_dir && p.nlink >= MAX_LINKS {
            return Err(Errno::EMLINK);
        }
        // A setgid directory gives its group to what is made in it, and
        // its setgid bit to directories.
        let (gid, perm) = if p.perm & 0o2000 != 0 {
            (p.gid, if is_dir { new.perm | 0o2000 } else { new.perm })
        } else {
            (new.gid, new.perm)
        };
        let ino = self.next_ino;
        self.next_ino += 1;
        let node = Node {
            kind: new.kind,
            perm,
            nlink: if is_dir { 2 } else { 1 },
            uid: new.uid,
            gid,
            size: match new.kind {
                FileType::Directory => DIR_SIZE,
                FileType::Symlink => new.target.len() as u64,
                _ => 0,
            },
            rdev: new.rdev,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            open: 0,
            refs: AtomicU64::new(0),
            dir: is_dir.then(|| Box::new(Dir::new(parent))),
            target: new.target.into(),
        };
        self.nodes.insert(ino, node);
        self.dir_mut(parent)?.insert(name, ino);
        self.dir_changed(parent, i32::from(is_dir), now);
        Ok(ino)
    }

    fn unlink(&mut self, parent: u64, name: &[u8]) -> Res<()> {
        let ino = self.child(parent, name)?;
        if self.node(ino)?.is_dir() {
            return Err(Errno::EISDIR);
        }
        let now = SystemTime::now();
        self.dir_mut(parent)?.remove(name);
        self.dir_changed(parent, 0, now);
        let node = self.node_mut(ino)?;
        node.nlink = node.nlink.saturating_sub(1);
        node.ctime = now;
        self.maybe_drop(ino);
        Ok(())
    }

    fn rmdir(&mut self, parent: u64, name: &[u8]) -> Res<()> {
        let ino = self.child(parent, name)?;
        if !self.dir(ino)?.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        let now = SystemTime::now();
        self.dir_mut(parent)?.remove(name);
        self.dir_changed(parent, -1, now);
        let node = self.node_mut(ino)?;
        node.nlink = 0;
        node.ctime = now;
        self.maybe_drop(ino);
        Ok(())
    }

    fn link(&mut self, ino: u64, newparent: u64, newname: &[u8]) -> Res<()> {
        let node = self.node(ino)?;
        if node.is_dir() {
            return Err(Errno::EPERM);
        }
        if node.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        if node.nlink >= MAX_LINKS {
            return Err(Errno::EMLINK);
        }
        let dir = self.live_dir(newparent)?;
        if newname == b"." || newname == b".." || dir.get(newname).is_some() {
            return Err(Errno::EEXIST);
        }
        let now = SystemTime::now();
        self.dir_mut(newparent)?.insert(newname, ino);
        self.dir_changed(newparent, 0, now);
        let node = self.node_mut(ino)?;
        node.nlink += 1;
        node.ctime = now;
        Ok(())
    }

    /// True if `ino` is `dir` or lies below it.
    fn is_within(&self, ino: u64, dir: u64) -> bool {
        let mut at = ino;
        // Each step goes one level up; more steps than inodes means a
        // cycle, which renames never make.
        for _ in 0..=self.nodes.len() {
            if at == dir {
                return true;
            }
            match self.dir(at) {
                Ok(d) if d.parent != at => at = d.parent,
                _ => return false,
            }
        }
        false
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: ordo_fs::RenameFlags,
    ) -> Res<()> {
        let src = self.child(parent, name)?;
        self.live_dir(newparent)?;
        if newname == b"." || newname == b".." {
            return Err(Errno::EINVAL);
        }
        let src_dir = self.node(src)?.is_dir();
        let dst = self.dir(newparent)?.get(newname);
        if flags.noreplace && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        if src_dir && parent != newparent && self.is_within(newparent, src) {
            return Err(Errno::EINVAL);
        }
        let now = SystemTime::now();
        if flags.exchange {
            let dst = dst.ok_or(Errno::ENOENT)?;
            if dst == src {
                return Ok(());
            }
            let dst_dir = self.node(dst)?.is_dir();
            if dst_dir && parent != newparent && self.is_within(parent, dst) {
                return Err(Errno::EINVAL);
            }
            self.dir_mut(parent)?.repoint(name, dst);
            self.dir_mut(newparent)?.repoint(newname, src);
            if parent != newparent {
                // A directory moving across takes its ".." link along.
                let moved = i32::from(src_dir) - i32::from(dst_dir);
                self.dir_changed(parent, -moved, now);
                self.dir_changed(newparent, moved, now);
            } else {
                self.dir_changed(parent, 0, now);
            }
            for (ino, to) in [(src, newparent), (dst, parent)] {
                let node = self.node_mut(ino)?;
                node.ctime = now;
                if let Some(d) = node.dir.as_deref_mut() {
                    d.parent = to;
                }
            }
            return Ok(());
        }
        if let Some(dst) = dst {
            if dst == src {
                // Two names of one inode: rename(2) does nothing.
                return Ok(());
            }
            let dst_node = self.node(dst)?;
            match (src_dir, dst_node.dir.as_deref()) {
                (true, Some(d)) if !d.is_empty() => return Err(Errno::ENOTEMPTY),
                (true, Some(_)) => {}
                (true, None) => return Err(Errno::ENOTDIR),
                (false, Some(_)) => return Err(Errno::EISDIR),
                (false, None) => {}
            }
            self.dir_mut(newparent)?.remove(newname);
            let node = self.node_mut(dst)?;
            node.nlink = if src_dir {
                0
            } else {
                node.nlink.saturating_sub(1)
            };
            node.ctime = now;
            if src_dir {
                self.dir_changed(newparent, -1, now);
            }
            self.maybe_drop(dst);
        }
        self.dir_mut(parent)?.remove(name);
        self.dir_mut(newparent)?.insert(newname, src);
        if parent != newparent {
            let moved = i32::from(src_dir);
            self.dir_changed(parent, -moved, now);
            self.dir_changed(newparent, moved, now);
        } else {
            self.dir_changed(parent, 0, now);
        }
        let node = self.node_mut(src)?;
        node.ctime = now;
        if let Some(d) = node.dir.as_deref_mut() {
            d.parent = newparent;
        }
        Ok(())
    }

    fn setattr(&mut self, ino: u64, set: SetAttr) -> Res<FileAttr> {
        let now = SystemTime::now();
        let node = self.node_mut(ino)?;
        if let Some(size) = set.size {
            if node.is_dir() {
                return Err(Errno::EISDIR);
            }
            if node.kind != FileType::RegularFile {
                return Err(Errno::EINVAL);
            }
            if size > MAX_FILE_BYTES {
                return Err(Errno::EFBIG);
            }
            node.size = size;
            node.mtime = now;
        }
        if let Some(p) = set.perm {
            node.perm = p;
        }
        if let Some(u) = set.uid {
            node.uid = u;
        }
        if let Some(g) = set.gid {
            node.gid = g;
        }
        if let Some(t) = set.atime {
            node.atime = time_of(t, now);
        }
        if let Some(t) = set.mtime {
            node.mtime = time_of(t, now);
        }
        node.ctime = set.ctime.unwrap_or(now);
        Ok(node.attr(ino))
    }

    /// Open `ino` (a directory with `dir`); `truncate` for O_TRUNC.
    fn open(&mut self, ino: u64, dir: bool, truncate: bool) -> Res<FileAttr> {
        let node = self.node_mut(ino)?;
        if dir && !node.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        if truncate && node.kind == FileType::RegularFile {
            node.size = 0;
            node.touch(SystemTime::now());
        }
        node.open = node.open.saturating_add(1);
        Ok(node.attr(ino))
    }

    fn release(&mut self, ino: u64) -> Res<()> {
        let node = self.node_mut(ino)?;
        node.open = node.open.saturating_sub(1);
        self.maybe_drop(ino);
        Ok(())
    }

    /// How many bytes a read of `size` at `offset` returns.
    fn read_len(&self, ino: u64, offset: u64, size: u32) -> Res<usize> {
        let node = self.node(ino)?;
        if node.is_dir() {
            return Err(Errno::EISDIR);
        }
        Ok(node.size.saturating_sub(offset).min(u64::from(size)) as usize)
    }

    fn write(&mut self, ino: u64, offset: u64, len: usize) -> Res<u32> {
        let n = u32::try_from(len).map_err(|_| Errno::EINVAL)?;
        let end = offset
            .checked_add(u64::from(n))
            .filter(|&e| e <= MAX_FILE_BYTES)
            .ok_or(Errno::EFBIG)?;
        let node = self.node_mut(ino)?;
        if node.is_dir() {
            return Err(Errno::EISDIR);
        }
        node.size = node.size.max(end);
        node.touch(SystemTime::now());
        Ok(n)
    }

    fn fallocate(&mut self, ino: u64, offset: u64, length: u64, mode: i32) -> Res<()> {
        let flags = falloc_flags(mode)?;
        let end = offset
            .checked_add(length)
            .filter(|&e| e <= MAX_FILE_BYTES)
            .ok_or(Errno::EFBIG)?;
        let node = self.node_mut(ino)?;
        if node.kind != FileType::RegularFile {
            return Err(Errno::ENODEV);
        }
        if flags.collapse_range || flags.insert_range {
            return Err(Errno::EOPNOTSUPP);
        }
        if !flags.keep_size && end > node.size {
            node.size = end;
            node.touch(SystemTime::now());
        }
        Ok(())
    }

    fn seek(&self, ino: u64, offset: u64, whence: SeekWhence) -> Res<u64> {
        let node = self.node(ino)?;
        if offset >= node.size {
            return Err(Errno::ENXIO);
        }
        // No holes: everything up to the size is data.
        Ok(match whence {
            SeekWhence::Data => offset,
            SeekWhence::Hole => node.size,
        })
    }
}

/// A `fuser::Filesystem` that stores nothing (see the module comment).
#[derive(Debug)]
pub struct FloorFs {
    ns: RwLock<Namespace>,
    ttl: Duration,
    /// A create's handle is served with direct I/O, as ordo's is when the
    /// kernel allows it (set at `init`).
    direct_create: bool,
    /// OPEN is answered with ENOSYS, so the kernel opens and closes regular
    /// files itself (`MountConfig::open_requests` off, as ordo serves it):
    /// the kernel's references then keep an unlinked inode alive.
    kernel_opens: bool,
}

impl FloorFs {
    /// An empty file system owned by the calling user, whose attributes and
    /// names the kernel may cache for `ttl`.
    pub fn new(ttl: Duration) -> FloorFs {
        // SAFETY: geteuid and getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        FloorFs {
            ns: RwLock::new(Namespace::new(uid, gid)),
            ttl,
            direct_create: false,
            kernel_opens: false,
        }
    }

    /// The floor of a mount with `config` (its `open_requests`).
    pub fn for_config(config: &MountConfig) -> FloorFs {
        FloorFs {
            kernel_opens: !config.open_requests,
            ..FloorFs::new(config.attr_ttl)
        }
    }

    /// The handle of a create: counted as an open one, unless the kernel
    /// opens files itself (it may then send no RELEASE for it, and its
    /// reference keeps the inode, as in ordo).
    fn open_created(&self, ns: &mut Namespace, ino: u64, truncate: bool) -> Res<FileAttr> {
        if self.kernel_opens {
            if truncate {
                ns.setattr(
                    ino,
                    SetAttr {
                        size: Some(0),
                        ..SetAttr::default()
                    },
                )?;
            }
            return ns.attr(ino);
        }
        ns.open(ino, false, truncate)
    }

    /// One more kernel reference on `ino` when the kernel opens files
    /// itself, taken before the reply that gives it.
    fn hold(&self, ns: &Namespace, ino: u64) {
        if self.kernel_opens && ino != ROOT {
            if let Ok(n) = ns.node(ino) {
                n.refs.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Namespace> {
        self.ns.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Namespace> {
        self.ns.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answer with an entry; `ns` holds the node (its reference is taken).
    fn entry(&self, ns: &Namespace, reply: ReplyEntry, result: Res<FileAttr>) {
        match result {
            Ok(attr) => {
                self.hold(ns, attr.ino.0);
                reply.entry(&self.ttl, &attr, Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    fn empty(reply: ReplyEmpty, result: Res<()>) {
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Make a node and answer with its entry.
    fn make(&self, reply: ReplyEntry, parent: INodeNo, name: &OsStr, new: NewNode) {
        let mut ns = self.write();
        let result = name_bytes(name).and_then(|name| {
            let ino = ns.make(parent.0, name, new)?;
            ns.attr(ino)
        });
        self.entry(&ns, reply, result);
    }

    /// The directory entries of `ino` after `offset`, each given to `add`
    /// (name, inode, its cookie, its node) until `add` says the reply is
    /// full.
    fn list(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(&[u8], u64, u64, &Node) -> bool,
    ) -> Res<()> {
        let ns = self.read();
        let dir = ns.dir(ino)?;
        for (name, target, cookie) in [
            (&b"."[..], ino, DOT_COOKIE),
            (b"..", dir.parent, DOTDOT_COOKIE),
        ] {
            if offset < cookie {
                if let Ok(node) = ns.node(target) {
                    if add(name, target, cookie, node) {
                        return Ok(());
                    }
                }
            }
        }
        for (&cookie, (name, child)) in dir
            .order
            .range(offset.max(DOTDOT_COOKIE).saturating_add(1)..)
        {
            let Ok(node) = ns.node(*child) else {
                continue;
            };
            if add(name, *child, cookie, node) {
                break;
            }
        }
        Ok(())
    }
}

/// The permission bits of a new inode: the mode asked for less the umask
/// (the kernel sends both apart with FUSE_DONT_MASK; there are no default
/// ACLs here to decide otherwise).
fn masked(mode: u32, umask: u32) -> u16 {
    (mode & 0o7777 & !(umask & 0o777)) as u16
}

impl fuser::Filesystem for FloorFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        self.direct_create = request_capabilities(config, self.kernel_opens);
        Ok(())
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if self.kernel_opens && ino.0 != ROOT {
            let mut ns = self.write();
            if let Ok(n) = ns.node(ino.0) {
                let refs = n.refs.load(Ordering::Relaxed);
                n.refs
                    .store(refs.saturating_sub(nlookup), Ordering::Relaxed);
            }
            ns.maybe_drop(ino.0);
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = match name_bytes(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let ns = self.read();
        match ns.lookup(parent.0, name) {
            // A negative entry, cached for the TTL, as ordo answers.
            Err(Errno::ENOENT) if ns.dir(parent.0).is_ok() => {
                reply.entry(&self.ttl, &negative_entry_attr(), Generation(0))
            }
            r => {
                let r = r.and_then(|ino| ns.attr(ino));
                self.entry(&ns, reply, r)
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.read().attr(ino.0) {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
        };
        match self.write().setattr(ino.0, set) {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let ns = self.read();
        match ns.node(ino.0) {
            Ok(n) if n.kind == FileType::Symlink => reply.data(&n.target),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let kind = match mode & libc::S_IFMT {
            // mknod(2) with type 0 makes a regular file.
            0 | libc::S_IFREG => FileType::RegularFile,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFIFO => FileType::NamedPipe,
            libc::S_IFSOCK => FileType::Socket,
            _ => return reply.error(Errno::EINVAL),
        };
        let new = NewNode {
            kind,
            perm: masked(mode, umask),
            uid: req.uid(),
            gid: req.gid(),
            rdev,
            target: &[],
        };
        self.make(reply, parent, name, new);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let new = NewNode {
            kind: FileType::Directory,
            perm: masked(mode, umask),
            uid: req.uid(),
            gid: req.gid(),
            rdev: 0,
            target: &[],
        };
        self.make(reply, parent, name, new);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = name_bytes(name).and_then(|name| self.write().unlink(parent.0, name));
        Self::empty(reply, result);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = name_bytes(name).and_then(|name| self.write().rmdir(parent.0, name));
        Self::empty(reply, result);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        // Linux's limit on a symlink's target (PATH_MAX, with its NUL).
        if target.len() >= 4096 {
            return reply.error(Errno::ENAMETOOLONG);
        }
        let new = NewNode {
            kind: FileType::Symlink,
            perm: 0o777,
            uid: req.uid(),
            gid: req.gid(),
            rdev: 0,
            target,
        };
        self.make(reply, parent, link_name, new);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let name = name_bytes(name)?;
            let newname = name_bytes(newname)?;
            let flags = rename_flags(flags).ok_or(Errno::EINVAL)?;
            self.write()
                .rename(parent.0, name, newparent.0, newname, flags)
        })();
        Self::empty(reply, result);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut ns = self.write();
        let result = name_bytes(newname).and_then(|newname| {
            ns.link(ino.0, newparent.0, newname)?;
            ns.attr(ino.0)
        });
        self.entry(&ns, reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.kernel_opens {
            // As ordo answers: the kernel opens regular files itself from
            // now on (and sends no RELEASE for them).
            return reply.error(Errno::ENOSYS);
        }
        let truncate = flags.0 & libc::O_TRUNC != 0;
        match self.write().open(ino.0, false, truncate) {
            Ok(_) => reply.opened(FileHandle(0), crate::FILE_OPEN_FLAGS),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let n = match self.read().read_len(ino.0, offset, size) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        match ZEROS.get(..n) {
            Some(zeros) => reply.data(zeros),
            None => reply.data(&vec![0; n]),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.write().write(ino.0, offset, data.len()) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // As ordo answers: the kernel then stops sending FLUSH on close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if self.kernel_opens {
            // Only a created file's handle reaches here, and it was not
            // counted (see `create`).
            return reply.ok();
        }
        Self::empty(reply, self.write().release(ino.0));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Nothing is stored, so everything is as durable as it will be.
        Self::empty(reply, self.read().node(ino.0).map(|_| ()));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.write().open(ino.0, true, false) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self.list(ino.0, offset, |name, child, cookie, node| {
            reply.add(INodeNo(child), cookie, node.kind, OsStr::from_bytes(name))
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.ttl;
        let kernel_opens = self.kernel_opens;
        let listed = self.list(ino.0, offset, |name, child, cookie, node| {
            // Each entry but "." and ".." is a reference the kernel keeps
            // (a full reply drops the entry: no reference then).
            let full = reply.add(
                INodeNo(child),
                cookie,
                OsStr::from_bytes(name),
                &ttl,
                &node.attr(child),
                Generation(0),
            );
            if kernel_opens && !full && name != b"." && name != b".." {
                node.refs.fetch_add(1, Ordering::Relaxed);
            }
            full
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        Self::empty(reply, self.write().release(ino.0));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(reply, self.read().dir(ino.0).map(|_| ()));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let used = self.read().nodes.len() as u64;
        reply.statfs(
            STATFS_BLOCKS,
            STATFS_BLOCKS,
            STATFS_BLOCKS,
            STATFS_FILES,
            STATFS_FILES.saturating_sub(used),
            BLOCK_SIZE,
            NAME_MAX_BYTES as u32,
            BLOCK_SIZE,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let exists = self.read().node(ino.0).map(|_| ());
        Self::empty(reply, exists.and(Err(Errno::EOPNOTSUPP)));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        match self.read().node(ino.0) {
            Ok(_) => reply.error(Errno::ENODATA),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.read().node(ino.0) {
            Ok(_) => xattr_reply(reply, size, &[]),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        let exists = self.read().node(ino.0).map(|_| ());
        Self::empty(reply, exists.and(Err(Errno::ENODATA)));
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (`default_permissions`).
        Self::empty(reply, self.read().node(ino.0).map(|_| ()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut ns = self.write();
        let result = name_bytes(name).and_then(|name| {
            let new = NewNode {
                kind: FileType::RegularFile,
                perm: masked(mode, umask),
                uid: req.uid(),
                gid: req.gid(),
                rdev: 0,
                target: &[],
            };
            let ino = match ns.make(parent.0, name, new) {
                Ok(ino) => ino,
                // Made by another request since the kernel's lookup: open
                // it, as open(O_CREAT) without O_EXCL does (and as ordo).
                Err(Errno::EEXIST) if flags & libc::O_EXCL == 0 => {
                    let ino = ns.lookup(parent.0, name)?;
                    if ns.node(ino)?.is_dir() {
                        return Err(Errno::EISDIR);
                    }
                    return self.open_created(&mut ns, ino, flags & libc::O_TRUNC != 0);
                }
                Err(e) => return Err(e),
            };
            self.open_created(&mut ns, ino, false)
        });
        if let Ok(attr) = &result {
            self.hold(&ns, attr.ino.0);
        }
        drop(ns);
        match result {
            Ok(attr) => reply.created(
                &self.ttl,
                &attr,
                Generation(0),
                FileHandle(0),
                if self.direct_create {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::empty()
                },
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        Self::empty(reply, self.write().fallocate(ino.0, offset, length, mode));
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let result = seek_whence(whence).and_then(|whence| {
            let offset = u64::try_from(offset).map_err(|_| Errno::ENXIO)?;
            self.read().seek(ino.0, offset, whence)
        });
        match result {
            Ok(pos) => reply.offset(pos as i64),
            Err(e) => reply.error(e),
        }
    }
}

/// The mount configuration of a floor: ordo's defaults (threads aside).
/// With `open_requests` off, OPEN is answered with ENOSYS, as ordo does
/// with `-o open_requests=off`; with `io_uring`, requests come through FUSE
/// over io_uring when the kernel offers it, as with `-o io_uring`.
/// `readers_on_demand` as ordo's `-o readers=` has it.
pub fn floor_config(
    threads: usize,
    open_requests: bool,
    io_uring: bool,
    readers_on_demand: bool,
) -> MountConfig {
    MountConfig {
        threads: threads.max(1),
        fsname: FLOOR_FSNAME.to_string(),
        open_requests,
        io_uring,
        readers_on_demand,
        ..MountConfig::default()
    }
}

/// Mount a floor on `mountpoint`, served by `threads` workers once
/// [`Session::run`] is called (it returns when the mount is unmounted).
pub fn mount_floor(
    mountpoint: &Path,
    threads: usize,
    open_requests: bool,
    io_uring: bool,
    readers_on_demand: bool,
) -> io::Result<Session<FloorFs>> {
    let config = floor_config(threads, open_requests, io_uring, readers_on_demand);
    session(
        FloorFs::for_config(&config),
        mountpoint,
        &config,
        FLOOR_SUBTYPE,
    )
}

/// Mount a floor on `mountpoint` and serve it in the foreground; returns
/// once it is unmounted.
pub fn serve_floor(
    mountpoint: &Path,
    threads: usize,
    open_requests: bool,
    io_uring: bool,
    readers_on_demand: bool,
) -> io::Result<()> {
    mount_floor(
        mountpoint,
        threads,
        open_requests,
        io_uring,
        readers_on_demand,
    )?
    .run()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(uid: u32) -> NewNode<'static> {
        NewNode {
            kind: FileType::RegularFile,
            perm: 0o644,
            uid,
            gid: uid,
            rdev: 0,
            target: &[],
        }
    }

    fn dir() -> NewNode<'static> {
        NewNode {
            kind: FileType::Directory,
            ..file(0)
        }
    }

    fn names(ns: &Namespace, ino: u64) -> Vec<String> {
        let dir = ns.dir(ino).unwrap();
        dir.order
            .values()
            .map(|(n, _)| String::from_utf8_lossy(n).into_owned())
            .collect()
    }

    #[test]
    fn makes_finds_and_removes_names() {
        let mut ns = Namespace::new(0, 0);
        let d = ns.make(ROOT, b"d", dir()).unwrap();
        let f = ns.make(d, b"f", file(7)).unwrap();
        assert_eq!(ns.lookup(ROOT, b"d"), Ok(d));
        assert_eq!(ns.lookup(d, b"f"), Ok(f));
        assert_eq!(ns.lookup(d, b".."), Ok(ROOT));
        assert_eq!(ns.lookup(d, b"nope"), Err(Errno::ENOENT));
        assert_eq!(ns.lookup(f, b"x"), Err(Errno::ENOTDIR));
        assert_eq!(ns.lookup(999, b"x"), Err(Errno::ENOENT));
        assert_eq!(ns.make(d, b"f", file(0)), Err(Errno::EEXIST));
        assert_eq!(ns.node(ROOT).unwrap().nlink, 3);
        assert_eq!(ns.attr(f).unwrap().uid, 7);
        assert_eq!(ns.rmdir(ROOT, b"d"), Err(Errno::ENOTEMPTY));
        assert_eq!(ns.unlink(ROOT, b"d"), Err(Errno::EISDIR));
        assert_eq!(ns.rmdir(d, b"f"), Err(Errno::ENOTDIR));
        ns.unlink(d, b"f").unwrap();
        assert_eq!(ns.attr(f), Err(Errno::ENOENT));
        ns.rmdir(ROOT, b"d").unwrap();
        assert_eq!(ns.node(ROOT).unwrap().nlink, 2);
        assert_eq!(ns.nodes.len(), 1);
    }

    #[test]
    fn data_is_discarded_but_sizes_are_kept() {
        let mut ns = Namespace::new(0, 0);
        let f = ns.make(ROOT, b"f", file(0)).unwrap();
        assert_eq!(ns.write(f, 4096, 100), Ok(100));
        assert_eq!(ns.attr(f).unwrap().size, 4196);
        assert_eq!(ns.read_len(f, 4000, 4096), Ok(196));
        assert_eq!(ns.read_len(f, 5000, 4096), Ok(0));
        assert_eq!(ns.write(f, 0, 10), Ok(10));
        assert_eq!(ns.attr(f).unwrap().size, 4196);
        assert_eq!(ns.write(f, u64::MAX - 1, 10), Err(Errno::EFBIG));
        ns.fallocate(f, 0, 1 << 20, 0).unwrap();
        assert_eq!(ns.attr(f).unwrap().size, 1 << 20);
        ns.fallocate(f, 0, 1 << 21, libc::FALLOC_FL_KEEP_SIZE)
            .unwrap();
        assert_eq!(ns.attr(f).unwrap().size, 1 << 20);
        assert_eq!(
            ns.fallocate(f, 0, 1, libc::FALLOC_FL_PUNCH_HOLE),
            Err(Errno::EOPNOTSUPP)
        );
        let set = SetAttr {
            size: Some(5),
            ..SetAttr::default()
        };
        assert_eq!(ns.setattr(f, set).unwrap().size, 5);
        ns.open(f, false, true).unwrap();
        assert_eq!(ns.attr(f).unwrap().size, 0);
        assert_eq!(ns.seek(f, 0, SeekWhence::Data), Err(Errno::ENXIO));
    }

    #[test]
    fn open_files_outlive_their_names() {
        let mut ns = Namespace::new(0, 0);
        let f = ns.make(ROOT, b"f", file(0)).unwrap();
        ns.open(f, false, false).unwrap();
        ns.unlink(ROOT, b"f").unwrap();
        assert_eq!(ns.attr(f).unwrap().nlink, 0);
        assert_eq!(ns.write(f, 0, 3), Ok(3));
        ns.release(f).unwrap();
        assert_eq!(ns.attr(f), Err(Errno::ENOENT));
        assert_eq!(ns.release(f), Err(Errno::ENOENT));
    }

    #[test]
    fn renames_replace_exchange_and_refuse_loops() {
        let mut ns = Namespace::new(0, 0);
        let plain = ordo_fs::RenameFlags::default();
        let a = ns.make(ROOT, b"a", dir()).unwrap();
        let b = ns.make(a, b"b", dir()).unwrap();
        let f = ns.make(ROOT, b"f", file(0)).unwrap();
        let g = ns.make(ROOT, b"g", file(0)).unwrap();
        assert_eq!(ns.rename(ROOT, b"a", b, b"a", plain), Err(Errno::EINVAL));
        assert_eq!(ns.rename(ROOT, b"f", ROOT, b"a", plain), Err(Errno::EISDIR));
        assert_eq!(
            ns.rename(ROOT, b"a", ROOT, b"f", plain),
            Err(Errno::ENOTDIR)
        );
        let noreplace = ordo_fs::RenameFlags {
            noreplace: true,
            ..plain
        };
        assert_eq!(
            ns.rename(ROOT, b"f", ROOT, b"g", noreplace),
            Err(Errno::EEXIST)
        );
        ns.rename(ROOT, b"f", ROOT, b"g", plain).unwrap();
        assert_eq!(ns.lookup(ROOT, b"g"), Ok(f));
        assert_eq!(ns.attr(g), Err(Errno::ENOENT));
        assert_eq!(names(&ns, ROOT), ["a", "g"]);
        // A directory moving up takes its ".." link along.
        ns.rename(a, b"b", ROOT, b"b", plain).unwrap();
        assert_eq!(ns.lookup(b, b".."), Ok(ROOT));
        assert_eq!(ns.node(a).unwrap().nlink, 2);
        assert_eq!(ns.node(ROOT).unwrap().nlink, 4);
        let exchange = ordo_fs::RenameFlags {
            exchange: true,
            ..plain
        };
        ns.rename(ROOT, b"g", a, b"x", exchange)
            .expect_err("nothing to exchange with");
        ns.rename(ROOT, b"b", ROOT, b"g", exchange).unwrap();
        assert_eq!(ns.lookup(ROOT, b"g"), Ok(b));
        assert_eq!(ns.lookup(ROOT, b"b"), Ok(f));
        // Replacing an empty directory with a directory.
        ns.rename(ROOT, b"g", ROOT, b"a", plain).unwrap();
        assert_eq!(ns.lookup(ROOT, b"a"), Ok(b));
        assert_eq!(ns.node(ROOT).unwrap().nlink, 3);
        assert_eq!(ns.nodes.len(), 3);
    }

    #[test]
    fn links_count_and_refuse_directories() {
        let mut ns = Namespace::new(0, 0);
        let f = ns.make(ROOT, b"f", file(0)).unwrap();
        ns.link(f, ROOT, b"g").unwrap();
        assert_eq!(ns.attr(f).unwrap().nlink, 2);
        assert_eq!(ns.link(f, ROOT, b"g"), Err(Errno::EEXIST));
        assert_eq!(ns.link(ROOT, ROOT, b"h"), Err(Errno::EPERM));
        ns.unlink(ROOT, b"f").unwrap();
        assert_eq!(ns.attr(f).unwrap().nlink, 1);
        // Renaming one name of an inode onto another does nothing.
        ns.link(f, ROOT, b"h").unwrap();
        ns.rename(ROOT, b"g", ROOT, b"h", ordo_fs::RenameFlags::default())
            .unwrap();
        assert_eq!(names(&ns, ROOT), ["g", "h"]);
    }

    #[test]
    fn setgid_directories_pass_on_their_group() {
        let mut ns = Namespace::new(0, 0);
        let mut sg = dir();
        sg.perm = 0o2775;
        sg.gid = 50;
        let d = ns.make(ROOT, b"d", sg).unwrap();
        let f = ns.make(d, b"f", file(9)).unwrap();
        assert_eq!(ns.attr(f).unwrap().gid, 50);
        let sub = ns.make(d, b"s", dir()).unwrap();
        assert_eq!(ns.attr(sub).unwrap().perm & 0o2000, 0o2000);
        assert_eq!(masked(0o100666, 0o022), 0o644);
        assert_eq!(masked(0o2777, 0o027), 0o2750);
    }

    #[test]
    fn listings_resume_after_their_cookie() {
        let mut ns = Namespace::new(0, 0);
        for n in ["a", "b", "c"] {
            ns.make(ROOT, n.as_bytes(), file(0)).unwrap();
        }
        let fs = FloorFs {
            ns: RwLock::new(ns),
            ..FloorFs::new(Duration::from_secs(1))
        };
        let collect = |offset: u64, max: usize| {
            let mut out = Vec::new();
            fs.list(ROOT, offset, |name, _, cookie, _| {
                out.push((String::from_utf8_lossy(name).into_owned(), cookie));
                out.len() >= max
            })
            .unwrap();
            out
        };
        let all = collect(0, usize::MAX);
        let got: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(got, [".", "..", "a", "b", "c"]);
        let first = collect(0, 3);
        let last_cookie = first.last().unwrap().1;
        fs.write().unlink(ROOT, b"b").unwrap();
        let rest: Vec<String> = collect(last_cookie, usize::MAX)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(rest, ["c"]);
        assert!(collect(u64::MAX, usize::MAX).is_empty());
    }

    #[test]
    fn long_names_are_refused() {
        let long = "a".repeat(NAME_MAX_BYTES + 1);
        assert_eq!(name_bytes(OsStr::new(&long)), Err(Errno::ENAMETOOLONG));
    }
}
