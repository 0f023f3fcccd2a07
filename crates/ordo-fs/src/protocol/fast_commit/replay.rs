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
//! as the kernel's `fc_regions` ensures.
//!
//! # Hashed (htree) directories
//!
//! A LINK, CREAT or UNLINK into a directory the kernel indexed does what
//! ordo's core does on a directory's first change: it drops the index.
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
//! directory's `i_size` is set from the blocks it maps once the tags are
//! replayed, as e2fsck requires.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ordo_dev::{BlockClass, BlockDevice, WriteFlags};
use ordo_format::fc::{self, Tag};
use ordo_format::group::{self, GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use ordo_format::inode::{flags as iflags, mode as imode, off as ioff};
use ordo_format::{bitmap, dir as fdir, Superblock};

use crate::clock::Clock;
use crate::error::{FsError, Result};
use crate::extent::{self, ExtentStore, LBLK_END, ROOT_SIZE_BYTES};
use crate::protocol::{jbd2 as journal, ProtocolEnv, Recovered};
use crate::recovery::{self, JournalMap};
use crate::update::{Ino, UpdateKind};

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

/// Apply fast-commit tags to the image on `dev` and rebuild the
/// allocation state of what they touched, in memory: returns the blocks
/// to write (nothing is written).
fn replay_image(
    dev: &dyn BlockDevice,
    tags: &[Tag],
    dtime_sec: u32,
) -> Result<(ReplayStats, BTreeMap<u64, Vec<u8>>)> {
    let mut img = Img::open(dev, dtime_sec)?;
    for t in tags {
        if let Tag::AddRange {
            pblk, len, ino: _, ..
        } = t
        {
            img.claimed.push((*pblk, *pblk + *len as u64));
        }
    }
    for t in tags {
        img.apply(t)?;
    }
    img.rebuild()?;
    let stats = ReplayStats {
        inodes: img.touched.len() as u64,
        blocks_written: img.dirty.len() as u64,
    };
    Ok((stats, img.into_dirty()))
}

/// Per-inode replay state.
#[derive(Clone, Debug, Default)]
struct Touched {
    /// Blocks (data and tree) the inode owned before the replay, and the
    /// tree nodes the replay gave it since. Those it does not map at the
    /// end are freed: a node the replay allocated is dropped with the
    /// whole tree, without [`extent`] freeing it, when the inode loses
    /// its last link or an INODE record of a new incarnation resets the
    /// extent root.
    initial: BTreeSet<u64>,
    /// Created by a CREAT of this log.
    created: bool,
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

/// The image being replayed: a write-back cache of blocks over the device.
struct Img<'a> {
    dev: &'a dyn BlockDevice,
    /// `i_dtime` for inodes the replay releases ([`dtime_now`]).
    dtime_sec: u32,
    sb: Superblock,
    sb_block: u64,
    sb_off: usize,
    bs: usize,
    isz: usize,
    csum: bool,
    seed: u32,
    groups: Vec<GroupDesc>,
    gd_dirty: BTreeSet<u32>,
    cache: HashMap<u64, Vec<u8>>,
    dirty: BTreeSet<u64>,
    claimed: Vec<(u64, u64)>,
    touched: BTreeMap<Ino, Touched>,
    /// Directories known to be linear (no index flag, no dx block) in
    /// this replay.
    linear: BTreeSet<Ino>,
    /// Directories that gained or lost a subdirectory entry: their link
    /// count is recounted from their entries at the end.
    subdir_parents: BTreeSet<Ino>,
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

fn i_size(raw: &[u8]) -> u64 {
    le32(raw, ioff::SIZE_LO) as u64 | (le32(raw, ioff::SIZE_HIGH) as u64) << 32
}
fn set_i_size(raw: &mut [u8], v: u64) {
    put32(raw, ioff::SIZE_LO, v as u32);
    put32(raw, ioff::SIZE_HIGH, (v >> 32) as u32);
}

impl<'a> Img<'a> {
    fn open(dev: &'a dyn BlockDevice, dtime_sec: u32) -> Result<Self> {
        let (sb, _) = read_super(dev)?;
        let bs = sb.block_size() as usize;
        if bs != dev.block_size() as usize {
            return Err(FsError::Invalid(
                "device and file-system block sizes differ".into(),
            ));
        }
        let ds = sb.desc_size();
        let per = bs / ds as usize;
        let gdt = sb.gdt_first_block(0);
        let mut groups = Vec::new();
        let mut buf = vec![0u8; bs];
        for g in 0..sb.groups_count() {
            let blk = gdt + g / per as u64;
            if g % per as u64 == 0 {
                dev.read(blk, &mut buf, BlockClass::GroupMeta)?;
            }
            let o = (g as usize % per) * ds as usize;
            groups.push(GroupDesc::decode(&buf[o..o + ds as usize], ds).map_err(|e| e.at(blk))?);
        }
        Ok(Img {
            dev,
            dtime_sec,
            sb_block: recovery::super_block_nr(bs as u32),
            sb_off: recovery::super_offset(bs as u32),
            isz: sb.inode_size() as usize,
            csum: sb.has_metadata_csum(),
            seed: sb.csum_seed(),
            bs,
            sb,
            groups,
            gd_dirty: BTreeSet::new(),
            cache: HashMap::new(),
            dirty: BTreeSet::new(),
            claimed: Vec::new(),
            touched: BTreeMap::new(),
            linear: BTreeSet::new(),
            subdir_parents: BTreeSet::new(),
        })
    }

    fn block(&mut self, b: u64) -> Result<&mut Vec<u8>> {
        if b >= self.sb.blocks_count {
            return Err(FsError::corrupt(
                b,
                "fast commit replay",
                "block past the end",
            ));
        }
        if !self.cache.contains_key(&b) {
            let mut buf = vec![0u8; self.bs];
            self.dev.read(b, &mut buf, BlockClass::Other)?;
            self.cache.insert(b, buf);
        }
        Ok(self.cache.get_mut(&b).expect("cached"))
    }

    fn write_block(&mut self, b: u64, data: Vec<u8>) {
        self.cache.insert(b, data);
        self.dirty.insert(b);
    }

    fn inode_loc(&self, ino: Ino) -> Result<(u64, usize)> {
        if ino == 0 || ino > self.sb.inodes_count {
            return Err(FsError::corrupt(
                0,
                "fast commit inode number",
                format!("{ino}"),
            ));
        }
        let g = self.sb.group_of_inode(ino) as usize;
        Ok(self.sb.inode_location(self.groups[g].inode_table, ino))
    }

    fn read_inode(&mut self, ino: Ino) -> Result<Vec<u8>> {
        let (b, o) = self.inode_loc(ino)?;
        let isz = self.isz;
        Ok(self.block(b)?[o..o + isz].to_vec())
    }

    fn write_inode(&mut self, ino: Ino, mut raw: Vec<u8>) -> Result<()> {
        if self.csum {
            ordo_format::inode::set_inode_checksum(&mut raw, self.seed, ino);
        }
        let (b, o) = self.inode_loc(ino)?;
        let isz = self.isz;
        self.block(b)?[o..o + isz].copy_from_slice(&raw);
        self.dirty.insert(b);
        Ok(())
    }

    /// Remember what `ino` owned before its first change.
    fn touch(&mut self, ino: Ino) -> Result<()> {
        if self.touched.contains_key(&ino) {
            return Ok(());
        }
        let raw = self.read_inode(ino)?;
        let initial = self.owned_blocks(ino, &raw).unwrap_or_default();
        let g = self.sb.group_of_inode(ino) as usize;
        let i = self.sb.inode_index_in_group(ino) as usize;
        let ib = self.inode_bitmap(g)?;
        let used = bitmap::test(self.block(ib)?, i);
        let was_used_dir = used && le16(&raw, ioff::MODE) & imode::S_IFMT == imode::S_IFDIR;
        self.touched.insert(
            ino,
            Touched {
                initial,
                created: false,
                was_used_dir,
            },
        );
        Ok(())
    }

    /// Data and tree blocks of an extent-mapped inode.
    fn owned_blocks(&mut self, ino: Ino, raw: &[u8]) -> Result<BTreeSet<u64>> {
        let mut set = BTreeSet::new();
        if le32(raw, ioff::FLAGS) & iflags::EXTENTS == 0 || le16(raw, ioff::LINKS_COUNT) == 0 {
            return Ok(set);
        }
        let mut t = Tree::new(self, ino, raw.to_vec());
        let summary = extent::check(&mut t)?;
        set.extend(summary.tree_blocks.iter().copied());
        for m in extent::extents(&mut t, 0..LBLK_END)? {
            set.extend(m.pblk..m.pblk + m.len as u64);
        }
        Ok(set)
    }

    // ----- allocation bitmaps -----

    fn block_bitmap(&mut self, g: usize) -> Result<u64> {
        let d = self.groups[g];
        if d.has_flag(BG_BLOCK_UNINIT) {
            let bm = group::uninit_block_bitmap(&self.sb, g as u64, &d);
            self.write_block(d.block_bitmap, bm);
            self.groups[g].flags &= !BG_BLOCK_UNINIT;
            self.gd_dirty.insert(g as u32);
        }
        Ok(d.block_bitmap)
    }

    fn inode_bitmap(&mut self, g: usize) -> Result<u64> {
        let d = self.groups[g];
        if d.has_flag(BG_INODE_UNINIT) {
            let bm = group::uninit_inode_bitmap(&self.sb);
            self.write_block(d.inode_bitmap, bm);
            self.groups[g].flags &= !BG_INODE_UNINIT;
            self.gd_dirty.insert(g as u32);
        }
        Ok(d.inode_bitmap)
    }

    fn set_block_used(&mut self, b: u64, used: bool) -> Result<()> {
        let g = self.sb.group_of_block(b) as usize;
        let i = self.sb.block_index_in_group(b) as usize;
        let bb = self.block_bitmap(g)?;
        let bm = self.block(bb)?;
        let changed = if used {
            !bitmap::test(bm, i) && {
                bitmap::set(bm, i);
                true
            }
        } else {
            bitmap::test(bm, i) && {
                bitmap::clear(bm, i);
                true
            }
        };
        if changed {
            self.dirty.insert(bb);
            self.gd_dirty.insert(g as u32);
        }
        Ok(())
    }

    fn set_inode_used(&mut self, ino: Ino, used: bool) -> Result<()> {
        let g = self.sb.group_of_inode(ino) as usize;
        let i = self.sb.inode_index_in_group(ino) as usize;
        let ib = self.inode_bitmap(g)?;
        let bm = self.block(ib)?;
        let was = bitmap::test(bm, i);
        if was != used {
            if used {
                bitmap::set(bm, i);
            } else {
                bitmap::clear(bm, i);
            }
            self.dirty.insert(ib);
            self.gd_dirty.insert(g as u32);
        }
        let unused = self.groups[g].itable_unused as usize;
        let ipg = self.sb.inodes_per_group as usize;
        if used && i >= ipg.saturating_sub(unused) {
            self.groups[g].itable_unused = (ipg - i - 1) as u32;
            self.gd_dirty.insert(g as u32);
        }
        Ok(())
    }

    fn is_claimed(&self, b: u64) -> bool {
        self.claimed.iter().any(|&(s, e)| b >= s && b < e)
    }

    /// A free block for a tree node or directory block, never one the log
    /// maps to a file.
    fn alloc_block(&mut self, goal: u64) -> Result<u64> {
        let ngroups = self.groups.len();
        let start_g = (self
            .sb
            .group_of_block(goal.max(self.sb.first_data_block as u64))
            as usize)
            .min(ngroups - 1);
        for k in 0..ngroups {
            let g = (start_g + k) % ngroups;
            let bb = self.block_bitmap(g)?;
            let n = self.sb.blocks_in_group(g as u64) as usize;
            let first = self.sb.group_first_block(g as u64);
            let mut from = 0;
            loop {
                let bm = self.block(bb)?;
                let Some(i) = bitmap::find_first_zero(bm, from, n) else {
                    break;
                };
                let b = first + i as u64;
                if !self.is_claimed(b) {
                    self.set_block_used(b, true)?;
                    return Ok(b);
                }
                from = i + 1;
            }
        }
        Err(FsError::Errno(libc::ENOSPC))
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
                self.with_tree(*ino, |t| {
                    extent::remove_range(t, *lblk, *len as u64)?;
                    extent::insert(t, *lblk, *pblk, *len, *unwritten)
                })
            }
            Tag::DelRange { ino, lblk, len } => {
                self.touch(*ino)?;
                self.with_tree(*ino, |t| {
                    extent::remove_range(t, *lblk, *len as u64).map(|_| ())
                })
            }
            Tag::Creat(d) => {
                self.touch(d.ino)?;
                self.touched.get_mut(&d.ino).expect("touched").created = true;
                let raw = self.read_inode(d.ino)?;
                if le16(raw.as_slice(), ioff::MODE) & imode::S_IFMT == imode::S_IFDIR {
                    self.init_dir(d.ino, d.parent)?;
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
        let mut raw = self.read_inode(ino)?;
        // A new incarnation of the slot (it held another file type or
        // generation, or nothing): whatever it mapped belongs to the old
        // one. A link count of 0 alone does not say so: a replay
        // interrupted by a crash and run again can drop the same
        // incarnation's count to 0 on the way (an UNLINK replayed twice
        // where its LINK was already there) before the INODE restores it.
        let fresh = le16(&raw, ioff::MODE) == 0
            || le16(&raw, ioff::MODE) & imode::S_IFMT != le16(logged, ioff::MODE) & imode::S_IFMT
            || le32(&raw, ioff::GENERATION) != le32(logged, ioff::GENERATION);
        // The index flag a directory has on disk (none for a new
        // incarnation, whose blocks the replay builds linear).
        let disk_index = if fresh {
            0
        } else {
            le32(&raw, ioff::FLAGS) & iflags::INDEX
        };
        let n = logged.len().min(raw.len());
        raw[..ioff::BLOCK].copy_from_slice(&logged[..ioff::BLOCK]);
        raw[ioff::GENERATION..n].copy_from_slice(&logged[ioff::GENERATION..n]);
        if le16(logged, ioff::MODE) & imode::S_IFMT == imode::S_IFDIR {
            let fl = (le32(&raw, ioff::FLAGS) & !iflags::INDEX) | disk_index;
            put32(&mut raw, ioff::FLAGS, fl);
        }
        let fl = le32(&raw, ioff::FLAGS);
        if fl & iflags::EXTENTS != 0 {
            if fresh
                || ordo_format::extent::ExtentNode::decode_root(&raw[ioff::BLOCK..ioff::GENERATION])
                    .is_err()
            {
                raw[ioff::BLOCK..ioff::GENERATION].copy_from_slice(&extent::empty_root());
            }
        } else {
            // Fast symlinks, devices, inline data: i_block is the content.
            raw[ioff::BLOCK..ioff::GENERATION]
                .copy_from_slice(&logged[ioff::BLOCK..ioff::GENERATION]);
        }
        self.write_inode(ino, raw)
    }

    fn with_tree<T>(
        &mut self,
        ino: Ino,
        f: impl FnOnce(&mut Tree<'_, 'a>) -> Result<T>,
    ) -> Result<T> {
        let mut raw = self.read_inode(ino)?;
        if le32(&raw, ioff::FLAGS) & iflags::EXTENTS == 0 {
            // A range on an inode without an extent tree yet (its INODE tag
            // comes later in the log): give it an empty one.
            let fl = le32(&raw, ioff::FLAGS) | iflags::EXTENTS;
            put32(&mut raw, ioff::FLAGS, fl);
            raw[ioff::BLOCK..ioff::GENERATION].copy_from_slice(&extent::empty_root());
        }
        let mut t = Tree::new(self, ino, raw);
        let out = f(&mut t)?;
        let raw = t.raw;
        self.write_inode(ino, raw)?;
        Ok(out)
    }

    /// The (logical, physical) blocks of a directory.
    fn dir_blocks(&mut self, dir: Ino) -> Result<Vec<(u32, u64)>> {
        let raw = self.read_inode(dir)?;
        if le32(&raw, ioff::FLAGS) & iflags::EXTENTS == 0 {
            return Err(FsError::Unsupported(format!(
                "fast-commit replay into directory {dir} without extents"
            )));
        }
        let mut t = Tree::new(self, dir, raw);
        let mut out = Vec::new();
        for m in extent::extents(&mut t, 0..LBLK_END)? {
            for i in 0..m.len {
                out.push((m.lblk + i, m.pblk + i as u64));
            }
        }
        Ok(out)
    }

    fn layout(&self) -> fdir::DirBlockLayout {
        fdir::DirBlockLayout {
            block_size: self.bs,
            has_tail: self.csum,
        }
    }

    fn seal_dir_block(&mut self, dir: Ino, b: u64) -> Result<()> {
        if self.csum {
            let raw = self.read_inode(dir)?;
            let gen = le32(&raw, ioff::GENERATION);
            let seed = ordo_format::csum::inode_csum_seed(self.seed, dir, gen);
            let blk = self.block(b)?;
            fdir::set_dirent_tail_checksum(blk, seed);
        }
        self.dirty.insert(b);
        Ok(())
    }

    /// Make `dir` a linear directory before its entries change: clear
    /// `EXT4_INDEX_FL` and rewrite the dx root and nodes as empty linear
    /// blocks (see the module header). Idempotent, and safe on any mix of
    /// converted and unconverted blocks a crashed replay left.
    fn ensure_linear(&mut self, dir: Ino) -> Result<()> {
        if self.linear.contains(&dir) {
            return Ok(());
        }
        let mut raw = self.read_inode(dir)?;
        let fl = le32(&raw, ioff::FLAGS);
        let indexed = fl & iflags::INDEX != 0;
        if indexed || self.csum {
            if indexed {
                self.touch(dir)?;
                put32(&mut raw, ioff::FLAGS, fl & !iflags::INDEX);
                self.write_inode(dir, raw)?;
            }
            let layout = self.layout();
            for (l, b) in self.dir_blocks(dir)? {
                let blk = self.block(b)?;
                let kind = if l == 0 && fdir::looks_like_dx_root(blk) {
                    fdir::DxKind::Root
                } else if l > 0 && fdir::looks_like_dx_node(blk) {
                    fdir::DxKind::Node
                } else {
                    continue;
                };
                fdir::linearize_dx_block(blk, layout, kind);
                self.seal_dir_block(dir, b)?;
            }
        }
        self.linear.insert(dir);
        Ok(())
    }

    fn find(&mut self, dir: Ino, name: &[u8]) -> Result<Option<(u64, u32)>> {
        let layout = self.layout();
        for (_, b) in self.dir_blocks(dir)? {
            let blk = self.block(b)?;
            if let Some(e) = fdir::find(blk, layout, name).map_err(|e| e.at(b))? {
                return Ok(Some((b, e.inode)));
            }
        }
        Ok(None)
    }

    fn link(&mut self, dir: Ino, ino: Ino, name: &[u8], created: bool) -> Result<()> {
        self.ensure_linear(dir)?;
        self.note_subdir_parent(dir, ino)?;
        if self.find(dir, name)?.is_some() {
            return Ok(());
        }
        self.touch(ino)?;
        let child = self.read_inode(ino)?;
        let ft = fdir::file_type_from_mode(le16(&child, ioff::MODE));
        let ft = if self.sb.has_filetype() { ft } else { 0 };
        let layout = self.layout();
        let mut placed = None;
        let blocks = self.dir_blocks(dir)?;
        for &(_, b) in &blocks {
            let blk = self.block(b)?;
            if fdir::insert(blk, layout, ino, name, ft)
                .map_err(|e| e.at(b))?
                .is_some()
            {
                placed = Some(b);
                break;
            }
        }
        if placed.is_none() {
            // Every block is full: append one, as ext4_add_entry does.
            let next = blocks.iter().map(|&(l, _)| l + 1).max().unwrap_or(0);
            let goal = blocks.last().map(|&(_, p)| p + 1).unwrap_or(0);
            let b = self.alloc_block(goal)?;
            let mut img = vec![0u8; self.bs];
            fdir::init_empty(&mut img, layout);
            fdir::insert(&mut img, layout, ino, name, ft)
                .map_err(|e| e.at(b))?
                .expect("an empty block takes one entry");
            self.write_block(b, img);
            self.touch(dir)?;
            self.with_tree(dir, |t| extent::insert(t, next, b, 1, false))?;
            let mut raw = self.read_inode(dir)?;
            let sz = i_size(&raw).max((next as u64 + 1) * self.bs as u64);
            set_i_size(&mut raw, sz);
            self.write_inode(dir, raw)?;
            placed = Some(b);
        }
        self.seal_dir_block(dir, placed.expect("placed"))?;
        let is_dir = le16(&child, ioff::MODE) & imode::S_IFMT == imode::S_IFDIR;
        if created && is_dir {
            self.adjust_links(dir, 1)?;
        }
        if !created {
            self.adjust_links(ino, 1)?;
        }
        Ok(())
    }

    fn unlink(&mut self, dir: Ino, ino: Ino, name: &[u8]) -> Result<()> {
        self.ensure_linear(dir)?;
        self.note_subdir_parent(dir, ino)?;
        let Some((b, found)) = self.find(dir, name)? else {
            return Ok(());
        };
        if found != ino {
            return Err(FsError::corrupt(
                b,
                "fast commit UNLINK",
                format!("entry names inode {found}, the log says {ino}"),
            ));
        }
        let layout = self.layout();
        let blk = self.block(b)?;
        fdir::remove(blk, layout, name).map_err(|e| e.at(b))?;
        self.seal_dir_block(dir, b)?;
        self.touch(ino)?;
        let child = self.read_inode(ino)?;
        if le16(&child, ioff::MODE) & imode::S_IFMT == imode::S_IFDIR {
            self.adjust_links(dir, -1)?;
            self.adjust_links(ino, -2)?;
        } else {
            self.adjust_links(ino, -1)?;
        }
        Ok(())
    }

    /// Remember `dir` when `child` is a directory (see [`Self::recount_subdirs`]).
    fn note_subdir_parent(&mut self, dir: Ino, child: Ino) -> Result<()> {
        let raw = self.read_inode(child)?;
        if le16(&raw, ioff::MODE) & imode::S_IFMT == imode::S_IFDIR {
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
        let layout = self.layout();
        let parents: Vec<Ino> = self.subdir_parents.iter().copied().collect();
        for dir in parents {
            let raw = self.read_inode(dir)?;
            if le16(&raw, ioff::LINKS_COUNT) == 0
                || le16(&raw, ioff::MODE) & imode::S_IFMT != imode::S_IFDIR
            {
                continue;
            }
            let mut children = Vec::new();
            for (_, b) in self.dir_blocks(dir)? {
                let blk = self.block(b)?;
                for e in fdir::iter(blk, layout) {
                    let e = e.map_err(|e| e.at(b))?;
                    if e.inode != 0 && e.name != b"." && e.name != b".." {
                        children.push((e.inode, e.file_type));
                    }
                }
            }
            let mut subdirs: u32 = 0;
            for (child, ft) in children {
                let is_dir = if self.sb.has_filetype() {
                    ft == fdir::ft::DIR
                } else {
                    let c = self.read_inode(child)?;
                    le16(&c, ioff::MODE) & imode::S_IFMT == imode::S_IFDIR
                };
                subdirs += is_dir as u32;
            }
            let links = match 2 + subdirs {
                n if n >= 65000 => 1,
                n => n as u16,
            };
            if le16(&raw, ioff::LINKS_COUNT) != links {
                self.touch(dir)?;
                let mut raw = raw;
                put16(&mut raw, ioff::LINKS_COUNT, links);
                self.write_inode(dir, raw)?;
            }
        }
        Ok(())
    }

    fn adjust_links(&mut self, ino: Ino, delta: i32) -> Result<()> {
        let mut raw = self.read_inode(ino)?;
        let n = le16(&raw, ioff::LINKS_COUNT) as i32;
        put16(
            &mut raw,
            ioff::LINKS_COUNT,
            (n + delta).clamp(0, 65000) as u16,
        );
        self.write_inode(ino, raw)
    }

    /// A directory created by the log gets its "." and ".." block when it
    /// has none yet (directories are not logged block by block).
    fn init_dir(&mut self, ino: Ino, parent: Ino) -> Result<()> {
        if !self.dir_blocks(ino)?.is_empty() {
            return Ok(());
        }
        let b = self.alloc_block(0)?;
        let layout = self.layout();
        let mut img = vec![0u8; self.bs];
        fdir::init_dot_dotdot(&mut img, layout, ino, parent, self.sb.has_filetype());
        self.write_block(b, img);
        self.with_tree(ino, |t| extent::insert(t, 0, b, 1, false))?;
        self.seal_dir_block(ino, b)?;
        let mut raw = self.read_inode(ino)?;
        set_i_size(&mut raw, self.bs as u64);
        self.write_inode(ino, raw)
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
        let touched: Vec<(Ino, Touched)> =
            self.touched.iter().map(|(k, v)| (*k, v.clone())).collect();
        let mut finals = Vec::with_capacity(touched.len());
        // Test-only: a replay that never frees what the log unmapped; the
        // explorer's kernel judge must catch it (ordo-crash judge_fault.rs).
        let skip_frees = std::env::var("ORDO_FAULT").as_deref() == Ok("fc_replay_skip_frees");
        for (ino, t) in touched {
            let raw = self.read_inode(ino)?;
            let fin = if le16(&raw, ioff::LINKS_COUNT) > 0 {
                self.owned_blocks(ino, &raw)?
            } else {
                BTreeSet::new()
            };
            for &b in t.initial.difference(&fin) {
                if skip_frees {
                    continue;
                }
                self.set_block_used(b, false)?;
            }
            finals.push((ino, t, fin));
        }
        for (ino, t, fin) in finals {
            let mut raw = self.read_inode(ino)?;
            let links = le16(&raw, ioff::LINKS_COUNT);
            let is_dir = le16(&raw, ioff::MODE) & imode::S_IFMT == imode::S_IFDIR;
            if is_dir && links > 0 && le32(&raw, ioff::FLAGS) & iflags::EXTENTS != 0 {
                // A directory's size is its blocks (an INODE tag may carry
                // the size of blocks the replay rebuilt differently).
                let end = self
                    .dir_blocks(ino)?
                    .iter()
                    .map(|&(l, _)| l as u64 + 1)
                    .max();
                if let Some(end) = end {
                    set_i_size(&mut raw, end * self.bs as u64);
                }
            }
            let g = self.sb.group_of_inode(ino) as usize;
            for &b in &fin {
                self.set_block_used(b, true)?;
            }
            let now_used = links > 0;
            self.set_inode_used(ino, now_used)?;
            let now_used_dir = is_dir && now_used;
            if t.was_used_dir != now_used_dir {
                let d = &mut self.groups[g].used_dirs_count;
                *d = if now_used_dir {
                    *d + 1
                } else {
                    d.saturating_sub(1)
                };
                self.gd_dirty.insert(g as u32);
            }
            if now_used {
                // i_blocks from what the tree maps now.
                let sectors = fin.len() as u64 * (self.bs as u64 / 512);
                put32(&mut raw, ioff::BLOCKS_LO, sectors as u32);
                put16(&mut raw, ioff::BLOCKS_HIGH, (sectors >> 32) as u16);
                if le32(&raw, ioff::DTIME) != 0 {
                    put32(&mut raw, ioff::DTIME, 0);
                }
            } else if le32(&raw, ioff::DTIME) == 0 && le16(&raw, ioff::MODE) != 0 {
                put32(&mut raw, ioff::DTIME, self.dtime_sec);
            }
            let _ = t.created;
            self.write_inode(ino, raw)?;
        }
        self.write_counts()
    }

    fn write_counts(&mut self) -> Result<()> {
        let gcs = self.sb.group_csum();
        let ds = self.sb.desc_size();
        let per = self.bs / ds as usize;
        let gdt = self.sb.gdt_first_block(0);
        let dirty: Vec<u32> = self.gd_dirty.iter().copied().collect();
        for g in dirty {
            let gi = g as usize;
            let d = self.groups[gi];
            let nblocks = self.sb.blocks_in_group(g as u64) as usize;
            let ipg = self.sb.inodes_per_group as usize;
            if !d.has_flag(BG_BLOCK_UNINIT) {
                let bm = self.block(d.block_bitmap)?.clone();
                self.groups[gi].free_blocks_count = bitmap::count_zero(&bm, 0, nblocks) as u32;
                if self.csum {
                    self.groups[gi].block_bitmap_csum =
                        group::block_bitmap_checksum(self.seed, &bm, self.sb.blocks_per_group);
                }
            }
            if !d.has_flag(BG_INODE_UNINIT) {
                let bm = self.block(d.inode_bitmap)?.clone();
                self.groups[gi].free_inodes_count = bitmap::count_zero(&bm, 0, ipg) as u32;
                if self.csum {
                    self.groups[gi].inode_bitmap_csum =
                        group::inode_bitmap_checksum(self.seed, &bm, self.sb.inodes_per_group);
                }
            }
            let blk = gdt + g as u64 / per as u64;
            let o = (g as usize % per) * ds as usize;
            let slot = self.groups[gi];
            let b = self.block(blk)?;
            slot.encode_into(&mut b[o..o + ds as usize], g, gcs);
            self.dirty.insert(blk);
        }
        let free_blocks: u64 = self.groups.iter().map(|g| g.free_blocks_count as u64).sum();
        let free_inodes: u64 = self.groups.iter().map(|g| g.free_inodes_count as u64).sum();
        self.sb.free_blocks_count = free_blocks;
        self.sb.free_inodes_count = free_inodes as u32;
        let enc = self.sb.encode();
        let (sbb, so) = (self.sb_block, self.sb_off);
        self.block(sbb)?[so..so + 1024].copy_from_slice(&enc);
        self.dirty.insert(sbb);
        Ok(())
    }

    /// The changed blocks, by block number.
    fn into_dirty(mut self) -> BTreeMap<u64, Vec<u8>> {
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .into_iter()
            .map(|b| {
                let data = self.cache.remove(&b).expect("a dirty block is cached");
                (b, data)
            })
            .collect()
    }
}

/// An inode's extent tree over the replay image.
struct Tree<'i, 'a> {
    img: &'i mut Img<'a>,
    ino: Ino,
    raw: Vec<u8>,
}

impl<'i, 'a> Tree<'i, 'a> {
    fn new(img: &'i mut Img<'a>, ino: Ino, raw: Vec<u8>) -> Self {
        Tree { img, ino, raw }
    }
    fn generation(&self) -> u32 {
        le32(&self.raw, ioff::GENERATION)
    }
}

impl ExtentStore for Tree<'_, '_> {
    fn block_size(&self) -> u32 {
        self.img.bs as u32
    }
    fn blocks_count(&self) -> u64 {
        self.img.sb.blocks_count
    }
    fn ino(&self) -> Ino {
        self.ino
    }
    fn root(&self) -> [u8; ROOT_SIZE_BYTES] {
        self.raw[ioff::BLOCK..ioff::BLOCK + ROOT_SIZE_BYTES]
            .try_into()
            .expect("60 bytes")
    }
    fn set_root(&mut self, offset: u32, bytes: &[u8], _kind: UpdateKind) -> Result<()> {
        let o = ioff::BLOCK + offset as usize;
        self.raw[o..o + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
    fn read_tree_block(&mut self, pblk: u64) -> Result<Vec<u8>> {
        Ok(self.img.block(pblk)?.clone())
    }
    fn alloc_tree_block(&mut self, goal: u64) -> Result<u64> {
        let b = self.img.alloc_block(goal)?;
        if let Some(t) = self.img.touched.get_mut(&self.ino) {
            t.initial.insert(b);
        }
        Ok(b)
    }
    fn init_tree_block(&mut self, pblk: u64, image: &[u8]) -> Result<()> {
        self.img.write_block(pblk, image.to_vec());
        Ok(())
    }
    fn modify_tree_block(
        &mut self,
        pblk: u64,
        offset: u32,
        bytes: &[u8],
        _kind: UpdateKind,
    ) -> Result<()> {
        let b = self.img.block(pblk)?;
        b[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        self.img.dirty.insert(pblk);
        Ok(())
    }
    fn free_tree_block(&mut self, pblk: u64) -> Result<()> {
        self.img.set_block_used(pblk, false)
    }
    fn csum_tree_block(&self, image: &mut [u8]) {
        if self.img.csum {
            let _ =
                ordo_format::extent::set_tail(self.img.seed, self.ino, self.generation(), image);
        }
    }
}
