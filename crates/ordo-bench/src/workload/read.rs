//! Read benchmarks: one large file read sequentially, and many small files
//! each opened, read whole and closed, from a cold cache and from a warm
//! one.
//!
//! The runner remounts every target with a device between setup and run
//! (`target.rs`), which empties the file system's own caches: the kernel's
//! page cache of the mount (ext4's, FUSE's), ordo's process or in-process
//! `Fs`. The image, though, is a file on the host that setup has just
//! written through the loop device, so the host still caches it and a
//! "cold" read after the remount alone would be served from memory. A cold
//! case therefore also drops the host's clean caches
//! (`/proc/sys/vm/drop_caches`) at the start of its run, untimed; a warm
//! case reads everything once, untimed, and measures a second pass through
//! new opens. The measured interval is that pass alone
//! ([`RunOutput::elapsed_ns`]).
//!
//! Every byte read is compared with what setup wrote: a seeded pattern in
//! which the first 8 bytes of every 4 KiB block hold the file's number and
//! the block's, so that a block read from the wrong place, the wrong file,
//! or not at all (zeros) fails the case. The FUSE floor keeps sizes and
//! not bytes ([`Vfs::keeps_data`]): on it every file's length is checked,
//! and its rows measure what the kernel's FUSE transport alone costs for
//! the same requests (a LOOKUP, OPEN, READ and RELEASE per small file).
//!
//! The floor is not remounted (it would lose the setup's names), so a cold
//! case drops the host's dentries and inodes as well as its page cache
//! (`drop_caches` 3): the floor's cold pass then looks every name up again,
//! as a remounted target's does.

use serde_json::json;

use super::{pattern, Case, RunCtx, RunOutput, Scale};
use crate::error::{BenchError, Result};
use crate::sys;
use crate::vfs::{VFile, Vfs};

/// Request size of every read, and of the large file's writes.
const IO_BYTES: usize = 1 << 20;
/// The stamped unit: the first [`STAMP_BYTES`] of each carry its number.
const STAMP_BLOCK_BYTES: usize = 4096;
/// Bytes of the stamp at the start of each 4 KiB block.
const STAMP_BYTES: usize = 8;
/// Size of each small file.
const SMALL_FILE_BYTES: usize = 8 << 10;
/// Directories the small files are spread over.
pub(super) const SMALL_DIRS: u64 = 100;
/// The large file's name.
const LARGE_PATH: &str = "large";
/// Mixed into the seed of the small files' pattern.
const SMALL_SALT: u64 = 0x5a11_f11e;
/// Where a cold case drops the host's page cache.
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";
/// Bytes per MiB, for the bandwidth figure.
const MIB: f64 = (1u64 << 20) as f64;

/// Whether the measured pass starts with empty caches or follows a full
/// untimed pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// Remounted (by the runner) and the host's page cache dropped.
    Cold,
    /// Everything read once before the measured pass.
    Warm,
}

impl Cache {
    pub(super) fn name(self) -> &'static str {
        match self {
            Cache::Cold => "cold",
            Cache::Warm => "warm",
        }
    }
}

/// The four cases at `scale`: large cold, large warm, small cold, small
/// warm.
pub fn cases(scale: Scale) -> Vec<Box<dyn Case>> {
    // Medium and paper stop at three quarters of the default image (2 GiB
    // and 4 GiB), which a file of the image's size would not fit.
    let file_bytes: u64 = scale.pick(64 << 20, 1 << 30, 1536 << 20, 3 << 30);
    let files: u64 = scale.pick(2_000, 10_000, 20_000, 100_000);
    let mut out: Vec<Box<dyn Case>> = Vec::new();
    for cache in [Cache::Cold, Cache::Warm] {
        out.push(Box::new(LargeRead { file_bytes, cache }));
    }
    for cache in [Cache::Cold, Cache::Warm] {
        out.push(Box::new(SmallRead { files, cache }));
    }
    out
}

/// What a file must hold: `base` repeated, with the first 8 bytes of every
/// 4 KiB block replaced by `id << 32 | block number`.
struct Content {
    base: Vec<u8>,
    id: u64,
}

impl Content {
    /// `base_len` must be a multiple of 4 KiB.
    fn new(base_len: usize, seed: u64, id: u64) -> Content {
        debug_assert_eq!(base_len % STAMP_BLOCK_BYTES, 0);
        Content {
            base: pattern(base_len, seed),
            id,
        }
    }

    fn stamp(&self, block: u64) -> [u8; STAMP_BYTES] {
        ((self.id << 32) | block).to_le_bytes()
    }

    /// The `len` bytes at `offset` (4 KiB aligned).
    fn bytes_at(&self, offset: u64, len: usize) -> Vec<u8> {
        debug_assert_eq!(offset % STAMP_BLOCK_BYTES as u64, 0);
        let mut out = Vec::with_capacity(len);
        let mut off = offset;
        while out.len() < len {
            let b = (off % self.base.len() as u64) as usize;
            let n = (len - out.len()).min(STAMP_BLOCK_BYTES);
            let start = out.len();
            out.extend_from_slice(&self.base[b..b + n]);
            let s = n.min(STAMP_BYTES);
            out[start..start + s].copy_from_slice(&self.stamp(off / STAMP_BLOCK_BYTES as u64)[..s]);
            off += n as u64;
        }
        out
    }

    /// The offset of the first 4 KiB block of `data` (read at `offset`)
    /// that differs from what the file must hold, if any.
    fn first_mismatch(&self, offset: u64, data: &[u8]) -> Option<u64> {
        let block = STAMP_BLOCK_BYTES as u64;
        let mut pos = 0usize;
        while pos < data.len() {
            let off = offset + pos as u64;
            let in_block = (off % block) as usize;
            let seg = (STAMP_BLOCK_BYTES - in_block).min(data.len() - pos);
            let got = &data[pos..pos + seg];
            // The stamp part of this segment, then the pattern part.
            let stamp_len = STAMP_BYTES.saturating_sub(in_block).min(seg);
            let stamp_ok = stamp_len == 0
                || got[..stamp_len] == self.stamp(off / block)[in_block..in_block + stamp_len];
            let base_at = (off % self.base.len() as u64) as usize;
            if !stamp_ok || got[stamp_len..] != self.base[base_at + stamp_len..base_at + seg] {
                return Some(off - in_block as u64);
            }
            pos += seg;
        }
        None
    }
}

/// The error for a file whose bytes are not what setup wrote.
fn mismatch(path: &str, off: u64, data_at_off: &[u8]) -> BenchError {
    let block = &data_at_off[..data_at_off.len().min(STAMP_BLOCK_BYTES)];
    let what = if block.iter().all(|&b| b == 0) {
        "reads as zeros, not what setup wrote"
    } else {
        "differs from what setup wrote"
    };
    check_failed(format!("{path}: the 4 KiB block at offset {off} {what}"))
}

/// A failed data check (the words come first: the table cuts long errors).
fn check_failed(detail: String) -> BenchError {
    BenchError::Workload {
        workload: "read".into(),
        detail: format!("data check failed: {detail}"),
    }
}

/// Reads `f` from start to end in 1 MiB requests, checking every byte
/// against `want` (when the file system keeps bytes) and the length
/// against `len`; `tick`s every whole MiB read. Returns the bytes read.
fn read_checked(
    f: &dyn VFile,
    path: &str,
    want: Option<&Content>,
    len: u64,
    buf: &mut [u8],
    mut tick: impl FnMut(u64),
) -> Result<u64> {
    let mut off = 0u64;
    let mut ticked = 0u64;
    loop {
        let n = f.read_at(off, buf)?;
        if n == 0 {
            break;
        }
        if off + n as u64 > len {
            return Err(check_failed(format!(
                "{path}: more than the {len} bytes setup wrote ({n} at offset {off})"
            )));
        }
        if let Some(bad) = want.and_then(|w| w.first_mismatch(off, &buf[..n])) {
            let at = bad.max(off);
            return Err(mismatch(path, at, &buf[(at - off) as usize..n]));
        }
        off += n as u64;
        let mib = off / IO_BYTES as u64;
        if mib > ticked {
            tick(mib - ticked);
            ticked = mib;
        }
    }
    if off != len {
        return Err(check_failed(format!(
            "{path}: read {off} bytes, setup wrote {len}"
        )));
    }
    Ok(off)
}

/// Empties the host's clean caches: the page cache (the image's pages, the
/// loop device's, every mount's) and the unused dentries and inodes (a
/// FUSE mount's, so that the floor, which is not remounted, answers its
/// LOOKUPs again). Nothing in virtual time needs it.
pub(crate) fn drop_host_cache(vfs: &dyn Vfs, workload: &str) -> Result<&'static str> {
    if vfs.virtual_time() {
        return Ok("not needed (virtual time)");
    }
    std::fs::write(DROP_CACHES, "3").map_err(|e| BenchError::Workload {
        workload: workload.into(),
        detail: format!(
            "a cold read drops the host's caches (writing 3 to {DROP_CACHES}), which failed: {e} (run as root)"
        ),
    })?;
    Ok("dropped")
}

/// The ENOSPC of a setup write, said with what to do about it.
fn explain_full(e: BenchError, what: &str) -> BenchError {
    let errno = match &e {
        BenchError::Io { source, .. } => source.raw_os_error(),
        BenchError::Fs { source, .. } => Some(source.errno()),
        _ => None,
    };
    if errno == Some(libc::ENOSPC) {
        BenchError::Workload {
            workload: "read".into(),
            detail: format!("setup: {what} does not fit in the image ({e}): pass a larger --size"),
        }
    } else {
        e
    }
}

/// The measured pass of a case: its interval, and this process's CPU time
/// over it (the FUSE server's is not in it).
pub(super) struct Pass {
    pub(super) elapsed_ns: u64,
    pub(super) cpu_us: u64,
}

/// Runs the untimed preparation for `cache`, then times `measured`.
pub(super) fn measure(
    vfs: &dyn Vfs,
    workload: &str,
    cache: Cache,
    out: &mut RunOutput,
    warm_up: impl FnOnce() -> Result<()>,
    measured: impl FnOnce() -> Result<()>,
) -> Result<Pass> {
    match cache {
        Cache::Cold => {
            let how = drop_host_cache(vfs, workload)?;
            out.extra.insert("host_page_cache".into(), json!(how));
        }
        Cache::Warm => warm_up()?,
    }
    let cpu0 = sys::self_and_children_cpu_us();
    let t0 = vfs.now_ns();
    measured()?;
    let elapsed_ns = vfs.now_ns().saturating_sub(t0).max(1);
    let cpu_us = sys::self_and_children_cpu_us().saturating_sub(cpu0);
    Ok(Pass { elapsed_ns, cpu_us })
}

/// Fills in the figures every read case reports.
fn finish(vfs: &dyn Vfs, mut out: RunOutput, pass: Pass, ops: u64, bytes: u64) -> RunOutput {
    out.ops = ops;
    // False on the FUSE floor: lengths checked, not bytes.
    out.extra
        .insert("bytes_checked".into(), json!(vfs.keeps_data()));
    out.elapsed_ns = Some(pass.elapsed_ns);
    let secs = pass.elapsed_ns as f64 / 1e9;
    out.extra
        .insert("mib_per_sec".into(), json!(bytes as f64 / MIB / secs));
    out.extra.insert(
        "pass_cpu_us_per_op".into(),
        json!(pass.cpu_us as f64 / ops.max(1) as f64),
    );
    out
}

/// One file read sequentially in 1 MiB requests.
pub struct LargeRead {
    file_bytes: u64,
    cache: Cache,
}

impl LargeRead {
    fn content(seed: u64) -> Content {
        Content::new(IO_BYTES, seed, 0)
    }

    /// Opens the file and reads it whole; returns the bytes read.
    fn read_pass(&self, vfs: &dyn Vfs, want: &Content, tick: impl FnMut(u64)) -> Result<u64> {
        let mut buf = vec![0u8; IO_BYTES];
        let f = vfs.open(LARGE_PATH)?;
        let want = vfs.keeps_data().then_some(want);
        read_checked(&*f, LARGE_PATH, want, self.file_bytes, &mut buf, tick)
    }
}

impl Case for LargeRead {
    fn workload(&self) -> &'static str {
        "read"
    }
    fn label(&self) -> String {
        format!("large {}", self.cache.name())
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "file_bytes": self.file_bytes,
            "read_bytes": IO_BYTES,
            "cache": self.cache.name(),
            "file": "written in 1 MiB writes and fsynced by setup",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.file_bytes.div_ceil(IO_BYTES as u64)
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        let want = Self::content(seed);
        let what = format!("a file of {} MiB", self.file_bytes >> 20);
        let f = vfs.create(LARGE_PATH)?;
        let mut off = 0u64;
        while off < self.file_bytes {
            let n = (self.file_bytes - off).min(IO_BYTES as u64) as usize;
            f.write_at(off, &want.bytes_at(off, n))
                .map_err(|e| explain_full(e, &what))?;
            off += n as u64;
        }
        f.fsync().map_err(|e| explain_full(e, &what))
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let want = Self::content(ctx.seed);
        let mut out = RunOutput::default();
        let mut bytes = 0;
        let pass = measure(
            vfs,
            "read",
            self.cache,
            &mut out,
            || self.read_pass(vfs, &want, |_| {}).map(drop),
            || {
                bytes = self.read_pass(vfs, &want, |n| ctx.tick(n))?;
                Ok(())
            },
        )?;
        Ok(finish(
            vfs,
            out,
            pass,
            bytes.div_ceil(IO_BYTES as u64),
            bytes,
        ))
    }
}

/// `files` files spread over [`SMALL_DIRS`] directories named `PREFIX00`
/// on (the small-file read and the stat workloads'): file `i` is in
/// directory `i / ceil(files / 100)`, so a pass in file order goes one
/// directory after the other.
pub(super) struct Spread {
    pub(super) prefix: char,
    pub(super) files: u64,
}

impl Spread {
    fn per_dir(&self) -> u64 {
        self.files.div_ceil(SMALL_DIRS)
    }

    /// File `i`'s path.
    pub(super) fn path(&self, i: u64) -> String {
        format!("{}{:02}/f{:06}", self.prefix, i / self.per_dir(), i)
    }

    /// Makes the directories.
    pub(super) fn mkdirs(&self, vfs: &dyn Vfs) -> Result<()> {
        for d in 0..self.files.div_ceil(self.per_dir()) {
            vfs.mkdir(&format!("{}{d:02}", self.prefix))?;
        }
        Ok(())
    }
}

/// Many 8 KiB files, each opened, read whole and closed once.
pub struct SmallRead {
    files: u64,
    cache: Cache,
}

impl SmallRead {
    fn spread(&self) -> Spread {
        Spread {
            prefix: 'd',
            files: self.files,
        }
    }

    fn path(&self, i: u64) -> String {
        self.spread().path(i)
    }

    fn content(seed: u64, i: u64) -> Content {
        Content::new(SMALL_FILE_BYTES, seed ^ SMALL_SALT, i + 1)
    }

    /// Reads every file once, in creation order; returns the bytes read.
    fn read_pass(&self, vfs: &dyn Vfs, seed: u64, tick: impl Fn(u64)) -> Result<u64> {
        let mut buf = vec![0u8; IO_BYTES];
        let mut total = 0;
        let keeps_data = vfs.keeps_data();
        for i in 0..self.files {
            let path = self.path(i);
            let want = keeps_data.then(|| Self::content(seed, i));
            let f = vfs.open(&path)?;
            total += read_checked(
                &*f,
                &path,
                want.as_ref(),
                SMALL_FILE_BYTES as u64,
                &mut buf,
                |_| {},
            )?;
            drop(f);
            tick(1);
        }
        Ok(total)
    }
}

impl Case for SmallRead {
    fn workload(&self) -> &'static str {
        "read"
    }
    fn label(&self) -> String {
        format!("small {}", self.cache.name())
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "files": self.files,
            "file_bytes": SMALL_FILE_BYTES,
            "dirs": SMALL_DIRS,
            "read_bytes": IO_BYTES,
            "cache": self.cache.name(),
            "files_written": "one 8 KiB write and an fsync each, by setup",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.files
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        self.spread().mkdirs(vfs)?;
        let what = format!("{} files of 8 KiB", self.files);
        for i in 0..self.files {
            let f = vfs.create(&self.path(i))?;
            let data = Self::content(seed, i).bytes_at(0, SMALL_FILE_BYTES);
            f.write_at(0, &data).map_err(|e| explain_full(e, &what))?;
            f.fsync().map_err(|e| explain_full(e, &what))?;
        }
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let mut out = RunOutput::default();
        let mut bytes = 0;
        let pass = measure(
            vfs,
            "read",
            self.cache,
            &mut out,
            || self.read_pass(vfs, ctx.seed, |_| {}).map(drop),
            || {
                bytes = self.read_pass(vfs, ctx.seed, |n| ctx.tick(n))?;
                Ok(())
            },
        )?;
        Ok(finish(vfs, out, pass, self.files, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::PosixVfs;

    #[test]
    fn content_checks_what_it_wrote() {
        let c = Content::new(IO_BYTES, 42, 3);
        let data = c.bytes_at(0, 3 * IO_BYTES);
        assert_eq!(c.first_mismatch(0, &data), None);
        // Any slice at any offset checks against the same file.
        assert_eq!(c.first_mismatch(5, &data[5..9000]), None);
        assert_eq!(c.first_mismatch(4100, &data[4100..4101]), None);
        // A block of zeros, a block from elsewhere in the file, another
        // file's block: all fail, at the block they start.
        let zeros = vec![0u8; 4096];
        assert_eq!(c.first_mismatch(8192, &zeros), Some(8192));
        assert_eq!(
            c.first_mismatch(IO_BYTES as u64, &data[..4096]),
            Some(IO_BYTES as u64),
            "the pattern repeats every MiB; the stamp does not"
        );
        let other = Content::new(IO_BYTES, 42, 4);
        assert_eq!(c.first_mismatch(0, &other.bytes_at(0, 4096)), Some(0));
        let mut flipped = data[..8192].to_vec();
        flipped[6000] ^= 1;
        assert_eq!(c.first_mismatch(0, &flipped), Some(4096));
        assert!(mismatch("f", 0, &zeros).to_string().contains("zeros"));
    }

    #[test]
    fn cases_read_back_on_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let v = PosixVfs::new(dir.path());
        let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ctx = RunCtx {
            seed: 9,
            progress: progress.clone(),
        };
        let large = LargeRead {
            file_bytes: 3 << 20,
            cache: Cache::Warm,
        };
        large.setup(&v, 9).unwrap();
        let out = large.run(&v, &ctx).unwrap();
        assert_eq!(out.ops, 3);
        assert!(out.elapsed_ns.unwrap() > 0);
        assert!(out.extra["mib_per_sec"].as_f64().unwrap() > 0.0);
        let small = SmallRead {
            files: 300,
            cache: Cache::Warm,
        };
        small.setup(&v, 9).unwrap();
        assert_eq!(
            v.list("").unwrap().len(),
            101,
            "100 directories and the large file"
        );
        let out = small.run(&v, &ctx).unwrap();
        assert_eq!(out.ops, 300);
        assert_eq!(progress.load(std::sync::atomic::Ordering::Relaxed), 3 + 300);
        // Another seed's bytes are not these.
        let other = RunCtx { seed: 10, progress };
        let e = small.run(&v, &other).unwrap_err().to_string();
        assert!(e.contains("data check failed"), "{e}");
        // A short file fails the length check.
        v.create(LARGE_PATH).unwrap();
        let e = large.run(&v, &ctx).unwrap_err().to_string();
        assert!(e.contains("read 0 bytes"), "{e}");
    }
}
