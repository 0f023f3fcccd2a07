//! NoFS's benchmarks (Chidambaram, Sharma, Arpaci-Dusseau and
//! Arpaci-Dusseau, "Consistency Without Ordering", FAST '12): the
//! micro-benchmarks of its Figure 4 and the sort of its Figure 5 (Figure
//! 5's Filebench personalities are [`super::filebench`]'s; Figure 6, the
//! scanners' cost, is [`crate::nofs_scan`], which needs crashed images and
//! so is not a [`Case`]).
//!
//! `nofs-micro` (Figure 4), one case each, every case on a fresh file
//! system:
//!
//! - `seq-write`: one file written from offset 0 in 64 KiB requests, one
//!   fsync at the end (the paper: 1 GB); operation: a request.
//! - `seq-read`: the same file, written and made durable in the setup,
//!   read whole in 64 KiB requests from a cold cache; operation: a
//!   request.
//! - `rand-write`: 4 KiB writes at random 4 KiB-aligned offsets of a file
//!   of the same size filled in the setup, an fsync every 1,000 (the
//!   paper: 10K writes of 4,088 bytes, its 8-byte in-block header being
//!   the rest of the block; ordo's owner records live in a table, so the
//!   block stays 4,096 bytes of data); operation: a write.
//! - `rand-read`: as many 4 KiB reads at random offsets, cold cache;
//!   operation: a read.
//! - `create`: empty files created round-robin in 100 directories, each
//!   created, fsynced and closed (the paper: 100K files, "a fsync after
//!   every create"); operation: a create.
//! - `delete`: the same files, made in the setup, each unlinked and its
//!   directory fsynced (the directory holds what a delete changed);
//!   operation: a delete.
//!
//! Cold means what [`super::read`] means: the runner remounted the target
//! and the host's clean page cache is dropped at the start of the run
//! (in virtual time the in-process file system's cache is empty after the
//! remount, which is all the model needs). Every byte read is compared
//! with what the setup wrote.
//!
//! `sort` (Figure 5): gensort-style records of 100 bytes (a random 10-byte
//! key, then the record's number and filler), written in the setup; the
//! run is an external merge sort as sort(1) does it on a file larger than
//! its buffer: the input read in 1 MiB requests into four runs, each
//! sorted in memory and written to a temporary file, then merged into the
//! output, the runs deleted, and the output fsynced (sort(1) does not
//! fsync; without it the output would still be in the cache when the time
//! stops). The output is checked to be in order and complete. Operation:
//! a record; `extra.mb_per_s` is the input's bytes (10^6) per second.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::Rng;
use serde_json::json;

use super::read::drop_host_cache;
use super::{pattern, timed_fsync, Case, RunCtx, RunOutput, Scale};
use crate::error::{BenchError, Result};
use crate::stats::thread_rng;
use crate::vfs::{mkdir_all, VFile, Vfs};

use super::micro::{fill, FILL_IO_BYTES};

/// Sequential request size (reads and writes).
const SEQ_IO_BYTES: usize = 64 << 10;
/// Random request size.
const RAND_IO_BYTES: usize = 4096;
/// Directory of every file of the workload.
const ROOT: &str = "nofs";
/// The large file of the data cases.
const DATA_PATH: &str = "nofs/data";
/// The workload's name.
const NAME: &str = "nofs-micro";
/// Bytes per MiB.
const MIB: f64 = (1u64 << 20) as f64;

/// Which of Figure 4's benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Micro {
    /// Sequential write of one file.
    SeqWrite,
    /// Sequential read of one file, cold.
    SeqRead,
    /// Random 4 KiB writes, an fsync every `fsync_every`.
    RandWrite,
    /// Random 4 KiB reads, cold.
    RandRead,
    /// Creates with an fsync each.
    Create,
    /// Deletes with an fsync of the directory each.
    Delete,
}

impl Micro {
    /// Every case, in the figure's order.
    pub const ALL: [Micro; 6] = [
        Micro::SeqWrite,
        Micro::SeqRead,
        Micro::RandWrite,
        Micro::RandRead,
        Micro::Create,
        Micro::Delete,
    ];

    /// The case label.
    pub fn name(self) -> &'static str {
        match self {
            Micro::SeqWrite => "seq-write",
            Micro::SeqRead => "seq-read",
            Micro::RandWrite => "rand-write",
            Micro::RandRead => "rand-read",
            Micro::Create => "create",
            Micro::Delete => "delete",
        }
    }
}

/// One of Figure 4's benchmarks at one scale.
pub struct NofsMicro {
    kind: Micro,
    /// The data cases' file.
    file_bytes: u64,
    /// Random requests.
    rand_ios: u64,
    /// An fsync every this many random writes.
    fsync_every: u64,
    /// Files created or deleted.
    files: u64,
    /// Directories they are spread over.
    dirs: u64,
}

/// The six cases of `nofs-micro` at `scale`; `fsync_every` (first value
/// of `--fsync-every`) overrides rand-write's 1,000.
pub fn micro_cases(scale: Scale, fsync_every: Option<u64>) -> Vec<Box<dyn Case>> {
    Micro::ALL
        .into_iter()
        .map(|kind| {
            Box::new(NofsMicro {
                kind,
                file_bytes: scale.pick(4 << 20, 64 << 20, 256 << 20, 1 << 30),
                rand_ios: scale.pick(200, 10_000, 10_000, 10_000),
                fsync_every: fsync_every
                    .unwrap_or(scale.pick(100, 1000, 1000, 1000))
                    .max(1),
                files: scale.pick(200, 2_000, 20_000, 100_000),
                dirs: scale.pick(10, 100, 100, 100),
            }) as Box<dyn Case>
        })
        .collect()
}

/// The directory of file `i`.
fn dir_of(i: u64, dirs: u64) -> String {
    format!("{ROOT}/d{}", i % dirs)
}

/// The path of file `i`.
fn file_of(i: u64, dirs: u64) -> String {
    format!("{}/f{i}", dir_of(i, dirs))
}

fn check_failed(path: &str, detail: String) -> BenchError {
    BenchError::Workload {
        workload: NAME.into(),
        detail: format!("data check failed: {path}: {detail}"),
    }
}

/// Reads `len` bytes at `off` and compares them with the fill pattern
/// `want` (1 MiB, repeated).
fn read_and_check(f: &dyn VFile, off: u64, buf: &mut [u8], want: &[u8]) -> Result<()> {
    let mut got = 0usize;
    while got < buf.len() {
        let n = f.read_at(off + got as u64, &mut buf[got..])?;
        if n == 0 {
            return Err(check_failed(
                DATA_PATH,
                format!(
                    "end of file at {} (wanted {} bytes at {off})",
                    off + got as u64,
                    buf.len()
                ),
            ));
        }
        got += n;
    }
    let at = (off % want.len() as u64) as usize;
    if buf[..] != want[at..at + buf.len()] {
        let what = if buf.iter().all(|&b| b == 0) {
            "reads as zeros"
        } else {
            "differs from what setup wrote"
        };
        return Err(check_failed(
            DATA_PATH,
            format!("the {} bytes at offset {off} {what}", buf.len()),
        ));
    }
    Ok(())
}

impl NofsMicro {
    fn seq_write(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let t0 = vfs.now_ns();
        let f = vfs.create(DATA_PATH)?;
        let buf = pattern(SEQ_IO_BYTES, ctx.seed);
        let writes = self.file_bytes / SEQ_IO_BYTES as u64;
        for i in 0..writes {
            f.write_at(i * SEQ_IO_BYTES as u64, &buf)?;
            ctx.tick(1);
        }
        let mut lat = Vec::new();
        timed_fsync(vfs, &*f, &mut lat)?;
        let mut out = RunOutput {
            ops: writes,
            fsync_ns: lat,
            ..RunOutput::default()
        };
        out.extra
            .insert("mib_per_sec".into(), json!(self.mib_per_sec(vfs, t0)));
        Ok(out)
    }

    fn mib_per_sec(&self, vfs: &dyn Vfs, t0: u64) -> f64 {
        let secs = vfs.now_ns().saturating_sub(t0).max(1) as f64 / 1e9;
        self.file_bytes as f64 / MIB / secs
    }

    fn seq_read(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let cache = drop_host_cache(vfs, NAME)?;
        let want = pattern(FILL_IO_BYTES, ctx.seed);
        let t0 = vfs.now_ns();
        let f = vfs.open(DATA_PATH)?;
        let mut buf = vec![0u8; SEQ_IO_BYTES];
        let reads = self.file_bytes / SEQ_IO_BYTES as u64;
        for i in 0..reads {
            read_and_check(&*f, i * SEQ_IO_BYTES as u64, &mut buf, &want)?;
            ctx.tick(1);
        }
        let mut out = RunOutput {
            ops: reads,
            ..RunOutput::default()
        };
        out.extra
            .insert("mib_per_sec".into(), json!(self.mib_per_sec(vfs, t0)));
        out.extra.insert("host_cache".into(), json!(cache));
        Ok(out)
    }

    fn rand_write(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        super::micro::random_writes(
            vfs,
            ctx,
            super::micro::RandomWrites {
                path: DATA_PATH,
                file_bytes: self.file_bytes,
                io_bytes: RAND_IO_BYTES,
                writes: self.rand_ios,
                fsync_every: self.fsync_every,
                stream: 0x4a4d,
            },
        )
    }

    fn rand_read(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let cache = drop_host_cache(vfs, NAME)?;
        let want = pattern(FILL_IO_BYTES, ctx.seed);
        let f = vfs.open(DATA_PATH)?;
        let mut rng = thread_rng(ctx.seed, 0x4a4e);
        let blocks = self.file_bytes / RAND_IO_BYTES as u64;
        let mut buf = vec![0u8; RAND_IO_BYTES];
        for _ in 0..self.rand_ios {
            let b = rng.gen_range(0..blocks);
            read_and_check(&*f, b * RAND_IO_BYTES as u64, &mut buf, &want)?;
            ctx.tick(1);
        }
        let mut out = RunOutput {
            ops: self.rand_ios,
            ..RunOutput::default()
        };
        out.extra.insert("host_cache".into(), json!(cache));
        Ok(out)
    }

    fn make_dirs(&self, vfs: &dyn Vfs) -> Result<()> {
        mkdir_all(vfs, ROOT)?;
        for d in 0..self.dirs.min(self.files.max(1)) {
            vfs.mkdir(&dir_of(d, self.dirs))?;
        }
        Ok(())
    }

    fn create(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let mut lat = Vec::with_capacity(self.files as usize);
        for i in 0..self.files {
            let f = vfs.create(&file_of(i, self.dirs))?;
            timed_fsync(vfs, &*f, &mut lat)?;
            drop(f);
            ctx.tick(1);
        }
        Ok(RunOutput {
            ops: self.files,
            fsync_ns: lat,
            ..RunOutput::default()
        })
    }

    fn delete(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let dirs: Vec<Box<dyn VFile>> = (0..self.dirs.min(self.files.max(1)))
            .map(|d| vfs.open_dir(&dir_of(d, self.dirs)))
            .collect::<Result<_>>()?;
        let mut lat = Vec::with_capacity(self.files as usize);
        for i in 0..self.files {
            vfs.unlink(&file_of(i, self.dirs))?;
            timed_fsync(vfs, &*dirs[(i % self.dirs) as usize], &mut lat)?;
            ctx.tick(1);
        }
        drop(dirs);
        for d in 0..self.dirs.min(self.files.max(1)) {
            if !vfs.list(&dir_of(d, self.dirs))?.is_empty() {
                return Err(BenchError::Workload {
                    workload: NAME.into(),
                    detail: format!("{} is not empty after the deletes", dir_of(d, self.dirs)),
                });
            }
        }
        Ok(RunOutput {
            ops: self.files,
            fsync_ns: lat,
            ..RunOutput::default()
        })
    }
}

impl Case for NofsMicro {
    fn workload(&self) -> &'static str {
        NAME
    }
    fn label(&self) -> String {
        self.kind.name().to_string()
    }
    fn params(&self) -> serde_json::Value {
        match self.kind {
            Micro::SeqWrite | Micro::SeqRead => json!({
                "file_bytes": self.file_bytes,
                "io_bytes": SEQ_IO_BYTES,
                "fsync": if self.kind == Micro::SeqWrite { "at end" } else { "none (cold cache)" },
            }),
            Micro::RandWrite => json!({
                "file_bytes": self.file_bytes,
                "io_bytes": RAND_IO_BYTES,
                "ios": self.rand_ios,
                "fsync_every": self.fsync_every,
            }),
            Micro::RandRead => json!({
                "file_bytes": self.file_bytes,
                "io_bytes": RAND_IO_BYTES,
                "ios": self.rand_ios,
                "cache": "cold",
            }),
            Micro::Create | Micro::Delete => json!({
                "files": self.files,
                "dirs": self.dirs,
                "file_bytes": 0,
                "fsync": if self.kind == Micro::Create { "the file, after each create" } else { "the directory, after each delete" },
            }),
        }
    }
    fn expected_ops(&self) -> u64 {
        match self.kind {
            Micro::SeqWrite | Micro::SeqRead => self.file_bytes / SEQ_IO_BYTES as u64,
            Micro::RandWrite | Micro::RandRead => self.rand_ios,
            Micro::Create | Micro::Delete => self.files,
        }
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        match self.kind {
            Micro::SeqWrite => mkdir_all(vfs, ROOT),
            Micro::SeqRead | Micro::RandWrite | Micro::RandRead => {
                mkdir_all(vfs, ROOT)?;
                fill(vfs, DATA_PATH, self.file_bytes, seed)
            }
            Micro::Create => self.make_dirs(vfs),
            Micro::Delete => {
                self.make_dirs(vfs)?;
                for i in 0..self.files {
                    drop(vfs.create(&file_of(i, self.dirs))?);
                }
                Ok(())
            }
        }
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        match self.kind {
            Micro::SeqWrite => self.seq_write(vfs, ctx),
            Micro::SeqRead => self.seq_read(vfs, ctx),
            Micro::RandWrite => self.rand_write(vfs, ctx),
            Micro::RandRead => self.rand_read(vfs, ctx),
            Micro::Create => self.create(vfs, ctx),
            Micro::Delete => self.delete(vfs, ctx),
        }
    }
}

/// gensort's record size.
const RECORD_BYTES: usize = 100;
/// gensort's key size.
const KEY_BYTES: usize = 10;
/// Runs the input is split into (sort(1) with a buffer a quarter of the
/// input).
const SORT_RUNS: u64 = 4;
/// Where sort's files live.
const SORT_DIR: &str = "sort";
/// The input.
const SORT_INPUT: &str = "sort/input";
/// The output.
const SORT_OUTPUT: &str = "sort/output";

/// An external merge sort of gensort-style records.
pub struct Sort {
    records: u64,
}

/// sort at `scale`: 20,000 / 320,000 / 1,280,000 / 5,000,000 records of
/// 100 bytes (2 / 32 / 128 / 500 MB; the paper: 500 MB).
pub fn sort(scale: Scale) -> Box<dyn Case> {
    Box::new(Sort {
        records: scale.pick(20_000, 320_000, 1_280_000, 5_000_000),
    })
}

/// Record `i` of the input: a random key from the seed, then `i` in 16
/// hex digits, then filler (gensort's layout, in spirit).
fn record(rng: &mut impl Rng, i: u64, out: &mut Vec<u8>) {
    let mut key = [0u8; KEY_BYTES];
    rng.fill(&mut key[..]);
    out.extend_from_slice(&key);
    out.extend_from_slice(format!("  {i:016X}  ").as_bytes());
    let used = KEY_BYTES + 20;
    out.extend((0..RECORD_BYTES - used).map(|k| b'A' + ((i as usize + k) % 26) as u8));
}

/// Writes a stream in `FILL_IO_BYTES` requests.
struct SeqWriter<'a> {
    f: &'a dyn VFile,
    off: u64,
    buf: Vec<u8>,
}

impl<'a> SeqWriter<'a> {
    fn new(f: &'a dyn VFile) -> Self {
        SeqWriter {
            f,
            off: 0,
            buf: Vec::with_capacity(FILL_IO_BYTES + RECORD_BYTES),
        }
    }
    fn push(&mut self, rec: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(rec);
        if self.buf.len() >= FILL_IO_BYTES {
            self.f.write_at(self.off, &self.buf[..FILL_IO_BYTES])?;
            self.off += FILL_IO_BYTES as u64;
            self.buf.drain(..FILL_IO_BYTES);
        }
        Ok(())
    }
    fn finish(mut self) -> Result<u64> {
        if !self.buf.is_empty() {
            self.f.write_at(self.off, &self.buf)?;
            self.off += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(self.off)
    }
}

/// Reads a stream of records in `FILL_IO_BYTES` requests.
struct RecordReader {
    f: Box<dyn VFile>,
    off: u64,
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
}

impl RecordReader {
    fn new(f: Box<dyn VFile>) -> Self {
        RecordReader {
            f,
            off: 0,
            buf: Vec::new(),
            pos: 0,
            eof: false,
        }
    }
    /// The next record, `None` at the end.
    fn next(&mut self) -> Result<Option<&[u8]>> {
        if self.buf.len() - self.pos < RECORD_BYTES && !self.eof {
            self.buf.drain(..self.pos);
            self.pos = 0;
            let have = self.buf.len();
            self.buf.resize(have + FILL_IO_BYTES, 0);
            let n = self.f.read_at(self.off, &mut self.buf[have..])?;
            self.buf.truncate(have + n);
            self.off += n as u64;
            self.eof = n == 0;
        }
        if self.buf.len() - self.pos < RECORD_BYTES {
            if self.buf.len() > self.pos {
                return Err(BenchError::Workload {
                    workload: "sort".into(),
                    detail: format!(
                        "a partial record of {} bytes at the end",
                        self.buf.len() - self.pos
                    ),
                });
            }
            return Ok(None);
        }
        let r = &self.buf[self.pos..self.pos + RECORD_BYTES];
        self.pos += RECORD_BYTES;
        Ok(Some(r))
    }
}

impl Sort {
    fn input_bytes(&self) -> u64 {
        self.records * RECORD_BYTES as u64
    }

    /// Phase 1: the input into sorted runs; returns their paths.
    fn make_runs(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<Vec<String>> {
        let per_run = self.records.div_ceil(SORT_RUNS).max(1) as usize;
        let mut input = RecordReader::new(vfs.open(SORT_INPUT)?);
        let mut runs = Vec::new();
        let mut recs: Vec<[u8; RECORD_BYTES]> = Vec::with_capacity(per_run);
        loop {
            let done = match input.next()? {
                Some(r) => {
                    let mut a = [0u8; RECORD_BYTES];
                    a.copy_from_slice(r);
                    recs.push(a);
                    false
                }
                None => true,
            };
            if recs.len() == per_run || (done && !recs.is_empty()) {
                recs.sort_unstable_by(|a, b| a[..KEY_BYTES].cmp(&b[..KEY_BYTES]));
                let path = format!("{SORT_DIR}/run{}", runs.len());
                let f = vfs.create(&path)?;
                let mut w = SeqWriter::new(&*f);
                for r in &recs {
                    w.push(r)?;
                }
                w.finish()?;
                ctx.tick(recs.len() as u64 / 2);
                recs.clear();
                runs.push(path);
            }
            if done {
                return Ok(runs);
            }
        }
    }

    /// Phase 2: the runs merged into the output; returns the records
    /// written.
    fn merge(&self, vfs: &dyn Vfs, runs: &[String], ctx: &RunCtx) -> Result<(u64, Box<dyn VFile>)> {
        let mut readers: Vec<RecordReader> = runs
            .iter()
            .map(|p| vfs.open(p).map(RecordReader::new))
            .collect::<Result<_>>()?;
        let mut heap = BinaryHeap::new();
        let mut heads: Vec<[u8; RECORD_BYTES]> = vec![[0u8; RECORD_BYTES]; readers.len()];
        for (k, r) in readers.iter_mut().enumerate() {
            if let Some(rec) = r.next()? {
                heads[k].copy_from_slice(rec);
                let mut key = [0u8; KEY_BYTES];
                key.copy_from_slice(&rec[..KEY_BYTES]);
                heap.push(Reverse((key, k)));
            }
        }
        let out = vfs.create(SORT_OUTPUT)?;
        let mut w = SeqWriter::new(&*out);
        let mut last = [0u8; KEY_BYTES];
        let mut written = 0u64;
        while let Some(Reverse((key, k))) = heap.pop() {
            if key < last {
                return Err(BenchError::Workload {
                    workload: "sort".into(),
                    detail: format!(
                        "run {k} is out of order at its record read after {written} written"
                    ),
                });
            }
            last = key;
            w.push(&heads[k])?;
            written += 1;
            if written.is_multiple_of(2 * SORT_RUNS) {
                ctx.tick(SORT_RUNS);
            }
            if let Some(rec) = readers[k].next()? {
                heads[k].copy_from_slice(rec);
                let mut key = [0u8; KEY_BYTES];
                key.copy_from_slice(&rec[..KEY_BYTES]);
                heap.push(Reverse((key, k)));
            }
        }
        w.finish()?;
        Ok((written, out))
    }
}

impl Case for Sort {
    fn workload(&self) -> &'static str {
        "sort"
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "records": self.records,
            "record_bytes": RECORD_BYTES,
            "key_bytes": KEY_BYTES,
            "input_bytes": self.input_bytes(),
            "runs": SORT_RUNS,
            "io_bytes": FILL_IO_BYTES,
            "fsync": "the output, at the end",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.records
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        mkdir_all(vfs, SORT_DIR)?;
        let f = vfs.create(SORT_INPUT)?;
        let mut rng = thread_rng(seed, 0x5027);
        let mut w = SeqWriter::new(&*f);
        let mut rec = Vec::with_capacity(RECORD_BYTES);
        for i in 0..self.records {
            rec.clear();
            record(&mut rng, i, &mut rec);
            w.push(&rec)?;
        }
        w.finish()?;
        f.fsync()
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let wall = std::time::Instant::now();
        let t0 = vfs.now_ns();
        let runs = self.make_runs(vfs, ctx)?;
        let (written, out) = self.merge(vfs, &runs, ctx)?;
        for r in &runs {
            vfs.unlink(r)?;
        }
        let mut lat = Vec::new();
        timed_fsync(vfs, &*out, &mut lat)?;
        drop(out);
        if written != self.records {
            return Err(BenchError::Workload {
                workload: "sort".into(),
                detail: format!(
                    "the output holds {written} records, the input {}",
                    self.records
                ),
            });
        }
        let secs = vfs.now_ns().saturating_sub(t0).max(1) as f64 / 1e9;
        let mut out = RunOutput {
            ops: self.records,
            fsync_ns: lat,
            ..RunOutput::default()
        };
        out.extra.insert(
            "mb_per_s".into(),
            json!(self.input_bytes() as f64 / 1e6 / secs),
        );
        out.extra
            .insert("wall_s".into(), json!(wall.elapsed().as_secs_f64()));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::PosixVfs;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    fn ctx() -> RunCtx {
        RunCtx {
            seed: 3,
            progress: Arc::new(AtomicU64::new(0)),
        }
    }

    #[test]
    fn sort_sorts_on_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let v = PosixVfs::new(dir.path());
        let s = Sort { records: 1001 };
        s.setup(&v, 3).unwrap();
        let out = s.run(&v, &ctx()).unwrap();
        assert_eq!(out.ops, 1001);
        let data = std::fs::read(dir.path().join(SORT_OUTPUT)).unwrap();
        assert_eq!(data.len(), 1001 * RECORD_BYTES);
        let keys: Vec<&[u8]> = data.chunks(RECORD_BYTES).map(|r| &r[..KEY_BYTES]).collect();
        assert!(keys.windows(2).all(|w| w[0] <= w[1]));
        let input = std::fs::read(dir.path().join(SORT_INPUT)).unwrap();
        let mut a: Vec<&[u8]> = data.chunks(RECORD_BYTES).collect();
        let mut b: Vec<&[u8]> = input.chunks(RECORD_BYTES).collect();
        a.sort();
        b.sort();
        assert_eq!(a, b, "the output is a permutation of the input");
        assert!(!dir.path().join("sort/run0").exists(), "runs deleted");
    }

    #[test]
    fn micro_cases_run_on_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let v = PosixVfs::new(dir.path());
        for kind in [
            Micro::SeqWrite,
            Micro::RandWrite,
            Micro::Create,
            Micro::Delete,
        ] {
            let c = NofsMicro {
                kind,
                file_bytes: 1 << 20,
                rand_ios: 30,
                fsync_every: 10,
                files: 25,
                dirs: 10,
            };
            let _ = std::fs::remove_dir_all(dir.path().join(ROOT));
            c.setup(&v, 3).unwrap();
            let out = c.run(&v, &ctx()).unwrap();
            assert_eq!(out.ops, c.expected_ops(), "{kind:?}");
            match kind {
                Micro::RandWrite => assert_eq!(out.fsync_ns.len(), 3),
                Micro::Create | Micro::Delete => assert_eq!(out.fsync_ns.len(), 25),
                _ => {}
            }
        }
        assert!(v.list("nofs/d3").unwrap().is_empty());
    }
}
