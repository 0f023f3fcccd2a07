//! NoFS's scanners (`Capabilities::backlinks`): after an unclean mount the
//! allocation state on disk is not trusted. Before anything is allocated,
//! the core rebuilds it from what validates, with three scanners
//! (docs/DESIGN.md, "Backpointers"):
//!
//! 1. **Metadata scanner**, inodes in disk order: an inode is a candidate
//!    when its checksum holds, it has a mode and a link count, and its
//!    extent tree validates (every tree block's checksum is seeded with the
//!    inode and its generation, so a tree block now another file's fails).
//! 2. **Name walk** from the root: a directory's blocks must carry its own
//!    checksum (a block that fails is reset to an empty block: its entries
//!    were never this directory's), and an entry stays only if its inode is
//!    a candidate that names the directory back, as often as the
//!    directory holds it. A directory reached twice keeps its first name.
//!    Candidates left unreached whose backlinks name a live directory are
//!    linked back into it as `#INO` (recovery re-links orphans); the rest
//!    are reclaimed. Link counts, `..` and backlinks are then set from the
//!    names that stayed.
//! 3. **Data scanner**: every block a valid inode maps is claimed. A claim
//!    whose owner record names that very file block is strong; a claim
//!    without (the record or the data never reached the disk) is weak. A
//!    block claimed twice goes to the strong claimant (the other pointer is
//!    stale: its file is cut short before it); two weak claims go to the
//!    first. Bitmaps and every counter are then rebuilt from the claims.
//!
//! The metadata scanner writes nothing, and runs in batches
//! ([`Core::meta_scan_step`]): a mount's background thread runs it at the
//! rate `scan_rate=` allows, releasing the core's lock between batches, so
//! reads and lookups go on meanwhile (they need no scan: they check owner
//! records and backlinks themselves), and `ordo info` shows how far it
//! got. The rest of the scan (settling, the name walk, the data scanner)
//! writes, and runs in one handle under the lock: when the background
//! batches are done, or as soon as a handle that may allocate starts
//! (which finishes the metadata scanner first, at full speed), or at
//! `Fs::scan_to_end` or the unmount. Owner records the kernel did not keep (the
//! image was mounted elsewhere) are rebuilt at mount by
//! [`Core::rebuild_owner_records`], which trusts the tree of a cleanly
//! unmounted image.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use ordo_dev::BlockClass;

use crate::backlinks;
use crate::error::Result;
use crate::exec::Shared;
use crate::extent::{self, LBLK_END};
use crate::layout::{gd, ino as io, le32};
use crate::state::{Core, Owner};
use crate::types::{FileType, ROOT_INO};
use crate::update::{BlockOwner, CounterKind, Ino, InodeField, OpKind, UpdateKind, XATTR_LBLK};

/// What the backlink checks and the scanners found (`ordo info`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NofsStats {
    /// Lookups refused: the inode did not name its directory back.
    pub stale_names: u64,
    /// Scans run to completion.
    pub scans: u64,
    /// Inodes the metadata scanner examined.
    pub inodes_scanned: u64,
    /// Inodes found valid.
    pub inodes_valid: u64,
    /// Inodes that were candidates but were reclaimed.
    pub inodes_reclaimed: u64,
    /// Entries removed (stale names, second names of a directory).
    pub entries_removed: u64,
    /// Orphans linked back through their backlinks.
    pub orphans_relinked: u64,
    /// Link counts, `..` entries and backlink lists corrected.
    pub links_fixed: u64,
    /// Directory blocks that failed their checksum and were reset.
    pub dir_blocks_reset: u64,
    /// Files cut short at a block another file owns.
    pub conflicts_cut: u64,
    /// Blocks claimed by valid inodes (data, tree, directory, attribute).
    pub blocks_claimed: u64,
    /// Claims without a matching owner record (reads of them fail).
    pub weak_claims: u64,
    /// Block bits changed by the rebuild.
    pub block_bits_fixed: u64,
    /// Inode bits changed by the rebuild.
    pub inode_bits_fixed: u64,
    /// Owner records rebuilt from the tree at mount (a table not trusted).
    pub records_rebuilt: u64,
    /// Files whose map was rebuilt from their owner records (the extent
    /// tree did not survive).
    pub maps_rebuilt: u64,
    /// File blocks taken from a file whose pointer to them was stale
    /// (another file's record proves them its own): EIO from then on.
    pub blocks_poisoned: u64,
}

impl NofsStats {
    /// Name/value pairs for `ordo info`.
    pub fn pairs(&self) -> Vec<(String, u64)> {
        vec![
            ("nofs_stale_names".into(), self.stale_names),
            ("nofs_scans".into(), self.scans),
            ("nofs_inodes_scanned".into(), self.inodes_scanned),
            ("nofs_inodes_valid".into(), self.inodes_valid),
            ("nofs_inodes_reclaimed".into(), self.inodes_reclaimed),
            ("nofs_entries_removed".into(), self.entries_removed),
            ("nofs_orphans_relinked".into(), self.orphans_relinked),
            ("nofs_links_fixed".into(), self.links_fixed),
            ("nofs_dir_blocks_reset".into(), self.dir_blocks_reset),
            ("nofs_conflicts_cut".into(), self.conflicts_cut),
            ("nofs_blocks_claimed".into(), self.blocks_claimed),
            ("nofs_weak_claims".into(), self.weak_claims),
            ("nofs_block_bits_fixed".into(), self.block_bits_fixed),
            ("nofs_inode_bits_fixed".into(), self.inode_bits_fixed),
            ("nofs_records_rebuilt".into(), self.records_rebuilt),
            ("nofs_maps_rebuilt".into(), self.maps_rebuilt),
            ("nofs_blocks_poisoned".into(), self.blocks_poisoned),
        ]
    }
}

/// One claim of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    ino: Ino,
    lblk: u32,
    strong: bool,
    /// A file block (its strength is its owner record's).
    data: bool,
    generation: u32,
}

/// What a group descriptor says of an inode slot ([`Core::slot_hint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotHint {
    /// Initialized: it holds an inode, live or free.
    Initialized,
    /// Never used, by the descriptor; `zeroed`: its table was zeroed.
    Unused { zeroed: bool },
}

/// Inodes the background thread examines per batch (16 inode-table
/// blocks of 256-byte inodes) before it lets go of the core's lock.
pub(crate) const SCAN_BATCH: u64 = 256;

/// The metadata scanner's findings so far (`Core::meta_scan_step`).
#[derive(Debug, Default)]
pub(crate) struct MetaScan {
    /// The next inode to examine.
    next: Ino,
    /// Candidates: inode -> (is a directory, generation).
    cand: BTreeMap<Ino, (bool, u32)>,
    /// Regular files whose extent tree did not validate: their maps are
    /// rebuilt from their owner records.
    remap: Vec<Ino>,
    /// Every inode that looks in use (a mode and a link count in its raw
    /// bytes): what is not found valid among them is reclaimed, or
    /// e2fsck would take it for a live inode.
    looks_live: Vec<Ino>,
    /// Candidates whose attribute-block pointer outlived the block.
    bad_acl: Vec<Ino>,
}

/// Reserved inodes whose blocks are kept as they are: the owner table
/// (5, `EXT4_BOOT_LOADER_INO`), the resize inode (7) and the journal (8).
const OWNER_TABLE_INO: Ino = 5;
const RESIZE_INO: Ino = 7;
const JOURNAL_INO: Ino = 8;

impl Core {
    /// Run the scanners in a handle of their own, if the mount needs them.
    pub(crate) fn scan_if_needed(&mut self) -> Result<()> {
        if !self.scan_needed || self.read_only {
            return Ok(());
        }
        self.begin(OpKind::Internal, 0);
        let r = self.nofs_scan();
        let e = self.end();
        r?;
        e?;
        self.scan_needed = false;
        self.nofs.scans += 1;
        Ok(())
    }

    fn nofs_scan(&mut self) -> Result<()> {
        self.backlinks_frozen = true;
        let r = self.nofs_scan_inner();
        self.backlinks_frozen = false;
        r
    }

    /// Whether inode `ino`'s slot may hold an initialized inode, by its
    /// group descriptor: not in an `INODE_UNINIT` group, nor in the
    /// table's unused tail (`bg_itable_unused`) unless the table is known
    /// zeroed. Right for an image whose descriptors are trusted (cleanly
    /// unmounted); see [`Core::slot_hint`] for the scanner's use.
    fn itable_initialized(&mut self, ino: Ino) -> Result<bool> {
        Ok(self.slot_hint(ino)? == SlotHint::Initialized)
    }

    /// What inode `ino`'s group descriptor says of its slot. After a
    /// crash under a protocol that does not trust allocation state, these
    /// marks are hints written in no order, like the bitmaps: an fsync
    /// writes a file's inode and the directory entries naming it, not its
    /// group's descriptor, so a group still marked `INODE_UNINIT` (or a
    /// slot in its unused tail) on disk may hold a durable inode.
    fn slot_hint(&mut self, ino: Ino) -> Result<SlotHint> {
        let ipg = self.sbi.inodes_per_group;
        let g = (ino - 1) / ipg;
        let idx = (ino - 1) % ipg;
        if !self.sbi.has_group_csum() {
            return Ok(SlotHint::Initialized);
        }
        let flags = self.gd16(g, gd::FLAGS)?;
        let zeroed = flags & gd::FLAG_INODE_ZEROED != 0;
        if flags & gd::FLAG_INODE_UNINIT != 0 {
            return Ok(SlotHint::Unused { zeroed });
        }
        if zeroed {
            return Ok(SlotHint::Initialized);
        }
        let unused = self.gd_count(g, gd::ITABLE_UNUSED_LO, gd::ITABLE_UNUSED_HI)?;
        Ok(if idx < ipg - unused.min(ipg) {
            SlotHint::Initialized
        } else {
            SlotHint::Unused { zeroed }
        })
    }

    /// Run the metadata scanner over at most `budget` more inodes (those
    /// in initialized inode-table slots), keeping its findings in
    /// [`Core::meta_scan`] for the handle that finishes the scan. It
    /// writes nothing and needs no handle, so the background thread runs
    /// it a batch at a time, with the core's lock released between
    /// batches; that is sound because every handle but the mount's own
    /// finishes the scan before it changes anything ([`Core::scan_if_needed`]),
    /// so what a batch saw is still on disk when the next one runs.
    /// Returns whether every inode has been examined (or no scan is
    /// needed). On an error the findings are dropped: the next attempt
    /// starts over.
    pub(crate) fn meta_scan_step(&mut self, budget: u64) -> Result<bool> {
        if !self.scan_needed {
            return Ok(true);
        }
        let mut m = self.meta_scan.take().unwrap_or_default();
        let r = self.meta_scan_batch(&mut m, budget);
        if r.is_ok() {
            self.meta_scan = Some(m);
        }
        r
    }

    /// The next inode the metadata scanner examines (past the last once
    /// it has examined them all), for `ordo info`.
    pub(crate) fn meta_scan_next(&self) -> Ino {
        match &self.meta_scan {
            _ if !self.scan_needed => self.sbi.inodes_count.saturating_add(1),
            Some(m) => m.next.max(ROOT_INO),
            None => ROOT_INO,
        }
    }

    fn meta_scan_batch(&mut self, m: &mut MetaScan, budget: u64) -> Result<bool> {
        let first_ino = self.sbi.first_ino.max(11);
        let inodes = self.sbi.inodes_count;
        let ipg = self.sbi.inodes_per_group;
        let mut left = budget;
        if m.next < ROOT_INO {
            m.next = ROOT_INO;
        }
        while m.next <= inodes && left > 0 {
            let ino = m.next;
            if ino != ROOT_INO && ino < first_ino {
                m.next = first_ino;
                continue;
            }
            // A slot its descriptor calls unused is examined all the same
            // (the descriptor is a hint, [`Core::slot_hint`]), when what
            // it holds can be told from an inode: zeros in a zeroed table,
            // or an inode whose checksum holds. Only a table neither
            // zeroed nor checksummed is skipped past its marks.
            let beyond = match self.slot_hint(ino)? {
                SlotHint::Initialized => false,
                SlotHint::Unused { zeroed } if zeroed || self.sbi.has_metadata_csum() => true,
                SlotHint::Unused { .. } => {
                    m.next = ((ino - 1) / ipg + 1).saturating_mul(ipg).saturating_add(1);
                    continue;
                }
            };
            left -= 1;
            self.meta_scan_one(m, ino, beyond)?;
            m.next = ino + 1;
        }
        Ok(m.next > inodes)
    }

    /// The metadata scanner's test of inode `ino`.
    /// `beyond`: the slot is past what its group descriptor calls
    /// initialized, and counts only if it holds a valid inode (a table
    /// not zeroed holds whatever the disk held before it).
    fn meta_scan_one(&mut self, m: &mut MetaScan, ino: Ino, beyond: bool) -> Result<()> {
        self.nofs.inodes_scanned += 1;
        let raw = self.inode_raw(ino)?;
        let read = self.read_inode(ino);
        if crate::layout::le16(&raw, io::MODE) != 0
            && crate::layout::le16(&raw, io::LINKS) != 0
            && (!beyond || read.is_ok())
        {
            m.looks_live.push(ino);
        }
        let Ok(i) = read else {
            return Ok(());
        };
        if i.mode == 0 || i.links == 0 || FileType::from_mode(i.mode).is_none() {
            return Ok(());
        }
        // An attribute block that is not one (the pointer outlived the
        // block): the pointer goes (when the scan is finished), the inode
        // stays.
        let acl = io::file_acl(&raw);
        if acl != 0 {
            // The block must be this inode's: a block freed by an earlier
            // file and taken by this one may still hold the earlier
            // file's attributes, the pointer having reached the disk
            // before the new contents.
            let ok = acl > u64::from(self.sbi.first_data_block) && acl < self.sbi.blocks_count && {
                let img = self.block_image(acl)?;
                self.xattr_block_ok(acl, &img)
                    && self.xattr_block_owned(ino, i.generation, acl, &img)
            };
            if !ok {
                m.bad_acl.push(ino);
            }
        }
        if i.uses_extents() {
            let ok = match self.tree(ino) {
                Ok(mut t) => extent::check(&mut t).is_ok(),
                Err(_) => false,
            };
            if !ok {
                if !i.is_reg() {
                    return Ok(());
                }
                // Its map is emptied when the scan is finished, and
                // rebuilt from its owner records.
                m.remap.push(ino);
            }
        } else if i.is_dir() || (i.is_reg() && i.size > 0) {
            return Ok(());
        }
        if i.is_symlink() && i.uses_extents() && !self.symlink_block_ok(ino)? {
            // A slow symlink whose target block never reached the disk.
            return Ok(());
        }
        m.cand.insert(ino, (i.is_dir(), i.generation));
        Ok(())
    }

    fn nofs_scan_inner(&mut self) -> Result<()> {
        // 1. Metadata scanner: what the background batches left, then
        // the rest, and the fixes it decided on.
        while !self.meta_scan_step(u64::MAX)? {}
        let MetaScan {
            mut cand,
            remap,
            looks_live,
            bad_acl,
            ..
        } = self.meta_scan.take().unwrap_or_default();
        for ino in bad_acl {
            self.set_inode_bytes(ino, io::FILE_ACL_LO, &0u32.to_le_bytes(), InodeField::Other);
            self.set_inode_bytes(ino, io::FILE_ACL_HI, &0u16.to_le_bytes(), InodeField::Other);
            self.nofs.links_fixed += 1;
        }
        for &ino in &remap {
            self.empty_map(ino)?;
        }
        self.settle_dir_blocks(&mut cand)?;
        if !cand.contains_key(&ROOT_INO) {
            return Err(crate::error::FsError::corrupt(
                self.inode_loc(ROOT_INO).0,
                "inode 2",
                "the root directory does not validate",
            ));
        }

        // Nothing the name walk allocates (a directory block for the
        // orphans linked back into a full directory, say) may be a block
        // some candidate maps or a lost tree's records give: the bitmaps
        // on disk were written in no order, and a bit may be clear under
        // a live directory block. Until the data scanner rebuilds them,
        // all of those count as in use.
        self.reserve_candidates_blocks(&cand, &remap)?;

        // 2. Name walk.
        let mut valid: HashSet<Ino> = HashSet::from([ROOT_INO]);
        let mut parent_of: HashMap<Ino, Ino> = HashMap::from([(ROOT_INO, ROOT_INO)]);
        let mut names: HashMap<Ino, Vec<Ino>> = HashMap::new();
        let mut queue: VecDeque<Ino> = VecDeque::from([ROOT_INO]);
        let mut walked: HashSet<Ino> = HashSet::new();
        // Walked directories whose entry named a candidate its backlinks
        // did not name (the entry is removed).
        let mut named_by: HashMap<Ino, Vec<Ino>> = HashMap::new();
        // Orphans linked back as `#INO`.
        let mut orphaned: HashSet<Ino> = HashSet::new();
        loop {
            while let Some(d) = queue.pop_front() {
                walked.insert(d);
                let parent = parent_of[&d];
                self.repair_dir(d, parent)?;
                self.dedup_names(d, &cand)?;
                let mut entries: Vec<(Vec<u8>, Ino, u8)> = self
                    .dir_index(d)?
                    .names
                    .iter()
                    .map(|(n, s)| (n.clone(), s.ino, s.ft))
                    .collect();
                entries.sort();
                let mut held: HashMap<Ino, usize> = HashMap::new();
                for (name, c, ft) in entries {
                    if name == b"." || name == b".." {
                        continue;
                    }
                    let keep = match cand.get(&c) {
                        None => false,
                        Some(_) if !self.entry_type_matches(c, ft)? => false,
                        Some(&(is_dir, _)) => {
                            // Every name of a file in a directory it names
                            // stays (its backlink and entry writes were not
                            // ordered: a rename or link may have reached
                            // the disk in part, and the older name may be
                            // the durable one); a directory keeps its
                            // first name only.
                            let bl = self.backlinks_of(c)?;
                            let times = if bl.contains(&backlinks::OVERFLOW) || !is_dir {
                                if bl.contains(&d) || bl.contains(&backlinks::OVERFLOW) {
                                    usize::MAX
                                } else {
                                    0
                                }
                            } else {
                                bl.iter().filter(|&&x| x == d).count()
                            };
                            let n = held.entry(c).or_insert(0);
                            let first_dir_name = !is_dir || !valid.contains(&c);
                            if *n < times && first_dir_name {
                                *n += 1;
                                true
                            } else {
                                false
                            }
                        }
                    };
                    if !keep {
                        if cand.contains_key(&c) && self.entry_type_matches(c, ft)? {
                            // A name the inode's backlinks do not give:
                            // stale, or the durable name of a file whose
                            // rename reached the disk only in its backlink.
                            named_by.entry(c).or_default().push(d);
                        }
                        self.dir_remove(d, &name)?;
                        self.nofs.entries_removed += 1;
                        continue;
                    }
                    names.entry(c).or_default().push(d);
                    if valid.insert(c) && cand[&c].0 {
                        parent_of.insert(c, d);
                        queue.push_back(c);
                    }
                }
            }
            let lost_found = self
                .dir_lookup(ROOT_INO, b"lost+found")?
                .map(|s| s.ino)
                .filter(|i| walked.contains(i));
            // Orphans: candidates no name reached, linked back into a
            // directory their backlinks name.
            let mut relinked = false;
            let orphans: Vec<Ino> = cand
                .keys()
                .copied()
                .filter(|c| !valid.contains(c))
                .collect();
            for c in orphans {
                let bl = self.backlinks_of(c)?;
                // Only into a directory already walked: one walked later
                // would count the new name a second time. If no directory
                // its backlinks name is one (a rename whose new directory
                // never reached the disk, though the backlink did), then
                // into one that named it on disk: the file was durable
                // under that name, and must not be lost.
                // Failing both, into lost+found, as e2fsck would put it: a
                // file whose every name was lost in flight is still a
                // file. Both fallbacks are for files and symlinks only: a
                // directory no backlink leads to is most often one being
                // removed, whose blocks may be another's by now.
                let file = !cand[&c].0;
                let Some(&p) = bl
                    .iter()
                    .find(|p| walked.contains(p))
                    .or_else(|| named_by.get(&c).and_then(|v| v.first()).filter(|_| file))
                    .or(lost_found.as_ref().filter(|_| file))
                else {
                    continue;
                };
                let name = format!("#{c}").into_bytes();
                if self.dir_lookup(p, &name)?.is_some() {
                    continue;
                }
                let i = self.read_inode(c)?;
                let kind = FileType::from_mode(i.mode).expect("a candidate has a type");
                self.dir_add(p, &name, c, kind)?;
                self.nofs.orphans_relinked += 1;
                orphaned.insert(c);
                names.entry(c).or_default().push(p);
                valid.insert(c);
                if cand[&c].0 {
                    parent_of.insert(c, p);
                    queue.push_back(c);
                }
                relinked = true;
            }
            if !relinked {
                break;
            }
        }
        // Reclaim the rest.
        let now = self.now().sec as u32;
        for &c in looks_live.iter().filter(|c| !valid.contains(c)) {
            self.set_links(c, 0);
            self.set_dtime(c, now.max(1), InodeField::Dtime);
            self.csum_inode(c);
            self.nofs.inodes_reclaimed += 1;
        }
        // Link counts, `..`, backlinks.
        let mut subdirs: HashMap<Ino, u32> = HashMap::new();
        for (&c, &p) in &parent_of {
            if c != ROOT_INO {
                *subdirs.entry(p).or_default() += 1;
            }
        }
        let mut sorted: Vec<Ino> = valid.iter().copied().collect();
        sorted.sort_unstable();
        for &c in &sorted {
            let i = self.read_inode(c)?;
            let is_dir = cand[&c].0;
            let want = if is_dir {
                2 + subdirs.get(&c).copied().unwrap_or(0)
            } else {
                names.get(&c).map_or(0, |v| v.len() as u32)
            };
            let want = if is_dir && want >= 65000 { 1 } else { want };
            if u32::from(i.links) != want {
                self.set_links(c, want as u16);
                self.nofs.links_fixed += 1;
            }
            if is_dir {
                let p = parent_of[&c];
                let dotdot = self.dir_lookup(c, b"..")?.map(|s| s.ino);
                if dotdot != Some(p) {
                    self.dir_retarget(c, b"..", p, FileType::Directory)?;
                    self.nofs.links_fixed += 1;
                }
            }
            if c != ROOT_INO {
                let mut want_bl = names.get(&c).cloned().unwrap_or_default();
                let mut have = self.backlinks_of(c)?;
                want_bl.sort_unstable();
                have.sort_unstable();
                let overflowed = have.contains(&backlinks::OVERFLOW);
                if !overflowed && have != want_bl {
                    self.set_backlinks(c, &want_bl)?;
                    self.nofs.links_fixed += 1;
                }
            }
        }
        self.nofs.inodes_valid += valid.len() as u64;

        // Sizes against mappings: a file maps no written block past its
        // size, a directory's size covers every block it maps (the inode
        // and a tree block below it were written in no order).
        for &c in &sorted {
            self.fit_size(c)?;
        }

        // 3. Data scanner: claims, conflicts, then bitmaps and counters.
        let mut claims = self.claim_blocks(&sorted)?;
        let mut punch: BTreeMap<Ino, BTreeSet<u32>> = BTreeMap::new();
        for _ in 0..4 {
            let cut = self.cut_conflicts(&claims, &mut punch)?;
            if cut == 0 {
                break;
            }
            claims = self.claim_blocks(&sorted)?;
        }
        self.rebuild_bitmaps(&claims, &valid, &cand)?;
        for (ino, lblks) in punch {
            if valid.contains(&ino) {
                self.punch_and_poison(ino, &lblks)?;
            }
        }
        let remap: Vec<Ino> = remap.into_iter().filter(|i| valid.contains(i)).collect();
        self.remap_from_records(&remap, &orphaned)?;
        self.update_sb_counters()?;
        Ok(())
    }

    /// Mark in use every block a candidate maps (data, tree, directory and
    /// attribute blocks, and the reserved inodes') and every block the
    /// owner table gives a file whose map is to be rebuilt (`remap`), so
    /// that an allocation before the bitmaps are rebuilt takes none.
    fn reserve_candidates_blocks(
        &mut self,
        cand: &BTreeMap<Ino, (bool, u32)>,
        remap: &[Ino],
    ) -> Result<()> {
        let all: Vec<Ino> = cand.keys().copied().collect();
        let mut blocks: Vec<u64> = self.claim_blocks(&all)?.into_keys().collect();
        for &ino in remap {
            if let Some(&(_, generation)) = cand.get(&ino) {
                blocks.extend(
                    self.proto
                        .blocks_owned_by(ino, generation)
                        .into_iter()
                        .map(|(_, pblk)| pblk),
                );
            }
        }
        blocks.sort_unstable();
        blocks.dedup();
        for b in blocks {
            if b < self.sbi.blocks_count && !self.block_in_use(b)? {
                self.set_blocks_in_use(b, 1, true)?;
            }
        }
        Ok(())
    }

    /// Whether an entry's file type (`ft`, 0 without the feature) is
    /// inode `c`'s: a name left from an earlier inode of that number may
    /// say another.
    pub(crate) fn entry_type_matches(&mut self, c: Ino, ft: u8) -> Result<bool> {
        if !self.sbi.has_filetype() || ft == 0 {
            return Ok(true);
        }
        let i = self.read_inode(c)?;
        Ok(FileType::from_mode(i.mode).is_some_and(|k| crate::dir::ft_of(k) == ft))
    }

    /// Whether `img`, read as a block of directory `d` (generation
    /// `generation`), is one: its checksum is seeded with `d`.
    fn dir_block_is_own(&self, d: Ino, generation: u32, img: &[u8]) -> bool {
        let n = img.len();
        if !self.seal.csum {
            return crate::dir::dirents(img, 0, d).all(|e| e.is_ok());
        }
        crate::dir::has_tail(img) && le32(img, n - 4) == self.seal.dir_csum(d, generation, img)
    }

    /// Whether slow symlink `ino`'s target block is the one its owner
    /// record names (the target was written with the inode).
    fn symlink_block_ok(&mut self, ino: Ino) -> Result<bool> {
        let i = self.read_inode(ino)?;
        let Some(m) = extent::lookup(&mut self.tree(ino)?, 0)? else {
            return Ok(false);
        };
        if m.lblk != 0 || m.unwritten {
            return Ok(false);
        }
        let img = self.block_image(m.pblk)?;
        let owner = BlockOwner {
            ino,
            generation: i.generation,
            lblk: 0,
        };
        Ok(self.proto_probe(m.pblk, owner, &img))
    }

    /// A regular file whose extent tree did not survive (the inode reached
    /// the disk, a tree block it names did not): its map is emptied now,
    /// and rebuilt from its owner records once the bitmaps are
    /// ([`Core::remap_from_records`]), when blocks can be allocated for
    /// the tree again.
    fn empty_map(&mut self, ino: Ino) -> Result<()> {
        let root = extent::empty_root();
        self.set_inode_bytes(ino, io::BLOCK, &root, InodeField::Blocks);
        Ok(())
    }

    /// Map every block the owner records give each of `inos` (within its
    /// size) that nothing else took: holes stay holes, as the file had
    /// them (and unwritten extents, which have no records, become holes,
    /// which read the same). An orphan among them (`orphaned`) that the
    /// table gives no block is one whose unlink freed them all: its size
    /// goes to 0.
    fn remap_from_records(&mut self, inos: &[Ino], orphaned: &HashSet<Ino>) -> Result<()> {
        // Every file's blocks are taken before any tree is built: a tree
        // block the inserts allocate must be none of them, this file's or
        // another's still to be remapped (two files whose trees were both
        // lost would otherwise trade a data block for a tree block).
        let mut plans = Vec::with_capacity(inos.len());
        for &ino in inos {
            let i = self.read_inode(ino)?;
            let end = i.size.div_ceil(self.bs as u64);
            let mut mine: Vec<(u32, u64)> = Vec::new();
            let mut doubt = BTreeSet::new();
            for (lblk, pblk) in self.proto.blocks_owned_by(ino, i.generation) {
                if u64::from(lblk) >= end || self.block_in_use(pblk)? {
                    continue;
                }
                // Records come sorted by logical block. Two that name the
                // same one (records the protocol failed to keep in step)
                // say nothing of which is the file's: neither is mapped
                // (both stay free), and the block reads EIO.
                if mine.last().is_some_and(|&(l, _)| l == lblk) || doubt.contains(&lblk) {
                    mine.retain(|&(l, _)| l != lblk);
                    doubt.insert(lblk);
                    continue;
                }
                mine.push((lblk, pblk));
            }
            for &(_, pblk) in &mine {
                self.set_blocks_in_use(pblk, 1, true)?;
            }
            plans.push((ino, mine, doubt));
        }
        for (ino, mine, doubt) in plans {
            if mine.is_empty() && orphaned.contains(&ino) {
                // No name reached it and the table on disk gives it no
                // block: the unlink that freed every one was in flight
                // (its inode did not reach the disk). What it held is
                // gone; it reads as nothing, not as zeros it never held.
                // A named file keeps its size: a truncate in flight ended
                // it there, and its unwritten extents read as zeros.
                self.set_size(ino, 0);
            }
            for (lblk, pblk) in mine {
                extent::insert(&mut self.tree(ino)?, lblk, pblk, 1, false)?;
            }
            if !doubt.is_empty() {
                self.punch_and_poison(ino, &doubt)?;
            }
            self.fix_iblocks(ino)?;
            self.nofs.maps_rebuilt += 1;
        }
        Ok(())
    }

    /// Settle who owns each directory block before names are read: a
    /// block that fails its directory's checksum but is another
    /// candidate's (another directory's by checksum, or a file's by its
    /// owner record and contents) is not this directory's, which is cut
    /// short before it (a directory that loses its first block is no
    /// candidate). A block nobody owns is left for the walk to reset.
    fn settle_dir_blocks(&mut self, cand: &mut BTreeMap<Ino, (bool, u32)>) -> Result<()> {
        let dirs: Vec<(Ino, u32)> = cand
            .iter()
            .filter(|(_, c)| c.0)
            .map(|(&d, c)| (d, c.1))
            .collect();
        let mut maps: HashMap<u64, Vec<(Ino, u32, u32)>> = HashMap::new();
        let bs = self.bs as u64;
        for &(d, generation) in &dirs {
            let size = self.read_inode(d)?.size;
            for m in extent::extents(&mut self.tree(d)?, 0..size.div_ceil(bs).max(1))? {
                if m.unwritten {
                    continue;
                }
                for k in 0..m.len {
                    maps.entry(m.pblk + k as u64)
                        .or_default()
                        .push((d, generation, m.lblk + k));
                }
            }
        }
        let mut cut: BTreeMap<Ino, u32> = BTreeMap::new();
        for (&b, owners) in &maps {
            let img = self.block_image(b)?;
            let own: Vec<bool> = owners
                .iter()
                .map(|&(d, g, _)| self.cache.is_dirty(b) || self.dir_block_is_own(d, g, &img))
                .collect();
            let mut someone = own.iter().any(|&o| o);
            if !someone {
                if let Some(o) = self.proto.block_owner(b) {
                    if cand
                        .get(&o.ino)
                        .is_some_and(|c| c.1 == o.generation && !c.0)
                    {
                        someone = self.proto_probe(b, o, &img);
                    }
                }
            }
            for (k, &(d, _, l)) in owners.iter().enumerate() {
                if !own[k] && someone {
                    let e = cut.entry(d).or_insert(l);
                    *e = (*e).min(l);
                }
            }
        }
        for (d, l) in cut {
            self.nofs.conflicts_cut += 1;
            if l == 0 {
                cand.remove(&d);
                continue;
            }
            extent::remove_range(&mut self.tree(d)?, l, LBLK_END - u64::from(l))?;
            self.set_size(d, u64::from(l) * bs);
            self.drop_dir_index(d);
        }
        Ok(())
    }

    /// The image of block `b` (cached, or read from the device without
    /// caching it: a block whose owner is in question must not be served
    /// to a reader from the cache unchecked).
    fn block_image(&mut self, b: u64) -> Result<Vec<u8>> {
        if let Some(img) = self.cache.snapshot(b) {
            return Ok(img.to_vec());
        }
        let mut buf = vec![0u8; self.bs as usize];
        self.dev.read(b, &mut buf, BlockClass::Data)?;
        Ok(buf)
    }

    /// Whether `img` at `b` is `o`'s by its owner record and contents.
    fn proto_probe(&mut self, b: u64, o: BlockOwner, img: &[u8]) -> bool {
        self.proto.check_block_read(o, b, img).is_ok()
    }

    /// Bring `c`'s size and mappings into agreement (see the caller).
    fn fit_size(&mut self, c: Ino) -> Result<()> {
        let i = self.read_inode(c)?;
        if !i.uses_extents() {
            return Ok(());
        }
        let bs = self.bs as u64;
        let maps = extent::extents(&mut self.tree(c)?, 0..LBLK_END)?;
        if i.is_dir() {
            let end = maps
                .iter()
                .filter(|m| !m.unwritten)
                .map(|m| u64::from(m.lblk) + u64::from(m.len))
                .max()
                .unwrap_or(0);
            if i.size < end * bs {
                self.set_size(c, end * bs);
                self.drop_dir_index(c);
                self.nofs.links_fixed += 1;
            }
            return Ok(());
        }
        let keep = i.size.div_ceil(bs);
        let past = maps
            .iter()
            .any(|m| !m.unwritten && u64::from(m.lblk) + u64::from(m.len) > keep);
        if past && keep < LBLK_END {
            extent::remove_range(&mut self.tree(c)?, keep as u32, LBLK_END - keep)?;
            self.nofs.conflicts_cut += 1;
        }
        Ok(())
    }

    /// Reset every block of directory `d` that is not its own to an empty
    /// one (the first to `.` and `..`), and index it afresh.
    fn repair_dir(&mut self, d: Ino, parent: Ino) -> Result<()> {
        let i = self.read_inode(d)?;
        if i.flags & io::FL_INDEX != 0 {
            self.dir_linearize(d)?;
        }
        let i = self.read_inode(d)?;
        let bs = self.bs as u64;
        let nblocks = i.size.div_ceil(bs);
        let maps = extent::extents(&mut self.tree(d)?, 0..nblocks.max(1))?;
        for m in maps.iter().filter(|m| !m.unwritten) {
            for k in 0..m.len as u64 {
                let l = m.lblk as u64 + k;
                let p = m.pblk + k;
                let img = self.read_block(p, BlockClass::Directory)?;
                let n = img.len();
                let csum_ok = !self.seal.csum
                    || self.cache.is_dirty(p)
                    || (crate::dir::has_tail(&img)
                        && le32(&img, n - 4) == self.seal.dir_csum(d, i.generation, &img));
                let parsed = crate::dir::parse_block(&img, p, d);
                let dots_ok = l != 0
                    || parsed.as_ref().is_ok_and(|e| {
                        e.len() >= 2 && e[0].name == b"." && e[0].ino == d && e[1].name == b".."
                    });
                drop(img);
                if csum_ok && parsed.is_ok() && dots_ok {
                    continue;
                }
                let fresh = if l == 0 {
                    self.new_dir_block(d, parent)
                } else {
                    self.empty_dir_block()
                };
                self.seal.owners.insert(
                    p,
                    Owner::Dir {
                        ino: d,
                        generation: i.generation,
                    },
                );
                self.init_block(
                    p,
                    BlockClass::Directory,
                    &fresh,
                    UpdateKind::DirBlockInit { dir: d },
                );
                self.csum_dir_block(p);
                self.nofs.dir_blocks_reset += 1;
            }
        }
        self.drop_dir_index(d);
        Ok(())
    }

    /// Keep one entry of each name in directory `d`. An unlink and a
    /// create of the same name that went to different blocks, unordered,
    /// can leave both entries on disk; the index holds only one of them,
    /// so the walk would never judge the other. The entry kept is the one
    /// whose inode is a candidate of the right type that names `d` back,
    /// the most recently created among those; the walk judges it as any
    /// other.
    fn dedup_names(&mut self, d: Ino, cand: &BTreeMap<Ino, (bool, u32)>) -> Result<()> {
        let pblks = self.dir_index(d)?.pblks.clone();
        let mut by_name: HashMap<Vec<u8>, Vec<crate::dir::Slot>> = HashMap::new();
        for (l, &p) in pblks.iter().enumerate() {
            if p == 0 {
                continue;
            }
            let img = self.read_block(p, BlockClass::Directory)?;
            let entries = crate::dir::parse_block(&img, p, d)?;
            drop(img);
            for e in entries.into_iter().filter(|e| e.ino != 0) {
                by_name.entry(e.name).or_default().push(crate::dir::Slot {
                    lblk: l as u32,
                    off: e.off as u16,
                    ino: e.ino,
                    ft: e.ft,
                });
            }
        }
        let mut dups: Vec<(Vec<u8>, Vec<crate::dir::Slot>)> =
            by_name.into_iter().filter(|(_, v)| v.len() > 1).collect();
        if dups.is_empty() {
            return Ok(());
        }
        dups.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, slots) in dups {
            let mut best: Option<(bool, (i64, u32), usize)> = None;
            for (k, s) in slots.iter().enumerate() {
                let valid = cand.contains_key(&s.ino) && self.entry_type_matches(s.ino, s.ft)? && {
                    let bl = self.backlinks_of(s.ino)?;
                    bl.contains(&d) || bl.contains(&backlinks::OVERFLOW)
                };
                let born = self
                    .read_inode(s.ino)
                    .map(|i| (i.crtime.sec, i.crtime.nsec))
                    .unwrap_or((i64::MIN, 0));
                let score = (valid, born, k);
                if best.is_none_or(|b| score > b) {
                    best = Some(score);
                }
            }
            let keep = best.expect("two entries at least").2;
            for (k, s) in slots.into_iter().enumerate() {
                if k != keep {
                    self.dir_remove_slot(d, &name, s)?;
                    self.nofs.entries_removed += 1;
                }
            }
        }
        self.drop_dir_index(d);
        Ok(())
    }

    /// Every block the valid inodes (and the kept reserved ones) map, with
    /// who claims it.
    fn claim_blocks(&mut self, valid: &[Ino]) -> Result<HashMap<u64, Vec<Claim>>> {
        let mut claims: HashMap<u64, Vec<Claim>> = HashMap::new();
        let mut add = |b: u64, c: Claim| claims.entry(b).or_default().push(c);
        for ino in [OWNER_TABLE_INO, JOURNAL_INO] {
            let i = self.read_inode(ino)?;
            if i.mode != 0 && i.uses_extents() {
                for (b, lblk) in self.mapped_blocks_of(ino)? {
                    add(
                        b,
                        Claim {
                            ino,
                            lblk,
                            strong: true,
                            data: false,
                            generation: 0,
                        },
                    );
                }
            }
        }
        let resize = self.read_inode(RESIZE_INO)?;
        if resize.mode != 0 && !resize.uses_extents() {
            let dind = le32(&resize.block, 13 * 4) as u64;
            if dind != 0 && dind < self.sbi.blocks_count {
                add(
                    dind,
                    Claim {
                        ino: RESIZE_INO,
                        lblk: u32::MAX,
                        strong: true,
                        data: false,
                        generation: 0,
                    },
                );
            }
        }
        for &ino in valid {
            let i = self.read_inode(ino)?;
            let acl = le32(&self.inode_raw(ino)?, io::FILE_ACL_LO) as u64;
            if acl != 0 && acl < self.sbi.blocks_count {
                add(
                    acl,
                    Claim {
                        ino,
                        lblk: XATTR_LBLK,
                        strong: true,
                        data: false,
                        generation: i.generation,
                    },
                );
            }
            if !i.uses_extents() {
                continue;
            }
            let is_data = i.is_reg() || i.is_symlink();
            for (b, lblk) in self.mapped_blocks_of(ino)? {
                let strong = if is_data && lblk < u32::MAX {
                    // A moving record (a shift in flight at the crash)
                    // names the file at whatever offset its tree gives.
                    self.proto.block_owner(b).is_some_and(|o| {
                        o.ino == ino
                            && o.generation == i.generation
                            && (o.lblk == lblk || o.lblk == crate::update::MOVING_LBLK)
                    })
                } else {
                    // Tree and directory blocks prove their owner by their
                    // checksums (checked when the inode became a candidate
                    // and when its directory was repaired).
                    true
                };
                add(
                    b,
                    Claim {
                        ino,
                        lblk,
                        strong,
                        data: is_data && lblk < u32::MAX,
                        generation: i.generation,
                    },
                );
            }
        }
        Ok(claims)
    }

    /// The blocks `ino` maps: tree blocks (`lblk` `u32::MAX`) and every
    /// mapped block, written or not, with its logical block.
    fn mapped_blocks_of(&mut self, ino: Ino) -> Result<Vec<(u64, u32)>> {
        let mut out = Vec::new();
        let summary = extent::check(&mut self.tree(ino)?)?;
        out.extend(summary.tree_blocks.iter().map(|&b| (b, u32::MAX)));
        for m in extent::extents(&mut self.tree(ino)?, 0..LBLK_END)? {
            for k in 0..m.len {
                out.push((m.pblk + k as u64, m.lblk + k));
            }
        }
        Ok(out)
    }

    /// Cut every file whose pointer is the losing claim of a block claimed
    /// twice short before that block; how many were cut.
    fn cut_conflicts(
        &mut self,
        claims: &HashMap<u64, Vec<Claim>>,
        punch: &mut BTreeMap<Ino, BTreeSet<u32>>,
    ) -> Result<u64> {
        let mut cut_at: BTreeMap<Ino, u32> = BTreeMap::new();
        for (&b, v) in claims.iter().filter(|(_, v)| v.len() > 1) {
            // Attribute blocks are shared by design.
            if v.iter().all(|c| c.lblk == XATTR_LBLK) {
                continue;
            }
            // A file's claim is as strong as its record *and* the block's
            // contents agree (a record may be stale: a freed block reused
            // as another file's tree or directory block keeps it).
            let mut verified = Vec::with_capacity(v.len());
            for c in v {
                let ok = if c.data && c.strong {
                    let img = self.block_image(b)?;
                    let o = BlockOwner {
                        ino: c.ino,
                        generation: c.generation,
                        lblk: c.lblk,
                    };
                    self.proto_probe(b, o, &img)
                } else {
                    c.strong
                };
                verified.push(ok);
            }
            let winner = verified.iter().position(|&s| s).unwrap_or(0);
            for (k, c) in v.iter().enumerate() {
                if k == winner {
                    continue;
                }
                if c.lblk >= XATTR_LBLK {
                    // A tree or attribute block lost: drop the whole file.
                    cut_at.insert(c.ino, 0);
                } else {
                    // A file block another file proves its own: unmapped
                    // once the bitmaps are rebuilt (the unmapping may
                    // need a tree block), and EIO from then on.
                    punch.entry(c.ino).or_default().insert(c.lblk);
                }
            }
        }
        let n = cut_at.len() as u64;
        for (ino, lblk) in cut_at {
            self.cut_file(ino, lblk)?;
            self.nofs.conflicts_cut += 1;
        }
        Ok(n)
    }

    /// Unmap `lblks` of `ino` (blocks another file owns: not freed) and
    /// make them read as EIO; a file that would need more poisoned blocks
    /// than a list holds is cut short at the first instead.
    fn punch_and_poison(&mut self, ino: Ino, lblks: &BTreeSet<u32>) -> Result<()> {
        let mut list = self.poisoned(ino)?;
        list.extend(lblks.iter().copied());
        list.sort_unstable();
        list.dedup();
        if list.len() > backlinks::POISON_MAX {
            let first = *lblks.iter().next().expect("not empty");
            extent::remove_range(&mut self.tree(ino)?, first, LBLK_END - u64::from(first))?;
            let size = u64::from(first) * self.bs as u64;
            if self.read_inode(ino)?.size > size {
                self.set_size(ino, size);
            }
            list.retain(|&l| l < first);
        } else {
            for &l in lblks {
                extent::remove_range(&mut self.tree(ino)?, l, 1)?;
            }
        }
        self.set_poisoned(ino, &list)?;
        self.fix_iblocks(ino)?;
        self.nofs.blocks_poisoned += lblks.len() as u64;
        Ok(())
    }

    /// Unmap `ino`'s blocks from `lblk` on (not freeing them: the bitmaps
    /// are rebuilt from the claims) and bring its size down to match.
    fn cut_file(&mut self, ino: Ino, lblk: u32) -> Result<()> {
        let i = self.read_inode(ino)?;
        if lblk == 0 && !i.is_reg() {
            // Not a file to cut: it goes with its names.
            self.set_links(ino, 0);
            let now = self.now().sec as u32;
            self.set_dtime(ino, now.max(1), InodeField::Dtime);
            return Ok(());
        }
        let root = extent::empty_root();
        let removed = if lblk == 0 {
            let before = self.mapped_blocks_of(ino).map(|v| v.len()).unwrap_or(0);
            self.set_inode_bytes(ino, io::BLOCK, &root, InodeField::Blocks);
            before as i64
        } else {
            let freed =
                extent::remove_range(&mut self.tree(ino)?, lblk, LBLK_END - u64::from(lblk))?;
            freed.iter().map(|&(_, n)| n as i64).sum()
        };
        let _ = removed;
        let size = u64::from(lblk) * self.bs as u64;
        if i.size > size {
            self.set_size(ino, size);
        }
        self.fix_iblocks(ino)?;
        Ok(())
    }

    /// Set `ino`'s `i_blocks` to what it maps.
    fn fix_iblocks(&mut self, ino: Ino) -> Result<()> {
        let i = self.read_inode(ino)?;
        // Without extents a valid inode maps nothing (a fast symlink, an
        // empty file, a device: the metadata scanner takes no other), but
        // may still have an attribute block, or have lost one.
        let mut n = if i.uses_extents() {
            self.mapped_blocks_of(ino)?.len() as i64
        } else {
            0
        };
        if le32(&self.inode_raw(ino)?, io::FILE_ACL_LO) != 0 {
            n += 1;
        }
        let have = (i.sectors / (self.bs as u64 / 512)) as i64;
        if have != n {
            self.add_iblocks(ino, n - have)?;
        }
        Ok(())
    }

    /// Bring every bitmap and counter to what the claims and the valid
    /// inodes say.
    fn rebuild_bitmaps(
        &mut self,
        claims: &HashMap<u64, Vec<Claim>>,
        valid: &HashSet<Ino>,
        cand: &BTreeMap<Ino, (bool, u32)>,
    ) -> Result<()> {
        let groups = self.group_count();
        let first_ino = self.sbi.first_ino.max(11);
        let total = self.sbi.blocks_count;
        let mut used = vec![false; total as usize];
        for (&b, v) in claims {
            if b < total {
                used[b as usize] = true;
                self.nofs.blocks_claimed += 1;
                if v.iter().all(|c| !c.strong) {
                    self.nofs.weak_claims += 1;
                }
            }
        }
        // Fixed metadata: superblock and descriptor copies (with the
        // reserved descriptor blocks), bitmaps, inode tables.
        let gdt = self.sbi.gdt_blocks() + u64::from(self.sbi.reserved_gdt_blocks);
        let itb = u64::from(self.sbi.inode_table_blocks());
        for g in 0..groups {
            let first = self.sbi.group_first_block(u64::from(g));
            if self.sbi.has_super(u64::from(g)) {
                for b in first..(first + 1 + gdt).min(total) {
                    used[b as usize] = true;
                }
            }
            let loc = self.groups[g as usize];
            used[loc.block_bitmap as usize] = true;
            used[loc.inode_bitmap as usize] = true;
            for b in loc.inode_table..(loc.inode_table + itb).min(total) {
                used[b as usize] = true;
            }
        }
        for b in u64::from(self.sbi.first_data_block)..total {
            let want = used[b as usize];
            if self.block_in_use(b)? != want {
                self.set_blocks_in_use(b, 1, want)?;
                self.nofs.block_bits_fixed += 1;
            }
        }
        for ino in 1..=self.sbi.inodes_count {
            let want = ino < first_ino || valid.contains(&ino);
            if self.inode_in_use(ino)? != want {
                self.set_inode_in_use(ino, want)?;
                self.nofs.inode_bits_fixed += 1;
            }
        }
        // Counters, absolutely (the on-disk ones were never ordered).
        let ipg = self.sbi.inodes_per_group;
        for g in 0..groups {
            let first = self.sbi.group_first_block(u64::from(g));
            let n = u64::from(self.sbi.blocks_in_group(u64::from(g)));
            let free_b = (first..first + n).filter(|&b| !used[b as usize]).count() as i64;
            let have = i64::from(self.group_free_blocks(g)?);
            if have != free_b {
                self.add_group_counter(g, CounterKind::FreeBlocks, free_b - have)?;
            }
            let inos = g * ipg + 1..=(g + 1) * ipg;
            let free_i = inos
                .clone()
                .filter(|&i| !(i < first_ino || valid.contains(&i)))
                .count() as i64;
            let have = i64::from(self.group_free_inodes(g)?);
            if have != free_i {
                self.add_group_counter(g, CounterKind::FreeInodes, free_i - have)?;
            }
            let dirs = inos
                .filter(|i| valid.contains(i) && cand.get(i).is_some_and(|c| c.0))
                .count() as i64;
            let have = i64::from(self.gd_count(g, gd::USED_DIRS_LO, gd::USED_DIRS_HI)?);
            if have != dirs {
                self.add_group_counter(g, CounterKind::UsedDirs, dirs - have)?;
            }
            if self.sbi.has_group_csum() {
                // No inode in use past the table's unused tail.
                let last_used = (g * ipg + 1..=(g + 1) * ipg)
                    .rev()
                    .find(|&i| i < first_ino || valid.contains(&i))
                    .map_or(0, |i| (i - 1) % ipg + 1);
                let unused = self.gd_count(g, gd::ITABLE_UNUSED_LO, gd::ITABLE_UNUSED_HI)?;
                let want = unused.min(ipg - last_used);
                if want != unused {
                    self.add_group_counter(
                        g,
                        CounterKind::ItableUnused,
                        i64::from(want) - i64::from(unused),
                    )?;
                }
            }
        }
        for &ino in valid {
            self.fix_iblocks(ino)?;
        }
        // Attribute blocks: the reference count is the inodes naming them.
        for (&b, v) in claims {
            if v.iter().all(|c| c.lblk == XATTR_LBLK) {
                self.xattr_set_refcount(b, v.len() as u32)?;
            }
        }
        for g in 0..groups {
            self.csum_block_bitmap(g);
            self.csum_inode_bitmap(g);
        }
        if self.sb32(crate::layout::sb::LAST_ORPHAN)? != 0 {
            self.set_sb(
                crate::layout::sb::LAST_ORPHAN,
                &0u32.to_le_bytes(),
                UpdateKind::Other,
            )?;
        }
        self.update_sb_counters()?;
        Ok(())
    }

    /// Rebuild every owner record from the tree (a table the protocol does
    /// not trust): each block a file maps is recorded as that file's, with
    /// the checksum of what it holds now. Trusts the tree, so it is right
    /// only for an image that was cleanly unmounted.
    pub(crate) fn rebuild_owner_records(&mut self) -> Result<()> {
        let first_ino = self.sbi.first_ino.max(11);
        let bs = self.bs as usize;
        let mut buf = vec![0u8; bs];
        for ino in (ROOT_INO..=self.sbi.inodes_count).filter(|&i| i >= first_ino) {
            if !self.itable_initialized(ino)? {
                continue;
            }
            let Ok(i) = self.read_inode(ino) else {
                continue;
            };
            if i.mode == 0 || i.links == 0 {
                continue;
            }
            let raw = self.inode_raw(ino)?;
            let acl = io::file_acl(&raw);
            if acl > u64::from(self.sbi.first_data_block) && acl < self.sbi.blocks_count {
                match self.cache.snapshot(acl) {
                    Some(img) => buf.copy_from_slice(&img),
                    None => self.dev.read(acl, &mut buf, BlockClass::Other)?,
                }
                let owner = BlockOwner {
                    ino,
                    generation: i.generation,
                    lblk: XATTR_LBLK,
                };
                self.proto.record_owner(acl, Some(owner), &buf);
                self.nofs.records_rebuilt += 1;
            }
            if !(i.is_reg() || i.is_symlink()) || !i.uses_extents() {
                continue;
            }
            for m in extent::extents(&mut self.tree(ino)?, 0..LBLK_END)? {
                if m.unwritten {
                    continue;
                }
                for k in 0..m.len {
                    let b = m.pblk + k as u64;
                    if b >= self.sbi.blocks_count {
                        continue;
                    }
                    match self.cache.snapshot(b) {
                        Some(img) => buf.copy_from_slice(&img),
                        None => self.dev.read(b, &mut buf, BlockClass::Data)?,
                    }
                    let owner = BlockOwner {
                        ino,
                        generation: i.generation,
                        lblk: m.lblk + k,
                    };
                    self.proto.record_owner(b, Some(owner), &buf);
                    self.nofs.records_rebuilt += 1;
                }
            }
        }
        Ok(())
    }

    /// Give every inode reachable from the root the backlinks its names
    /// say (an image whose backlinks ordo did not keep). Trusts the tree.
    pub(crate) fn rebuild_backlinks(&mut self) -> Result<()> {
        let mut names: BTreeMap<Ino, Vec<Ino>> = BTreeMap::new();
        let mut queue = VecDeque::from([ROOT_INO]);
        let mut seen = HashSet::from([ROOT_INO]);
        while let Some(d) = queue.pop_front() {
            let entries: Vec<(Vec<u8>, Ino, u8)> = self
                .dir_index(d)?
                .names
                .iter()
                .map(|(n, s)| (n.clone(), s.ino, s.ft))
                .collect();
            for (name, c, _) in entries {
                if name == b"." || name == b".." {
                    continue;
                }
                names.entry(c).or_default().push(d);
                if self.read_inode(c)?.is_dir() && seen.insert(c) {
                    queue.push_back(c);
                }
            }
        }
        self.backlinks_frozen = true;
        let r = (|| {
            for (c, mut want) in names {
                want.sort_unstable();
                let mut have = self.backlinks_of(c)?;
                have.sort_unstable();
                if have != want {
                    self.set_backlinks(c, &want)?;
                }
            }
            Ok(())
        })();
        self.backlinks_frozen = false;
        r
    }

    /// The owner table's blocks (reserved inode 5), created if the image
    /// has none; whether it was created. Empty: the protocol keeps none.
    pub(crate) fn ensure_owner_table(&mut self, was_clean: bool) -> Result<(bool, Vec<u64>)> {
        let want = self.proto.owner_table_blocks(self.sbi.blocks_count);
        if want == 0 {
            return Ok((false, Vec::new()));
        }
        let i = self.read_inode(OWNER_TABLE_INO)?;
        let mut created = false;
        if i.mode == 0 {
            if !was_clean {
                return Err(crate::error::FsError::Invalid(
                    "the image was not cleanly unmounted and has no owner table: \
                     run e2fsck, then mount it with mode=backpointers"
                        .into(),
                ));
            }
            let root = extent::empty_root();
            self.init_inode(
                OWNER_TABLE_INO,
                0o100600,
                &crate::types::Creds::root(),
                0,
                1,
                io::FL_EXTENTS,
                &root,
            )?;
            let mut lblk = 0u64;
            let mut goal = self.sbi.group_first_block(0);
            while lblk < want {
                let max = (want - lblk).min(u64::from(crate::layout::ext::MAX_INIT_LEN)) as u32;
                let (p, n) = self.alloc_blocks(goal, max)?;
                extent::insert(&mut self.tree(OWNER_TABLE_INO)?, lblk as u32, p, n, false)?;
                self.add_iblocks(OWNER_TABLE_INO, i64::from(n))?;
                lblk += u64::from(n);
                goal = p + u64::from(n);
            }
            self.set_size(OWNER_TABLE_INO, want * self.bs as u64);
            created = true;
        }
        let mut blocks = vec![0u64; want as usize];
        for m in extent::extents(&mut self.tree(OWNER_TABLE_INO)?, 0..want)? {
            for k in 0..m.len as u64 {
                let l = m.lblk as u64 + k;
                if l < want {
                    blocks[l as usize] = m.pblk + k;
                }
            }
        }
        if let Some(l) = blocks.iter().position(|&b| b == 0) {
            return Err(crate::error::FsError::corrupt(
                self.inode_loc(OWNER_TABLE_INO).0,
                "inode 5 (owner table) extents",
                format!("logical block {l} of {want} is not mapped"),
            ));
        }
        Ok((created, blocks))
    }
}

impl Shared {
    /// One batch of the background scan, `budget` inodes of the metadata
    /// scanner under the core's lock, and the rest of the scan (in a
    /// handle) once they are all examined. Returns whether there is more
    /// to do; not after a failure, which the first handle then meets and
    /// reports.
    pub(crate) fn scan_batch(&self, budget: u64) -> bool {
        let mut c = self.lock();
        if !c.scan_needed || c.read_only {
            return false;
        }
        match c.meta_scan_step(budget) {
            Ok(false) => true,
            Ok(true) => {
                let _ = c.scan_if_needed();
                let plans = self.take_plans(&mut c);
                drop(c);
                let _ = self.run(plans);
                false
            }
            Err(_) => false,
        }
    }
}
