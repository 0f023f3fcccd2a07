//! `stat` of many files, from a cold cache and from a warm one: what a
//! file system costs per metadata request when there is no data to move
//! (`ls -l`, a build system checking timestamps, rsync's scan).
//!
//! Setup creates the files (spread over 100 directories, each file a few
//! hundred bytes, a different size for each); the runner then remounts
//! the targets that have an image, which empties their caches. A cold case
//! also drops the host's clean page cache, as the read benchmark does
//! ([`super::read`]); a warm case stats every file once, untimed, and then,
//! on a real clock, waits out the FUSE attribute and entry lifetime
//! ([`FUSE_TTL`]) so that the measured pass is served by the file system,
//! not by the kernel's dentry cache: for a FUSE target each stat of that
//! pass is a LOOKUP the server answers from its own caches, which is what
//! it costs per request. The kernel's ext4 answers both passes from its
//! dentry and inode caches. The FUSE floor is not remounted (it keeps
//! nothing across mounts); a cold case drops the host's dentries and
//! inodes with its page cache, so the floor's cold pass looks every name
//! up again, as a remounted target's does.
//!
//! Every stat checks the file's size against what setup wrote, so a stat
//! answered with another file's inode fails the case.

use std::time::Duration;

use serde_json::json;

use super::read::{measure, Cache, Spread, SMALL_DIRS};
use super::{pattern, Case, RunCtx, RunOutput, Scale};
use crate::error::{BenchError, Result};
use crate::vfs::Vfs;

/// How long the FUSE targets let the kernel keep an entry or attributes
/// (`ordo mount` and the FUSE floor: 1 s), and a margin.
pub const FUSE_TTL: Duration = Duration::from_millis(1_100);

/// The two cases at `scale`: cold and warm.
pub fn cases(scale: Scale) -> Vec<Box<dyn Case>> {
    let files = scale.pick(2_000, 10_000, 10_000, 100_000);
    [Cache::Cold, Cache::Warm]
        .into_iter()
        .map(|cache| Box::new(StatFiles { files, cache }) as Box<dyn Case>)
        .collect()
}

/// `files` files, each statted once in the measured pass.
pub struct StatFiles {
    files: u64,
    cache: Cache,
}

impl StatFiles {
    fn spread(&self) -> Spread {
        Spread {
            prefix: 's',
            files: self.files,
        }
    }

    fn path(&self, i: u64) -> String {
        self.spread().path(i)
    }

    /// File `i`'s size: 1 to 512 bytes, different for neighbours.
    fn size_of(i: u64) -> u64 {
        (i * 37) % 512 + 1
    }

    /// Stats every file once, in creation order, checking each size.
    fn pass(&self, vfs: &dyn Vfs, tick: impl Fn(u64)) -> Result<()> {
        for i in 0..self.files {
            let path = self.path(i);
            let size = vfs.size(&path)?;
            if size != Self::size_of(i) {
                return Err(BenchError::Workload {
                    workload: "stat".into(),
                    detail: format!(
                        "check failed: {path} has size {size}, setup wrote {}",
                        Self::size_of(i)
                    ),
                });
            }
            tick(1);
        }
        Ok(())
    }
}

impl Case for StatFiles {
    fn workload(&self) -> &'static str {
        "stat"
    }
    fn label(&self) -> String {
        self.cache.name().to_string()
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "files": self.files,
            "dirs": SMALL_DIRS,
            "cache": self.cache.name(),
            "file_bytes": "1 to 512, one write each, by setup",
            "warm_wait_ms": FUSE_TTL.as_millis() as u64,
        })
    }
    fn expected_ops(&self) -> u64 {
        self.files
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        self.spread().mkdirs(vfs)?;
        let data = pattern(512, seed);
        for i in 0..self.files {
            let f = vfs.create(&self.path(i))?;
            f.write_at(0, &data[..Self::size_of(i) as usize])?;
        }
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let mut out = RunOutput::default();
        let pass = measure(
            vfs,
            "stat",
            self.cache,
            &mut out,
            || {
                self.pass(vfs, |_| {})?;
                if !vfs.virtual_time() {
                    std::thread::sleep(FUSE_TTL);
                }
                Ok(())
            },
            || self.pass(vfs, |n| ctx.tick(n)),
        )?;
        out.ops = self.files;
        out.elapsed_ns = Some(pass.elapsed_ns);
        out.extra.insert(
            "pass_cpu_us_per_op".into(),
            json!(pass.cpu_us as f64 / self.files.max(1) as f64),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::PosixVfs;

    #[test]
    fn both_cases_stat_every_file_and_check_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let v = PosixVfs::new(dir.path());
        let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ctx = RunCtx {
            seed: 3,
            progress: progress.clone(),
        };
        let warm = StatFiles {
            files: 250,
            cache: Cache::Warm,
        };
        warm.setup(&v, 3).unwrap();
        assert_eq!(v.list("").unwrap().len(), 84, "250 files, 3 per directory");
        let out = warm.run(&v, &ctx).unwrap();
        assert_eq!(out.ops, 250);
        assert!(out.elapsed_ns.unwrap() > 0);
        assert_eq!(progress.load(std::sync::atomic::Ordering::Relaxed), 250);
        // A file of the wrong size fails the case, naming it.
        let f = v.create(&warm.path(7)).unwrap();
        f.write_at(0, &[1; 600]).unwrap();
        drop(f);
        let e = warm.run(&v, &ctx).unwrap_err().to_string();
        assert!(e.contains("s02/f000007 has size 600"), "{e}");
    }
}
