//! `async`: delayed write-back in any order — ext2's behaviour, Ganger and
//! Patt's "No Order" baseline.
//!
//! What it does
//! ------------
//! Nothing is written when an operation ends. Changed blocks (metadata and
//! data alike) stay dirty in the buffer cache, and the protocol writes them
//! all back, in ascending block order and with no regard for what depends on
//! what:
//!
//! - every commit interval (`Fs::write_back`, or the background thread when
//!   mounted with `background`), like the old `update`/`bdflush` daemon: plain
//!   writes, no cache flush;
//! - on `fsync`, `fdatasync` and `sync`: every dirty block, then one cache
//!   flush. This is more than the file asked for, but it is simple and
//!   obviously correct: when the call returns, the file (and everything else)
//!   is durable;
//! - under memory pressure: every dirty block, so that the cache can evict;
//! - at unmount: every dirty block, then a flush.
//!
//! What a crash leaves
//! -------------------
//! Any subset of the dirty blocks written since the last flush may be on
//! disk, in any order. A directory entry can reach the disk before the inode
//! it names is initialized, a freed block can be reused by another file
//! while an old pointer to it is still on disk, a rename can lose both
//! names. Recovery is a benign repair (bitmaps and counters recomputed,
//! leaked inodes freed), which is often not enough: that is the point of
//! this protocol. It is the baseline the ordered protocols are measured
//! against, and the proof that ordo's crash explorer can find real
//! inconsistencies.
//!
//! Reuse rules: none. A freed block may be allocated again at once.

use super::*;

/// `mode=async`.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "async",
    summary: "delayed write-back in any order (ext2; Ganger & Patt's No Order)",
    variants: &[],
    mkfs_features: "",
    caps: Capabilities {
        ..Capabilities::NONE
    },
    recover: recover_nothing,
    build,
};

fn build(_recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    Ok(Box::new(AsyncProtocol::new(env)))
}

/// The `async` protocol.
pub struct AsyncProtocol {
    write_backs: u64,
    blocks_written: u64,
}

impl AsyncProtocol {
    /// A new instance for one mount.
    pub fn new(_env: &ProtocolEnv) -> Self {
        AsyncProtocol {
            write_backs: 0,
            blocks_written: 0,
        }
    }

    /// Send every dirty block home, then flush if asked. Under memory
    /// pressure (`pressure`) the blocks an earlier plan already sends home
    /// at their current image are left to it: many threads meeting the
    /// bound at once would otherwise each copy and write the whole dirty
    /// set again.
    fn write_all(&mut self, io: &mut Io, flush: bool, pressure: bool) {
        let dirty = io.dirty_to_send(pressure);
        self.blocks_written += dirty.len() as u64;
        io.write_home_runs(&dirty, false, super::MAX_RUN_BLOCKS);
        if flush {
            io.flush();
        }
        self.write_backs += 1;
    }
}

impl Protocol for AsyncProtocol {
    fn name(&self) -> &'static str {
        "async"
    }
    fn fsync(&mut self, _ino: Ino, _datasync: bool, io: &mut Io) -> Result<()> {
        self.write_all(io, true, false);
        Ok(())
    }
    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.write_all(io, true, false);
        Ok(())
    }
    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        self.write_all(
            io,
            reason == WriteBackReason::Unmount,
            reason == WriteBackReason::Pressure,
        );
        Ok(())
    }
    fn stats(&self) -> Vec<(String, u64)> {
        vec![
            ("write_backs".into(), self.write_backs),
            ("blocks_written".into(), self.blocks_written),
        ]
    }
}
