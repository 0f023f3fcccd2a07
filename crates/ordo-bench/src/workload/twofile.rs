//! The ccfs two-file test (Pillai et al., "Application Crash Consistency
//! and Performance with CCFS", FAST '17 / ACM TOS '17): application A
//! appends 100 MB to its file without asking for durability; application B
//! then writes one byte to its own file and fsyncs it.
//!
//! Under ext4's `data=ordered` one running transaction holds both, so B's
//! fsync waits for A's 100 MB: the false sharing ccfs's streams remove. The
//! figure is B's fsync latency (the first one carries A's data; the later
//! ones show the steady state); operations are B's fsyncs and the measured
//! interval is B's phase only.

use serde_json::json;

use super::{pattern, timed_fsync, Case, RunCtx, RunOutput, Scale};
use crate::error::Result;
use crate::vfs::Vfs;

/// A's request size.
const A_IO_BYTES: usize = 1 << 20;

/// The two-file test at one scale.
pub struct TwoFile {
    a_bytes: u64,
    b_fsyncs: u64,
}

/// twofile at `scale`.
pub fn twofile(scale: Scale) -> Box<dyn Case> {
    Box::new(TwoFile {
        a_bytes: scale.pick(4 << 20, 32 << 20, 100_000_000, 100_000_000),
        b_fsyncs: scale.pick(3, 10, 10, 10),
    })
}

impl Case for TwoFile {
    fn workload(&self) -> &'static str {
        "twofile"
    }
    fn params(&self) -> serde_json::Value {
        json!({ "a_append_bytes": self.a_bytes, "a_write_bytes": A_IO_BYTES, "b_write_bytes": 1, "b_fsyncs": self.b_fsyncs })
    }
    fn expected_ops(&self) -> u64 {
        self.b_fsyncs
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let a = vfs.create("A")?;
        let b = vfs.create("B")?;
        let buf = pattern(A_IO_BYTES, ctx.seed);
        let mut off = 0u64;
        while off < self.a_bytes {
            let n = (self.a_bytes - off).min(A_IO_BYTES as u64) as usize;
            a.write_at(off, &buf[..n])?;
            off += n as u64;
        }
        let t0 = vfs.now_ns();
        let mut lat = Vec::new();
        for i in 0..self.b_fsyncs {
            b.write_at(i, b"b")?;
            timed_fsync(vfs, &*b, &mut lat)?;
            ctx.tick(1);
        }
        let elapsed = vfs.now_ns().saturating_sub(t0);
        let mut out = RunOutput {
            ops: self.b_fsyncs,
            elapsed_ns: Some(elapsed),
            ..RunOutput::default()
        };
        if let Some(first) = lat.first() {
            out.extra
                .insert("first_fsync_us".into(), json!(*first as f64 / 1e3));
        }
        out.fsync_ns = lat;
        Ok(out)
    }
}
