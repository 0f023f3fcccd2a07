//! Fast-commit replay: what mount does after a crash of `mode=fast_commit`
//! (or of a kernel mounted with `-o fast_commit`), after JBD2 recovery.
//!
//! # Order, and why
//!
//! 1. **Scan** the JBD2 log ([`crate::recovery::scan`]) to learn the tid
//!    after the last committed transaction, then scan the fast-commit area
//!    ([`ordo_format::fc::scan`]): only commits whose HEAD and TAILs name
//!    that tid and whose CRCs match count, up to the last valid TAIL. As in
//!    the kernel, a clean journal (`s_start == 0`) has no fast commits to
//!    replay: a fast commit is only ever written on top of a live log.
//! 2. **Replay JBD2** copies home (the plan of [`crate::recovery`]), flush.
//! 3. **Replay the tags** in log order onto the image, each idempotent
//!    because it stores a result, not an operation: INODE copies the logged
//!    inode over the one on disk (keeping the extent root, which ADD_RANGE
//!    and DEL_RANGE rebuild); ADD_RANGE makes a logical range map exactly
//!    the logged physical blocks; DEL_RANGE unmaps a range; LINK / CREAT
//!    add an entry unless it is there; UNLINK removes one if it is there.
//! 4. **Rebuild** the allocation state of the touched inodes: blocks they
//!    no longer map are freed, then (for all of them, after every free)
//!    blocks they map are marked used, as the kernel's
//!    `ext4_fc_set_bitmaps_and_counters` marks last; inodes with
//!    links are marked used and inodes left without any are freed; group
//!    and superblock counts and bitmap checksums follow. Steps 3 and 4 run
//!    in memory: nothing is written yet.
//!
//! # Through the core
//!
//! Steps 3 and 4 are ordo's core at work, not a replayer of their own: a
//! `Core` is opened over the image JBD2 recovery left, under a protocol
//! that writes nothing (`ReplayProtocol`), each tag in an internal handle
//! of its own and the rebuild in a last one. Inodes are read and written, blocks and inodes marked
//! in the bitmaps (with group counters and the unused-table mark),
//! extents mapped and unmapped, entries looked up, added and removed
//! (appending a directory block when every block is full, as
//! `ext4_add_entry` does), and checksums sealed when the handle ends, by
//! the code every mount runs. The blocks the core leaves dirty are the
//! result, which step 5 writes. What the replay adds to the core is only
//! the rules above: where a tag's result comes from, which blocks an
//! inode gave up, the link counts of directories recounted from their
//! entries. The core's allocations never take a block any ADD_RANGE of
//! the log claims (the protocol's reuse rule, as the kernel's
//! `fc_regions`), and the protocol notes each block the core gives an
//! inode (tree nodes, directory blocks) so that the rebuild frees it
//! again if the inode ends up not mapping it.
//! 5. **Write the result** through the journal: the changed blocks become
//!    JBD2 transaction `end_tid` (descriptors and copies after the live
//!    log, a flush, the commit block, a flush), then go home, flush. The
//!    blocks are encoded by [`ordo_format::jbd2::TransactionWriter`], the
//!    same encoder as the journal's own commits.
//! 6. Only then mark the journal empty and clear `needs_recovery` (by
//!    handing over to [`crate::protocol::jbd2::recover`], which finds a
//!    clean log).
//! 7. Zero the area's last block if another writer left something there:
//!    ordo never writes it, so that the kernel's and e2fsck's scan, which
//!    reads past the area when no block ends it first, stops there
//!    (docs/FORMAT.md, "The full area").
//!
//! # Why the result is journaled
//!
//! Replaying tags reads the image it changes (which entries exist, what an
//! inode maps, which blocks are free), so a replay that wrote home as it
//! went and crashed would run again over a mix of its own writes and the
//! blocks the JBD2 replay restores: an UNLINK finds its entry again while
//! the LINK before it finds its own, an old incarnation's blocks are
//! marked in use again by a restored bitmap while the inode that freed
//! them is already the new one. Writing the whole result as one JBD2
//! transaction makes it atomic. A crash before its commit block leaves
//! the home blocks as the previous attempt found them, and the replay runs
//! again from the same image to the same bytes. A crash after it leaves a
//! committed transaction `end_tid`: the next mount's JBD2 replay writes
//! the result home, and the fast commits, which name `end_tid`, are stale
//! (as in the kernel, a fast commit only applies on top of the last full
//! commit). The copies are the result, never the fast commits themselves,
//! so e2fsck and the kernel replay this transaction like any other. When
//! the free part of the log is too small (or the journal uses the v1
//! checksum), the result goes home directly; each tag is then replayed to
//! be as idempotent as it can be (an INODE judges a new incarnation by
//! type and generation, not by a link count a half-done replay lowered;
//! directories' link counts are recounted from their entries).
//!
//! Blocks the replay itself must allocate (extent-tree nodes, directory
//! blocks) are never taken from a range any ADD_RANGE of the log claims,
//! as the kernel's `fc_regions` ensures, nor from a block the same tag
//! freed (the core never hands out a block its own handle freed). They
//! are taken first-fit from the start of the goal's group, as the
//! kernel's replay allocator does, so that both recoveries place a new
//! tree node alike. For the same reason the replay shapes trees as the
//! kernel's does: a range tag frees the blocks it unmaps in the bitmap at
//! once (a later tag's tree node may take one), the removal an ADD_RANGE
//! starts with never lowers a tree's depth, and the insert ends with the
//! kernel's merge-up of a small only child into the inode; a DEL_RANGE
//! that leaves a small tree merges it up too.
//!
//! # Hashed (htree) directories
//!
//! A LINK, CREAT or UNLINK into a directory the kernel indexed does what
//! ordo's core does on a directory's first change: it drops the index
//! (through `Core::dir_linearize`, which, unlike the conversion on a
//! first change, also takes the leftovers below).
//! `EXT4_INDEX_FL` is cleared and the dx root and interior nodes are
//! rewritten as valid empty linear blocks (the root keeps "." and ".."),
//! with dirent tails; the leaves already are linear blocks. Entries are
//! then added and removed as in any linear directory. The result is valid
//! ext4 (the kernel may index the directory again), and it needs no hash:
//! inserting by hash would have to split full leaves and grow the index,
//! all of which a crash in the middle of replay could leave half done.
//!
//! Where the result goes home directly (see below), the conversion is
//! still idempotent whatever subset of its writes reached the disk before
//! a crash. Under `metadata_csum` no linear block has the
//! shape of a dx root or node (their records run to the block's end, where
//! a linear block has its checksum tail), so a directory whose flag is
//! already clear still has any such leftover block rewritten; a flag still
//! set over blocks already rewritten is simply cleared. Without
//! `metadata_csum` a dx block with the flag clear already is a valid
//! linear block, as the core relies on.
//!
//! An INODE tag never sets the index flag over the directory's blocks as
//! the replay left them: the kernel logs a directory's inode (with CREAT)
//! as it is in memory, indexed when it outgrew one block, while its
//! blocks are rebuilt by the replay (a fresh directory gets one linear
//! "." and ".." block) or were linearised by it. So a directory's INODE
//! keeps the index flag the inode has on disk, and a new incarnation of
//! the slot starts without it. (The kernel copies the flag, and its own
//! replay of such a log fails: Linux 6.18 refuses the mount, "Structure
//! needs cleaning", its JBD2 recovery failed.) For the same reason a
//! directory's `i_size` is set from the blocks it maps, before each entry
//! change (the core's view of a directory covers `i_size`) and once the
//! tags are replayed, as e2fsck requires.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{mpsc, Arc, Mutex};

use ordo_dev::{BlockClass, BlockDevice, Counters, Ticket, WriteFlags};
use ordo_format::dir as fdir;
use ordo_format::fc::{self, Tag};
use ordo_format::inode::mode as imode;
use ordo_format::Superblock;

use crate::clock::{Clock, SimClock};
use crate::dir::InodeTree;
use crate::error::{FsError, Result};
use crate::extent::{self, LBLK_END};
use crate::layout::{ino as io, le16, le32, put32};
use crate::mount::{CoreImage, CoreOptions};
use crate::protocol::{jbd2 as journal, Io, Protocol, ProtocolEnv, Recovered, WriteBackReason};
use crate::recovery::{self, JournalMap};
use crate::state::Core;
use crate::types::{FileType, Timespec};
use crate::update::{CounterKind, HandleInfo, Ino, InodeField, OpKind, Update, UpdateKind};

/// What the fast-commit area of an image holds (for `ordo info` and tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FcState {
    /// Blocks of the area.
    pub area_blocks: u32,
    /// The tid the log must name to be replayed.
    pub expected_tid: u32,
    /// What the scan found.
    pub scan: fc::Scan,
}

impl std::fmt::Display for FcState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Fast commit area:         {} blocks", self.area_blocks)?;
        writeln!(
            f,
            "Fast commits to replay:   {} ({} blocks, {} tags, on tid {})",
            self.scan.commits,
            self.scan.blocks,
            self.scan.tags.len(),
            self.expected_tid
        )?;
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &self.scan.tags {
            *counts.entry(t.name()).or_insert(0) += 1;
        }
        if !counts.is_empty() {
            let list: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
            writeln!(f, "Fast commit tags:         {}", list.join(", "))?;
        }
        writeln!(f, "Fast commit log end:      {:?}", self.scan.end)
    }
}

/// Read and scan the fast-commit area of the image on `dev` without
/// writing. `Ok(None)` when the image has no journal or no fast-commit area.
pub fn fc_state(dev: &dyn BlockDevice) -> Result<Option<FcState>> {
    let Some(runs) = recovery::locate_journal(dev)? else {
        return Ok(None);
    };
    let map = JournalMap::new(runs);
    let jscan = recovery::scan(dev, &map)?;
    let (sb, _) = read_super(dev)?;
    scan_area(dev, &map, &jscan, sb.inode_size() as usize)
}

fn read_super(dev: &dyn BlockDevice) -> Result<(Superblock, Vec<u8>)> {
    let bs = dev.block_size();
    let blk = recovery::super_block_nr(bs);
    let mut buf = vec![0u8; bs as usize];
    dev.read(blk, &mut buf, BlockClass::Super)?;
    let off = recovery::super_offset(bs);
    let s = Superblock::decode(&buf[off..off + 1024]).map_err(|e| FsError::from(e.at(blk)))?;
    Ok((s, buf))
}

/// The fast-commit area as the kernel and e2fsck use it: `(first journal
/// block, blocks)`. Both set `j_fc_first = j_last + 1` with `j_last` the
/// log's exclusive end, and stop before `j_fc_last = s_maxlen`, so the
/// first of the `s_num_fc_blks` blocks is never used: the area is
/// `log_end + 1 .. maxlen`.
pub fn fc_area(sb: &ordo_format::jbd2::JournalSuperblock) -> Option<(u32, u32)> {
    let n = sb.fast_commit_blocks();
    if n < 2 {
        return None;
    }
    Some((sb.log_end() + 1, n - 1))
}

fn scan_area(
    dev: &dyn BlockDevice,
    map: &JournalMap,
    jscan: &recovery::Scan,
    inode_size: usize,
) -> Result<Option<FcState>> {
    let Some((first, n)) = fc_area(&jscan.sb) else {
        return Ok(None);
    };
    let bs = dev.block_size() as usize;
    let mut blocks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let p = map.phys(first + i).ok_or_else(|| {
            FsError::corrupt(
                0,
                "journal inode extents",
                format!("fast-commit block {} is not mapped", first + i),
            )
        })?;
        let mut b = vec![0u8; bs];
        dev.read(p, &mut b, BlockClass::FastCommit)?;
        let empty = b[..4] == [0, 0, 0, 0];
        blocks.push(b);
        if empty {
            // A zero record header ends any scan; stop reading.
            break;
        }
    }
    let expected_tid = jscan.end_tid;
    let scan = fc::scan(
        blocks.iter().map(|b| b.as_slice()),
        expected_tid,
        inode_size,
    );
    Ok(Some(FcState {
        area_blocks: n,
        expected_tid,
        scan,
    }))
}

/// Mount-time recovery for `mode=fast_commit`: JBD2 replay, fast-commit
/// replay, then the journal hand-over of `mode=journal`.
pub fn recover(dev: &dyn BlockDevice, env: &ProtocolEnv) -> Result<Recovered> {
    let runs = match env.journal_runs.is_empty() {
        false => Some(env.journal_runs.clone()),
        true => recovery::locate_journal(dev)?,
    };
    let Some(runs) = runs else {
        return Err(FsError::Invalid(
            "mode=fast_commit needs an image with a journal (has_journal)".into(),
        ));
    };
    let map = JournalMap::new(runs);
    let jscan = recovery::scan(dev, &map)?;
    let (sup, _) = read_super(dev)?;
    let handoff = super::Handoff {
        uuid: sup.uuid,
        inode_size: sup.inode_size() as usize,
        first_ino: sup.first_ino(),
    };
    let mut lines = Vec::new();
    let mut replayed = 0;
    let mut written = 0;
    if jscan.sb.start != 0 {
        let (sb, _) = read_super(dev)?;
        if let Some(st) = scan_area(dev, &map, &jscan, sb.inode_size() as usize)? {
            if st.scan.commits > 0 {
                // JBD2 first: the tags apply on top of the recovered image.
                let (plan, _) = recovery::replay_plan(&jscan);
                let bs = dev.block_size() as usize;
                let mut buf = vec![0u8; bs];
                for b in &plan {
                    let p = map.phys(b.log_block).expect("scanned block is mapped");
                    dev.read(p, &mut buf, BlockClass::Journal)?;
                    if b.escaped {
                        ordo_format::jbd2::unescape(&mut buf);
                    }
                    dev.write(b.home, &buf, WriteFlags::new(BlockClass::Other))?;
                }
                dev.flush()?;
                let (stats, blocks) = replay_image(dev, &st.scan.tags, dtime_now(&*env.clock))?;
                // The result goes home through a JBD2 transaction of its
                // own when the log has room: see "Writing the result".
                let journaled = write_through_journal(dev, &map, &jscan, &blocks)?;
                if journaled.is_none() {
                    write_home(dev, &blocks)?;
                }
                if let Some(tid) = journaled {
                    lines.push(format!(
                        "fast commit: result written through JBD2 transaction {tid} ({} blocks)",
                        blocks.len()
                    ));
                }
                let end_tid = match journaled {
                    Some(tid) => tid.wrapping_add(1),
                    None => jscan.end_tid,
                };
                written += stats.blocks_written + plan.len() as u64;
                written += journaled.map_or(0, |tid| {
                    ordo_format::jbd2::TransactionWriter::new(&jscan.sb.format(), tid)
                        .log_blocks(blocks.len(), 0)
                });
                replayed += st.scan.commits as u64;
                lines.push(format!(
                    "fast commit: replayed {} commits ({} tags, {} inodes) on tid {}",
                    st.scan.commits,
                    st.scan.tags.len(),
                    stats.inodes,
                    st.expected_tid
                ));
                // The log is done with: mark it empty so the hand-over
                // below finds a clean journal (as e2fsck: the next id
                // after the log plus one).
                let mut jsb = jscan.sb.clone();
                jsb.start = 0;
                jsb.sequence = end_tid.wrapping_add(1);
                let p = map.phys(0).expect("journal block 0 is mapped");
                let mut jbuf = vec![0u8; bs];
                dev.read(p, &mut jbuf, BlockClass::Journal)?;
                jsb.encode_into(&mut jbuf);
                dev.write(p, &jbuf, WriteFlags::new(BlockClass::Journal))?;
                dev.flush()?;
                written += 1;
            } else {
                lines.push(format!(
                    "fast commit: nothing to replay ({:?})",
                    st.scan.end
                ));
            }
        }
    }
    let mut env = env.clone();
    env.journal_runs = map.runs().to_vec();
    let mut recovered = journal::recover(dev, &env)?;
    recovered.put(handoff);
    let report = &mut recovered.report;
    // The log is empty now, and every fast commit in the area stale.
    if clear_last_area_block(dev, &map, &jscan.sb)? {
        lines.push(
            "fast commit: cleared the area's last block (left by another writer)".to_string(),
        );
        written += 1;
    }
    report.lines.splice(0..0, lines);
    report.replayed += replayed;
    report.blocks_written += written;
    Ok(recovered)
}

/// Zero the fast-commit area's last block when it is not zero; whether
/// it wrote. ordo's writer never uses that block, so that a scan by the
/// kernel or e2fsck, which reads one block past the area when no block
/// ends the log before (docs/FORMAT.md, "The full area"), stops there.
/// That holds only if the block does end a scan, and another writer may
/// have left one that does not: the kernel uses it, and a commit it gave
/// up for want of room (a full commit instead) leaves blocks without a
/// TAIL up to the area's end. Cleared once at mount, after recovery, it
/// stays zero, whatever stale blocks precede it. The area is where the
/// fast-commit protocol will find it: the journal's fast-commit feature,
/// which mke2fs leaves clear, set.
fn clear_last_area_block(
    dev: &dyn BlockDevice,
    map: &JournalMap,
    jsb: &ordo_format::jbd2::JournalSuperblock,
) -> Result<bool> {
    let mut sb = jsb.clone();
    sb.feature_incompat |= ordo_format::jbd2::FEATURE_INCOMPAT_FAST_COMMIT;
    let Some((first, n)) = fc_area(&sb) else {
        return Ok(false);
    };
    let last = first + n - 1;
    if last >= sb.maxlen {
        return Ok(false);
    }
    let Some(p) = map.phys(last) else {
        return Ok(false);
    };
    let mut buf = vec![0u8; dev.block_size() as usize];
    dev.read(p, &mut buf, BlockClass::FastCommit)?;
    if buf.iter().all(|&b| b == 0) {
        return Ok(false);
    }
    buf.fill(0);
    dev.write(p, &buf, WriteFlags::new(BlockClass::FastCommit))?;
    dev.flush()?;
    Ok(true)
}

/// What [`replay_tags`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Inodes touched.
    pub inodes: u64,
    /// Blocks written.
    pub blocks_written: u64,
}

/// Apply fast-commit tags (already validated by a scan) to the image on
/// `dev`, rebuild the allocation state of what they touched, write and
/// flush. The journal is not touched.
/// Inodes the replay releases get `clock`'s time as `i_dtime`.
pub fn replay_tags(dev: &dyn BlockDevice, tags: &[Tag], clock: &dyn Clock) -> Result<ReplayStats> {
    let (stats, blocks) = replay_image(dev, tags, dtime_now(clock))?;
    write_home(dev, &blocks)?;
    Ok(stats)
}

/// Write replayed blocks home and flush.
fn write_home(dev: &dyn BlockDevice, blocks: &BTreeMap<u64, Vec<u8>>) -> Result<()> {
    for (b, data) in blocks {
        dev.write(*b, data, WriteFlags::new(BlockClass::Other))?;
    }
    dev.flush()?;
    Ok(())
}

/// Write the replayed blocks as JBD2 transaction `jscan.end_tid` after the
/// live log, commit it, then write them home and flush. Returns the tid,
/// or `None` (nothing written) when the log lacks the room or the journal
/// uses the v1 checksum, and the caller writes home directly.
fn write_through_journal(
    dev: &dyn BlockDevice,
    map: &JournalMap,
    jscan: &recovery::Scan,
    blocks: &BTreeMap<u64, Vec<u8>>,
) -> Result<Option<u32>> {
    use ordo_format::jbd2::{self, BodyBlock, TransactionWriter};
    let sb = &jscan.sb;
    let fmt = sb.format();
    if blocks.is_empty() || fmt.csum_v1() || sb.start == 0 {
        return Ok(None);
    }
    let (first, last) = (sb.first, sb.log_end());
    if first == 0 || last <= first || jscan.end_block < first || jscan.end_block >= last {
        return Ok(None);
    }
    let log_len = (last - first) as u64;
    let used = (jscan.end_block as u64 + log_len - sb.start as u64) % log_len;
    let tid = jscan.end_tid;
    let writer = TransactionWriter::new(&fmt, tid);
    let need = writer.log_blocks(blocks.len(), 0);
    // Keep one block free, so that the log never reaches its own start.
    if used + need + 1 > log_len {
        return Ok(None);
    }
    let mut at = jscan.end_block;
    let mut put = |img: &[u8], flags: WriteFlags| -> Result<()> {
        let p = map.phys(at).ok_or_else(|| {
            FsError::corrupt(
                0,
                "journal inode extents",
                format!("journal block {at} is not mapped"),
            )
        })?;
        dev.write(p, img, flags)?;
        at = jbd2::log_next(first, last, at);
        Ok(())
    };
    let copies: Vec<(u64, &[u8])> = blocks.iter().map(|(b, d)| (*b, d.as_slice())).collect();
    for block in writer.body(&copies, &[]) {
        let img = match &block {
            BodyBlock::Encoded(b) | BodyBlock::Escaped(_, b) => b.as_slice(),
            BodyBlock::Copy(i) => copies[*i].1,
        };
        put(img, WriteFlags::new(BlockClass::Journal))?;
    }
    dev.flush()?;
    // A commit time that does not depend on when the replay ran, so that
    // a replay run twice writes the same bytes.
    let sec = jscan.transactions.last().map_or(0, |t| t.commit_sec);
    put(&writer.commit(sec, 0), WriteFlags::new(BlockClass::Journal))?;
    dev.flush()?;
    write_home(dev, blocks)?;
    Ok(Some(tid))
}

/// Apply fast-commit tags to the image on `dev` through ordo's core and
/// rebuild the allocation state of what they touched, in memory: returns
/// the blocks to write (nothing is written).
fn replay_image(
    dev: &dyn BlockDevice,
    tags: &[Tag],
    dtime_sec: u32,
) -> Result<(ReplayStats, BTreeMap<u64, Vec<u8>>)> {
    let claimed = tags
        .iter()
        .filter_map(|t| match t {
            Tag::AddRange { pblk, len, .. } => Some((*pblk, *pblk + *len as u64)),
            _ => None,
        })
        .collect();
    let (sb, sb_block, sb_offset) = CoreImage::read_super(dev)?;
    let image = CoreImage::load(dev, sb, sb_block, sb_offset)?;
    let allocated = Arc::new(Mutex::new(Vec::new()));
    let proto = Box::new(ReplayProtocol {
        claimed,
        allocated: allocated.clone(),
    });
    with_shared_reads(dev, |reads| {
        let opts = CoreOptions {
            // Nothing is evicted: every dirty block is the result.
            cache_bytes: u64::MAX / 4,
            read_only: false,
            // The core stamps no time here; dtime comes from the caller.
            clock: Arc::new(SimClock::fixed(Timespec {
                sec: dtime_sec as i64,
                nsec: 0,
            })),
            seed: 0,
        };
        let mut r = Replay {
            core: Core::open(reads, image, opts, proto),
            dtime_sec,
            allocated,
            touched: BTreeMap::new(),
            linear: BTreeSet::new(),
            subdir_parents: BTreeSet::new(),
        };
        r.core.alloc_from_group_start = true;
        // One internal handle per tag, and one for the rebuild: a block a
        // tag freed (a tree node) may be allocated again by a later one,
        // as in the kernel's replay.
        for t in tags {
            r.core.begin(OpKind::Internal, 0);
            r.apply(t)?;
            r.core.end()?;
        }
        r.core.begin(OpKind::Internal, 0);
        r.rebuild()?;
        r.core.end()?;
        let mut blocks = BTreeMap::new();
        for b in r.core.cache.dirty_blocks() {
            let img = r.core.cache.snapshot(b).expect("a dirty block is cached");
            blocks.insert(b, img.to_vec());
        }
        let stats = ReplayStats {
            inodes: r.touched.len() as u64,
            blocks_written: blocks.len() as u64,
        };
        Ok((stats, blocks))
    })
}

/// Run `f` with a device that reads `dev`: the core owns its device as an
/// `Arc`, which a borrowed one cannot be, so a scoped thread holds the
/// borrow and serves the core's reads. The replay never writes through
/// it.
fn with_shared_reads<T>(
    dev: &dyn BlockDevice,
    f: impl FnOnce(Arc<dyn BlockDevice>) -> Result<T>,
) -> Result<T> {
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel::<ReadRequest>();
        s.spawn(move || {
            for (block, len, class, reply) in rx {
                let mut buf = vec![0u8; len];
                let r = dev.read(block, &mut buf, class).map(|()| buf);
                let _ = reply.send(r);
            }
        });
        let reads: Arc<dyn BlockDevice> = Arc::new(SharedReads {
            block_size: dev.block_size(),
            block_count: dev.block_count(),
            tx: Mutex::new(tx),
        });
        // The core and every handle on `reads` are gone when `f` returns,
        // which ends the reading thread.
        f(reads)
    })
}

type ReadRequest = (
    u64,
    usize,
    BlockClass,
    mpsc::Sender<std::io::Result<Vec<u8>>>,
);

/// See [`with_shared_reads`].
struct SharedReads {
    block_size: u32,
    block_count: u64,
    tx: Mutex<mpsc::Sender<ReadRequest>>,
}

impl BlockDevice for SharedReads {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn block_count(&self) -> u64 {
        self.block_count
    }
    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> std::io::Result<()> {
        let gone = || std::io::Error::other("fast-commit replay: reader gone");
        let (reply, answer) = mpsc::channel();
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send((block, buf.len(), class, reply))
            .map_err(|_| gone())?;
        let data = answer.recv().map_err(|_| gone())??;
        buf.copy_from_slice(&data);
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8], _: WriteFlags) -> std::io::Result<Ticket> {
        Err(std::io::Error::other(
            "fast-commit replay: the core's result is collected, not written",
        ))
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn durable(&self) -> Ticket {
        0
    }
    fn counters(&self) -> Counters {
        Counters::default()
    }
}

/// The protocol the core runs under while it replays tags: it writes
/// nothing (the changed blocks stay dirty in the cache and are the
/// result, written by [`write_through_journal`] or [`write_home`]), keeps
/// the blocks the log maps to files from the core's allocations (as the
/// kernel's `fc_regions`), and notes each block the core gives an inode
/// (tree nodes, directory blocks), which the rebuild frees again if the
/// inode no longer maps it.
struct ReplayProtocol {
    claimed: Vec<(u64, u64)>,
    allocated: Arc<Mutex<Vec<(u64, Ino)>>>,
}

impl Protocol for ReplayProtocol {
    fn name(&self) -> &'static str {
        "fast_commit replay"
    }
    fn on_update(&mut self, u: &Update, _h: &HandleInfo) {
        if let UpdateKind::ExtentBlockInit { ino } | UpdateKind::DirBlockInit { dir: ino } = &u.kind
        {
            self.allocated
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((u.block, *ino));
        }
    }
    fn can_allocate(&self, block: u64) -> bool {
        !self.claimed.iter().any(|&(s, e)| block >= s && block < e)
    }
    fn fsync(&mut self, _ino: Ino, _datasync: bool, _io: &mut Io) -> Result<()> {
        Ok(())
    }
    fn sync(&mut self, _io: &mut Io) -> Result<()> {
        Ok(())
    }
    fn write_back(&mut self, _reason: WriteBackReason, _io: &mut Io) -> Result<()> {
        Ok(())
    }
}

/// Per-inode replay state.
#[derive(Clone, Debug, Default)]
struct Touched {
    /// Blocks (data and tree) the inode owned before the replay, and the
    /// blocks the replay gave it since. Those it does not map at the end
    /// are freed: a node the replay allocated is dropped with the whole
    /// tree, without [`extent`] freeing it, when the inode loses its last
    /// link or an INODE record of a new incarnation resets the extent
    /// root.
    initial: BTreeSet<u64>,
    /// The inode was an in-use directory before the replay (for
    /// `bg_used_dirs_count`).
    was_used_dir: bool,
}

/// The `i_dtime` a replay stamps on the inodes it releases: one reading
/// of the mount's clock for the whole replay (never 0, which means "in
/// use").
fn dtime_now(clock: &dyn Clock) -> u32 {
    clock.now().sec.max(1) as u32
}

/// A replay in progress: the core, inside one handle, and what the tags
/// touched.
struct Replay {
    core: Core,
    /// `i_dtime` for inodes the replay releases ([`dtime_now`]).
    dtime_sec: u32,
    /// Blocks the core gave an inode ([`ReplayProtocol`]).
    allocated: Arc<Mutex<Vec<(u64, Ino)>>>,
    touched: BTreeMap<Ino, Touched>,
    /// Directories known to be linear (no index flag, no dx block) in
    /// this replay.
    linear: BTreeSet<Ino>,
    /// Directories that gained or lost a subdirectory entry: their link
    /// count is recounted from their entries at the end.
    subdir_parents: BTreeSet<Ino>,
}

fn is_dir_mode(raw: &[u8]) -> bool {
    le16(raw, io::MODE) & imode::S_IFMT == imode::S_IFDIR
}

impl Replay {
    fn raw(&mut self, ino: Ino) -> Result<Vec<u8>> {
        if ino == 0 || ino > self.core.sbi.inodes_count {
            return Err(FsError::corrupt(
                0,
                "fast commit inode number",
                format!("{ino}"),
            ));
        }
        self.core.inode_raw(ino)
    }

    /// Remember what `ino` owned before its first change.
    fn touch(&mut self, ino: Ino) -> Result<()> {
        if self.touched.contains_key(&ino) {
            return Ok(());
        }
        let raw = self.raw(ino)?;
        let initial = self.owned_blocks(ino, &raw).unwrap_or_default();
        let was_used_dir = self.core.inode_in_use(ino)? && is_dir_mode(&raw);
        self.touched.insert(
            ino,
            Touched {
                initial,
                was_used_dir,
            },
        );
        Ok(())
    }

    /// Data and tree blocks of an extent-mapped inode.
    fn owned_blocks(&mut self, ino: Ino, raw: &[u8]) -> Result<BTreeSet<u64>> {
        let mut set = BTreeSet::new();
        if le32(raw, io::FLAGS) & io::FL_EXTENTS == 0 || le16(raw, io::LINKS) == 0 {
            return Ok(set);
        }
        let mut t = self.core.tree(ino)?;
        let summary = extent::check(&mut t)?;
        set.extend(summary.tree_blocks.iter().copied());
        for m in extent::extents(&mut t, 0..LBLK_END)? {
            set.extend(m.pblk..m.pblk + m.len as u64);
        }
        Ok(set)
    }

    // ----- tags -----

    fn apply(&mut self, t: &Tag) -> Result<()> {
        match t {
            Tag::Inode { ino, raw } => self.replay_inode(*ino, raw),
            Tag::AddRange {
                ino,
                lblk,
                pblk,
                len,
                unwritten,
            } => {
                self.touch(*ino)?;
                // As the kernel's replay shapes the tree: the old mapping
                // removed without lowering the depth, the merge-up after
                // the insert.
                let unmapped = self.with_tree(*ino, |t| {
                    let unmapped = extent::remove_range_keeping_depth(t, *lblk, *len as u64)?;
                    extent::insert(t, *lblk, *pblk, *len, *unwritten)?;
                    extent::collapse_root(t)?;
                    Ok(unmapped)
                })?;
                self.free_unmapped(&unmapped)
            }
            Tag::DelRange { ino, lblk, len } => {
                self.touch(*ino)?;
                // A removal may lower the depth here: the kernel's replay
                // of a DEL_RANGE that leaves a small tree ends with it in
                // the inode (`mix` seed 3038).
                let unmapped =
                    self.with_tree(*ino, |t| extent::remove_range(t, *lblk, *len as u64))?;
                self.free_unmapped(&unmapped)
            }
            Tag::Creat(d) => {
                self.touch(d.ino)?;
                let raw = self.raw(d.ino)?;
                if is_dir_mode(&raw) && self.dir_blocks(d.ino)?.is_empty() {
                    // Directories are not logged block by block: one
                    // created by the log gets its "." and ".." block.
                    self.core.dir_make_first_block(d.ino, d.parent)?;
                }
                self.link(d.parent, d.ino, &d.name, true)
            }
            Tag::Link(d) => self.link(d.parent, d.ino, &d.name, false),
            Tag::Unlink(d) => self.unlink(d.parent, d.ino, &d.name),
            Tag::Head { .. } | Tag::Tail { .. } | Tag::Pad { .. } => Ok(()),
        }
    }

    fn replay_inode(&mut self, ino: Ino, logged: &[u8]) -> Result<()> {
        self.touch(ino)?;
        let mut raw = self.raw(ino)?;
        // A new incarnation of the slot (it held another file type or
        // generation, or nothing): whatever it mapped belongs to the old
        // one. A link count of 0 alone does not say so: a replay
        // interrupted by a crash and run again can drop the same
        // incarnation's count to 0 on the way (an UNLINK replayed twice
        // where its LINK was already there) before the INODE restores it.
        let fresh = le16(&raw, io::MODE) == 0
            || le16(&raw, io::MODE) & imode::S_IFMT != le16(logged, io::MODE) & imode::S_IFMT
            || le32(&raw, io::GENERATION) != le32(logged, io::GENERATION);
        // The index flag a directory has on disk (none for a new
        // incarnation, whose blocks the replay builds linear).
        let disk_index = if fresh {
            0
        } else {
            le32(&raw, io::FLAGS) & io::FL_INDEX
        };
        let n = logged.len().min(raw.len());
        raw[..io::BLOCK].copy_from_slice(&logged[..io::BLOCK]);
        raw[io::GENERATION..n].copy_from_slice(&logged[io::GENERATION..n]);
        if is_dir_mode(logged) {
            let fl = (le32(&raw, io::FLAGS) & !io::FL_INDEX) | disk_index;
            put32(&mut raw, io::FLAGS, fl);
        }
        if le32(&raw, io::FLAGS) & io::FL_EXTENTS != 0 {
            if fresh
                || ordo_format::extent::ExtentNode::decode_root(&raw[io::BLOCK..io::GENERATION])
                    .is_err()
            {
                raw[io::BLOCK..io::GENERATION].copy_from_slice(&extent::empty_root());
            }
        } else {
            // Fast symlinks, devices, inline data: i_block is the content.
            raw[io::BLOCK..io::GENERATION].copy_from_slice(&logged[io::BLOCK..io::GENERATION]);
        }
        self.core.set_inode_bytes(ino, 0, &raw, InodeField::Whole);
        // The inode is the log's now, checksummed when the handle ends.
        self.core.inode_csum_bad.remove(&ino);
        self.core.dirs.remove(&ino);
        Ok(())
    }

    /// Run `f` on `ino`'s extent tree (given an empty one if it has none:
    /// a range on an inode whose INODE tag comes later in the log).
    fn with_tree<T>(
        &mut self,
        ino: Ino,
        f: impl FnOnce(&mut InodeTree<'_>) -> Result<T>,
    ) -> Result<T> {
        let raw = self.raw(ino)?;
        let fl = le32(&raw, io::FLAGS);
        if fl & io::FL_EXTENTS == 0 {
            let c = &mut self.core;
            c.set_inode_bytes(
                ino,
                io::FLAGS,
                &(fl | io::FL_EXTENTS).to_le_bytes(),
                InodeField::Flags,
            );
            c.set_inode_bytes(ino, io::BLOCK, &extent::empty_root(), InodeField::Blocks);
        }
        let out = f(&mut self.core.tree(ino)?)?;
        self.core.dirs.remove(&ino);
        Ok(out)
    }

    /// The (logical, physical) blocks of a directory.
    fn dir_blocks(&mut self, dir: Ino) -> Result<Vec<(u32, u64)>> {
        let raw = self.raw(dir)?;
        if le32(&raw, io::FLAGS) & io::FL_EXTENTS == 0 {
            return Err(FsError::Unsupported(format!(
                "fast-commit replay into directory {dir} without extents"
            )));
        }
        let mut out = Vec::new();
        for m in extent::extents(&mut self.core.tree(dir)?, 0..LBLK_END)? {
            for i in 0..m.len {
                out.push((m.lblk + i, m.pblk + i as u64));
            }
        }
        Ok(out)
    }

    /// Set a directory's `i_size` to the blocks it maps (an INODE tag may
    /// carry the size of blocks the replay rebuilt differently), so that
    /// the core's view of it covers every block.
    fn size_dir(&mut self, dir: Ino) -> Result<()> {
        let bs = self.core.bs as u64;
        let Some(end) = self
            .dir_blocks(dir)?
            .iter()
            .map(|&(l, _)| l as u64 + 1)
            .max()
        else {
            return Ok(());
        };
        let raw = self.raw(dir)?;
        let size = le32(&raw, io::SIZE_LO) as u64 | (le32(&raw, io::SIZE_HI) as u64) << 32;
        if size != end * bs {
            self.core.set_size(dir, end * bs);
            self.core.dirs.remove(&dir);
        }
        Ok(())
    }

    /// Make `dir` a linear directory before its entries change (see the
    /// module header), from whatever a crashed replay that wrote home
    /// directly left ([`Core::dir_linearize`]).
    fn ensure_linear(&mut self, dir: Ino) -> Result<()> {
        if self.linear.contains(&dir) {
            return Ok(());
        }
        if le32(&self.raw(dir)?, io::FLAGS) & io::FL_INDEX != 0 {
            self.touch(dir)?;
        }
        self.core.dir_linearize(dir)?;
        self.linear.insert(dir);
        Ok(())
    }

    /// Ready `dir` for an entry change: linear, sized to its blocks. The
    /// core keeps the bitmaps, `i_blocks` and `i_size` of a block it
    /// appends to the directory.
    fn prepare_dir(&mut self, dir: Ino) -> Result<()> {
        self.ensure_linear(dir)?;
        self.size_dir(dir)
    }

    fn link(&mut self, dir: Ino, ino: Ino, name: &[u8], created: bool) -> Result<()> {
        self.prepare_dir(dir)?;
        self.note_subdir_parent(dir, ino)?;
        if self.core.dir_lookup(dir, name)?.is_some() {
            return Ok(());
        }
        self.touch(ino)?;
        let child = self.raw(ino)?;
        let kind = FileType::from_mode(le16(&child, io::MODE)).unwrap_or(FileType::Regular);
        self.core.dir_add(dir, name, ino, kind)?;
        if created && is_dir_mode(&child) {
            self.adjust_links(dir, 1)?;
        }
        if !created {
            self.adjust_links(ino, 1)?;
        }
        Ok(())
    }

    fn unlink(&mut self, dir: Ino, ino: Ino, name: &[u8]) -> Result<()> {
        self.prepare_dir(dir)?;
        self.note_subdir_parent(dir, ino)?;
        let Some(slot) = self.core.dir_lookup(dir, name)? else {
            return Ok(());
        };
        if slot.ino != ino {
            let b = self.core.dir_index(dir)?.pblks[slot.lblk as usize];
            return Err(FsError::corrupt(
                b,
                "fast commit UNLINK",
                format!("entry names inode {}, the log says {ino}", slot.ino),
            ));
        }
        self.core.dir_remove(dir, name)?;
        self.touch(ino)?;
        let before = self.raw(ino)?;
        if is_dir_mode(&before) {
            self.adjust_links(dir, -1)?;
            self.adjust_links(ino, -2)?;
        } else {
            self.adjust_links(ino, -1)?;
        }
        if le16(&self.raw(ino)?, io::LINKS) == 0 {
            // The kernel's replay evicts an inode its UNLINK leaves
            // without links, and so frees its blocks at once: a later
            // tag's tree node may take one (`mix` seed 1535 recorded
            // through FUSE). The rebuild settles the rest.
            let owned = self.owned_blocks(ino, &before)?;
            let runs: Vec<(u64, u32)> = runs(owned.iter())
                .into_iter()
                .map(|(first, len)| (first, len as u32))
                .collect();
            self.free_unmapped(&runs)?;
        }
        Ok(())
    }

    /// Remember `dir` when `child` is a directory (see [`Self::recount_subdirs`]).
    fn note_subdir_parent(&mut self, dir: Ino, child: Ino) -> Result<()> {
        if is_dir_mode(&self.raw(child)?) {
            self.subdir_parents.insert(dir);
        }
        Ok(())
    }

    /// Set the link count of each directory that gained or lost a
    /// subdirectory to what its entries say (2 + subdirectories; 1 past
    /// the `dir_nlink` limit). Adding and subtracting as tags go is not
    /// idempotent: a replay run again after a crash finds some entries in
    /// place (and skips them) whose parent's count never reached the disk.
    fn recount_subdirs(&mut self) -> Result<()> {
        let parents: Vec<Ino> = self.subdir_parents.iter().copied().collect();
        let filetype = self.core.sbi.has_filetype();
        for dir in parents {
            let raw = self.raw(dir)?;
            if le16(&raw, io::LINKS) == 0 || !is_dir_mode(&raw) {
                continue;
            }
            self.size_dir(dir)?;
            let children: Vec<(Ino, u8)> = self
                .core
                .dir_index(dir)?
                .names
                .iter()
                .filter(|(name, _)| name.as_slice() != b"." && name.as_slice() != b"..")
                .map(|(_, s)| (s.ino, s.ft))
                .collect();
            let mut subdirs: u32 = 0;
            for (child, ft) in children {
                let is_dir = if filetype {
                    ft == fdir::ft::DIR
                } else {
                    is_dir_mode(&self.raw(child)?)
                };
                subdirs += is_dir as u32;
            }
            let links = match 2 + subdirs {
                n if n >= 65000 => 1,
                n => n as u16,
            };
            if le16(&raw, io::LINKS) != links {
                self.touch(dir)?;
                self.core.set_links(dir, links);
            }
        }
        Ok(())
    }

    fn adjust_links(&mut self, ino: Ino, delta: i32) -> Result<()> {
        let n = le16(&self.raw(ino)?, io::LINKS) as i32;
        self.core.set_links(ino, (n + delta).clamp(0, 65000) as u16);
        Ok(())
    }

    /// Free in the bitmap, now, the blocks a range tag unmapped (or an
    /// UNLINK left to no one), as the kernel's replay does
    /// (`ext4_mb_mark_bb` in its ADD_RANGE and DEL_RANGE replay, the
    /// eviction after its UNLINK): a tree node a later tag needs may then take one,
    /// first-fit, as it does in the kernel's (a block some ADD_RANGE of the
    /// log claims stays out of reach, [`ReplayProtocol::can_allocate`]).
    /// The rebuild marks again whatever a touched inode still maps.
    /// Without this the two recoveries placed such a node apart (`mix`
    /// seed 1082 recorded through FUSE).
    fn free_unmapped(&mut self, unmapped: &[(u64, u32)]) -> Result<()> {
        if skip_frees() {
            return Ok(());
        }
        for &(first, len) in unmapped {
            self.core.set_blocks_in_use(first, u64::from(len), false)?;
        }
        Ok(())
    }

    // ----- rebuild -----

    /// Bring the bitmaps, counts and `i_blocks` of the touched inodes in
    /// line with what they map now. Blocks are freed for every inode
    /// before any is marked used: a block one inode gave up (a tree node
    /// [`extent`] freed while the tags ran, a range it no longer maps) may
    /// be what another inode maps now, and marking it first then freeing
    /// it would leave a block in use free in the bitmap.
    fn rebuild(&mut self) -> Result<()> {
        self.recount_subdirs()?;
        let given = std::mem::take(&mut *self.allocated.lock().unwrap_or_else(|e| e.into_inner()));
        for (b, ino) in given {
            if let Some(t) = self.touched.get_mut(&ino) {
                t.initial.insert(b);
            }
        }
        let touched: Vec<(Ino, Touched)> =
            self.touched.iter().map(|(k, v)| (*k, v.clone())).collect();
        let mut finals = Vec::with_capacity(touched.len());
        let skip_frees = skip_frees();
        for (ino, t) in touched {
            let raw = self.raw(ino)?;
            let fin = if le16(&raw, io::LINKS) > 0 {
                self.owned_blocks(ino, &raw)?
            } else {
                BTreeSet::new()
            };
            if !skip_frees {
                for (first, len) in runs(t.initial.difference(&fin)) {
                    self.core.set_blocks_in_use(first, len, false)?;
                }
            }
            finals.push((ino, t, fin));
        }
        let bs = self.core.bs as u64;
        for (ino, t, fin) in finals {
            let raw = self.raw(ino)?;
            let now_used = le16(&raw, io::LINKS) > 0;
            let is_dir = is_dir_mode(&raw);
            if is_dir && now_used && le32(&raw, io::FLAGS) & io::FL_EXTENTS != 0 {
                // A directory's size is its blocks.
                self.size_dir(ino)?;
            }
            for (first, len) in runs(fin.iter()) {
                self.core.set_blocks_in_use(first, len, true)?;
            }
            self.core.set_inode_in_use(ino, now_used)?;
            let now_used_dir = is_dir && now_used;
            if t.was_used_dir != now_used_dir {
                let g = (ino - 1) / self.core.sbi.inodes_per_group;
                let delta = if now_used_dir { 1 } else { -1 };
                self.core
                    .add_group_counter(g, CounterKind::UsedDirs, delta)?;
            }
            if now_used {
                // i_blocks from what the tree maps now, and the attribute
                // block the inode shares or owns.
                let acl = le32(&raw, io::FILE_ACL_LO) != 0 || le16(&raw, io::FILE_ACL_HI) != 0;
                let sectors = (fin.len() as u64 + u64::from(acl)) * (bs / 512);
                let c = &mut self.core;
                c.set_inode_bytes(
                    ino,
                    io::BLOCKS_LO,
                    &(sectors as u32).to_le_bytes(),
                    InodeField::BlockCount,
                );
                c.set_inode_bytes(
                    ino,
                    io::BLOCKS_HI,
                    &((sectors >> 32) as u16).to_le_bytes(),
                    InodeField::BlockCount,
                );
                if le32(&raw, io::DTIME) != 0 {
                    c.set_dtime(ino, 0, InodeField::Dtime);
                }
            } else if le32(&raw, io::DTIME) == 0 && le16(&raw, io::MODE) != 0 {
                self.core.set_dtime(ino, self.dtime_sec, InodeField::Dtime);
            }
        }
        self.core.update_sb_counters()
    }
}

/// Test-only: a replay that never frees what the log unmapped, neither
/// as a tag unmaps it nor in the rebuild (`ORDO_FAULT=fc_replay_skip_frees`);
/// the explorer's kernel judge must catch it (ordo-crash `judge_fault.rs`).
fn skip_frees() -> bool {
    std::env::var("ORDO_FAULT").as_deref() == Ok("fc_replay_skip_frees")
}

/// Runs of consecutive block numbers, from blocks in increasing order.
fn runs<'a>(blocks: impl Iterator<Item = &'a u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some((first, len)) if *first + *len == b => *len += 1,
            _ => out.push((b, 1)),
        }
    }
    out
}
