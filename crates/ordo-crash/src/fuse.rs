//! Recording through the FUSE mount (`--fuse`): the recorded operations go
//! through the kernel (open, pwrite, fallocate, fsync, rename, ...) to
//! ordo's FUSE adapter instead of calling the library directly, so that the
//! adapter's translation of each call (which inode is fsynced, which
//! flags reach fallocate, what close does) is what the crash states come
//! from. OptFS's `osync` and `dsync`, `streamsync` and `ignorefsync` are
//! ordo's ioctls on the mount (`ordo_fuse::ioctl`), as a program makes
//! them.
//!
//! The exceptions call the library on the mounted file system (the same
//! object the adapter serves): FUSE does not forward `syncfs(2)` to an
//! ordinary FUSE file system, so `sync` calls `Fs::sync`, and the
//! write-back tick is the mount's own timer, `Fs::write_back`.
//!
//! Streams through FUSE belong to the requesting process (a FUSE request
//! carries the id of the calling process, not of its thread), and every
//! request of a recording comes from the explorer's one process: a
//! workload that moves to another stream (`setstream`) can not be recorded
//! through the mount, and [`refuses`] says so before anything runs.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ordo_fs::Fs;
use ordo_fuse::ioctl;

use crate::record::{OrdoErr, Payload};
use crate::workload::Op;

/// A FUSE mount of a library file system, unmounted when dropped.
pub struct FuseMount {
    dir: tempfile::TempDir,
    /// Given whether the mount point is already unmounted, finish the
    /// unmount and join the serving thread.
    unmount: Option<Box<dyn FnOnce(bool) -> io::Result<()>>>,
}

impl FuseMount {
    /// Mount `fs` on a fresh temporary directory.
    pub fn new(fs: Arc<Fs>) -> io::Result<FuseMount> {
        Self::with_open_requests(fs, true)
    }

    /// The same, with OPEN and RELEASE served or not
    /// ([`ordo_fuse::MountConfig::open_requests`]).
    pub fn with_open_requests(fs: Arc<Fs>, open_requests: bool) -> io::Result<FuseMount> {
        let dir = tempfile::Builder::new()
            .prefix("ordo-crash-mnt-")
            .tempdir()?;
        let config = ordo_fuse::MountConfig {
            threads: 1,
            allow_other: false,
            read_only: false,
            attr_ttl: std::time::Duration::ZERO,
            fsname: "ordo-crash".to_string(),
            open_requests,
            ..ordo_fuse::MountConfig::default()
        };
        let session = ordo_fuse::mount(fs, dir.path(), &config)?.spawn()?;
        let unmount: Box<dyn FnOnce(bool) -> io::Result<()>> = Box::new(move |done| {
            if done {
                // The serving thread ends when the kernel drops the
                // connection; fuser's own unmount on drop finds nothing
                // mounted.
                session.join()
            } else {
                session.umount_and_join()
            }
        });
        Ok(FuseMount {
            dir,
            unmount: Some(unmount),
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Unmount and wait for the serving thread.
    ///
    /// A FUSE mount can be busy for a moment after the last file on it is
    /// closed: a child process forked by another thread (e2fsck, mkfs) holds
    /// copies of the descriptors until it execs, and the kernel's release
    /// of a file is asynchronous. So an `EBUSY` is retried for a while, then
    /// the mount is detached (`MNT_DETACH`), which is all a crash recording
    /// needs: the events were taken before the unmount.
    pub fn unmount(mut self) -> io::Result<()> {
        let done = settle_unmount(self.dir.path())?;
        match self.unmount.take() {
            Some(f) => f(done),
            None => Ok(()),
        }
    }
}

/// Unmount `path`, retrying `EBUSY` ([`ordo_dev::loopdev::unmount_retrying`])
/// and finally detaching; true once it is unmounted. `EPERM` (not root)
/// leaves the unmount to fuser, which goes through `fusermount3 -u`
/// (false).
fn settle_unmount(path: &Path) -> io::Result<bool> {
    use ordo_dev::{loopdev, DevError};
    let errno = |e: &DevError| match e {
        DevError::Io { source, .. } => source.raw_os_error(),
        _ => None,
    };
    match loopdev::unmount_retrying(path) {
        Ok(()) => Ok(true),
        Err(e) if errno(&e) == Some(libc::EPERM) => Ok(false),
        Err(e) if errno(&e) == Some(libc::EBUSY) => loopdev::unmount_lazy(path)
            .map(|()| true)
            .map_err(io::Error::other),
        Err(e) => Err(io::Error::other(e)),
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(f) = self.unmount.take() {
            let _ = f(false);
        }
    }
}

/// Why `seq` can not be recorded through the FUSE mount, if it can not:
/// it moves to a stream other than `default`. The adapter keys streams by
/// process (a FUSE request carries the id of the calling process, not of
/// its thread), and every request of a recording comes from the
/// explorer's one process.
pub fn refuses(seq: &crate::workload::Sequence) -> Option<String> {
    let op = seq
        .setup
        .iter()
        .chain(&seq.ops)
        .find(|op| matches!(op, Op::SetStream(name) if name.as_str() != "default"))?;
    Some(format!(
        "{}: '{op}' can not be recorded through FUSE: the FUSE adapter keys streams by \
         process and every request of the explorer comes from one process (record \
         streams through the library, without --fuse)",
        seq.name
    ))
}

fn at(mount: &Path, path: &str) -> PathBuf {
    mount.join(path.trim_start_matches('/'))
}

fn fallocate(file: &File, mode: i32, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: a plain system call on a file descriptor we own.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Run one operation through the mount at `mount` (the model's side is
/// `record::run_op`'s, shared with the library path, and so is what an
/// ENOSPC means); returns the inode it created, which `fs`, the library
/// under the mount, names.
pub(crate) fn run_on_mount(
    mount: &Path,
    fs: &Fs,
    op: &Op,
    payload: Option<Payload>,
) -> Result<Option<u32>, OrdoErr> {
    /// A failed call: ENOSPC changed nothing, anything else is reported.
    fn e(what: &'static str) -> impl Fn(io::Error) -> OrdoErr {
        move |err| {
            if err.raw_os_error() == Some(libc::ENOSPC) {
                OrdoErr::NoSpace { done: 0 }
            } else {
                OrdoErr::Text(format!("{what}: {err}"))
            }
        }
    }
    let open_rw = |p: &str| OpenOptions::new().write(true).open(at(mount, p));
    match op {
        Op::Creat(p) => {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(at(mount, p))
                .map_err(e("creat"))?;
        }
        Op::Mkdir(p) => std::fs::DirBuilder::new()
            .mode(0o755)
            .create(at(mount, p))
            .map_err(e("mkdir"))?,
        Op::Symlink { target, path } => {
            std::os::unix::fs::symlink(target, at(mount, path)).map_err(e("symlink"))?
        }
        Op::Write { path, .. } | Op::Append { path, .. } => {
            let (_, off, data) = payload.ok_or("no payload")?;
            let f = open_rw(path).map_err(e("open"))?;
            // A write the file system runs out of space in the middle of
            // is short; the model stores the same first bytes.
            let mut done = 0usize;
            while done < data.len() {
                match f.write_at(&data[done..], off + done as u64) {
                    Ok(0) => return Err("pwrite wrote 0 bytes".into()),
                    Ok(n) => done += n,
                    Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => {
                        return Err(OrdoErr::NoSpace { done })
                    }
                    Err(err) => return Err(OrdoErr::Text(format!("pwrite: {err}"))),
                }
            }
        }
        Op::Falloc {
            path,
            off,
            len,
            keep_size,
        } => {
            let mode = if *keep_size {
                libc::FALLOC_FL_KEEP_SIZE
            } else {
                0
            };
            open_rw(path)
                .and_then(|f| fallocate(&f, mode, *off, *len))
                .map_err(e("fallocate"))?;
        }
        Op::Punch { path, off, len } => {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            open_rw(path)
                .and_then(|f| fallocate(&f, mode, *off, *len))
                .map_err(e("punch"))?;
        }
        Op::Zero {
            path,
            off,
            len,
            keep_size,
        } => {
            let mut mode = libc::FALLOC_FL_ZERO_RANGE;
            if *keep_size {
                mode |= libc::FALLOC_FL_KEEP_SIZE;
            }
            open_rw(path)
                .and_then(|f| fallocate(&f, mode, *off, *len))
                .map_err(e("zero range"))?;
        }
        // The kernel's FUSE module answers EOPNOTSUPP to these modes
        // without asking the file system: such a workload fails here.
        Op::Collapse { path, off, len } => open_rw(path)
            .and_then(|f| fallocate(&f, libc::FALLOC_FL_COLLAPSE_RANGE, *off, *len))
            .map_err(e("collapse range"))?,
        Op::Insert { path, off, len } => open_rw(path)
            .and_then(|f| fallocate(&f, libc::FALLOC_FL_INSERT_RANGE, *off, *len))
            .map_err(e("insert range"))?,
        Op::Truncate { path, size } => open_rw(path)
            .and_then(|f| f.set_len(*size))
            .map_err(e("ftruncate"))?,
        Op::Link { src, dst } => {
            std::fs::hard_link(at(mount, src), at(mount, dst)).map_err(e("link"))?
        }
        Op::Unlink(p) => std::fs::remove_file(at(mount, p)).map_err(e("unlink"))?,
        Op::Rmdir(p) => std::fs::remove_dir(at(mount, p)).map_err(e("rmdir"))?,
        Op::Rename { src, dst } => {
            std::fs::rename(at(mount, src), at(mount, dst)).map_err(e("rename"))?
        }
        Op::Fsync(p) => File::open(at(mount, p))
            .and_then(|f| f.sync_all())
            .map_err(e("fsync"))?,
        Op::Fdatasync(p) => File::open(at(mount, p))
            .and_then(|f| f.sync_data())
            .map_err(e("fdatasync"))?,
        Op::SetXattr { path, name, len } => {
            let v = crate::workload::xattr_value(name, *len);
            set_xattr(&at(mount, path), name.as_bytes(), &v).map_err(e("setxattr"))?
        }
        Op::RemoveXattr { path, name } => {
            remove_xattr(&at(mount, path), name.as_bytes()).map_err(e("removexattr"))?
        }
        Op::SetAcl { path, uid } => {
            let v = crate::workload::acl_value(*uid);
            let p = at(mount, path);
            set_xattr(&p, ordo_format::xattr::ACL_ACCESS_NAME, &v).map_err(e("setacl"))?;
            if p.is_dir() {
                set_xattr(&p, ordo_format::xattr::ACL_DEFAULT_NAME, &v).map_err(e("setacl -d"))?;
            }
        }
        Op::Sync => fs.sync().map_err(|err| format!("ordo sync: {err}"))?,
        // The mount's own tick, on the library under it.
        Op::Writeback => fs
            .write_back()
            .map_err(|err| format!("ordo write-back: {err}"))?,
        // ordo's ioctls, in the stream of the explorer's process: the
        // default one ([`refuses`]).
        Op::Osync(p) | Op::Dsync(p) => {
            let (what, cmd) = match op {
                Op::Osync(_) => ("osync", ioctl::ORDO_IOC_OSYNC),
                _ => ("dsync", ioctl::ORDO_IOC_DSYNC),
            };
            File::open(at(mount, p))
                .and_then(|f| ioctl::call(&f, cmd, None))
                .map_err(e(what))?;
        }
        Op::Streamsync => {
            let mut buf = ioctl::name_buffer(b"").expect("the empty name fits");
            File::open(mount)
                .and_then(|f| ioctl::call(&f, ioctl::ORDO_IOC_STREAMSYNC, Some(&mut buf)))
                .map_err(e("streamsync"))?;
        }
        Op::IgnoreFsync(_) => {
            let flags = op.stream_flags().expect("ignorefsync sets flags");
            let mut buf = ioctl::stream_flags_buffer(b"", flags).expect("the empty name fits");
            File::open(mount)
                .and_then(|f| ioctl::call(&f, ioctl::ORDO_IOC_SETSTREAMFLAGS, Some(&mut buf)))
                .map_err(e("ignorefsync"))?;
        }
        Op::SetStream(name) if name.as_str() == "default" => {}
        Op::SetStream(name) => {
            return Err(format!(
                "setstream {name}: streams through FUSE are keyed by process, and the \
                 explorer's requests all come from one process"
            )
            .into())
        }
    }
    let created = match op {
        Op::Creat(p) | Op::Mkdir(p) | Op::Symlink { path: p, .. } => Some(
            fs.lookup_path(p)
                .map_err(|err| format!("lookup {p} after creating it: {err}"))?
                .ino,
        ),
        _ => None,
    };
    Ok(created)
}

fn c_path(p: &std::path::Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// lsetxattr(2).
fn set_xattr(p: &std::path::Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    let path = c_path(p)?;
    let name =
        std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: NUL-terminated strings and a live buffer of `value.len()` bytes.
    let rc = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// lremovexattr(2).
fn remove_xattr(p: &std::path::Path, name: &[u8]) -> io::Result<()> {
    let path = c_path(p)?;
    let name =
        std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: NUL-terminated strings.
    let rc = unsafe { libc::lremovexattr(path.as_ptr(), name.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
