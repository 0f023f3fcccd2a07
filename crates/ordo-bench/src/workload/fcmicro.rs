//! The fast-commit micro-benchmark (Shirwadkar, Kadekodi and Ts'o, "FastCommit:
//! resource-efficient, performant and cost-effective file system journaling",
//! USENIX ATC '24): create a file, append 4 KiB, close; fsync every n-th file.
//!
//! With n = 1 every operation is a create + append + fsync, the case where a
//! full JBD2 commit (descriptor, bitmaps, inode table, directory block, commit
//! block, two flushes) is most wasteful next to a fast-commit record. The
//! paper sweeps n over 1, 2, 4, ..., 1024 to show where the two meet.

use serde_json::json;

use super::{pattern, timed_fsync, Case, Overrides, RunCtx, RunOutput, Scale};
use crate::error::Result;
use crate::vfs::Vfs;

/// Bytes appended to each file (the paper's; `--append-bytes` overrides).
const APPEND_BYTES: usize = 4096;

/// The fsync intervals of the paper's sweep.
pub const SWEEP: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// One fsync interval.
pub struct FcMicro {
    /// Files created (operations).
    pub files: u64,
    /// fsync every `fsync_every`-th file.
    pub fsync_every: u64,
    /// Bytes appended to each file; 0: the fsync commits metadata only.
    pub append_bytes: usize,
}

/// One case per `--fsync-every` value (default n = 1).
pub fn cases(scale: Scale, o: &Overrides) -> Vec<Box<dyn Case>> {
    let files = scale.pick(20, 1000, 5000, 10_000);
    let every = if o.fsync_every.is_empty() {
        vec![1]
    } else {
        o.fsync_every.clone()
    };
    every
        .into_iter()
        .map(|n| {
            Box::new(FcMicro {
                files,
                fsync_every: n.max(1),
                append_bytes: o.append_bytes.unwrap_or(APPEND_BYTES),
            }) as Box<dyn Case>
        })
        .collect()
}

impl Case for FcMicro {
    fn workload(&self) -> &'static str {
        "fcmicro"
    }
    fn label(&self) -> String {
        format!("n={}", self.fsync_every)
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "files": self.files,
            "append_bytes": self.append_bytes,
            "fsync_every": self.fsync_every,
            "threads": 1,
        })
    }
    fn expected_ops(&self) -> u64 {
        self.files
    }
    fn setup(&self, vfs: &dyn Vfs, _seed: u64) -> Result<()> {
        vfs.mkdir("fc")
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let data = pattern(self.append_bytes, ctx.seed);
        let mut lat = Vec::new();
        for i in 0..self.files {
            let f = vfs.create(&format!("fc/f{i}"))?;
            if !data.is_empty() {
                f.write_at(0, &data)?;
            }
            if (i + 1) % self.fsync_every == 0 {
                timed_fsync(vfs, &*f, &mut lat)?;
            }
            drop(f);
            ctx.tick(1);
        }
        Ok(RunOutput {
            ops: self.files,
            fsync_ns: lat,
            ..RunOutput::default()
        })
    }
}
