//! `sched-flag`: scheduler-enforced ordering with one flag per request —
//! Ganger and Patt's "Scheduler Flag" (OSDI '94, §3.1 and §3.3).
//!
//! The writes `sync` makes synchronously, in the same order and with the
//! same intermediate images ([`super::sync_mode::release`]), are issued
//! asynchronously instead: the system call returns at once, and the I/O
//! scheduler (`ordo_dev::sched`, SPTF unless `-o sched=` says otherwise)
//! is trusted with the order. Every write that may need ordering with
//! respect to a later one carries the flag; delayed writes (bitmaps,
//! counters, times, as under `sync`) do not. What the flag means is the
//! variant, `-o mode=sched-flag:VARIANT`:
//!
//! | variant | flagged request |
//! |---|---|
//! | `part-cb` (default) | later requests may not pass it (Part) |
//! | `back-cb` | later requests pass neither it nor anything before it (Back) |
//! | `full-cb` | a barrier both ways (Full) |
//! | `ignore-cb` | nothing: reordered freely (Ignore; not safe, for comparison) |
//!
//! and the same four without `-cb`, where a handle that changes a block
//! whose write is still queued waits for the queue (the write lock the
//! paper's block copying removes). The paper's `-NR` (reads bypass held
//! writes) is how ordo always behaves: the queue is above the cache.
//! The queue, when it is issued, and what each variant becomes in the
//! scheduler's terms are in `queue.rs`.
//!
//! **After a crash**: as `sync` — only benign damage, which the benign
//! repair fixes (`ConsistentAfterRepair`); `Ignore` breaks this, and the
//! crash explorer's tests show it.
//!
//! **Differences from the paper.** Its flagged writes completed when they
//! were on the medium (no write cache). On a volatile cache a flagged
//! write is FUA. Allocation initialization is always on, and ordo writes
//! the file's data itself rather than a shared zero block, so the
//! zero-block half of `-CB` has nothing to do.
//!
//! Fault for the explorer's own test: `ORDO_FAULT=sched_flag_drop:N`
//! issues the N-th flagged write of the mount unflagged.

pub mod queue;

use super::*;
use queue::{Config, Flag, SchedProtocol, Scheme};

/// `mode=sched-flag`.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "sched-flag",
    summary: "asynchronous writes ordered by a flag in the I/O scheduler (Ganger & Patt)",
    variants: &[
        "part-cb",
        "back-cb",
        "full-cb",
        "ignore-cb",
        "part",
        "back",
        "full",
        "ignore",
    ],
    mkfs_features: "",
    caps: Capabilities {
        after_crash: AfterCrash::ConsistentAfterRepair,
        scheduler: true,
        ..Capabilities::NONE
    },
    recover: recover_nothing,
    build,
};

/// The configuration a variant names.
pub fn config(variant: &str) -> Result<Config> {
    let (flag, cb) = match variant.strip_suffix("-cb") {
        Some(f) => (f, true),
        None => (variant, false),
    };
    let flag = match flag {
        "part" | "" => Flag::Part,
        "back" => Flag::Back,
        "full" => Flag::Full,
        "ignore" => Flag::Ignore,
        _ => {
            return Err(crate::FsError::Invalid(format!(
                "unknown sched-flag variant '{variant}'"
            )))
        }
    };
    let drop_flag = std::env::var("ORDO_FAULT")
        .ok()
        .and_then(|f| f.strip_prefix("sched_flag_drop:")?.parse().ok());
    Ok(Config {
        scheme: Scheme::Flag(flag),
        copy_blocks: cb || variant.is_empty(),
        drop_flag,
    })
}

fn build(_recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    Ok(Box::new(SchedProtocol::new(
        "sched-flag",
        config(env.variant)?,
    )))
}
