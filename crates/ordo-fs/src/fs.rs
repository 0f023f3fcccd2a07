//! The library API: an `Fs` is one mounted ordo file system.
//!
//! `Fs` is `Send + Sync`; every method takes `&self`. Inode numbers are
//! ext4's (root is [`ROOT_INO`](crate::types::ROOT_INO) = 2).
//!
//! Every public call that may change metadata runs as one operation handle
//! under the file-system lock. When it ends, the plans the protocol made are
//! taken out of the core, numbered, and executed *after* the lock is
//! released, strictly in the order of their numbers (the plan sequencer):
//! so a slow synchronous write of one caller does not stall the others, and
//! the order of device writes is exactly the order in which the protocol
//! asked for them. After each plan the lock is taken again to unpin its
//! blocks, mark them clean and tell the protocol.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use ordo_dev::{BlockClass, BlockDevice, Counters};
use ordo_format::Superblock;

use crate::cache::{BufferCache, CacheStats};
use crate::error::{errno, FsError, Result};
use crate::layout::{feat, gd, le16, le32, sb};
use crate::protocol::{self, IoPlan, IoStep, ProtocolEnv, WriteBackReason};
use crate::state::{Core, GroupLoc, SealCtx};
use crate::types::*;
use crate::update::OpKind;

/// Largest data write done in one operation handle; longer writes are split
/// (as the kernel splits a long write into page-sized journal handles), so
/// that the buffer cache can be relieved between the pieces.
const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// Most path components [`Fs::lookup_path`] visits: 40 symlinks (Linux's
/// `MAXSYMLINKS`) of at most a 4 KiB target each, over a `PATH_MAX` path.
const LOOKUP_PATH_STEPS_MAX: usize = 41 * 4096;

struct Sequencer {
    /// The next ticket to hand out.
    next_ticket: u64,
    /// The ticket whose plan may run now.
    now_serving: u64,
}

/// Group commit for the protocols whose commit makes *everything* before
/// it durable (JBD2 and fast commit): one fsync at a time leads a commit;
/// fsyncs that arrive while it runs wait, and the first of them leads the
/// next commit for all of them, as the kernel's JBD2 and fast-commit code
/// do. Without it every concurrent fsync would queue a commit (and a
/// flush) of its own.
#[derive(Default)]
struct GroupCommit {
    /// A leader is committing.
    leading: bool,
    /// Leaders started so far (the running one included).
    started: u64,
    /// The number of the last leader that finished, and its errno if it
    /// failed.
    done: u64,
    done_errno: Option<i32>,
    /// fsyncs waiting for a leader (observable by tests).
    waiting: usize,
}

struct Shared {
    core: Mutex<Core>,
    /// `Some` for the protocols whose commits cover everything before them.
    group: Option<(Mutex<GroupCommit>, Condvar)>,
    seq: Mutex<Sequencer>,
    turn: Condvar,
    dev: Arc<dyn BlockDevice>,
    stop: AtomicBool,
}

/// A mounted file system.
pub struct Fs {
    shared: Arc<Shared>,
    background: Mutex<Option<JoinHandle<()>>>,
    read_only: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take the plans out of the core and number them (under the lock, so
    /// numbers follow creation order).
    fn take_plans(&self, core: &mut Core) -> Vec<(u64, IoPlan)> {
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
    fn run(&self, mut plans: Vec<(u64, IoPlan)>) -> Result<()> {
        let mut first_err: Option<FsError> = None;
        while !plans.is_empty() {
            for (ticket, plan) in plans.drain(..) {
                {
                    let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
                    while seq.now_serving != ticket {
                        seq = self.turn.wait(seq).unwrap_or_else(|e| e.into_inner());
                    }
                }
                let r = self.execute(&plan);
                let ok = r.is_ok();
                if let Err(e) = r {
                    first_err.get_or_insert(e);
                }
                {
                    let mut core = self.lock();
                    core.plan_finished(&plan, ok);
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

    fn execute(&self, plan: &IoPlan) -> Result<()> {
        for step in &plan.steps {
            match step {
                IoStep::Write { block, data, flags } => {
                    self.dev.write(*block, data, *flags)?;
                }
                IoStep::Flush => self.dev.flush()?,
            }
        }
        Ok(())
    }

    /// Run `f` inside one operation handle, then execute the plans, for a
    /// caller that may use the reserved blocks.
    fn with_handle<T>(&self, op: OpKind, f: impl FnMut(&mut Core) -> Result<T>) -> Result<T> {
        self.with_handle_as(op, true, f)
    }

    /// Run `f` inside one operation handle, then execute the plans. A
    /// failing `f` leaves nothing behind: whatever it changed is rolled
    /// back before the handle ends. When it failed with ENOSPC while freed
    /// blocks wait for a commit to become reusable, the protocol commits,
    /// the commits under way are waited for, and `f` runs once more (as
    /// ext4's `ext4_should_retry_alloc`); only then is ENOSPC returned.
    /// `reserve`: the caller may use the blocks reserved for root.
    fn with_handle_as<T>(
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
    fn handle_once<T>(
        &self,
        op: OpKind,
        reserve: bool,
        first: bool,
        f: &mut impl FnMut(&mut Core) -> Result<T>,
    ) -> (Result<T>, bool) {
        let (r, plans, retry) = {
            let mut core = self.lock();
            core.begin(op);
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
            (r, plans, retry)
        };
        let ran = self.run(plans);
        let r = match (r, ran) {
            (Ok(v), Ok(())) => Ok(v),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        };
        (r, retry)
    }

    /// Make the frees the protocol holds back reusable: commit, and wait
    /// for every plan made so far (another caller's commit included).
    fn commit_for_space(&self) -> Result<()> {
        self.plan(|c| c.plan_with(|p, io| p.sync(io)))?;
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        let target = seq.next_ticket;
        while seq.now_serving < target {
            seq = self.turn.wait(seq).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    /// Run `f` under the lock without a handle (reads).
    fn read<T>(&self, f: impl FnOnce(&mut Core) -> Result<T>) -> Result<T> {
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
    fn plan(&self, f: impl FnOnce(&mut Core) -> Result<()>) -> Result<()> {
        let plans = {
            let mut core = self.lock();
            f(&mut core)?;
            self.take_plans(&mut core)
        };
        self.run(plans)
    }

    fn write_back(&self, reason: WriteBackReason) -> Result<()> {
        self.plan(|c| {
            if c.read_only {
                return Ok(());
            }
            c.plan_with(|p, io| p.write_back(reason, io))
        })
    }
}

/// Read the primary superblock image from the device.
fn read_superblock(dev: &dyn BlockDevice) -> Result<(u64, usize, Vec<u8>)> {
    let dbs = dev.block_size() as usize;
    if !(1024..=65536).contains(&dbs) || !dbs.is_power_of_two() {
        return Err(FsError::Invalid(format!("device block size {dbs}")));
    }
    use ordo_format::superblock::{super_block_nr, super_offset, SUPERBLOCK_SIZE};
    let bs = dev.block_size();
    let (block, off) = (super_block_nr(bs), super_offset(bs));
    let mut buf = vec![0u8; dbs];
    dev.read(block, &mut buf, BlockClass::Super)?;
    Ok((block, off, buf[off..off + SUPERBLOCK_SIZE].to_vec()))
}

fn check_features(s: &Superblock, opts: &MountOptions) -> Result<()> {
    let inc = s.features.incompat;
    let unknown = inc & !feat::INCOMPAT_SUPPORTED;
    if unknown != 0 {
        let names: Vec<String> = (0..32)
            .map(|b| 1u32 << b)
            .filter(|b| unknown & b != 0)
            .map(|b| format!("{} ({b:#x})", feat::incompat_name(b)))
            .collect();
        return Err(FsError::Unsupported(format!(
            "incompatible feature(s) {}",
            names.join(", ")
        )));
    }
    if inc & feat::INCOMPAT_EXTENTS == 0 {
        return Err(FsError::Unsupported(
            "images without the extent feature (ext2/ext3 block maps)".into(),
        ));
    }
    if inc & feat::INCOMPAT_RECOVER != 0
        && matches!(
            opts.mode,
            protocol::ProtocolKind::Async | protocol::ProtocolKind::Sync
        )
    {
        return Err(FsError::Unsupported(
            "needs_recovery: the journal needs recovery (replay it with e2fsck or mount with mode=journal)".into(),
        ));
    }
    if opts.mode == protocol::ProtocolKind::FastCommit
        && s.features.compat & ordo_format::features::compat::FAST_COMMIT == 0
    {
        // The fast-commit area is part of the journal's geometry, fixed at
        // mkfs: growing it at mount would change what e2fsck and the kernel
        // read as the journal. Refuse, as the kernel ignores the mount option.
        return Err(FsError::Unsupported(
            "mode=fast_commit needs an image made with -O fast_commit".into(),
        ));
    }
    if !opts.read_only {
        let ro = s.features.ro_compat;
        let unknown = ro & !(feat::RO_COMPAT_SUPPORTED | feat::RO_COMPAT_GDT_CSUM);
        if unknown != 0 {
            let names: Vec<String> = (0..32)
                .map(|b| 1u32 << b)
                .filter(|b| unknown & b != 0)
                .map(|b| format!("{} ({b:#x})", feat::ro_compat_name(b)))
                .collect();
            return Err(FsError::Unsupported(format!(
                "read-only-compatible feature(s) {} (mount read-only)",
                names.join(", ")
            )));
        }
        if s.log_cluster_size != s.log_block_size {
            return Err(FsError::Unsupported("bigalloc clusters".into()));
        }
    }
    Ok(())
}

/// Replay, on `dev` itself, the journal (and the fast commits) of an image
/// whose `needs_recovery` flag is set, with the recovery of the protocol
/// that wrote it (`fast_commit` when the image has the feature, JBD2
/// otherwise): what `e2fsck -y` and a read-write mount do first. Returns
/// `None` when the image needs no recovery.
pub fn recover_image(dev: &dyn BlockDevice) -> Result<Option<protocol::RecoveryReport>> {
    let (sb_block, _, raw) = read_superblock(dev)?;
    let s = Superblock::decode(&raw).map_err(|e| FsError::from(e.at(sb_block)))?;
    if s.features.incompat & feat::INCOMPAT_RECOVER == 0 {
        // A needs_recovery flip torn by a crash reads as a bad checksum
        // above; the flag is clear here, so nothing was torn.
        return Ok(None);
    }
    if s.block_size() != dev.block_size() {
        return Err(FsError::Invalid(format!(
            "the image has {}-byte blocks but the device was opened with {}-byte blocks",
            s.block_size(),
            dev.block_size()
        )));
    }
    let kind = recovery_kind(protocol::ProtocolKind::Journal, &s);
    let env = recovery_env(&s, 0, protocol::DataMode::Ordered);
    protocol::recover(kind, dev, &env).map(Some)
}

/// The recovery a mount in `mode` runs: decided by the image as much as
/// by the mode, since a journal can only be recovered whole. An image with
/// fast commits gets the fast-commit replay (which replays JBD2 first)
/// whether it is mounted `fast_commit` or `journal`, as the kernel replays
/// them whatever the mount options; a JBD2 recovery alone would empty the
/// log and discard fsynced fast commits.
fn recovery_kind(mode: protocol::ProtocolKind, s: &Superblock) -> protocol::ProtocolKind {
    use protocol::ProtocolKind::*;
    match mode {
        Journal | FastCommit
            if s.features.compat & ordo_format::features::compat::FAST_COMMIT != 0 =>
        {
            FastCommit
        }
        Journal | FastCommit => Journal,
        other => other,
    }
}

/// What recovery is told of the image (and of the mount, for the
/// protocol built after it on the same thread).
fn recovery_env(
    s: &Superblock,
    commit_interval_ms: u64,
    data_mode: protocol::DataMode,
) -> ProtocolEnv {
    ProtocolEnv {
        block_size: s.block_size(),
        block_count: s.blocks_count,
        uuid: s.uuid,
        journal_runs: Vec::new(),
        commit_interval_ms,
        data_mode,
        metadata_csum: s.has_metadata_csum(),
    }
}

/// What a read-only mount (or `ordo fsck -n`) reads: the device itself,
/// or, when its journal needs recovery, a copy-on-write view of it with
/// the journal (and any fast commits) replayed in memory, and the report
/// of that replay. The kernel either writes to a device mounted read-only
/// to recover it or, with `noload`, serves metadata the log would have
/// replaced; ordo serves the recovered file system and leaves the image
/// untouched (a later read-write mount recovers it).
pub fn recovered_view(
    dev: Arc<dyn BlockDevice>,
) -> Result<(Arc<dyn BlockDevice>, Option<protocol::RecoveryReport>)> {
    let view: Arc<dyn BlockDevice> = Arc::new(ordo_dev::OverlayDevice::new(dev.clone()));
    let repaired = crate::recovery::repair_torn_super(view.as_ref())?;
    match recover_image(view.as_ref())? {
        Some(report) => Ok((view, Some(report))),
        None if repaired => Ok((view, None)),
        None => Ok((dev, None)),
    }
}

impl Fs {
    /// Mount the image on `dev`: validate the superblock (refusing
    /// unsupported incompatible features by name), run the protocol's
    /// recovery, process the orphan list, and start the protocol.
    pub fn mount(dev: Arc<dyn BlockDevice>, opts: MountOptions) -> Result<Fs> {
        let dev = if opts.read_only {
            recovered_view(dev)?.0
        } else {
            dev
        };
        if matches!(
            opts.mode,
            protocol::ProtocolKind::Journal | protocol::ProtocolKind::FastCommit
        ) && !opts.read_only
        {
            // A crash can tear the superblock while the journal flips its
            // needs_recovery flag; undo that before validating it.
            crate::recovery::repair_torn_super(dev.as_ref())?;
        }
        let (sb_block, sb_offset, raw) = read_superblock(dev.as_ref())?;
        let s = Superblock::decode(&raw).map_err(|e| FsError::from(e.at(sb_block)))?;
        check_features(&s, &opts)?;
        // The protocol's recovery (journal replay) runs before anything else
        // is read: group descriptors and the superblock may be in the log.
        if !opts.read_only && s.block_size() == dev.block_size() {
            let env = recovery_env(&s, opts.commit_interval_ms, opts.data);
            protocol::recover(recovery_kind(opts.mode, &s), dev.as_ref(), &env)?;
        }
        let (_, _, raw) = read_superblock(dev.as_ref())?;
        let s = Superblock::decode(&raw).map_err(|e| FsError::from(e.at(sb_block)))?;
        let bs = s.block_size();
        if bs != dev.block_size() {
            return Err(FsError::Invalid(format!(
                "the image has {bs}-byte blocks but the device was opened with {}-byte blocks",
                dev.block_size()
            )));
        }
        if s.blocks_count > dev.block_count() {
            return Err(FsError::corrupt(
                sb_block,
                "superblock s_blocks_count",
                format!(
                    "{} blocks but the device has {}",
                    s.blocks_count,
                    dev.block_count()
                ),
            ));
        }
        check_features(&s, &opts)?;
        if s.features.compat & feat::COMPAT_ORPHAN_FILE != 0
            && s.features.ro_compat & feat::RO_COMPAT_ORPHAN_PRESENT != 0
            && !opts.read_only
        {
            return Err(FsError::Unsupported(
                "orphan_file with orphans present (run e2fsck first)".into(),
            ));
        }
        let csum = s.has_metadata_csum();
        let desc_size = s.desc_size() as u32;
        let ngroups = s.groups_count() as u32;
        let gdt_first = if bs == 1024 { 2 } else { 1 };
        let gdt_blocks = s.gdt_blocks();
        let mut seal = SealCtx {
            csum,
            csum_seed: s.csum_seed(),
            block_size: bs,
            inode_size: s.inode_size() as u32,
            inodes_per_group: s.inodes_per_group,
            desc_size,
            groups: ngroups,
            gdt_first,
            gdt_blocks,
            sb_block,
            sb_offset,
            uuid: s.uuid,
            group_crc16: s.has_gdt_csum(),
            itables: Default::default(),
            itable_blocks: s.inode_table_blocks() as u64,
            owners: Default::default(),
        };
        // Group descriptors, verified.
        let mut groups = Vec::with_capacity(ngroups as usize);
        let mut buf = vec![0u8; bs as usize];
        let per = (bs / desc_size) as u64;
        for g in 0..ngroups {
            let blk = gdt_first + g as u64 / per;
            if (g as u64).is_multiple_of(per) {
                dev.read(blk, &mut buf, BlockClass::GroupMeta)?;
            }
            let off = (g as u64 % per) as usize * desc_size as usize;
            let d = &buf[off..off + desc_size as usize];
            if csum || seal.group_crc16 {
                let want = seal.gd_csum(g, d);
                let have = le16(d, gd::CHECKSUM);
                if want != have {
                    return Err(FsError::corrupt(
                        blk,
                        format!("group descriptor {g} bg_checksum"),
                        format!("stored {have:#06x}, computed {want:#06x}"),
                    ));
                }
            }
            let hi = |o: usize| {
                if desc_size >= 64 {
                    (le32(d, o) as u64) << 32
                } else {
                    0
                }
            };
            let loc = GroupLoc {
                block_bitmap: le32(d, gd::BLOCK_BITMAP_LO) as u64 | hi(gd::BLOCK_BITMAP_HI),
                inode_bitmap: le32(d, gd::INODE_BITMAP_LO) as u64 | hi(gd::INODE_BITMAP_HI),
                inode_table: le32(d, gd::INODE_TABLE_LO) as u64 | hi(gd::INODE_TABLE_HI),
            };
            let itb = s.inode_table_blocks() as u64;
            for (what, b, n) in [
                ("bg_block_bitmap", loc.block_bitmap, 1),
                ("bg_inode_bitmap", loc.inode_bitmap, 1),
                ("bg_inode_table", loc.inode_table, itb),
            ] {
                if b <= s.first_data_block as u64 || b + n > s.blocks_count {
                    return Err(FsError::corrupt(
                        blk,
                        format!("group descriptor {g} {what}"),
                        format!("block {b} outside the file system"),
                    ));
                }
            }
            seal.itables.insert(loc.inode_table, g);
            groups.push(loc);
        }
        let env = ProtocolEnv {
            block_size: bs,
            block_count: s.blocks_count,
            uuid: s.uuid,
            journal_runs: Vec::new(),
            commit_interval_ms: opts.commit_interval_ms,
            data_mode: opts.data,
            metadata_csum: csum,
        };
        let proto = protocol::build(opts.mode, &env)?;
        let cache = BufferCache::new(bs, opts.cache_bytes);
        let mut core = Core::new(dev.clone(), s, groups, cache, proto, seal, opts.read_only);
        // The root must be a directory.
        let root = core.read_inode(ROOT_INO)?;
        if !root.is_dir() {
            return Err(FsError::corrupt(
                core.inode_loc(ROOT_INO).0,
                "inode 2 i_mode",
                format!("root is not a directory ({:#o})", root.mode),
            ));
        }
        let journaled = matches!(
            opts.mode,
            protocol::ProtocolKind::Journal | protocol::ProtocolKind::FastCommit
        );
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            group: journaled.then(|| (Mutex::new(GroupCommit::default()), Condvar::new())),
            seq: Mutex::new(Sequencer {
                next_ticket: 0,
                now_serving: 0,
            }),
            turn: Condvar::new(),
            dev,
            stop: AtomicBool::new(false),
        });
        // As the kernel (`ext4_setup_super`): a mount clears the "cleanly
        // unmounted" bit only when no journal protects the image; under
        // a journal, `needs_recovery` says whether a crash left work, and a
        // recovered image is as valid as a cleanly unmounted one (e2fsck
        // then exits 0 after replaying it).
        if !opts.read_only {
            shared.with_handle(OpKind::Internal, |c| {
                c.process_orphans()?;
                let state = c.sb32(sb::STATE)? as u16;
                if !journaled {
                    c.set_sb(
                        sb::STATE,
                        &(state & !sb::STATE_VALID).to_le_bytes(),
                        crate::update::UpdateKind::Other,
                    )?;
                }
                let mnt = (c.sb32(sb::MNT_COUNT)? as u16).wrapping_add(1);
                c.set_sb(
                    sb::MNT_COUNT,
                    &mnt.to_le_bytes(),
                    crate::update::UpdateKind::Other,
                )?;
                let now = Timespec::now().sec as u32;
                c.set_sb(
                    sb::MTIME,
                    &now.to_le_bytes(),
                    crate::update::UpdateKind::Other,
                )?;
                Ok(())
            })?;
        }
        let fs = Fs {
            shared,
            background: Mutex::new(None),
            read_only: opts.read_only,
        };
        if opts.background && !opts.read_only {
            let sh = fs.shared.clone();
            let interval = opts.commit_interval_ms.max(10);
            let h = std::thread::spawn(move || {
                let mut waited = 0u64;
                while !sh.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                    waited += 10;
                    if waited >= interval {
                        waited = 0;
                        let _ = sh.write_back(WriteBackReason::Timer);
                    }
                }
            });
            *fs.background.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        }
        Ok(fs)
    }

    fn stop_background(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self
            .background
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = h.join();
        }
    }

    /// Make everything durable, mark the image clean, and release it.
    pub fn unmount(self) -> Result<()> {
        self.stop_background();
        if self.read_only {
            return Ok(());
        }
        self.shared.with_handle(OpKind::Internal, |c| {
            c.update_sb_counters()?;
            let state = c.sb32(sb::STATE)? as u16;
            c.set_sb(
                sb::STATE,
                &(state | sb::STATE_VALID).to_le_bytes(),
                crate::update::UpdateKind::Other,
            )?;
            let now = Timespec::now().sec as u32;
            c.set_sb(
                sb::WTIME,
                &now.to_le_bytes(),
                crate::update::UpdateKind::Other,
            )?;
            Ok(())
        })?;
        self.shared.write_back(WriteBackReason::Unmount)?;
        let dirty = self.shared.lock().cache.dirty_count();
        if dirty != 0 {
            return Err(FsError::Invalid(format!(
                "{dirty} dirty blocks left after the unmount write-back"
            )));
        }
        self.shared.dev.flush()?;
        Ok(())
    }

    fn mutating(&self) -> Result<()> {
        if self.read_only {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    /// Look up `name` in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        self.shared.read(|c| c.op_lookup(parent, name))
    }

    /// Resolve an absolute path ("/a/b") without following a final symlink
    /// (intermediate symlinks are followed, up to 40 of them).
    pub fn lookup_path(&self, path: &str) -> Result<Attr> {
        self.shared.read(|c| {
            let mut todo: Vec<Vec<u8>> = path
                .as_bytes()
                .split(|&b| b == b'/')
                .filter(|s| !s.is_empty())
                .map(|s| s.to_vec())
                .rev()
                .collect();
            let mut cur = c.op_lookup(ROOT_INO, b".")?;
            let mut stack: Vec<Ino> = Vec::new();
            let mut links = 0;
            let mut steps = 0usize;
            while let Some(name) = todo.pop() {
                // Each step consumes a component and symlinks are capped,
                // yet a corrupted image should never be what keeps a walk
                // going: an explicit cap on the components visited.
                steps += 1;
                if steps > LOOKUP_PATH_STEPS_MAX {
                    return Err(errno(libc::ELOOP));
                }
                if cur.kind != FileType::Directory {
                    return Err(errno(libc::ENOTDIR));
                }
                let next = if name == b".." {
                    match stack.pop() {
                        Some(p) => c.op_lookup(p, b".")?,
                        None => c.op_lookup(ROOT_INO, b".")?,
                    }
                } else {
                    c.op_lookup(cur.ino, &name)?
                };
                if next.kind == FileType::Symlink && !todo.is_empty() {
                    links += 1;
                    if links > 40 {
                        return Err(errno(libc::ELOOP));
                    }
                    let target = c.op_readlink(next.ino)?;
                    for part in target.split(|&b| b == b'/').filter(|s| !s.is_empty()).rev() {
                        todo.push(part.to_vec());
                    }
                    if target.first() == Some(&b'/') {
                        stack.clear();
                        cur = c.op_lookup(ROOT_INO, b".")?;
                    }
                    continue;
                }
                if name != b".." {
                    stack.push(cur.ino);
                }
                cur = next;
            }
            Ok(cur)
        })
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.shared.read(|c| {
            let i = c.live_inode(ino)?;
            Ok(c.attr_of(&i))
        })
    }

    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        self.mutating()?;
        self.shared
            .with_handle(op_of_setattr(set), |c| c.op_setattr(ino, set, None))
    }

    /// `setattr` on behalf of `creds` (chmod drops S_ISGID when the caller
    /// is not in the file's group, as the kernel does).
    pub fn setattr_as(&self, ino: Ino, set: &SetAttr, creds: &Creds) -> Result<Attr> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared
            .with_handle_as(op_of_setattr(set), reserve, |c| {
                c.op_setattr(ino, set, Some(creds))
            })
    }

    /// Whether `creds` may allocate the blocks reserved for root.
    fn may_use_reserve(&self, creds: &Creds) -> bool {
        may_use_reserve(&self.shared.lock().sbi, creds)
    }

    /// Create a regular file (or, with another `kind`, a device node, FIFO or
    /// socket: mknod). `perm` is `mode & 0o7777` after the umask.
    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileType,
        perm: u16,
        rdev: u32,
        creds: &Creds,
    ) -> Result<Attr> {
        self.mutating()?;
        let op = if kind == FileType::Regular {
            OpKind::Create
        } else {
            OpKind::Mknod
        };
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(op, reserve, |c| {
            c.op_create(parent, name, kind, perm, rdev, creds)
        })
    }
    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u16, creds: &Creds) -> Result<Attr> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(OpKind::Mkdir, reserve, |c| {
            c.op_mkdir(parent, name, perm, creds)
        })
    }
    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], creds: &Creds) -> Result<Attr> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(OpKind::Symlink, reserve, |c| {
            c.op_symlink(parent, name, target, creds)
        })
    }
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.shared.read(|c| c.op_readlink(ino))
    }
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.link_as(ino, newparent, newname, &Creds::root())
    }
    /// `link` on behalf of `creds` (who may or may not use the reserved
    /// blocks should the directory need one).
    pub fn link_as(&self, ino: Ino, newparent: Ino, newname: &[u8], creds: &Creds) -> Result<Attr> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(OpKind::Link, reserve, |c| {
            c.op_link(ino, newparent, newname)
        })
    }
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.mutating()?;
        self.shared
            .with_handle(OpKind::Unlink, |c| c.op_unlink(parent, name))
    }
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.mutating()?;
        self.shared
            .with_handle(OpKind::Rmdir, |c| c.op_rmdir(parent, name))
    }
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.rename_as(parent, name, newparent, newname, flags, &Creds::root())
    }
    /// `rename` on behalf of `creds` (see [`Fs::link_as`]).
    pub fn rename_as(
        &self,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: RenameFlags,
        creds: &Creds,
    ) -> Result<()> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        self.shared.with_handle_as(OpKind::Rename, reserve, |c| {
            c.op_rename(parent, name, newparent, newname, flags)
        })
    }
    /// Note an open file handle on `ino` (keeps an unlinked inode alive).
    pub fn open(&self, ino: Ino) -> Result<()> {
        self.shared.read(|c| {
            c.live_inode(ino)?;
            *c.open_counts.entry(ino).or_insert(0) += 1;
            Ok(())
        })
    }
    /// Drop an open handle; the last close of an unlinked inode frees it.
    pub fn release(&self, ino: Ino) -> Result<()> {
        let evict = self.shared.read(|c| {
            let n = c.open_counts.get(&ino).copied().unwrap_or(0);
            if n == 0 {
                return Err(errno(libc::EBADF));
            }
            if n == 1 {
                c.open_counts.remove(&ino);
                let i = c.read_inode(ino)?;
                Ok(i.links == 0 && i.mode != 0 && !c.read_only)
            } else {
                c.open_counts.insert(ino, n - 1);
                Ok(false)
            }
        })?;
        if evict {
            self.shared.with_handle(OpKind::Evict, |c| {
                // Opened again meanwhile? Then it stays.
                if c.open_counts.contains_key(&ino) {
                    return Ok(());
                }
                let i = c.read_inode(ino)?;
                if i.links == 0 && i.mode != 0 {
                    c.evict(ino)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.shared.read(|c| c.file_read(ino, offset, size))
    }
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_as(ino, offset, data, &Creds::root())
    }
    /// `write` on behalf of `creds`: a caller who may not use the reserved
    /// blocks gets a short write, or ENOSPC, where root would not. A write
    /// that runs out of space returns the bytes it wrote (short write);
    /// ENOSPC only when it wrote none.
    pub fn write_as(&self, ino: Ino, offset: u64, data: &[u8], creds: &Creds) -> Result<u32> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        if data.is_empty() {
            self.getattr(ino)?;
            return Ok(0);
        }
        let chunk = {
            let c = self.shared.lock();
            ((c.cache.bound_bytes() / 8) as usize).clamp(c.bs as usize, WRITE_CHUNK_BYTES)
        };
        let mut done = 0usize;
        while done < data.len() {
            let end = (done + chunk).min(data.len());
            let r = self.shared.with_handle_as(OpKind::Write, reserve, |c| {
                c.file_write(ino, offset + done as u64, &data[done..end])
            });
            match r {
                Ok(n) => {
                    let want = end - done;
                    done += n as usize;
                    // Out of space (after the commit and retry that frees
                    // held-back blocks), or at the largest file size.
                    if (n as usize) < want {
                        break;
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done as u32)
    }
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, flags: FallocFlags) -> Result<()> {
        self.fallocate_as(ino, offset, len, flags, &Creds::root())
    }
    /// `fallocate` on behalf of `creds` (see [`Fs::write_as`]).
    pub fn fallocate_as(
        &self,
        ino: Ino,
        offset: u64,
        len: u64,
        flags: FallocFlags,
        creds: &Creds,
    ) -> Result<()> {
        self.mutating()?;
        let reserve = self.may_use_reserve(creds);
        let op = if flags.punch_hole {
            OpKind::PunchHole
        } else {
            OpKind::Fallocate
        };
        self.shared
            .with_handle_as(op, reserve, |c| c.file_fallocate(ino, offset, len, flags))
    }
    pub fn seek(&self, ino: Ino, offset: u64, whence: SeekWhence) -> Result<u64> {
        self.shared.read(|c| c.file_seek(ino, offset, whence))
    }
    pub fn fsync(&self, ino: Ino, datasync: bool) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let Some((group, cv)) = &self.shared.group else {
            return self.shared.plan(|c| {
                c.live_inode(ino)?;
                c.plan_with(|p, io| p.fsync(ino, datasync, io))
            });
        };
        // The caller's own errors first: a leader's commit must not fail
        // for a reason that is not its waiters'.
        self.shared.read(|c| c.live_inode(ino).map(|_| ()))?;
        let commit = || {
            self.shared
                .plan(|c| c.plan_with(|p, io| p.fsync(ino, datasync, io)))
        };
        let mut g = group.lock().unwrap_or_else(|e| e.into_inner());
        // Every change this caller made is in the cache now; a commit that
        // *starts* later (number > arrival) covers them.
        let arrival = g.started;
        loop {
            if g.done > arrival {
                return match g.done_errno {
                    None => Ok(()),
                    Some(e) => Err(errno(e)),
                };
            }
            if !g.leading {
                break;
            }
            g.waiting += 1;
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
            g.waiting -= 1;
        }
        g.leading = true;
        g.started += 1;
        let me = g.started;
        drop(g);
        let r = commit();
        let mut g = group.lock().unwrap_or_else(|e| e.into_inner());
        debug_assert!(g.leading && g.started == me);
        g.leading = false;
        g.done = me;
        g.done_errno = r.as_ref().err().map(|e| e.errno());
        cv.notify_all();
        r
    }
    /// How many fsyncs are waiting for a group commit led by another one
    /// (always 0 for the protocols without group commit).
    pub fn fsync_waiters(&self) -> usize {
        self.shared.group.as_ref().map_or(0, |(g, _)| {
            g.lock().unwrap_or_else(|e| e.into_inner()).waiting
        })
    }
    pub fn sync(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.shared
            .with_handle(OpKind::Internal, |c| c.update_sb_counters())?;
        self.shared.plan(|c| c.plan_with(|p, io| p.sync(io)))
    }
    pub fn statfs(&self) -> Result<StatFs> {
        self.shared.read(|c| {
            let (free_blocks, free_inodes) = c.free_totals()?;
            let s = &c.sbi;
            let mut overhead = s.first_data_block as u64;
            for g in 0..s.groups_count() {
                overhead += s.super_overhead_blocks(g) + 2 + s.inode_table_blocks() as u64;
            }
            let journal = if s.journal_inum != 0 {
                let ji = s.journal_inum;
                c.read_inode(ji)
                    .map(|i| i.sectors / (c.bs as u64 / 512))
                    .unwrap_or(0)
            } else {
                0
            };
            let s = &c.sbi;
            let blocks = s.blocks_count.saturating_sub(overhead + journal);
            Ok(StatFs {
                block_size: c.bs,
                blocks,
                blocks_free: free_blocks,
                blocks_avail: free_blocks.saturating_sub(s.r_blocks_count),
                files: s.inodes_count as u64,
                files_free: free_inodes,
                name_max: crate::ops::NAME_MAX as u32,
            })
        })
    }
    /// Entries of directory `ino` after cookie `offset` (0 = from the start,
    /// including "." and ".."), at most `max` of them.
    pub fn readdir(&self, ino: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        self.shared.read(|c| {
            c.live_dir(ino)?;
            c.dir_read(ino, offset, max)
        })
    }
    /// Check `mask` (R_OK=4, W_OK=2, X_OK=1) for `creds` as the kernel does.
    pub fn access(&self, ino: Ino, mask: u32, creds: &Creds) -> Result<()> {
        let attr = self.getattr(ino)?;
        if mask & 2 != 0
            && self.read_only
            && attr.kind != FileType::CharDevice
            && attr.kind != FileType::BlockDevice
            && attr.kind != FileType::Fifo
            && attr.kind != FileType::Socket
        {
            return Err(errno(libc::EROFS));
        }
        let perm = attr.perm as u32;
        if creds.uid == 0 {
            // Root may read and write anything; execute needs some x bit
            // (or a directory).
            if mask & 1 != 0 && attr.kind != FileType::Directory && perm & 0o111 == 0 {
                return Err(errno(libc::EACCES));
            }
            return Ok(());
        }
        let bits = if creds.uid == attr.uid {
            perm >> 6
        } else if creds.gid == attr.gid || creds.groups.contains(&attr.gid) {
            perm >> 3
        } else {
            perm
        } & 7;
        if bits & mask != mask & 7 {
            return Err(errno(libc::EACCES));
        }
        Ok(())
    }
    /// Run the protocol's periodic write-back now (what the timer does).
    pub fn write_back(&self) -> Result<()> {
        self.shared.write_back(WriteBackReason::Timer)
    }
    /// The device's counters.
    pub fn counters(&self) -> Counters {
        self.shared.dev.counters()
    }
    /// The protocol's name and statistics.
    pub fn protocol_stats(&self) -> (String, Vec<(String, u64)>) {
        let c = self.shared.lock();
        (c.proto.name().to_string(), c.proto.stats())
    }
    /// Buffer-cache figures (cached, peak and bound bytes, dirty blocks).
    pub fn cache_stats(&self) -> CacheStats {
        self.shared.lock().cache.stats()
    }
    /// Block size of the file system in bytes.
    pub fn block_size(&self) -> u32 {
        self.shared.lock().bs
    }
}

/// Operations that release space: they may use the reserved blocks (a
/// hole punched in an extent may need a block for the split), as ext4's
/// `EXT4_MB_USE_RESERVED` allocations.
fn op_frees_space(op: OpKind) -> bool {
    matches!(
        op,
        OpKind::Unlink | OpKind::Rmdir | OpKind::Evict | OpKind::Internal | OpKind::PunchHole
    )
}

/// Whether `creds` may allocate the blocks reserved with `mkfs -m`
/// (`s_r_blocks_count`): root, the reserved uid (`s_def_resuid`) or a
/// member of the reserved group (`s_def_resgid`, when it is not root's),
/// as ext4's `ext4_has_free_clusters`.
fn may_use_reserve(sbi: &Superblock, creds: &Creds) -> bool {
    creds.uid == 0
        || creds.uid == sbi.def_resuid as u32
        || (sbi.def_resgid != 0
            && (creds.gid == sbi.def_resgid as u32
                || creds.groups.contains(&(sbi.def_resgid as u32))))
}

fn op_of_setattr(set: &SetAttr) -> OpKind {
    if set.size.is_some() {
        OpKind::Truncate
    } else {
        OpKind::SetAttr
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        self.stop_background();
    }
}
