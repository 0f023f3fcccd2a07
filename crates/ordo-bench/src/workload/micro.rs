//! Data-path micro-benchmarks: random 4 KiB overwrites of one file with an
//! fsync every n writes, and sequential writes of one large file. These are
//! the shapes of the data micro-benchmarks of NoFS (Chidambaram et al.,
//! FAST '12) and OptFS (SOSP '13): an overwrite needs no allocation, so
//! what a protocol charges on top of the data block is pure ordering cost;
//! a sequential write shows what journaling data (`data=journal`) costs in
//! bandwidth, and a sequential overwrite what journaling overwrites costs
//! (OptFS's selective data journaling writes every overwritten block twice).

use rand::Rng;
use serde_json::json;

use super::{pattern, timed_fsync, Case, Overrides, RunCtx, RunOutput, Scale};
use crate::error::Result;
use crate::stats::thread_rng;
use crate::vfs::{VFile, Vfs};

/// The random write size.
const RANDWRITE_BYTES: usize = 4096;
/// Request size when filling a file.
/// Request size of [`fill`].
pub(crate) const FILL_IO_BYTES: usize = 1 << 20;
/// seqwrite's request size.
const SEQWRITE_IO_BYTES: usize = 64 << 10;

/// Random 4 KiB writes in one preallocated file.
pub struct RandWrite {
    file_bytes: u64,
    writes: u64,
    fsync_every: u64,
}

/// One case per `--fsync-every` value (default 100 and 1000).
pub fn randwrite_cases(scale: Scale, o: &Overrides) -> Vec<Box<dyn Case>> {
    let every = if o.fsync_every.is_empty() {
        vec![100, 1000]
    } else {
        o.fsync_every.clone()
    };
    every
        .into_iter()
        .map(|n| {
            Box::new(RandWrite {
                file_bytes: scale.pick(4 << 20, 64 << 20, 256 << 20, 1 << 30),
                writes: scale.pick(200, 5000, 20_000, 100_000),
                fsync_every: n.max(1),
            }) as Box<dyn Case>
        })
        .collect()
}

/// Fills `path` with `bytes` of the 1 MiB pattern of `seed` in 1 MiB
/// requests, fsynced.
pub(crate) fn fill(vfs: &dyn Vfs, path: &str, bytes: u64, seed: u64) -> Result<()> {
    let f = vfs.create(path)?;
    let buf = pattern(FILL_IO_BYTES, seed);
    let mut off = 0;
    while off < bytes {
        let n = (bytes - off).min(FILL_IO_BYTES as u64) as usize;
        f.write_at(off, &buf[..n])?;
        off += n as u64;
    }
    f.fsync()
}

impl Case for RandWrite {
    fn workload(&self) -> &'static str {
        "randwrite"
    }
    fn label(&self) -> String {
        format!("n={}", self.fsync_every)
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "file_bytes": self.file_bytes,
            "writes": self.writes,
            "write_bytes": RANDWRITE_BYTES,
            "fsync_every": self.fsync_every,
        })
    }
    fn expected_ops(&self) -> u64 {
        self.writes
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        fill(vfs, "rand", self.file_bytes, seed)
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        random_writes(
            vfs,
            ctx,
            RandomWrites {
                path: "rand",
                file_bytes: self.file_bytes,
                io_bytes: RANDWRITE_BYTES,
                writes: self.writes,
                fsync_every: self.fsync_every,
                stream: 1,
            },
        )
    }
}

/// Writes `file_bytes` of `f` from the start in 64 KiB requests of a
/// seeded pattern, then one timed fsync; one operation per request, and
/// the bandwidth since `t0` in `extra.mib_per_sec`.
fn sequential_pass(
    vfs: &dyn Vfs,
    f: &dyn VFile,
    file_bytes: u64,
    seed: u64,
    t0: u64,
    ctx: &RunCtx,
) -> Result<RunOutput> {
    let buf = pattern(SEQWRITE_IO_BYTES, seed);
    let writes = file_bytes / SEQWRITE_IO_BYTES as u64;
    for i in 0..writes {
        f.write_at(i * SEQWRITE_IO_BYTES as u64, &buf)?;
        ctx.tick(1);
    }
    let mut lat = Vec::new();
    timed_fsync(vfs, f, &mut lat)?;
    let secs = vfs.now_ns().saturating_sub(t0) as f64 / 1e9;
    let mut out = RunOutput {
        ops: writes,
        fsync_ns: lat,
        ..RunOutput::default()
    };
    if secs > 0.0 {
        out.extra.insert(
            "mib_per_sec".into(),
            json!(file_bytes as f64 / (1u64 << 20) as f64 / secs),
        );
    }
    Ok(out)
}

/// Sequential 64 KiB writes of one new file, one fsync at the end.
pub struct SeqWrite {
    file_bytes: u64,
}

/// seqwrite at `scale`.
pub fn seqwrite(scale: Scale) -> Box<dyn Case> {
    Box::new(SeqWrite {
        file_bytes: scale.pick(4 << 20, 64 << 20, 256 << 20, 1 << 30),
    })
}

impl Case for SeqWrite {
    fn workload(&self) -> &'static str {
        "seqwrite"
    }
    fn params(&self) -> serde_json::Value {
        json!({ "file_bytes": self.file_bytes, "write_bytes": SEQWRITE_IO_BYTES, "fsync": "at end" })
    }
    fn expected_ops(&self) -> u64 {
        self.file_bytes / SEQWRITE_IO_BYTES as u64
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let t0 = vfs.now_ns();
        let f = vfs.create("seq")?;
        sequential_pass(vfs, &*f, self.file_bytes, ctx.seed, t0, ctx)
    }
}

/// Sequential 64 KiB overwrites of one existing file, one fsync at the end
/// (OptFS's "overwrite": every block already holds data).
pub struct Overwrite {
    file_bytes: u64,
}

/// overwrite at `scale` (the same sizes as seqwrite).
pub fn overwrite(scale: Scale) -> Box<dyn Case> {
    Box::new(Overwrite {
        file_bytes: scale.pick(4 << 20, 64 << 20, 256 << 20, 1 << 30),
    })
}

impl Case for Overwrite {
    fn workload(&self) -> &'static str {
        "overwrite"
    }
    fn params(&self) -> serde_json::Value {
        json!({ "file_bytes": self.file_bytes, "write_bytes": SEQWRITE_IO_BYTES, "fsync": "at end", "file": "filled and fsynced before the run" })
    }
    fn expected_ops(&self) -> u64 {
        self.file_bytes / SEQWRITE_IO_BYTES as u64
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        fill(vfs, "over", self.file_bytes, seed)
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let t0 = vfs.now_ns();
        let f = vfs.open("over")?;
        // Different bytes from the fill, so every write changes its block.
        sequential_pass(vfs, &*f, self.file_bytes, ctx.seed ^ 0x0e, t0, ctx)
    }
}

/// What [`random_writes`] does.
pub(crate) struct RandomWrites<'a> {
    /// The file, already `file_bytes` long.
    pub path: &'a str,
    pub file_bytes: u64,
    /// Each write's size, and its alignment.
    pub io_bytes: usize,
    pub writes: u64,
    /// An fsync after every this many writes, and one after the last.
    pub fsync_every: u64,
    /// The random stream of the offsets (distinct per workload).
    pub stream: u64,
}

/// Aligned writes at random offsets of one file, with an fsync every
/// `fsync_every` and after the last; each fsync's latency is recorded.
pub(crate) fn random_writes(vfs: &dyn Vfs, ctx: &RunCtx, w: RandomWrites) -> Result<RunOutput> {
    assert!(w.fsync_every > 0, "an fsync interval of zero");
    let f = vfs.open(w.path)?;
    let mut rng = thread_rng(ctx.seed, w.stream);
    let blocks = w.file_bytes / w.io_bytes as u64;
    let buf = pattern(w.io_bytes, ctx.seed ^ 7);
    let mut lat = Vec::new();
    for i in 0..w.writes {
        let b = rng.gen_range(0..blocks);
        f.write_at(b * w.io_bytes as u64, &buf)?;
        if (i + 1) % w.fsync_every == 0 {
            timed_fsync(vfs, &*f, &mut lat)?;
        }
        ctx.tick(1);
    }
    if !w.writes.is_multiple_of(w.fsync_every) {
        timed_fsync(vfs, &*f, &mut lat)?;
    }
    Ok(RunOutput {
        ops: w.writes,
        fsync_ns: lat,
        ..RunOutput::default()
    })
}
