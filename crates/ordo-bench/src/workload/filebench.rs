//! Filebench's personalities, re-implemented with threads: varmail,
//! fileserver, webserver and createfiles (the `.f` files shipped with
//! Filebench 1.4/1.5, by Wilson, Tarasov, Zadok et al.). They are the
//! macro-benchmarks of OptFS (Chidambaram et al., SOSP '13) and of the
//! fast-commit paper (Shirwadkar et al., ATC '24), among many others.
//!
//! What is kept from Filebench: the flowop sequence of each personality,
//! file sizes drawn from a gamma distribution (shape 1.5) with the
//! personality's mean, `appendfilerand` appending a uniformly random 1 to
//! `meanappendsize` bytes (as Filebench does, despite the name), the
//! preallocated share of the file set, the directory width, and an
//! operation counted per flowop (Filebench's "ops/s"). What differs: a
//! fixed number of loops per thread instead of a fixed time, so every
//! target does the same work, and a file set whose entries a thread claims
//! exclusively while it uses them (Filebench's `FSE_BUSY`).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use rand::Rng;
use serde_json::json;

use super::{pattern, run_threads, timed_fsync, Case, Overrides, RunCtx, RunOutput, Scale};
use crate::error::Result;
use crate::stats::{filebench_size, thread_rng};
use crate::vfs::{mkdir_all, read_whole, Vfs};

/// Filebench's `iosize` for whole-file reads and writes: 1 MiB.
const IO_BYTES: usize = 1 << 20;
/// Filebench's `meanappendsize`: 16 KiB.
const APPEND_MAX_BYTES: u64 = 16 << 10;

const ABSENT: u8 = 0;
const PRESENT: u8 = 1;
const BUSY: u8 = 2;

/// A Filebench file set: `entries` files under `root`, `dir_width` per
/// directory, sizes fixed per entry by the seed.
pub struct FileSet {
    root: String,
    entries: u64,
    dir_width: u64,
    mean_bytes: u64,
    /// Percentage of entries created before the run.
    prealloc_pct: u64,
    state: Vec<AtomicU8>,
}

impl FileSet {
    fn new(root: &str, entries: u64, dir_width: u64, mean_bytes: u64, prealloc_pct: u64) -> Self {
        FileSet {
            root: root.to_string(),
            entries,
            dir_width: dir_width.max(2),
            mean_bytes,
            prealloc_pct,
            state: (0..entries).map(|_| AtomicU8::new(ABSENT)).collect(),
        }
    }

    /// Directory levels below the root: enough for `entries / dir_width`
    /// leaf directories at `dir_width` per directory.
    fn depth(&self) -> u32 {
        let mut leaves = self.entries.div_ceil(self.dir_width);
        let mut depth = 0;
        while leaves > 1 {
            leaves = leaves.div_ceil(self.dir_width);
            depth += 1;
        }
        depth
    }

    /// The directory holding entry `i`.
    fn dir_of(&self, i: u64) -> String {
        let depth = self.depth();
        let mut leaf = i / self.dir_width;
        let mut parts = Vec::with_capacity(depth as usize);
        for _ in 0..depth {
            parts.push(format!("d{}", leaf % self.dir_width));
            leaf /= self.dir_width;
        }
        parts.reverse();
        let mut p = self.root.clone();
        for part in parts {
            p.push('/');
            p.push_str(&part);
        }
        p
    }

    /// The path of entry `i`.
    pub fn path(&self, i: u64) -> String {
        format!("{}/f{i}", self.dir_of(i))
    }

    /// The size of entry `i` when it is written whole.
    fn size(&self, seed: u64, i: u64) -> u64 {
        let mut rng = thread_rng(seed ^ 0x5EED_F11E, i);
        filebench_size(&mut rng, self.mean_bytes)
    }

    /// Whether entry `i` exists before the run.
    fn preallocated(&self, seed: u64, i: u64) -> bool {
        let mut rng = thread_rng(seed ^ 0xA110C, i);
        rng.gen_range(0..100) < self.prealloc_pct
    }

    /// Creates the directories and the preallocated files.
    fn populate(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        let mut made = std::collections::HashSet::new();
        for i in 0..self.entries {
            let d = self.dir_of(i);
            if made.insert(d.clone()) {
                mkdir_all(vfs, &d)?;
            }
        }
        for i in 0..self.entries {
            if self.preallocated(seed, i) {
                write_whole(vfs, &self.path(i), self.size(seed, i), seed ^ i)?;
                self.state[i as usize].store(PRESENT, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Marks the preallocated entries present without touching the file
    /// system (the run sees the state setup left).
    fn mark_preallocated(&self, seed: u64) {
        for i in 0..self.entries {
            let s = if self.preallocated(seed, i) {
                PRESENT
            } else {
                ABSENT
            };
            self.state[i as usize].store(s, Ordering::Relaxed);
        }
    }

    /// Claims an entry in state `want` (starting at a random one and
    /// probing onwards), marking it busy; `None` if there is none.
    fn claim(&self, rng: &mut impl Rng, want: u8) -> Option<u64> {
        let start = rng.gen_range(0..self.entries);
        (0..self.entries)
            .map(|k| (start + k) % self.entries)
            .find(|&i| {
                self.state[i as usize]
                    .compare_exchange(want, BUSY, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
    }

    fn release(&self, i: u64, to: u8) {
        let prev = self.state[i as usize].swap(to, Ordering::AcqRel);
        debug_assert_eq!(prev, BUSY, "entry {i} released without being claimed");
    }
}

/// Writes a file of `size` bytes in `IO_BYTES` requests (Filebench's
/// `writewholefile`).
fn write_whole(vfs: &dyn Vfs, path: &str, size: u64, seed: u64) -> Result<()> {
    let f = vfs.create(path)?;
    write_whole_to(&*f, size, seed)
}

fn write_whole_to(f: &dyn crate::vfs::VFile, size: u64, seed: u64) -> Result<()> {
    let buf = pattern(IO_BYTES.min(size as usize).max(1), seed);
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(buf.len() as u64) as usize;
        f.write_at(off, &buf[..n])?;
        off += n as u64;
    }
    Ok(())
}

/// Appends 1..=`APPEND_MAX_BYTES` bytes (Filebench's `appendfilerand`).
fn append_rand(f: &dyn crate::vfs::VFile, rng: &mut impl Rng, buf: &[u8]) -> Result<()> {
    let n = rng.gen_range(1..=APPEND_MAX_BYTES) as usize;
    let off = f.size_bytes()?;
    f.write_at(off, &buf[..n])
}

/// Which personality.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Varmail,
    Fileserver,
    Webserver,
    Createfiles,
}

/// A Filebench personality at one scale.
pub struct Personality {
    kind: Kind,
    threads: u32,
    /// Loops of the flowop list per thread (createfiles: files in total).
    loops: u64,
    set: FileSet,
    /// Webserver's shared log file.
    log: Mutex<()>,
    /// Createfiles: next entry to create.
    next: AtomicU64,
}

fn personality(
    kind: Kind,
    threads: u32,
    loops: u64,
    entries: u64,
    dir_width: u64,
    mean_bytes: u64,
    prealloc_pct: u64,
) -> Box<dyn Case> {
    Box::new(Personality {
        kind,
        threads,
        loops,
        set: FileSet::new("set", entries, dir_width, mean_bytes, prealloc_pct),
        log: Mutex::new(()),
        next: AtomicU64::new(0),
    })
}

/// varmail.f: 16 threads, 1000 files in one directory (`meandirwidth`
/// 1000000), mean 16 KiB, 80% preallocated; per loop: delete, create +
/// append + fsync + close, open + read + append + fsync + close, open +
/// read + close (13 flowops).
pub fn varmail(scale: Scale, o: &Overrides) -> Box<dyn Case> {
    personality(
        Kind::Varmail,
        o.threads.unwrap_or(scale.pick(2, 16, 16, 16)),
        scale.pick(3, 20, 100, 500),
        scale.pick(20, 200, 1000, 1000),
        1_000_000,
        16 << 10,
        80,
    )
}

/// fileserver.f: 50 threads, 10,000 files, 20 per directory, mean
/// 128 KiB, 80% preallocated; per loop: create + write whole + close,
/// open + append + close, open + read whole + close, delete, stat (11
/// flowops).
pub fn fileserver(scale: Scale, o: &Overrides) -> Box<dyn Case> {
    personality(
        Kind::Fileserver,
        o.threads.unwrap_or(scale.pick(2, 10, 50, 50)),
        scale.pick(3, 10, 20, 100),
        scale.pick(20, 200, 2000, 10_000),
        20,
        scale.pick(16 << 10, 32 << 10, 128 << 10, 128 << 10),
        80,
    )
}

/// webserver.f: 100 threads, 1000 files, 20 per directory, mean 16 KiB,
/// all preallocated and read-only; per loop: ten times open + read whole +
/// close, then an append to one shared log file (31 flowops).
pub fn webserver(scale: Scale, o: &Overrides) -> Box<dyn Case> {
    personality(
        Kind::Webserver,
        o.threads.unwrap_or(scale.pick(2, 16, 100, 100)),
        scale.pick(2, 5, 10, 50),
        scale.pick(20, 200, 1000, 1000),
        20,
        16 << 10,
        100,
    )
}

/// createfiles.f: 16 threads create 50,000 files of mean 16 KiB, 100 per
/// directory: create + write whole + close (3 flowops per file).
pub fn createfiles(scale: Scale, o: &Overrides) -> Box<dyn Case> {
    let files = scale.pick(50, 2000, 10_000, 50_000);
    personality(
        Kind::Createfiles,
        o.threads.unwrap_or(scale.pick(2, 16, 16, 16)),
        files,
        files,
        100,
        16 << 10,
        0,
    )
}

impl Personality {
    fn flowops_per_loop(&self) -> u64 {
        match self.kind {
            Kind::Varmail => 13,
            Kind::Fileserver => 11,
            Kind::Webserver => 31,
            Kind::Createfiles => 3,
        }
    }

    fn varmail_loop(
        &self,
        vfs: &dyn Vfs,
        rng: &mut impl Rng,
        buf: &[u8],
        lat: &mut Vec<u64>,
    ) -> Result<u64> {
        let set = &self.set;
        let mut ops = 0;
        if let Some(i) = set.claim(rng, PRESENT) {
            vfs.unlink(&set.path(i))?;
            set.release(i, ABSENT);
            ops += 1;
        }
        if let Some(i) = set.claim(rng, ABSENT) {
            let f = vfs.create(&set.path(i))?;
            append_rand(&*f, rng, buf)?;
            timed_fsync(vfs, &*f, lat)?;
            drop(f);
            set.release(i, PRESENT);
            ops += 5;
        }
        if let Some(i) = set.claim(rng, PRESENT) {
            let f = vfs.open(&set.path(i))?;
            read_whole(&*f, IO_BYTES)?;
            append_rand(&*f, rng, buf)?;
            timed_fsync(vfs, &*f, lat)?;
            drop(f);
            set.release(i, PRESENT);
            ops += 5;
        }
        if let Some(i) = set.claim(rng, PRESENT) {
            let f = vfs.open(&set.path(i))?;
            read_whole(&*f, IO_BYTES)?;
            drop(f);
            set.release(i, PRESENT);
            ops += 3;
        }
        Ok(ops)
    }

    fn fileserver_loop(
        &self,
        vfs: &dyn Vfs,
        seed: u64,
        rng: &mut impl Rng,
        buf: &[u8],
    ) -> Result<u64> {
        let set = &self.set;
        let mut ops = 0;
        if let Some(i) = set.claim(rng, ABSENT) {
            let f = vfs.create(&set.path(i))?;
            write_whole_to(&*f, set.size(seed, i), seed ^ i)?;
            drop(f);
            set.release(i, PRESENT);
            ops += 3;
        }
        if let Some(i) = set.claim(rng, PRESENT) {
            let f = vfs.open(&set.path(i))?;
            append_rand(&*f, rng, buf)?;
            drop(f);
            set.release(i, PRESENT);
            ops += 3;
        }
        if let Some(i) = set.claim(rng, PRESENT) {
            let f = vfs.open(&set.path(i))?;
            read_whole(&*f, IO_BYTES)?;
            drop(f);
            set.release(i, PRESENT);
            ops += 3;
        }
        if let Some(i) = set.claim(rng, PRESENT) {
            vfs.unlink(&set.path(i))?;
            set.release(i, ABSENT);
            ops += 1;
        }
        if let Some(i) = set.claim(rng, PRESENT) {
            vfs.size(&set.path(i))?;
            set.release(i, PRESENT);
            ops += 1;
        }
        Ok(ops)
    }

    fn webserver_loop(&self, vfs: &dyn Vfs, rng: &mut impl Rng, buf: &[u8]) -> Result<u64> {
        /// Whole-file reads per loop (webserver.f lists ten).
        const READS_PER_LOOP: u64 = 10;
        let set = &self.set;
        for _ in 0..READS_PER_LOOP {
            // The set is read-only: readers share entries, nothing is claimed.
            let i = rng.gen_range(0..set.entries);
            let f = vfs.open(&set.path(i))?;
            read_whole(&*f, IO_BYTES)?;
        }
        {
            let _one_appender = self.log.lock().unwrap_or_else(|p| p.into_inner());
            let f = vfs.open("log")?;
            append_rand(&*f, rng, buf)?;
        }
        Ok(READS_PER_LOOP * 3 + 1)
    }
}

impl Case for Personality {
    fn workload(&self) -> &'static str {
        match self.kind {
            Kind::Varmail => "varmail",
            Kind::Fileserver => "fileserver",
            Kind::Webserver => "webserver",
            Kind::Createfiles => "createfiles",
        }
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "threads": self.threads,
            "loops_per_thread": if self.kind == Kind::Createfiles { serde_json::Value::Null } else { json!(self.loops) },
            "files": self.set.entries,
            "dir_width": self.set.dir_width,
            "mean_file_bytes": self.set.mean_bytes,
            "prealloc_pct": self.set.prealloc_pct,
            "append_max_bytes": APPEND_MAX_BYTES,
            "io_bytes": IO_BYTES,
            "flowops_per_loop": self.flowops_per_loop(),
        })
    }
    fn expected_ops(&self) -> u64 {
        match self.kind {
            Kind::Createfiles => self.loops * 3,
            _ => self.loops * self.threads as u64 * self.flowops_per_loop(),
        }
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        self.set.populate(vfs, seed)?;
        if self.kind == Kind::Webserver {
            write_whole(vfs, "log", 0, seed)?;
        }
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let seed = ctx.seed;
        self.set.mark_preallocated(seed);
        self.next.store(0, Ordering::Relaxed);
        run_threads(self.workload(), self.threads, |t| {
            let mut rng = thread_rng(seed, t as u64 + 1);
            let buf = pattern(APPEND_MAX_BYTES as usize, seed ^ t as u64);
            let mut lat = Vec::new();
            let mut ops = 0;
            if self.kind == Kind::Createfiles {
                loop {
                    let i = self.next.fetch_add(1, Ordering::Relaxed);
                    if i >= self.set.entries {
                        break;
                    }
                    write_whole(vfs, &self.set.path(i), self.set.size(seed, i), seed ^ i)?;
                    ops += 3;
                    ctx.tick(3);
                }
                return Ok((ops, lat));
            }
            for _ in 0..self.loops {
                let n = match self.kind {
                    Kind::Varmail => self.varmail_loop(vfs, &mut rng, &buf, &mut lat)?,
                    Kind::Fileserver => self.fileserver_loop(vfs, seed, &mut rng, &buf)?,
                    Kind::Webserver => self.webserver_loop(vfs, &mut rng, &buf)?,
                    Kind::Createfiles => unreachable!("handled above"),
                };
                ops += n;
                ctx.tick(n);
            }
            Ok((ops, lat))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::PosixVfs;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn file_set_paths_respect_the_directory_width() {
        let s = FileSet::new("set", 10_000, 20, 1, 0);
        assert_eq!(s.depth(), 3);
        assert_eq!(s.path(0), "set/d0/d0/d0/f0");
        assert_eq!(s.path(25), "set/d0/d0/d1/f25");
        let one = FileSet::new("set", 1000, 1_000_000, 1, 0);
        assert_eq!(one.depth(), 0);
        assert_eq!(one.path(999), "set/f999");
        let mut dirs = std::collections::HashSet::new();
        for i in 0..10_000 {
            dirs.insert(s.dir_of(i));
        }
        assert_eq!(dirs.len(), 500, "10000 files at 20 per directory");
    }

    #[test]
    fn claims_are_exclusive() {
        let s = FileSet::new("set", 3, 10, 1, 0);
        let mut rng = thread_rng(1, 1);
        let a = s.claim(&mut rng, ABSENT).unwrap();
        let b = s.claim(&mut rng, ABSENT).unwrap();
        let c = s.claim(&mut rng, ABSENT).unwrap();
        assert!(a != b && b != c && a != c);
        assert!(s.claim(&mut rng, ABSENT).is_none());
        s.release(b, PRESENT);
        assert_eq!(s.claim(&mut rng, PRESENT), Some(b));
    }

    #[test]
    fn every_personality_runs_on_a_directory() {
        for mk in [varmail, fileserver, webserver, createfiles] {
            let dir = tempfile::tempdir().unwrap();
            let vfs = PosixVfs::new(dir.path());
            let case = mk(Scale::Smoke, &Overrides::default());
            case.setup(&vfs, 9).unwrap();
            let ctx = RunCtx {
                seed: 9,
                progress: Arc::new(AtomicU64::new(0)),
            };
            let out = case.run(&vfs, &ctx).unwrap();
            assert!(out.ops > 0, "{}", case.workload());
            assert_eq!(ctx.progress.load(Ordering::Relaxed), out.ops);
            if case.workload() == "varmail" {
                assert!(!out.fsync_ns.is_empty(), "varmail fsyncs");
            }
            if case.workload() == "createfiles" {
                assert_eq!(out.ops, case.expected_ops());
            }
        }
    }
}
