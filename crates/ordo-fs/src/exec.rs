//! Plan execution: the sequencer that runs the plans protocols make, in
//! the order they were made, outside the file-system lock, and group
//! commit; and the operation handles every `Fs` call runs in.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ordo_dev::BlockDevice;

use crate::error::{errno, FsError, Result};
use crate::protocol::{IoPlan, WriteBackReason};
use crate::state::Core;
use crate::stream::{Caller, StreamId, Streams};
use crate::update::OpKind;

pub(crate) struct Sequencer {
    /// The next ticket to hand out.
    pub(crate) next_ticket: u64,
    /// The ticket whose plan may run now.
    pub(crate) now_serving: u64,
}

/// Group commit for the protocols whose commit makes *everything* before
/// it durable (JBD2 and fast commit): one fsync at a time leads a commit;
/// fsyncs that arrive while it runs wait, and the first of them leads the
/// next commit for all of them, as the kernel's JBD2 and fast-commit code
/// do. Without it every concurrent fsync would queue a commit (and a
/// flush) of its own.
#[derive(Default)]
pub(crate) struct GroupCommit {
    /// A leader is committing.
    pub(crate) leading: bool,
    /// Leaders started so far (the running one included).
    pub(crate) started: u64,
    /// The number of the last leader that finished, and its errno if it
    /// failed.
    pub(crate) done: u64,
    pub(crate) done_errno: Option<i32>,
    /// fsyncs waiting for a leader (observable by tests).
    pub(crate) waiting: usize,
    /// The files the waiting callers asked for: the next leader's commit
    /// covers them too (with streams, a file may hold another stream's
    /// changes, which only a commit naming the file brings along).
    pub(crate) inodes: Vec<crate::update::Ino>,
}

/// The group commits of a mount: one, or one per stream when a commit
/// covers its caller's stream rather than everything
/// (`Capabilities::group_commit_per_stream`).
#[derive(Default)]
pub(crate) struct GroupCommits {
    pub(crate) per_stream: bool,
    pub(crate) by_key: std::collections::HashMap<u32, GroupCommit>,
}

impl GroupCommits {
    /// The group commit a caller in `stream` joins.
    pub(crate) fn of(&mut self, stream: u32) -> &mut GroupCommit {
        let key = if self.per_stream { stream } else { 0 };
        self.by_key.entry(key).or_default()
    }
}

pub(crate) struct Shared {
    pub(crate) core: Mutex<Core>,
    /// `Some` for the protocols whose commits cover everything before them
    /// (or everything of the caller's stream).
    pub(crate) group: Option<(Mutex<GroupCommits>, Condvar)>,
    pub(crate) seq: Mutex<Sequencer>,
    pub(crate) turn: Condvar,
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) stop: AtomicBool,
    /// Stream names and the stream of each caller (see [`crate::stream`]).
    pub(crate) streams: Mutex<Streams>,
    /// The I/O scheduler plans run through (`sched=`); `None`: in order.
    pub(crate) sched: Option<Mutex<ordo_dev::Scheduler>>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn streams(&self) -> MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take the plans out of the core and number them (under the lock, so
    /// numbers follow creation order).
    pub(crate) fn take_plans(&self, core: &mut Core) -> Vec<(u64, IoPlan)> {
        if core.plans.is_empty() {
            return Vec::new();
        }
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        core.plans
            .drain(..)
            .map(|p| {
                let t = seq.next_ticket;
                seq.next_ticket += 1;
                (t, p)
            })
            .collect()
    }

    /// Execute numbered plans in turn, outside the core lock; repeat while
    /// finishing them produced more (write-back under memory pressure).
    pub(crate) fn run(&self, mut plans: Vec<(u64, IoPlan)>) -> Result<()> {
        if plans.is_empty() {
            return Ok(());
        }
        let _waiting = crate::waiting::Waiting::begin();
        let mut first_err: Option<FsError> = None;
        while !plans.is_empty() {
            for (ticket, plan) in plans.drain(..) {
                {
                    let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
                    while seq.now_serving != ticket {
                        seq = self.turn.wait(seq).unwrap_or_else(|e| e.into_inner());
                    }
                }
                let (done, r) =
                    crate::sched::execute(&plan, self.dev.as_ref(), self.sched.as_ref());
                if let Err(e) = r {
                    first_err.get_or_insert(e);
                }
                {
                    let mut core = self.lock();
                    core.plan_finished(&plan, &done);
                    if let Err(e) = core.relieve_pressure() {
                        first_err.get_or_insert(e);
                    }
                }
                let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
                seq.now_serving += 1;
                self.turn.notify_all();
            }
            let mut core = self.lock();
            plans = self.take_plans(&mut core);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Run `f` inside one operation handle, then execute the plans, for a
    /// caller that may use the reserved blocks.
    pub(crate) fn with_handle<T>(
        &self,
        op: OpKind,
        f: impl FnMut(&mut Core) -> Result<T>,
    ) -> Result<T> {
        self.with_handle_as(op, true, f)
    }

    /// Run `f` inside one operation handle, then execute the plans. A
    /// failing `f` leaves nothing behind: whatever it changed is rolled
    /// back before the handle ends. When it failed with ENOSPC while freed
    /// blocks wait for a commit to become reusable, the protocol commits,
    /// the commits under way are waited for, and `f` runs once more (as
    /// ext4's `ext4_should_retry_alloc`); only then is ENOSPC returned.
    /// `reserve`: the caller may use the blocks reserved for root.
    pub(crate) fn with_handle_as<T>(
        &self,
        op: OpKind,
        reserve: bool,
        mut f: impl FnMut(&mut Core) -> Result<T>,
    ) -> Result<T> {
        let (r, retry) = self.handle_once(op, reserve, true, &mut f);
        if !retry {
            return r;
        }
        self.commit_for_space()?;
        self.handle_once(op, reserve, false, &mut f).0
    }

    /// One attempt of [`Shared::with_handle_as`]; also says whether it
    /// failed for space with frees pending. On the `first` attempt a write
    /// cut short for space with frees pending is rolled back too, to be
    /// retried whole: committing its first part to retry the rest would
    /// make a state durable that no single call left.
    pub(crate) fn handle_once<T>(
        &self,
        op: OpKind,
        reserve: bool,
        first: bool,
        f: &mut impl FnMut(&mut Core) -> Result<T>,
    ) -> (Result<T>, bool) {
        // The stream is looked up before the core lock is taken: the two
        // locks are never held together.
        let stream = self.streams().of(Caller::current_thread());
        let (r, plans, retry, shown) = {
            let mut core = self.lock();
            // Backlinks after an unclean mount: the scanners rebuild the
            // allocation state before the first handle that may allocate.
            if core.scan_needed && op != OpKind::Internal {
                if let Err(e) = core.scan_if_needed() {
                    let plans = self.take_plans(&mut core);
                    drop(core);
                    let _ = self.run(plans);
                    return (Err(e), false);
                }
            }
            core.begin(op, stream.0);
            // What the protocol is shown, counted per stream (observable
            // through `Fs::stream_handles`).
            let shown = StreamId(core.handle.stream);
            core.use_reserve = reserve || op_frees_space(op);
            let start = core.savepoint();
            let mut r = f(&mut core);
            let mut retry = false;
            if let Err(e) = &r {
                core.rollback_to(start);
                retry = e.errno() == libc::ENOSPC && core.proto.has_pending_frees();
            } else if first && core.short_for_space && core.proto.has_pending_frees() {
                core.rollback_to(start);
                r = Err(errno(libc::ENOSPC));
                retry = true;
            }
            let end = core.end();
            let r = match (r, end) {
                (Ok(v), Ok(())) => Ok(v),
                (Err(e), _) => Err(e),
                (Ok(_), Err(e)) => Err(e),
            };
            let p = core.relieve_pressure();
            let r = match (r, p) {
                (Ok(v), Err(e)) => {
                    let _ = v;
                    Err(e)
                }
                (r, _) => r,
            };
            let plans = self.take_plans(&mut core);
            (r, plans, retry, shown)
        };
        self.streams().note_handle(shown);
        let ran = self.run(plans);
        let r = match (r, ran) {
            (Ok(v), Ok(())) => Ok(v),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        };
        (r, retry)
    }

    /// Make the frees the protocol holds back reusable: commit, and wait
    /// for every plan made so far (another caller's commit included).
    pub(crate) fn commit_for_space(&self) -> Result<()> {
        let _waiting = crate::waiting::Waiting::begin();
        self.plan(|c| c.plan_with(|p, io| p.sync(io)))?;
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        let target = seq.next_ticket;
        while seq.now_serving < target {
            seq = self.turn.wait(seq).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    /// Run `f` under the lock without a handle (reads).
    pub(crate) fn read<T>(&self, f: impl FnOnce(&mut Core) -> Result<T>) -> Result<T> {
        let (r, plans) = {
            let mut core = self.lock();
            let r = f(&mut core);
            let _ = core.relieve_pressure();
            let plans = self.take_plans(&mut core);
            (r, plans)
        };
        self.run(plans)?;
        r
    }

    /// Ask the protocol for a plan (no handle) and run it.
    pub(crate) fn plan(&self, f: impl FnOnce(&mut Core) -> Result<()>) -> Result<()> {
        let plans = {
            let mut core = self.lock();
            f(&mut core)?;
            self.take_plans(&mut core)
        };
        self.run(plans)
    }

    pub(crate) fn write_back(&self, reason: WriteBackReason) -> Result<()> {
        self.plan(|c| {
            if c.read_only {
                return Ok(());
            }
            if reason == WriteBackReason::Timer {
                c.proto.durable_notice(self.dev.durable());
            }
            c.plan_with(|p, io| p.write_back(reason, io))
        })
    }
}

/// Operations that release space: they may use the reserved blocks (a
/// hole punched in an extent may need a block for the split), as ext4's
/// `EXT4_MB_USE_RESERVED` allocations. COLLAPSE_RANGE removes blocks as a
/// punch does.
pub(crate) fn op_frees_space(op: OpKind) -> bool {
    matches!(
        op,
        OpKind::Unlink
            | OpKind::Rmdir
            | OpKind::Evict
            | OpKind::Internal
            | OpKind::PunchHole
            | OpKind::CollapseRange
    )
}
