//! The papers' workloads, re-implemented against [`Vfs`] or driving real
//! programs on a mounted target.
//!
//! A workload expands into one or more *cases* (the fast-commit sweep has
//! one per fsync interval, the Ganger & Patt small-file test one per phase);
//! every case runs on a fresh file system. A case has a setup phase (files
//! that must exist before the measurement, e.g. Filebench's preallocated
//! file set) and a measured run. Every parameter is chosen by the `--scale`
//! knob and documented in `docs/BENCH.md`; `smoke` is the tiny size the
//! tests run.

pub mod apps;
pub mod fcmicro;
pub mod filebench;
pub mod ganger;
pub mod micro;
pub mod nofs;
pub mod read;
pub mod stat;
pub mod streams_apps;
pub mod twofile;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::vfs::{VFile, Vfs};

/// How big a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// Seconds per case: what the tests and CI run.
    Smoke,
    /// The quick size: every workload in a few minutes on two cores.
    Small,
    /// Closer to the papers, minutes per case.
    Medium,
    /// The papers' parameters where this machine can hold them.
    Paper,
}

impl Scale {
    /// Picks the value for this scale.
    pub fn pick<T: Copy>(self, smoke: T, small: T, medium: T, paper: T) -> T {
        match self {
            Scale::Smoke => smoke,
            Scale::Small => small,
            Scale::Medium => medium,
            Scale::Paper => paper,
        }
    }

    /// The name, as on the command line.
    pub fn name(self) -> &'static str {
        self.pick("smoke", "small", "medium", "paper")
    }
}

/// Every workload, by its command-line name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadName {
    /// Fast commit (Shirwadkar et al.): create, append 4 KiB, close; fsync every n.
    Fcmicro,
    /// Filebench varmail: 16 threads, mail-server fsyncs.
    Varmail,
    /// Filebench fileserver: 50 threads, whole-file writes and reads.
    Fileserver,
    /// Filebench webserver: 100 threads, reads and a shared log.
    Webserver,
    /// Filebench createfiles: many threads creating 16 KiB files.
    Createfiles,
    /// 4 KiB random writes in one file, fsync every 100 / 1000.
    Randwrite,
    /// Sequential writes of one large file.
    Seqwrite,
    /// Sequential overwrites of one large existing file.
    Overwrite,
    /// Reads: one large file in 1 MiB requests, many 8 KiB files; cold and warm.
    Read,
    /// Ganger & Patt: N users copy a 535-file tree.
    Copy,
    /// Ganger & Patt: N users remove a 535-file tree.
    Remove,
    /// Ganger & Patt: 1 KiB create / remove / create-remove.
    Smallfiles,
    /// ccfs Table 4: A writes 100 MB (append, truncate, overwrite), B writes one byte and fsyncs.
    Twofile,
    /// ccfs Figure 7: B fsyncs every 5 s beside a 20 MB/s writer to A.
    #[value(name = "twofile-repeat")]
    #[serde(rename = "twofile-repeat")]
    TwofileRepeat,
    /// ccfs Table 5: SQLite inserts, fsync or IGNORE_FSYNC + streamsync.
    #[value(name = "streams-sqlite")]
    #[serde(rename = "streams-sqlite")]
    StreamsSqlite,
    /// ccfs Table 5: git add + commit of a kernel-like tree, fsync or streamsync.
    #[value(name = "streams-git")]
    #[serde(rename = "streams-git")]
    StreamsGit,
    /// ccfs Table 5: LevelDB fillrandom (plyvel), fsync or streamsync.
    #[value(name = "streams-leveldb")]
    #[serde(rename = "streams-leveldb")]
    StreamsLeveldb,
    /// sqlite3 inserts, each its own transaction, rollback journal.
    Sqlite,
    /// sqlite3 OLTP: sysbench oltp_read_write-style transactions (for MariaDB + sysbench).
    Oltp,
    /// git add + commit of a generated tree.
    Git,
    /// NetApp's PostMark (Debian package `postmark`).
    Postmark,
    /// fs_mark (Debian package `fsmark`).
    Fsmark,
    /// NoFS Figure 4: sequential write and read, random 4 KiB writes (fsync
    /// every 1,000) and reads, creates and deletes with an fsync each.
    #[value(name = "nofs-micro")]
    #[serde(rename = "nofs-micro")]
    NofsMicro,
    /// NoFS Figure 5: an external merge sort of gensort-style records.
    Sort,
    /// stat of many small files, cold and warm (the FUSE per-request cost).
    Stat,
}

impl WorkloadName {
    /// Every workload, in documentation order.
    pub const ALL: [WorkloadName; 25] = [
        WorkloadName::Fcmicro,
        WorkloadName::Varmail,
        WorkloadName::Fileserver,
        WorkloadName::Webserver,
        WorkloadName::Createfiles,
        WorkloadName::Randwrite,
        WorkloadName::Seqwrite,
        WorkloadName::Overwrite,
        WorkloadName::Read,
        WorkloadName::Copy,
        WorkloadName::Remove,
        WorkloadName::Smallfiles,
        WorkloadName::Twofile,
        WorkloadName::TwofileRepeat,
        WorkloadName::StreamsSqlite,
        WorkloadName::StreamsGit,
        WorkloadName::StreamsLeveldb,
        WorkloadName::Sqlite,
        WorkloadName::Oltp,
        WorkloadName::Git,
        WorkloadName::Postmark,
        WorkloadName::Fsmark,
        WorkloadName::NofsMicro,
        WorkloadName::Sort,
        WorkloadName::Stat,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadName::Fcmicro => "fcmicro",
            WorkloadName::Varmail => "varmail",
            WorkloadName::Fileserver => "fileserver",
            WorkloadName::Webserver => "webserver",
            WorkloadName::Createfiles => "createfiles",
            WorkloadName::Randwrite => "randwrite",
            WorkloadName::Seqwrite => "seqwrite",
            WorkloadName::Overwrite => "overwrite",
            WorkloadName::Read => "read",
            WorkloadName::Copy => "copy",
            WorkloadName::Remove => "remove",
            WorkloadName::Smallfiles => "smallfiles",
            WorkloadName::Twofile => "twofile",
            WorkloadName::TwofileRepeat => "twofile-repeat",
            WorkloadName::StreamsSqlite => "streams-sqlite",
            WorkloadName::StreamsGit => "streams-git",
            WorkloadName::StreamsLeveldb => "streams-leveldb",
            WorkloadName::Sqlite => "sqlite",
            WorkloadName::Oltp => "oltp",
            WorkloadName::Git => "git",
            WorkloadName::Postmark => "postmark",
            WorkloadName::Fsmark => "fsmark",
            WorkloadName::NofsMicro => "nofs-micro",
            WorkloadName::Sort => "sort",
            WorkloadName::Stat => "stat",
        }
    }
}

/// Knobs that override a workload's scaled defaults.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// fcmicro / randwrite: fsync every n operations (one case per value).
    pub fsync_every: Vec<u64>,
    /// copy / remove / smallfiles: concurrent users.
    pub users: Option<u32>,
    /// Filebench personalities: worker threads.
    pub threads: Option<u32>,
    /// fcmicro: bytes appended to each file.
    pub append_bytes: Option<usize>,
    /// twofile / twofile-repeat: 1 (A and B in one stream, ccfs-1) or 2
    /// (a stream each, ccfs-2).
    pub streams: Option<u32>,
}

/// What the measured run of a case reports.
#[derive(Debug, Default)]
pub struct RunOutput {
    /// Operations done (each workload defines its operation).
    pub ops: u64,
    /// Latency of every fsync the workload timed, nanoseconds.
    pub fsync_ns: Vec<u64>,
    /// The measured interval when it is not the whole run (twofile times
    /// only B's fsyncs), nanoseconds of the target's clock.
    pub elapsed_ns: Option<u64>,
    /// Workload-specific figures for the JSON report.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// What a case's run is given.
pub struct RunCtx {
    /// The run's seed.
    pub seed: u64,
    /// Operations done so far, for the progress bar.
    pub progress: Arc<AtomicU64>,
}

impl RunCtx {
    /// Counts `n` operations done.
    pub fn tick(&self, n: u64) {
        self.progress.fetch_add(n, Ordering::Relaxed);
    }
}

/// One measured configuration of a workload.
pub trait Case: Send + Sync {
    /// The workload's command-line name.
    fn workload(&self) -> &'static str;
    /// What distinguishes this case from its siblings ("n=4", "create"),
    /// empty when the workload has one case.
    fn label(&self) -> String {
        String::new()
    }
    /// The parameters, for the report.
    fn params(&self) -> serde_json::Value;
    /// Roughly how many operations the run does (for the progress bar).
    fn expected_ops(&self) -> u64;
    /// True if the case runs programs that need a mounted directory.
    fn needs_host_path(&self) -> bool {
        false
    }
    /// Creates what must exist before the measurement.
    fn setup(&self, _vfs: &dyn Vfs, _seed: u64) -> Result<()> {
        Ok(())
    }
    /// The measured run.
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput>;
}

/// The cases of `name` at `scale`.
pub fn cases(name: WorkloadName, scale: Scale, o: &Overrides) -> Result<Vec<Box<dyn Case>>> {
    Ok(match name {
        WorkloadName::Fcmicro => fcmicro::cases(scale, o),
        WorkloadName::Varmail => vec![filebench::varmail(scale, o)],
        WorkloadName::Fileserver => vec![filebench::fileserver(scale, o)],
        WorkloadName::Webserver => vec![filebench::webserver(scale, o)],
        WorkloadName::Createfiles => vec![filebench::createfiles(scale, o)],
        WorkloadName::Randwrite => micro::randwrite_cases(scale, o),
        WorkloadName::Seqwrite => vec![micro::seqwrite(scale)],
        WorkloadName::Overwrite => vec![micro::overwrite(scale)],
        WorkloadName::Read => read::cases(scale),
        WorkloadName::Copy => vec![ganger::copy(scale, o)],
        WorkloadName::Remove => vec![ganger::remove(scale, o)],
        WorkloadName::Smallfiles => ganger::smallfiles_cases(scale, o),
        WorkloadName::Twofile => twofile::twofile_cases(scale, o),
        WorkloadName::TwofileRepeat => twofile::twofile_repeat_cases(scale, o),
        WorkloadName::StreamsSqlite => streams_apps::sqlite_cases(scale),
        WorkloadName::StreamsGit => streams_apps::git_cases(scale),
        WorkloadName::StreamsLeveldb => streams_apps::leveldb_cases(scale),
        WorkloadName::Sqlite => vec![apps::sqlite(scale)],
        WorkloadName::Oltp => vec![apps::oltp(scale)],
        WorkloadName::Git => vec![apps::git(scale)],
        WorkloadName::Postmark => vec![apps::postmark(scale)],
        WorkloadName::Fsmark => vec![apps::fsmark(scale)],
        WorkloadName::NofsMicro => nofs::micro_cases(scale, o.fsync_every.first().copied()),
        WorkloadName::Sort => vec![nofs::sort(scale)],
        WorkloadName::Stat => stat::cases(scale),
    })
}

/// Times one fsync on the target's clock and records it.
pub fn timed_fsync(vfs: &dyn Vfs, f: &dyn VFile, lat_ns: &mut Vec<u64>) -> Result<()> {
    let t0 = vfs.now_ns();
    f.fsync()?;
    lat_ns.push(vfs.now_ns().saturating_sub(t0));
    Ok(())
}

/// A buffer of `len` bytes of a pattern that depends on `seed` (never all
/// zeroes, so no layer can treat it as a hole).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // xorshift64: cheap, and good enough to defeat deduplication; eight
        // bytes a step, so that making the data costs the benchmark
        // little beside the file system it measures.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&(x | 0x0101_0101_0101_0101).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// What each worker thread returns: operations done and fsync latencies.
pub type ThreadResult = Result<(u64, Vec<u64>)>;

/// Runs `threads` workers and sums what they did. A panicking worker is
/// an error, not a crash of the harness.
pub fn run_threads<F>(workload: &str, threads: u32, f: F) -> Result<RunOutput>
where
    F: Fn(u32) -> ThreadResult + Sync,
{
    let results: Vec<std::thread::Result<ThreadResult>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || f(t))
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut out = RunOutput::default();
    for r in results {
        match r {
            Ok(Ok((ops, lat))) => {
                out.ops += ops;
                out.fsync_ns.extend(lat);
            }
            Ok(Err(e)) => return Err(e),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                return Err(BenchError::Workload {
                    workload: workload.to_string(),
                    detail: format!("a worker thread panicked: {msg}"),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_has_cases_at_every_scale() {
        for w in WorkloadName::ALL {
            for s in [Scale::Smoke, Scale::Small, Scale::Medium, Scale::Paper] {
                let cs = cases(w, s, &Overrides::default()).unwrap();
                assert!(!cs.is_empty(), "{w:?} {s:?}");
                for c in &cs {
                    assert_eq!(c.workload(), w.name());
                    assert!(c.expected_ops() > 0, "{w:?} {s:?}");
                    assert!(c.params().is_object());
                }
            }
        }
    }

    #[test]
    fn pattern_is_seeded_and_never_zero() {
        let a = pattern(4096, 1);
        assert_eq!(a, pattern(4096, 1));
        assert_ne!(a, pattern(4096, 2));
        assert!(a.iter().all(|&b| b != 0));
    }

    #[test]
    fn a_panicking_worker_is_an_error() {
        let e = run_threads("t", 2, |t| {
            if t == 1 {
                panic!("boom");
            }
            Ok((1, vec![5]))
        })
        .unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
        let ok = run_threads("t", 3, |_| Ok((2, vec![1, 2]))).unwrap();
        assert_eq!(ok.ops, 6);
        assert_eq!(ok.fsync_ns.len(), 6);
    }
}
