//! The scheduled executor: runs a protocol's [`IoPlan`] through the I/O
//! scheduler of `ordo-dev` ([`ordo_dev::sched`]) instead of issuing its
//! steps in order, when the mount asks for it (`-o sched=fifo|clook|sptf|random[:SEED]`,
//! [`crate::MountOptions::sched`]). Without it the default in-order
//! executor ([`protocol::execute_plan`]) runs, and nothing changes.
//!
//! The plan's constraints become the scheduler's: a write's `after` list
//! (writes of the same plan; writes of earlier plans have completed, since
//! plans run one at a time, in order, each to its end), a `Barrier` as a
//! barrier, a `Flush` as a flush (a barrier on both sides). Everything else
//! the scheduler may reorder and concatenate; writes of one block keep
//! their order, so the final image is the one in-order issue leaves. The
//! protocol is told the same [`PlanDone`]: the writes in the order the
//! device served them, each with its device ticket (shared by writes
//! concatenated into one request), and the durable horizon after the plan.

use std::collections::HashMap;

use ordo_dev::sched::{ReqId, ReqKind, SchedStats, Scheduler};
use ordo_dev::BlockDevice;

use crate::error::Result;
use crate::fs::Fs;
use crate::protocol::{self, IoPlan, IoStep, PlanDone, WriteId};

pub use ordo_dev::sched::{Policy, SchedConfig};

/// Run `plan` on `dev` through `sched` (whose queue is empty before and
/// after), honouring its `after` lists, barriers and flushes, and report
/// what the protocol is told, as [`protocol::execute_plan`] does.
pub fn execute_plan_scheduled(
    plan: &IoPlan,
    dev: &dyn BlockDevice,
    sched: &mut Scheduler,
) -> (PlanDone, Result<()>) {
    let mut done = PlanDone {
        tag: plan.tag,
        serial: plan.serial,
        ok: true,
        writes: Vec::new(),
        durable: 0,
    };
    let mut req_of: Vec<ReqId> = Vec::new();
    let mut write_of: HashMap<ReqId, WriteId> = HashMap::new();
    for step in &plan.steps {
        match step {
            IoStep::Write {
                block,
                data,
                flags,
                after,
            } => {
                let id = WriteId {
                    plan: plan.serial,
                    index: req_of.len() as u32,
                };
                let deps: Vec<ReqId> = after
                    .iter()
                    .inspect(|a| {
                        assert!(
                            **a < id,
                            "plan {}: write {id:?} is ordered after {a:?}, which is not earlier",
                            plan.serial
                        )
                    })
                    .filter(|a| a.plan == plan.serial)
                    .map(|a| req_of[a.index as usize])
                    .collect();
                let r = sched.submit_write(*block, data.joined(), *flags, &deps);
                req_of.push(r);
                write_of.insert(r, id);
            }
            IoStep::Flush => {
                sched.flush();
            }
            IoStep::Barrier => sched.barrier(),
        }
    }
    let (completions, r) = sched.run(dev);
    for c in completions {
        if c.kind == ReqKind::Write {
            let t = c.ticket.expect("a write has a ticket");
            done.writes.push((write_of[&c.id], c.block, t));
        }
    }
    let r = r.map_err(Into::into);
    done.ok = r.is_ok();
    done.durable = dev.durable();
    (done, r)
}

impl Fs {
    /// What the mount's I/O scheduler has done (request counts, driver
    /// response times, device requests after concatenation); `None` when
    /// the mount runs plans in order (no `sched=`).
    pub fn sched_stats(&self) -> Option<SchedStats> {
        self.shared
            .sched
            .as_ref()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).stats())
    }
}

/// Run `plan` with the mount's executor: through the scheduler when there
/// is one, in order otherwise.
pub(crate) fn execute(
    plan: &IoPlan,
    dev: &dyn BlockDevice,
    sched: Option<&std::sync::Mutex<Scheduler>>,
) -> (PlanDone, Result<()>) {
    match sched {
        None => protocol::execute_plan(plan, dev),
        Some(s) => {
            let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
            execute_plan_scheduled(plan, dev, &mut s)
        }
    }
}
