//! `sched-chain`: scheduler-enforced ordering with a list of dependencies
//! per request — Ganger and Patt's "Scheduler Chains" (OSDI '94, §3.2).
//!
//! As `sched-flag` (it uses that protocol's queue, `sched_flag/queue.rs`),
//! the writes `sync` would make synchronously are queued instead, but each
//! names only the earlier requests it must follow: the writes that carry
//! the predecessors of its updates by the three rules, computed over every
//! update still queued, across handles (a handle's own fresh data among
//! them). The scheduler may reorder everything else. Variants, `-o
//! mode=sched-chain:VARIANT`, choose how a freed block is protected:
//!
//! | variant | a block freed by a queued handle |
//! |---|---|
//! | `dep-cb` (default) | may be reused at once; every write of the reusing handle (its new data among them) names every write of the freeing handle (the paper's faster approach) |
//! | `barrier-cb` | the freeing handle's writes become a barrier: every later write names them |
//!
//! and `dep`, `barrier` without block copies (see `sched-flag`).
//!
//! **After a crash**: as `sync` (`ConsistentAfterRepair`).
//!
//! **Differences from the paper**: as `sched-flag`. A write names every
//! write carrying a predecessor of any update it carries, which on ext4
//! includes the intermediate images `sync` makes; the paper's FFS had the
//! same writes.

use super::sched_flag::queue::{Config, Frees, SchedProtocol, Scheme};
use super::*;

/// `mode=sched-chain`.
pub static SPEC: ProtocolSpec = ProtocolSpec {
    name: "sched-chain",
    summary:
        "asynchronous writes with per-request dependencies in the I/O scheduler (Ganger & Patt)",
    variants: &["dep-cb", "barrier-cb", "dep", "barrier"],
    mkfs_features: "",
    caps: Capabilities {
        after_crash: AfterCrash::ConsistentAfterRepair,
        scheduler: true,
        ..Capabilities::NONE
    },
    recover: recover_nothing,
    build,
};

fn build(_recovered: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    let (frees, cb) = match env.variant {
        "dep-cb" | "" => (Frees::Dep, true),
        "barrier-cb" => (Frees::Barrier, true),
        "dep" => (Frees::Dep, false),
        "barrier" => (Frees::Barrier, false),
        v => {
            return Err(crate::FsError::Invalid(format!(
                "unknown sched-chain variant '{v}'"
            )))
        }
    };
    Ok(Box::new(SchedProtocol::new(
        "sched-chain",
        Config {
            scheme: Scheme::Chain(frees),
            copy_blocks: cb,
            drop_flag: None,
        },
    )))
}
