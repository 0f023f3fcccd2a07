//! The ccfs two-file tests (Pillai et al., "Application Crash Consistency
//! and Performance with CCFS", FAST '17 / ACM TOS '17, §4.2): how much of
//! one application's buffered writes another application's fsync has to
//! carry, with one stream for both (ccfs-1) and with a stream each
//! (ccfs-2).
//!
//! **`twofile`** (Table 4, "single-fsync experiments"): A and B exist and
//! are durable; application A writes `a_bytes` (100 MB in the paper) to its
//! file without asking for durability; application B writes one byte to
//! its own file and fsyncs it. Then, by variant: `append` does nothing
//! more; `truncate` truncates A to nothing; `overwrite` overwrites all of
//! A. The figures are B's fsync latency and the bytes the device wrote
//! during it (its write counter read just before and just after); the
//! window's total bytes written (the unmount included, so deferred
//! write-back is charged) shows write avoidance: a truncated A need never
//! reach the disk, an overwritten A need reach it once.
//!
//! **`twofile-repeat`** (Figure 7, "repeated fsync experiments"): a
//! background writer appends to A at 20 MB/s (truncating A, or starting
//! over at offset 0 to overwrite it, every 100 MB, by variant) while a
//! foreground writer writes one byte to B and fsyncs it every `period`
//! (5 s in the paper); the figure is the distribution of B's fsync
//! latencies. On a mount (and on the library in real time) the two run
//! concurrently, the background writer in a forked child process (a thread
//! on the library). In virtual time (the HDD model) the model has one
//! clock, so the two are interleaved in one thread, deterministically: the
//! background writer is brought up to its rate before each step, the disk
//! idles between steps ([`Vfs::sleep_until_ns`]), and the library's commit
//! timer, which runs no thread in virtual time, fires at each commit
//! interval the idle time crosses.
//!
//! **Streams** (`--streams 1|2`, default 2): with 2, A's writes run in
//! stream `A` and B's in the default stream. On the library the calling
//! thread switches streams; through FUSE streams belong to processes, so
//! in `twofile` (one phase after another) the bench process itself moves
//! between the streams with the mount's SETSTREAMFLAGS ioctl before each
//! phase, and in `twofile-repeat` the background writer is a child
//! process that joins stream `A`. With 1 everything stays in the default
//! stream. On the kernel's ext4 (no streams) the setting changes nothing.
//!
//! A and B are created, and made durable, in the setup: two streams that
//! insert entries into one directory block change each other's bytes,
//! which merges them in ordo's implementation (ccfs changed the directory
//! format instead; see the streams protocol's documentation).

use serde_json::json;

use super::{pattern, timed_fsync, Case, Overrides, RunCtx, RunOutput, Scale};
use crate::error::Result;
use crate::vfs::{VFile, Vfs};

/// A's request size.
const A_IO_BYTES: usize = 1 << 20;
/// The stream of A's writer with `--streams 2`.
pub const A_STREAM: &str = "A";
/// The stream every caller starts in.
const DEFAULT_STREAM: &str = "default";
/// The background writer's rate in `twofile-repeat` (the paper's 20 MB/s).
const REPEAT_RATE_BYTES_PER_S: u64 = 20_000_000;
/// The background writer truncates or starts over every this many bytes
/// (the paper's 100 MB).
const REPEAT_CYCLE_BYTES: u64 = 100_000_000;

/// What A does after B's fsync (Table 4's rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Nothing: A's data stays buffered until written back.
    Append,
    /// A is truncated to nothing: its data need never reach the disk.
    Truncate,
    /// A is overwritten whole: only the last version need reach the disk.
    Overwrite,
}

impl Variant {
    /// Every variant, in the paper's order.
    pub const ALL: [Variant; 3] = [Variant::Append, Variant::Truncate, Variant::Overwrite];

    /// The case label.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Append => "append",
            Variant::Truncate => "truncate",
            Variant::Overwrite => "overwrite",
        }
    }
}

/// The number of streams asked for: 1 or 2 (default 2).
fn streams_of(o: &Overrides) -> u32 {
    o.streams.unwrap_or(2).clamp(1, 2)
}

/// Creates A and B and makes both, and their directory entries, durable.
fn create_both(vfs: &dyn Vfs) -> Result<()> {
    for name in ["A", "B"] {
        let f = vfs.create(name)?;
        f.fsync()?;
    }
    // The entries: a file's fsync commits its creation on every journaling
    // target; the window's remount makes the rest durable anyway.
    Ok(())
}

/// Moves the caller to `stream` when the case uses two streams; true if
/// the file system has streams.
fn enter(vfs: &dyn Vfs, two: bool, stream: &str) -> Result<bool> {
    if two {
        vfs.set_stream(stream, 0)
    } else {
        Ok(false)
    }
}

/// Writes `bytes` to `f` from offset 0 in `A_IO_BYTES` requests.
fn write_a(f: &dyn VFile, bytes: u64, seed: u64) -> Result<()> {
    let buf = pattern(A_IO_BYTES, seed);
    let mut off = 0u64;
    while off < bytes {
        let n = (bytes - off).min(A_IO_BYTES as u64) as usize;
        f.write_at(off, &buf[..n])?;
        off += n as u64;
    }
    Ok(())
}

/// Table 4: one fsync of B after A's writes.
pub struct TwoFile {
    variant: Variant,
    a_bytes: u64,
    streams: u32,
}

/// twofile at `scale`: one case per variant.
pub fn twofile_cases(scale: Scale, o: &Overrides) -> Vec<Box<dyn Case>> {
    Variant::ALL
        .into_iter()
        .map(|variant| {
            Box::new(TwoFile {
                variant,
                a_bytes: scale.pick(4 << 20, 32 << 20, 100_000_000, 100_000_000),
                streams: streams_of(o),
            }) as Box<dyn Case>
        })
        .collect()
}

impl Case for TwoFile {
    fn workload(&self) -> &'static str {
        "twofile"
    }
    fn label(&self) -> String {
        self.variant.name().to_string()
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "variant": self.variant.name(),
            "a_write_total_bytes": self.a_bytes,
            "a_write_bytes": A_IO_BYTES,
            "b_write_bytes": 1,
            "streams": self.streams,
            "after_fsync": match self.variant {
                Variant::Append => "nothing",
                Variant::Truncate => "A truncated to 0",
                Variant::Overwrite => "A overwritten whole",
            },
        })
    }
    fn expected_ops(&self) -> u64 {
        1
    }
    fn setup(&self, vfs: &dyn Vfs, _seed: u64) -> Result<()> {
        create_both(vfs)
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let two = self.streams == 2;
        let a = vfs.open("A")?;
        let b = vfs.open("B")?;
        let has_streams = enter(vfs, two, A_STREAM)?;
        write_a(&*a, self.a_bytes, ctx.seed)?;
        enter(vfs, two, DEFAULT_STREAM)?;
        b.write_at(0, b"b")?;
        let w0 = vfs.device_write_bytes();
        let mut lat = Vec::new();
        timed_fsync(vfs, &*b, &mut lat)?;
        let w1 = vfs.device_write_bytes();
        ctx.tick(1);
        enter(vfs, two, A_STREAM)?;
        match self.variant {
            Variant::Append => {}
            Variant::Truncate => a.set_len(0)?,
            Variant::Overwrite => write_a(&*a, self.a_bytes, ctx.seed ^ 0x0f0f)?,
        }
        enter(vfs, two, DEFAULT_STREAM)?;
        let mut out = RunOutput {
            ops: 1,
            elapsed_ns: lat.first().copied(),
            ..RunOutput::default()
        };
        out.extra
            .insert("fsync_s".into(), json!(lat[0] as f64 / 1e9));
        if let (Some(w0), Some(w1)) = (w0, w1) {
            out.extra
                .insert("fsync_write_bytes".into(), json!(w1.saturating_sub(w0)));
        }
        // Whether A's writes really ran in a stream of their own (not on
        // a file system without streams, nor with `--streams 1`).
        out.extra
            .insert("a_own_stream".into(), json!(two && has_streams));
        out.fsync_ns = lat;
        Ok(out)
    }
}

/// Figure 7: B's fsyncs beside a background writer to A.
pub struct TwoFileRepeat {
    variant: Variant,
    /// Time between the end of one fsync of B and the next write of B.
    period_ns: u64,
    /// fsyncs of B.
    fsyncs: u64,
    streams: u32,
}

/// twofile-repeat at `scale`: one case per variant.
pub fn twofile_repeat_cases(scale: Scale, o: &Overrides) -> Vec<Box<dyn Case>> {
    let period_ms: u64 = scale.pick(200, 2000, 5000, 5000);
    let fsyncs: u64 = scale.pick(5, 15, 12, 24);
    Variant::ALL
        .into_iter()
        .map(|variant| {
            Box::new(TwoFileRepeat {
                variant,
                period_ns: period_ms * 1_000_000,
                fsyncs,
                streams: streams_of(o),
            }) as Box<dyn Case>
        })
        .collect()
}

/// The background writer's state: where it writes next and how much it
/// wrote.
struct Background {
    variant: Variant,
    buf: Vec<u8>,
    /// Bytes written so far.
    total: u64,
    /// Offset of the next write in A.
    off: u64,
}

impl Background {
    fn new(variant: Variant, seed: u64) -> Self {
        Background {
            variant,
            buf: pattern(A_IO_BYTES, seed),
            total: 0,
            off: 0,
        }
    }

    /// One request of `A_IO_BYTES`; at every `REPEAT_CYCLE_BYTES` the
    /// variant's truncate or return to offset 0.
    fn step(&mut self, a: &dyn VFile) -> Result<()> {
        a.write_at(self.off, &self.buf)?;
        self.off += A_IO_BYTES as u64;
        self.total += A_IO_BYTES as u64;
        if self.total % REPEAT_CYCLE_BYTES < A_IO_BYTES as u64 {
            match self.variant {
                Variant::Append => {}
                Variant::Truncate => {
                    a.set_len(0)?;
                    self.off = 0;
                }
                Variant::Overwrite => self.off = 0,
            }
        }
        Ok(())
    }

    /// When the next request is due, on the clock that started at `t0`.
    fn next_due_ns(&self, t0: u64) -> u64 {
        t0 + (self.total + A_IO_BYTES as u64) * 1_000_000_000 / REPEAT_RATE_BYTES_PER_S
    }
}

impl TwoFileRepeat {
    /// Both writers interleaved in this thread (virtual time).
    fn run_interleaved(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<(Vec<u64>, u64)> {
        let two = self.streams == 2;
        let a = vfs.open("A")?;
        let b = vfs.open("B")?;
        let mut bg = Background::new(self.variant, ctx.seed);
        let t0 = vfs.now_ns();
        let mut next_fsync = t0 + self.period_ns;
        let mut lat = Vec::new();
        while (lat.len() as u64) < self.fsyncs {
            enter(vfs, two, A_STREAM)?;
            while bg.next_due_ns(t0) <= vfs.now_ns() {
                bg.step(&*a)?;
            }
            enter(vfs, two, DEFAULT_STREAM)?;
            if vfs.now_ns() >= next_fsync {
                b.write_at(lat.len() as u64, b"b")?;
                timed_fsync(vfs, &*b, &mut lat)?;
                ctx.tick(1);
                next_fsync = vfs.now_ns() + self.period_ns;
                continue;
            }
            vfs.sleep_until_ns(next_fsync.min(bg.next_due_ns(t0)));
        }
        Ok((lat, bg.total))
    }

    /// The background writer in its own thread or process (real time).
    fn run_concurrent(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<(Vec<u64>, u64)> {
        let b = vfs.open("B")?;
        let t0 = vfs.now_ns();
        // Long enough for every fsync even if each takes a few seconds;
        // the writer stops once the foreground is done.
        let stop_path = "A.stop";
        let (variant, seed) = (self.variant, ctx.seed);
        let writer: crate::vfs::StreamWriter = Box::new(move |v: &dyn Vfs| {
            let a = v.open("A")?;
            let mut bg = Background::new(variant, seed);
            loop {
                v.sleep_until_ns(bg.next_due_ns(t0));
                // The stop file is checked once per request: a stat on the
                // mount, cheap beside a 1 MiB write.
                if v.size(stop_path).is_ok() {
                    return Ok(());
                }
                bg.step(&*a)?;
            }
        });
        let stream = if self.streams == 2 {
            A_STREAM
        } else {
            DEFAULT_STREAM
        };
        let task = vfs.spawn_in_stream(stream, 0, writer)?;
        let mut lat = Vec::new();
        let mut next_fsync = t0 + self.period_ns;
        let result = (|| -> Result<()> {
            while (lat.len() as u64) < self.fsyncs {
                vfs.sleep_until_ns(next_fsync);
                b.write_at(lat.len() as u64, b"b")?;
                timed_fsync(vfs, &*b, &mut lat)?;
                ctx.tick(1);
                next_fsync = vfs.now_ns() + self.period_ns;
            }
            Ok(())
        })();
        // Stop the writer whatever happened, then report the first error.
        let stopped = vfs.create(stop_path).map(drop);
        let joined = task.join();
        result?;
        stopped?;
        joined?;
        // A's size at the end: what the append variant wrote (the others
        // start over every cycle).
        Ok((lat, vfs.size("A")?))
    }
}

impl Case for TwoFileRepeat {
    fn workload(&self) -> &'static str {
        "twofile-repeat"
    }
    fn label(&self) -> String {
        self.variant.name().to_string()
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "variant": self.variant.name(),
            "period_s": self.period_ns as f64 / 1e9,
            "fsyncs": self.fsyncs,
            "background_rate_bytes_per_s": REPEAT_RATE_BYTES_PER_S,
            "background_cycle_bytes": REPEAT_CYCLE_BYTES,
            "background_write_bytes": A_IO_BYTES,
            "streams": self.streams,
        })
    }
    fn expected_ops(&self) -> u64 {
        self.fsyncs
    }
    fn setup(&self, vfs: &dyn Vfs, _seed: u64) -> Result<()> {
        create_both(vfs)
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let t0 = vfs.now_ns();
        let (mut lat, a_bytes) = if vfs.virtual_time() {
            self.run_interleaved(vfs, ctx)?
        } else {
            self.run_concurrent(vfs, ctx)?
        };
        let mut out = RunOutput {
            ops: lat.len() as u64,
            elapsed_ns: Some(vfs.now_ns().saturating_sub(t0)),
            ..RunOutput::default()
        };
        out.extra.insert(
            "fsync_ms".into(),
            json!(lat.iter().map(|&l| l as f64 / 1e6).collect::<Vec<_>>()),
        );
        out.extra.insert(
            "background".into(),
            json!(if vfs.virtual_time() {
                "interleaved in one thread (virtual time)"
            } else {
                "concurrent (a child process on a mount, a thread on the library)"
            }),
        );
        out.extra.insert(
            if vfs.virtual_time() {
                "a_bytes_written"
            } else {
                "a_size_at_end"
            }
            .into(),
            json!(a_bytes),
        );
        out.fsync_ns = std::mem::take(&mut lat);
        Ok(out)
    }
}
