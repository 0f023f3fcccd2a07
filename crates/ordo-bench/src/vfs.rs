//! The file-system interface the workloads are written against.
//!
//! A workload runs unchanged on a mounted directory (the kernel's ext4,
//! tmpfs, ordo through FUSE: [`PosixVfs`]) and in-process on the library
//! ([`LibVfs`], ordo's `Fs` over a device, optionally a timing model). The
//! interface is the small subset of POSIX the papers' workloads use; paths
//! are relative to the file system's root and use `/`.
//!
//! Each implementation also owns the benchmark's clock ([`Vfs::now_ns`]):
//! the host's monotonic clock, or the timing model's virtual clock, so that
//! a run on a modeled HDD reports the HDD's time and not this machine's.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ordo_dev::{BlockDevice, FileDevice, TimedDevice};
use ordo_fs::{Creds, FileType, Fs, Ino, SetAttr, ROOT_INO};

use crate::error::{BenchError, Result};

/// An open file.
pub trait VFile: Send + Sync {
    /// Writes all of `data` at `offset`.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;
    /// Reads up to `buf.len()` bytes at `offset`; returns the count (0 at EOF).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize>;
    /// fsync(2): data and metadata durable.
    fn fsync(&self) -> Result<()>;
    /// Current size in bytes.
    fn size_bytes(&self) -> Result<u64>;
}

/// A file system under test.
pub trait Vfs: Send + Sync {
    /// Creates (or truncates) a regular file and opens it read-write.
    fn create(&self, path: &str) -> Result<Box<dyn VFile>>;
    /// Opens an existing regular file read-write.
    fn open(&self, path: &str) -> Result<Box<dyn VFile>>;
    /// Creates a directory.
    fn mkdir(&self, path: &str) -> Result<()>;
    /// Removes a file.
    fn unlink(&self, path: &str) -> Result<()>;
    /// Removes an empty directory.
    fn rmdir(&self, path: &str) -> Result<()>;
    /// The size of a file (stat).
    fn size(&self, path: &str) -> Result<u64>;
    /// Names in a directory (without "." and ".."), each with "is a directory".
    fn list(&self, dir: &str) -> Result<Vec<(String, bool)>>;
    /// The directory on the host where this file system is mounted, if it is
    /// (external programs such as sqlite3 need one).
    fn host_path(&self) -> Option<&Path>;
    /// The benchmark clock, nanoseconds from an arbitrary origin.
    fn now_ns(&self) -> u64;
    /// True if [`Vfs::now_ns`] is a timing model's virtual clock.
    fn virtual_time(&self) -> bool {
        false
    }
}

/// Creates `path` and every missing parent.
pub fn mkdir_all(vfs: &dyn Vfs, path: &str) -> Result<()> {
    let mut cur = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if !cur.is_empty() {
            cur.push('/');
        }
        cur.push_str(part);
        match vfs.mkdir(&cur) {
            Ok(()) => {}
            Err(e) if is_exists(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes a tree, children first.
pub fn remove_all(vfs: &dyn Vfs, path: &str) -> Result<u64> {
    let mut removed = 0;
    for (name, is_dir) in vfs.list(path)? {
        let child = format!("{path}/{name}");
        if is_dir {
            removed += remove_all(vfs, &child)?;
        } else {
            vfs.unlink(&child)?;
            removed += 1;
        }
    }
    vfs.rmdir(path)?;
    Ok(removed)
}

/// True if the error is EEXIST.
pub fn is_exists(e: &BenchError) -> bool {
    errno_of(e) == Some(libc::EEXIST)
}

/// True if the error is ENOENT.
pub fn is_not_found(e: &BenchError) -> bool {
    errno_of(e) == Some(libc::ENOENT)
}

fn errno_of(e: &BenchError) -> Option<i32> {
    match e {
        BenchError::Io { source, .. } => source.raw_os_error(),
        BenchError::Fs { source, .. } => Some(source.errno()),
        _ => None,
    }
}

/// Reads a whole file in `io_bytes` requests; returns the bytes read.
pub fn read_whole(f: &dyn VFile, io_bytes: usize) -> Result<u64> {
    let mut buf = vec![0u8; io_bytes.max(1)];
    let mut off = 0u64;
    loop {
        let n = f.read_at(off, &mut buf)?;
        if n == 0 {
            return Ok(off);
        }
        off += n as u64;
    }
}

/// A mounted directory on the host.
pub struct PosixVfs {
    root: PathBuf,
    origin: Instant,
}

impl PosixVfs {
    /// The file system mounted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PosixVfs {
            root: root.into(),
            origin: Instant::now(),
        }
    }

    fn p(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }
}

struct PosixFile {
    file: File,
    path: PathBuf,
}

impl VFile for PosixFile {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| BenchError::io("write", &self.path, e))
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        loop {
            match self.file.read_at(buf, offset) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(BenchError::io("read", &self.path, e)),
            }
        }
    }
    fn fsync(&self) -> Result<()> {
        self.file
            .sync_all()
            .map_err(|e| BenchError::io("fsync", &self.path, e))
    }
    fn size_bytes(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| BenchError::io("fstat", &self.path, e))
    }
}

impl Vfs for PosixVfs {
    fn create(&self, path: &str) -> Result<Box<dyn VFile>> {
        let p = self.p(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .map_err(|e| BenchError::io("create", &p, e))?;
        Ok(Box::new(PosixFile { file, path: p }))
    }
    fn open(&self, path: &str) -> Result<Box<dyn VFile>> {
        let p = self.p(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| BenchError::io("open", &p, e))?;
        Ok(Box::new(PosixFile { file, path: p }))
    }
    fn mkdir(&self, path: &str) -> Result<()> {
        let p = self.p(path);
        std::fs::create_dir(&p).map_err(|e| BenchError::io("mkdir", &p, e))
    }
    fn unlink(&self, path: &str) -> Result<()> {
        let p = self.p(path);
        std::fs::remove_file(&p).map_err(|e| BenchError::io("unlink", &p, e))
    }
    fn rmdir(&self, path: &str) -> Result<()> {
        let p = self.p(path);
        std::fs::remove_dir(&p).map_err(|e| BenchError::io("rmdir", &p, e))
    }
    fn size(&self, path: &str) -> Result<u64> {
        let p = self.p(path);
        std::fs::metadata(&p)
            .map(|m| m.len())
            .map_err(|e| BenchError::io("stat", &p, e))
    }
    fn list(&self, dir: &str) -> Result<Vec<(String, bool)>> {
        let p = self.p(dir);
        let mut out = Vec::new();
        for ent in std::fs::read_dir(&p).map_err(|e| BenchError::io("readdir", &p, e))? {
            let ent = ent.map_err(|e| BenchError::io("readdir", &p, e))?;
            let is_dir = ent
                .file_type()
                .map_err(|e| BenchError::io("readdir", &p, e))?
                .is_dir();
            out.push((ent.file_name().to_string_lossy().into_owned(), is_dir));
        }
        out.sort();
        Ok(out)
    }
    fn host_path(&self) -> Option<&Path> {
        Some(&self.root)
    }
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

/// ordo's library, in this process.
pub struct LibVfs {
    fs: Arc<Fs>,
    clock: Option<Arc<TimedDevice<Arc<FileDevice>>>>,
    origin: Instant,
}

impl LibVfs {
    /// `fs`, timed by the host clock, or by `clock`'s virtual time if given.
    pub fn new(fs: Arc<Fs>, clock: Option<Arc<TimedDevice<Arc<FileDevice>>>>) -> Self {
        LibVfs {
            fs,
            clock,
            origin: Instant::now(),
        }
    }

    fn fs_err(op: &'static str, path: &str, source: ordo_fs::FsError) -> BenchError {
        BenchError::Fs {
            op,
            path: path.to_string(),
            source,
        }
    }

    /// The inode of `path` ("" is the root).
    fn resolve(&self, path: &str) -> Result<Ino> {
        if path.is_empty() {
            return Ok(ROOT_INO);
        }
        self.fs
            .lookup_path(&format!("/{path}"))
            .map(|a| a.ino)
            .map_err(|e| Self::fs_err("lookup", path, e))
    }

    /// The parent directory's inode and the last component of `path`.
    fn parent<'p>(&self, path: &'p str) -> Result<(Ino, &'p str)> {
        let (dir, name) = match path.rfind('/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path),
        };
        Ok((self.resolve(dir)?, name))
    }

    fn open_ino(&self, ino: Ino, path: &str) -> Result<Box<dyn VFile>> {
        self.fs
            .open(ino)
            .map_err(|e| Self::fs_err("open", path, e))?;
        Ok(Box::new(LibFile {
            fs: self.fs.clone(),
            ino,
            path: path.to_string(),
        }))
    }
}

struct LibFile {
    fs: Arc<Fs>,
    ino: Ino,
    path: String,
}

impl Drop for LibFile {
    fn drop(&mut self) {
        // Close errors have no caller to go to; a failed release shows up
        // as a leaked inode in ordo's fsck, not as a wrong benchmark figure.
        let _ = self.fs.release(self.ino);
    }
}

impl VFile for LibFile {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let n = self
                .fs
                .write(self.ino, offset + done as u64, &data[done..])
                .map_err(|e| LibVfs::fs_err("write", &self.path, e))?;
            if n == 0 {
                return Err(BenchError::io(
                    "write",
                    &self.path,
                    std::io::Error::new(std::io::ErrorKind::WriteZero, "wrote nothing"),
                ));
            }
            done += n as usize;
        }
        Ok(())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let want = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let got = self
            .fs
            .read(self.ino, offset, want)
            .map_err(|e| LibVfs::fs_err("read", &self.path, e))?;
        let n = got.len().min(buf.len());
        buf[..n].copy_from_slice(&got[..n]);
        Ok(n)
    }
    fn fsync(&self) -> Result<()> {
        self.fs
            .fsync(self.ino, false)
            .map_err(|e| LibVfs::fs_err("fsync", &self.path, e))
    }
    fn size_bytes(&self) -> Result<u64> {
        self.fs
            .getattr(self.ino)
            .map(|a| a.size)
            .map_err(|e| LibVfs::fs_err("getattr", &self.path, e))
    }
}

impl Vfs for LibVfs {
    fn create(&self, path: &str) -> Result<Box<dyn VFile>> {
        let (parent, name) = self.parent(path)?;
        let ino = match self.fs.lookup(parent, name.as_bytes()) {
            Ok(a) => {
                let truncate = SetAttr {
                    size: Some(0),
                    ..SetAttr::default()
                };
                self.fs
                    .setattr(a.ino, &truncate)
                    .map_err(|e| Self::fs_err("truncate", path, e))?;
                a.ino
            }
            Err(e) if e.errno() == libc::ENOENT => {
                self.fs
                    .create(
                        parent,
                        name.as_bytes(),
                        FileType::Regular,
                        0o644,
                        0,
                        &Creds::root(),
                    )
                    .map_err(|e| Self::fs_err("create", path, e))?
                    .ino
            }
            Err(e) => return Err(Self::fs_err("lookup", path, e)),
        };
        self.open_ino(ino, path)
    }
    fn open(&self, path: &str) -> Result<Box<dyn VFile>> {
        let ino = self.resolve(path)?;
        self.open_ino(ino, path)
    }
    fn mkdir(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent(path)?;
        self.fs
            .mkdir(parent, name.as_bytes(), 0o755, &Creds::root())
            .map(|_| ())
            .map_err(|e| Self::fs_err("mkdir", path, e))
    }
    fn unlink(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent(path)?;
        self.fs
            .unlink(parent, name.as_bytes())
            .map_err(|e| Self::fs_err("unlink", path, e))
    }
    fn rmdir(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent(path)?;
        self.fs
            .rmdir(parent, name.as_bytes())
            .map_err(|e| Self::fs_err("rmdir", path, e))
    }
    fn size(&self, path: &str) -> Result<u64> {
        let ino = self.resolve(path)?;
        self.fs
            .getattr(ino)
            .map(|a| a.size)
            .map_err(|e| Self::fs_err("getattr", path, e))
    }
    fn list(&self, dir: &str) -> Result<Vec<(String, bool)>> {
        /// Entries asked for per readdir call.
        const BATCH_ENTRIES: usize = 256;
        let ino = self.resolve(dir)?;
        let mut out = Vec::new();
        let mut cookie = 0u64;
        loop {
            let batch = self
                .fs
                .readdir(ino, cookie, BATCH_ENTRIES)
                .map_err(|e| Self::fs_err("readdir", dir, e))?;
            let Some(last) = batch.last() else { break };
            cookie = last.next_offset;
            for e in batch {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                out.push((
                    String::from_utf8_lossy(&e.name).into_owned(),
                    e.kind == FileType::Directory,
                ));
            }
        }
        out.sort();
        Ok(out)
    }
    fn host_path(&self) -> Option<&Path> {
        None
    }
    fn now_ns(&self) -> u64 {
        match &self.clock {
            Some(t) => t.virtual_time_ns(),
            None => self.origin.elapsed().as_nanos() as u64,
        }
    }
    fn virtual_time(&self) -> bool {
        self.clock.is_some()
    }
}

/// A device as the in-process target holds it: the file device, and the
/// timing model wrapped around it when one was asked for.
pub fn lib_device(
    dev: Arc<FileDevice>,
    timed: Option<&Arc<TimedDevice<Arc<FileDevice>>>>,
) -> Arc<dyn BlockDevice> {
    match timed {
        Some(t) => t.clone(),
        None => dev,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posix_vfs_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let v = PosixVfs::new(dir.path());
        mkdir_all(&v, "a/b/c").unwrap();
        mkdir_all(&v, "a/b").unwrap();
        let f = v.create("a/b/c/f").unwrap();
        f.write_at(0, b"hello").unwrap();
        f.write_at(5, b" world").unwrap();
        f.fsync().unwrap();
        assert_eq!(f.size_bytes().unwrap(), 11);
        drop(f);
        assert_eq!(v.size("a/b/c/f").unwrap(), 11);
        let f = v.open("a/b/c/f").unwrap();
        assert_eq!(read_whole(&*f, 4).unwrap(), 11);
        assert_eq!(
            v.list("a/b").unwrap(),
            vec![("c".to_string(), true)],
            "list shows directories"
        );
        assert!(is_not_found(&v.open("nope").err().unwrap()));
        assert!(is_exists(&v.mkdir("a").unwrap_err()));
        assert_eq!(remove_all(&v, "a").unwrap(), 1);
        assert!(v.list("").unwrap().is_empty());
        let t0 = v.now_ns();
        assert!(v.now_ns() >= t0);
        assert!(!v.virtual_time());
    }
}
