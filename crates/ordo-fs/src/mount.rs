//! Mounting: the protocol's recovery, a [`Core`] built over the device
//! (the superblock, the verified group descriptors and the checksum
//! context, then the core itself), the orphan list, the background
//! write-back thread; and unmounting.
//!
//! Why apart from [`crate::fs::Fs::mount`]: mount is not the only place
//! that needs ext4's core over an image. Fast-commit replay applies its
//! tags through the same core (with a protocol that writes nothing), so
//! that there is one ext4 mutator in ordo, and that core must see the
//! image exactly as a mount would: same checks, same errors, block and
//! field named. Mount keeps what only a mount does (the feature and
//! orphan checks against its options, recovery, the protocol, the root
//! check, the superblock's mount fields).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ordo_dev::{BlockClass, BlockDevice};
use ordo_format::group::{group_desc_checksum, GroupDesc};
use ordo_format::superblock::GroupCsum;
use ordo_format::Superblock;

use crate::cache::BufferCache;
use crate::clock::Clock;
use crate::error::{FsError, Result};
use crate::exec::{GroupCommits, Sequencer, Shared};
use crate::fs::Fs;
use crate::layout::{feat, sb};
use crate::protocol::{self, Protocol, ProtocolEnv, WriteBackReason};
use crate::state::{Core, GroupLoc, SealCtx};
use crate::stream::Streams;
use crate::types::*;
use crate::update::OpKind;

/// Read the primary superblock's 1024 bytes: (block, byte offset in the
/// block, raw bytes).
pub(crate) fn read_superblock(dev: &dyn BlockDevice) -> Result<(u64, usize, Vec<u8>)> {
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

/// What a core needs to know about an image before its first block read
/// through the cache: the superblock, where it lies, the groups' metadata
/// locations and the checksum context.
pub(crate) struct CoreImage {
    pub sb: Superblock,
    pub groups: Vec<GroupLoc>,
    pub seal: SealCtx,
}

/// How a core is run over an image.
#[derive(Clone, Debug)]
pub(crate) struct CoreOptions {
    /// Bound of the buffer cache, bytes (at least 64 blocks; see
    /// [`BufferCache::new`]). A core that must never evict passes a bound
    /// above everything it can touch.
    pub cache_bytes: u64,
    /// Whether the core refuses every change.
    pub read_only: bool,
    /// The time source of every timestamp the core writes.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Seed of the core's random source (inode generations).
    pub seed: u64,
}

impl CoreImage {
    /// Read and decode the superblock and check it against the device:
    /// same block size, no more blocks than the device has. Returns the
    /// superblock, its block and its byte offset in that block.
    pub(crate) fn read_super(dev: &dyn BlockDevice) -> Result<(Superblock, u64, usize)> {
        let (sb_block, sb_offset, raw) = read_superblock(dev)?;
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
        Ok((s, sb_block, sb_offset))
    }

    /// Decode and verify every group descriptor of the image whose
    /// superblock `s` was read by [`CoreImage::read_super`]: checksum
    /// (metadata_csum or gdt_csum), and bitmaps and inode table inside the
    /// file system. The first bad descriptor is an error naming its
    /// table block and field.
    pub(crate) fn load(
        dev: &dyn BlockDevice,
        s: Superblock,
        sb_block: u64,
        sb_offset: usize,
    ) -> Result<CoreImage> {
        let bs = s.block_size();
        let csum = s.has_metadata_csum();
        let desc_size = s.desc_size() as u32;
        let ngroups = s.groups_count() as u32;
        let gdt_first = if bs == 1024 { 2 } else { 1 };
        let mut seal = SealCtx {
            csum,
            csum_seed: s.csum_seed(),
            block_size: bs,
            inode_size: s.inode_size() as u32,
            inodes_per_group: s.inodes_per_group,
            desc_size,
            groups: ngroups,
            gdt_first,
            gdt_blocks: s.gdt_blocks(),
            sb_block,
            sb_offset,
            uuid: s.uuid,
            group_crc16: s.has_gdt_csum(),
            itables: Default::default(),
            itable_blocks: s.inode_table_blocks() as u64,
            owners: Default::default(),
            bitmaps: Default::default(),
            clusters_per_group: s.clusters_per_group,
        };
        let gcsum = s.group_csum();
        let itb = s.inode_table_blocks() as u64;
        let mut groups = Vec::with_capacity(ngroups as usize);
        let mut buf = vec![0u8; bs as usize];
        let per = (bs / desc_size) as u64;
        for g in 0..ngroups {
            let blk = gdt_first + g as u64 / per;
            if (g as u64).is_multiple_of(per) {
                dev.read(blk, &mut buf, BlockClass::GroupMeta)?;
            }
            let off = (g as u64 % per) as usize * desc_size as usize;
            let slot = &buf[off..off + desc_size as usize];
            let d =
                GroupDesc::decode(slot, desc_size as u16).map_err(|e| FsError::from(e.at(blk)))?;
            if gcsum != GroupCsum::None {
                let want = group_desc_checksum(slot, g, gcsum);
                if want != d.checksum {
                    return Err(FsError::corrupt(
                        blk,
                        format!("group descriptor {g} bg_checksum"),
                        format!("stored {:#06x}, computed {want:#06x}", d.checksum),
                    ));
                }
            }
            let loc = GroupLoc {
                block_bitmap: d.block_bitmap,
                inode_bitmap: d.inode_bitmap,
                inode_table: d.inode_table,
            };
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
            seal.bitmaps.insert(loc.block_bitmap, (g, true));
            seal.bitmaps.insert(loc.inode_bitmap, (g, false));
            groups.push(loc);
        }
        Ok(CoreImage {
            sb: s,
            groups,
            seal,
        })
    }
}

impl Core {
    /// A core over `dev` whose image `image` describes, driven by `proto`.
    pub(crate) fn open(
        dev: Arc<dyn BlockDevice>,
        image: CoreImage,
        opts: CoreOptions,
        proto: Box<dyn Protocol>,
    ) -> Core {
        let cache = BufferCache::new(image.sb.block_size(), opts.cache_bytes);
        Core::new(
            dev,
            image.sb,
            image.groups,
            cache,
            proto,
            image.seal,
            opts.read_only,
            opts.clock,
            opts.seed,
        )
    }
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
    if inc & feat::INCOMPAT_RECOVER != 0 && !opts.mode.caps().log_replay {
        return Err(FsError::Unsupported(
            "needs_recovery: the journal needs recovery (replay it with e2fsck or mount with mode=journal)".into(),
        ));
    }
    // A protocol's on-disk structures (a journal, a fast-commit area) are
    // fixed at mkfs: making them at mount would change what e2fsck and the
    // kernel read. Refuse, as the kernel ignores a mount option whose
    // feature the image lacks. (A missing journal is reported by its
    // recovery, which names the journal.)
    let need = opts.mode.required_features();
    let missing_compat =
        need.compat & !s.features.compat & !ordo_format::features::compat::HAS_JOURNAL;
    if missing_compat != 0 {
        let names: Vec<&str> = ordo_format::features::ALL_FEATURES
            .iter()
            .filter(|f| {
                f.kind == ordo_format::features::FeatureKind::Compat && missing_compat & f.bit != 0
            })
            .map(|f| f.name)
            .collect();
        return Err(FsError::Unsupported(format!(
            "mode={} needs an image made with -O {}",
            opts.mode.name(),
            names.join(",")
        )));
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
    recover_image_with(dev, crate::clock::system())
}

/// [`recover_image`] reading the time (the `dtime` a replay stamps) from
/// `clock`.
pub fn recover_image_with(
    dev: &dyn BlockDevice,
    clock: Arc<dyn Clock>,
) -> Result<Option<protocol::RecoveryReport>> {
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
    // Whatever the image's log is, the registry's log-replaying protocol
    // with the most of the image's features recovers it.
    let any_log = protocol::ProtocolKind::all()
        .find(|k| k.caps().log_replay)
        .expect("a log-replaying protocol is registered");
    let kind = any_log.recovery_for_image(&s, dev);
    let env = recovery_env(&s, 0, protocol::DataMode::Ordered, clock);
    protocol::recover(kind, dev, &env).map(Some)
}

/// What recovery is told of the image (and of the mount, for the
/// protocol built from what it recovered).
fn recovery_env(
    s: &Superblock,
    commit_interval_ms: u64,
    data_mode: protocol::DataMode,
    clock: Arc<dyn Clock>,
) -> ProtocolEnv {
    ProtocolEnv {
        block_size: s.block_size(),
        block_count: s.blocks_count,
        uuid: s.uuid,
        journal_runs: Vec::new(),
        commit_interval_ms,
        flush_interval_ms: 1000,
        data_mode,
        metadata_csum: s.has_metadata_csum(),
        clock,
        variant: "",
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
    recovered_view_with(dev, crate::clock::system())
}

/// [`recovered_view`] reading the time from `clock`.
pub fn recovered_view_with(
    dev: Arc<dyn BlockDevice>,
    clock: Arc<dyn Clock>,
) -> Result<(Arc<dyn BlockDevice>, Option<protocol::RecoveryReport>)> {
    let view: Arc<dyn BlockDevice> = Arc::new(ordo_dev::OverlayDevice::new(dev.clone()));
    let repaired = crate::recovery::repair_torn_super(view.as_ref())?;
    match recover_image_with(view.as_ref(), clock)? {
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
        let clock = opts.clock_or_system();
        let seed = opts.seed.unwrap_or_else(crate::random::entropy_seed);
        let dev = if opts.read_only {
            recovered_view_with(dev, clock.clone())?.0
        } else if !opts.barrier {
            Arc::new(ordo_dev::NoBarrierDevice::new(dev))
        } else {
            dev
        };
        if opts.mode.caps().log_replay && !opts.read_only {
            // A crash can tear the superblock while the journal flips its
            // needs_recovery flag; undo that before validating it.
            crate::recovery::repair_torn_super(dev.as_ref())?;
        }
        let (sb_block, _, raw) = read_superblock(dev.as_ref())?;
        let s = Superblock::decode(&raw).map_err(|e| FsError::from(e.at(sb_block)))?;
        check_features(&s, &opts)?;
        // The protocol's recovery (journal replay) runs before anything else
        // is read: group descriptors and the superblock may be in the log.
        let recovered = if !opts.read_only && s.block_size() == dev.block_size() {
            let env = recovery_env(&s, opts.commit_interval_ms, opts.data, clock.clone());
            opts.mode
                .recovery_for_image(&s, dev.as_ref())
                .recover(dev.as_ref(), &env)?
        } else {
            protocol::Recovered::none()
        };
        let (s, sb_block, sb_offset) = CoreImage::read_super(dev.as_ref())?;
        check_features(&s, &opts)?;
        if s.features.compat & feat::COMPAT_ORPHAN_FILE != 0
            && s.features.ro_compat & feat::RO_COMPAT_ORPHAN_PRESENT != 0
            && !opts.read_only
        {
            return Err(FsError::Unsupported(
                "orphan_file with orphans present (run e2fsck first)".into(),
            ));
        }
        // Group descriptors, verified.
        let image = CoreImage::load(dev.as_ref(), s, sb_block, sb_offset)?;
        let s = &image.sb;
        let (bs, csum) = (s.block_size(), s.has_metadata_csum());
        let env = ProtocolEnv {
            block_size: bs,
            block_count: s.blocks_count,
            uuid: s.uuid,
            journal_runs: Vec::new(),
            commit_interval_ms: opts.commit_interval_ms,
            flush_interval_ms: opts.flush_interval_ms,
            data_mode: opts.data,
            metadata_csum: csum,
            clock: clock.clone(),
            variant: opts.mode.variant(),
        };
        let proto = opts.mode.build(recovered, &env)?;
        let fsync_is_osync = opts.fsync == crate::types::FsyncMeaning::Osync;
        if fsync_is_osync
            && !proto
                .native_durability_calls()
                .contains(crate::protocol::DurabilityCalls::OSYNC)
        {
            return Err(FsError::Invalid(format!(
                "fsync=osync: mode={} has no osync of its own (its fsync already is the \
                 cheapest ordering point it offers)",
                opts.mode
            )));
        }
        let dir_names_bound = crate::dir::dir_names_bound(opts.cache_bytes);
        let core_opts = CoreOptions {
            cache_bytes: opts.cache_bytes,
            read_only: opts.read_only,
            clock,
            seed,
        };
        let mut core = Core::open(dev.clone(), image, core_opts, proto);
        core.dir_names_bound = dir_names_bound;
        // The root must be a directory.
        let root = core.read_inode(ROOT_INO)?;
        if !root.is_dir() {
            return Err(FsError::corrupt(
                core.inode_loc(ROOT_INO).0,
                "inode 2 i_mode",
                format!("root is not a directory ({:#o})", root.mode),
            ));
        }
        let journaled = opts.mode.caps().log_replay;
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            group: opts.mode.caps().group_commit.then(|| {
                let g = GroupCommits {
                    per_stream: opts.mode.caps().group_commit_per_stream,
                    ..GroupCommits::default()
                };
                (Mutex::new(g), Condvar::new())
            }),
            seq: Mutex::new(Sequencer {
                next_ticket: 0,
                now_serving: 0,
            }),
            turn: Condvar::new(),
            dev,
            stop: AtomicBool::new(false),
            streams: Mutex::new(Streams::default()),
            sched: opts
                .sched
                .or(opts.mode.caps().scheduler.then_some(ordo_dev::Policy::Sptf))
                .map(|p| Mutex::new(ordo_dev::Scheduler::new(ordo_dev::SchedConfig::new(p), bs))),
        });
        // As the kernel (`ext4_setup_super`): a mount clears the "cleanly
        // unmounted" bit only when no journal protects the image; under
        // a journal, `needs_recovery` says whether a crash left work, and a
        // recovered image is as valid as a cleanly unmounted one (e2fsck
        // then exits 0 after replaying it).
        // The stamp and state the image had before this mount (backlinks:
        // the owner table's trust, and whether the scanners must run).
        let (before, was_clean) = {
            let mut c = shared.lock();
            c.backlinks = opts.mode.caps().backlinks;
            let mnt = c.sb32(sb::MNT_COUNT)? & 0xffff;
            let mtime = c.sb32(sb::MTIME)?;
            let state = c.sb32(sb::STATE)? as u16;
            let was_clean = state & sb::STATE_VALID != 0;
            // Until the scanners have run (or the protocol says it trusts
            // them) the bitmaps are not checked against their checksums:
            // nothing ordered the two writes.
            c.scan_needed = c.backlinks && !was_clean && !opts.read_only;
            ((mnt, mtime), was_clean)
        };
        if !opts.read_only {
            shared.with_handle(OpKind::Internal, |c| {
                // The orphan list of an image the scanners will rebuild is
                // not followed: they reclaim what no name reaches.
                if !c.scan_needed {
                    c.process_orphans()?;
                }
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
                let now = c.now().sec as u32;
                c.set_sb(
                    sb::MTIME,
                    &now.to_le_bytes(),
                    crate::update::UpdateKind::Other,
                )?;
                Ok(())
            })?;
        }
        let (reserve_ids, write_chunk) = {
            let c = shared.lock();
            (
                crate::fs::ReserveIds::of(&c.sbi),
                crate::fs::write_chunk(c.cache.bound_bytes(), c.bs),
            )
        };
        let fs = Fs {
            shared,
            background: Mutex::new(None),
            read_only: opts.read_only,
            fsync_is_osync,
            reserve_ids,
            write_chunk,
        };
        if opts.mode.caps().backlinks && !opts.read_only {
            fs.attach_owner_table(before, was_clean)?;
        }
        if opts.background && !opts.read_only {
            let sh = fs.shared.clone();
            let tick = fs.shared.lock().proto.tick_interval_ms();
            let interval = tick
                .map_or(opts.commit_interval_ms, |t| t.min(opts.commit_interval_ms))
                .max(10);
            let rate = opts.scan_rate;
            // Inodes per batch: about ten batches a second when bounded.
            let batch = if rate == 0 {
                crate::scan::SCAN_BATCH
            } else {
                crate::scan::SCAN_BATCH.min(rate.div_ceil(10))
            };
            let h = std::thread::spawn(move || {
                // Backlinks after an unclean mount: the scanners run here,
                // in the background, a batch at a time (at most `rate`
                // inodes a second when bounded), so that reads go on
                // meanwhile and the first operation that allocates finds
                // them done, or finishes them itself.
                let mut scanning = true;
                let mut scan_wait = 0u64;
                let mut waited = 0u64;
                while !sh.stop.load(Ordering::Relaxed) {
                    if scanning && scan_wait == 0 {
                        scanning = sh.scan_batch(batch);
                        if scanning && rate > 0 {
                            scan_wait = (batch * 1000).div_ceil(rate);
                        }
                        if scanning && scan_wait == 0 {
                            // No bound: the next batch at once, after the
                            // threads waiting for the lock had a turn.
                            std::thread::yield_now();
                            continue;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    waited += 10;
                    scan_wait = scan_wait.saturating_sub(10);
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

    pub(crate) fn stop_background(&self) {
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
        // The image is marked clean below, and a clean image's bitmaps
        // are trusted: scanners still pending run first.
        self.scan_to_end()?;
        self.shared.with_handle(OpKind::Internal, |c| {
            c.update_sb_counters()?;
            let state = c.sb32(sb::STATE)? as u16;
            c.set_sb(
                sb::STATE,
                &(state | sb::STATE_VALID).to_le_bytes(),
                crate::update::UpdateKind::Other,
            )?;
            let now = c.now().sec as u32;
            c.set_sb(
                sb::WTIME,
                &now.to_le_bytes(),
                crate::update::UpdateKind::Other,
            )?;
            Ok(())
        })?;
        self.shared.write_back(WriteBackReason::Unmount)?;
        let dirty: Vec<String> = {
            let c = self.shared.lock();
            c.cache
                .dirty_blocks()
                .into_iter()
                .map(|b| format!("{b} ({})", c.cache.class_of(b).name()))
                .collect()
        };
        if !dirty.is_empty() {
            return Err(FsError::Invalid(format!(
                "{} dirty blocks left after the unmount write-back: {}",
                dirty.len(),
                dirty[..dirty.len().min(8)].join(", ")
            )));
        }
        self.shared.dev.flush()?;
        Ok(())
    }
}
