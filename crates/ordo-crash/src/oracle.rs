//! The checks run on every crash state.
//!
//! 1. Recovery, as the protocol defines it (`docs/DESIGN.md`): for `async`
//!    and `sync` a repair of benign problems by ordo's fsck; anything it can
//!    not repair makes the state inconsistent. For the journaling protocols
//!    the mount's log replay followed by a clean unmount.
//! 2. `e2fsck -fn` on the recovered image (optional: it costs a process and
//!    a temporary file per state) must be clean, and ordo's fsck must agree.
//! 3. The recovered image mounts, read-only.
//! 4. Every promise logged before the crash point holds: data and size of
//!    fsynced files, names of new fsynced files, entries of fsynced
//!    directories, everything after `sync` and in the base. Operations after
//!    the promise and up to the one in flight may have changed a promised
//!    object: for each of them the oracle accepts any of the model's
//!    versions in that window, byte by byte, and nothing else.
//! 5. No file holds bytes never written to it: every byte of every reachable
//!    file is zero or what some version of that same file held at that
//!    offset; directory entries are names the directory had; symlinks
//!    point where they pointed.
//! 6. Protocol hooks ([`InvariantHook`]) add the protocol's own invariants:
//!    recovery is idempotent ([`RecoveryIdempotent`]) and, where the
//!    protocol promises it, the recovered tree is the model's after some
//!    operation ([`PrefixOfOperations`]) or after some prefix of each
//!    stream's operations ([`StreamPrefix`]).
//!
//! A protocol with `data_consistent_after_scan` (NoFS) has no recovery to
//! judge and promises no tree: its states go to [`crate::nofs`] instead.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use ordo_dev::{BlockDevice, MemDevice};
use ordo_fs::protocol::AfterCrash;
use ordo_fs::{FileType, Fs, Ino, ProtocolKind};

use crate::backend;
use crate::log::{apply_write, EventKind, LogEvent};
use crate::model::{content_hash, Listing, NodeData, NodeId, Shape, Tree};
use crate::pattern;
use crate::record::{Promised, Recording};
use crate::states::StateSpec;
use crate::workload::Op;

/// What is wrong with a state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailureClass {
    /// Recovery failed or left problems it can not repair.
    Recovery,
    /// The recovered image does not mount.
    Mount,
    /// `e2fsck -fn` found problems in the recovered image.
    E2fsck,
    /// ordo's fsck and e2fsck disagree about the recovered image.
    FsckDisagree,
    /// A promise does not hold.
    BrokenPromise,
    /// A file holds bytes never written to it, or a directory a name it
    /// never had.
    ForeignData,
    /// A protocol hook's invariant does not hold.
    Hook,
    /// ordo panicked on the state (a bug whatever the state).
    Panic,
    /// The kernel's recovery of the crash image (loop mount and unmount)
    /// differs from ordo's, or the kernel cannot recover it
    /// ([`crate::judge`]).
    KernelReplay,
    /// `e2fsck -fy`'s recovery of the crash image differs from ordo's
    /// beyond the documented difference, or e2fsck cannot recover it.
    E2fsckReplay,
}

impl FailureClass {
    /// Name in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            FailureClass::Recovery => "recovery",
            FailureClass::Mount => "mount",
            FailureClass::E2fsck => "e2fsck",
            FailureClass::FsckDisagree => "fsck_disagree",
            FailureClass::BrokenPromise => "broken_promise",
            FailureClass::ForeignData => "foreign_data",
            FailureClass::Hook => "hook",
            FailureClass::Panic => "panic",
            FailureClass::KernelReplay => "kernel_replay",
            FailureClass::E2fsckReplay => "e2fsck_replay",
        }
    }

    /// Whether the class makes the state *inconsistent* (as opposed to
    /// consistent but wrong about data).
    pub fn is_inconsistency(self) -> bool {
        matches!(
            self,
            FailureClass::Recovery
                | FailureClass::Mount
                | FailureClass::E2fsck
                | FailureClass::FsckDisagree
                | FailureClass::Panic
                | FailureClass::KernelReplay
                | FailureClass::E2fsckReplay
        )
    }

    /// Every class, in report order.
    pub const ALL: [FailureClass; 10] = [
        FailureClass::Recovery,
        FailureClass::Mount,
        FailureClass::E2fsck,
        FailureClass::FsckDisagree,
        FailureClass::BrokenPromise,
        FailureClass::ForeignData,
        FailureClass::Hook,
        FailureClass::Panic,
        FailureClass::KernelReplay,
        FailureClass::E2fsckReplay,
    ];
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Its class.
    pub class: FailureClass,
    /// What exactly (names the promise, file, offset, block).
    pub detail: String,
}

impl Failure {
    pub(crate) fn new(class: FailureClass, detail: impl Into<String>) -> Self {
        Failure {
            class,
            detail: detail.into(),
        }
    }
}

/// Something a check saw that is not a failure but is counted: a known,
/// documented behaviour of a tool nobody here wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Note {
    /// e2fsck abandoned its journal replay on a stale fast-commit HEAD
    /// (e2fsprogs bug, `docs/FORMAT.md`); the kernel's replay agreed with
    /// ordo's.
    E2fsckStaleFcHead,
    /// The crash image's superblock was torn: the kernel and e2fsck refuse
    /// it outright (ordo repairs it from the journal), so the judge had
    /// nothing to compare.
    JudgeTornSuperblock,
    /// e2fsck's fast-commit replay claimed a block twice: its tree was
    /// compared by shape only (names, inode numbers, types, sizes).
    E2fsckMultiplyClaimed,
    /// The log's last commit block was torn after its header: the kernel
    /// and ordo replay its transaction (the kernel's partial commit-block
    /// check), e2fsprogs 1.47.0 stops before it. The kernel's replay agreed
    /// with ordo's; e2fsck's difference is not counted.
    E2fsckTornCommit,
    /// NoFS (`crate::nofs`): a listed name's lookup was refused (ENOENT or
    /// EIO: a stale name), which the property allows.
    NofsLookupRefused,
    /// NoFS: a block of a reachable file (or a directory, a symlink) read
    /// EIO (its owner record disagrees), which the property allows.
    NofsReadEio,
    /// NoFS: the scanners linked an orphan back into a directory its
    /// backlinks name (as `#INO`).
    NofsOrphanRelinked,
    /// NoFS: the disk was filled and everything reached re-read.
    NofsDiskFilled,
    /// NoFS: the mount took the crash image for cleanly unmounted, so the
    /// scanners did not run (right for the base, which was; otherwise
    /// the allocation state on disk is trusted).
    NofsNoScan,
    /// NoFS: the scanners removed a directory entry (a stale name, a
    /// second name of a directory).
    NofsScanEntryRemoved,
    /// NoFS: the scanners reclaimed an inode no valid name reached.
    NofsScanInodeReclaimed,
    /// NoFS: the scanners corrected a link count, a `..` entry or a
    /// backlink list.
    NofsScanLinkFixed,
    /// NoFS: the scanners cut a file short at a block another file's
    /// owner record proves its own, or made such a block EIO.
    NofsScanConflictCut,
    /// NoFS: the scanners changed bits of the block or inode bitmaps (a
    /// leaked or a doubly used object).
    NofsScanBitsFixed,
    /// NoFS: the scanners rebuilt a file's map from its owner records
    /// (its extent tree did not survive).
    NofsScanMapRebuilt,
    /// e2fsck -fy's pass 3A rebuilt a directory of three blocks or more
    /// without an index (an optimisation, not a repair; the judge takes
    /// its size and freed blocks as ordo's).
    E2fsckRehashedDirs,
}

impl Note {
    /// Name in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Note::E2fsckStaleFcHead => "e2fsck_stale_fc_head",
            Note::JudgeTornSuperblock => "judge_torn_superblock",
            Note::E2fsckMultiplyClaimed => "e2fsck_multiply_claimed",
            Note::E2fsckTornCommit => "e2fsck_torn_commit",
            Note::NofsLookupRefused => "nofs_lookup_refused",
            Note::NofsReadEio => "nofs_read_eio",
            Note::NofsOrphanRelinked => "nofs_orphan_relinked",
            Note::NofsDiskFilled => "nofs_disk_filled",
            Note::NofsNoScan => "nofs_no_scan",
            Note::NofsScanEntryRemoved => "nofs_scan_entry_removed",
            Note::NofsScanInodeReclaimed => "nofs_scan_inode_reclaimed",
            Note::NofsScanLinkFixed => "nofs_scan_link_fixed",
            Note::NofsScanConflictCut => "nofs_scan_conflict_cut",
            Note::NofsScanBitsFixed => "nofs_scan_bits_fixed",
            Note::NofsScanMapRebuilt => "nofs_scan_map_rebuilt",
            Note::E2fsckRehashedDirs => "e2fsck_rehashed_dirs",
        }
    }
}

/// `v` if ordo's fsck found nothing at all (benign problems count),
/// otherwise every problem after `what`.
fn clean_or_err(v: backend::FsckVerdict, what: &str) -> Result<backend::FsckVerdict, String> {
    if v.is_clean() {
        return Ok(v);
    }
    let all: Vec<String> = v
        .unsafe_problems
        .iter()
        .chain(&v.benign_problems)
        .cloned()
        .collect();
    Err(format!("{what}: {}", all.join("; ")))
}

/// How to check.
#[derive(Clone, Copy, Debug)]
pub struct CheckParams {
    /// The protocol.
    pub mode: ProtocolKind,
    /// Its data mode.
    pub data: ordo_fs::DataMode,
    /// Run `e2fsck -fn` on this state.
    pub e2fsck: bool,
    /// Also recover the crash image with the kernel and `e2fsck -fy` and
    /// compare (only where [`crate::judge::applies_to`] the protocol).
    pub judge: bool,
}

/// What a hook sees.
pub struct HookContext<'a> {
    /// The recording.
    pub recording: &'a Recording,
    /// The state.
    pub state: &'a StateSpec,
    /// The recovered image.
    pub image: &'a Arc<MemDevice>,
    /// The recovered file system, mounted read-only.
    pub fs: &'a Fs,
    /// ordo's fsck verdict after recovery (what the repair changed).
    pub verdict: &'a backend::FsckVerdict,
}

/// A protocol's own invariant, checked on every state after the common
/// checks passed. Returns one message per violation.
pub trait InvariantHook: Send + Sync {
    /// Short name for reports.
    fn name(&self) -> &'static str;
    /// Check the invariant.
    fn check(&self, ctx: &HookContext) -> Vec<String>;
}

/// Recovery is idempotent: recovering the recovered image again changes
/// nothing (`docs/DESIGN.md`, invariants). Applies to every protocol.
pub struct RecoveryIdempotent {
    mode: ProtocolKind,
}

impl InvariantHook for RecoveryIdempotent {
    fn name(&self) -> &'static str {
        "recovery-idempotent"
    }
    fn check(&self, ctx: &HookContext) -> Vec<String> {
        if ctx.verdict.repairs.is_empty() && !self.mode.caps().log_replay {
            // Recovery wrote nothing, so a second one sees the same image.
            return Vec::new();
        }
        let copy = Arc::new(ctx.image.snapshot());
        if let Err(e) = recover(self.mode, ordo_fs::DataMode::Ordered, &copy) {
            return vec![format!("second recovery failed: {e}")];
        }
        let a = ctx.image.populated_blocks();
        let b = copy.populated_blocks();
        let changed: Vec<u64> = a
            .iter()
            .chain(&b)
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|&blk| match (ctx.image.block(blk), copy.block(blk)) {
                // A block the second recovery did not write is the same
                // shared image in both: no need to compare its bytes.
                (Some(x), Some(y)) => !Arc::ptr_eq(&x, &y) && x != y,
                (x, y) => x.is_some() != y.is_some(),
            })
            .collect();
        if changed.is_empty() {
            Vec::new()
        } else {
            vec![format!(
                "a second recovery rewrote block(s) {:?}",
                &changed[..changed.len().min(8)]
            )]
        }
    }
}

/// After recovery the tree is the model's after some operation: a prefix
/// of the workload survived the crash, and nothing of what followed it
/// (`Capabilities::prefix_after_crash`, the guarantee of OptFS's osync).
///
/// The recovered tree, walked from the root (every path with its kind, a
/// file's bytes, a symlink's target; not inode numbers, link counts,
/// attributes or times), must equal `snapshots[k]` for some `k` in
/// `lo..=j`: `j` is the operation in flight at the crash (its writes may
/// all have reached the disk, or none of the ones that matter), and `lo`
/// the operation after which the last promise before the crash was made
/// (0, the base, if none was). So a durability call (fsync, fdatasync,
/// dsync, sync) counts as making every operation before it durable, not
/// only its own file: on such a protocol it commits everything issued
/// before it (OptFS's fsync and dsync flush its one journal), and a crash
/// after it returns keeps at least that prefix.
///
/// An operation is one call of the library. A write larger than one FUSE
/// request (128 KiB), recorded through the mount, is several, and a crash
/// could keep part of it; no workload writes that much in one operation.
pub struct PrefixOfOperations;

impl InvariantHook for PrefixOfOperations {
    fn name(&self) -> &'static str {
        "prefix-of-operations"
    }
    fn check(&self, ctx: &HookContext) -> Vec<String> {
        let rec = ctx.recording;
        let (lo, j) = prefix_window(rec, ctx.state);
        let mut reader = Reader::new(ctx.fs);
        let (recovered, inos) = match recovered_listing(&mut reader) {
            Ok(l) => l,
            Err(e) => return vec![e],
        };
        // A file both have with other bytes: where they start to differ.
        let offset = |k: usize, path: &str| {
            let want = rec.snapshots[k].resolve(path)?;
            let want = rec.snapshots[k].node(want)?.content()?;
            let have = reader.file(*inos.get(path)?).ok()?;
            let at = have
                .iter()
                .zip(want.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(have.len().min(want.len()));
            Some(format!(" (bytes differ from offset {at})"))
        };
        prefix_mismatch(&recovered, lo, j, |k| rec.listing(k), offset)
            .into_iter()
            .collect()
    }
}

/// After recovery the tree is the model's after some prefix of *each
/// stream's* operations, closed under relations
/// (`Capabilities::stream_prefix_after_crash`, ccfs's guarantee): order is
/// kept within a stream, not across streams, except between related
/// operations.
///
/// The recovered tree, listed as [`PrefixOfOperations`] lists it, must
/// equal the tree of a valid candidate of [`crate::streams`]: a prefix of
/// each stream's tree-changing operations, applied in the order the
/// workload ran them, closed under relations (an operation kept with
/// every earlier operation of another stream it is related to: a path in
/// common, or a directory the earlier one made that a path of the later
/// one lies under), that the model can apply, keeping at most the
/// operations up to the one in flight (which may be in or out) and at
/// least what the promises returned before the crash require: a
/// `streamsync` every operation of its stream before it; an fsync,
/// fdatasync or dsync of a path its stream's operations before it and, of
/// every other stream, the operations up to its last one before the fsync
/// that touches the path (names it, or changes an entry of the directory
/// it names); `sync` every operation before it.
///
/// The candidates of a recording and the digests of their trees are
/// computed once and shared by its states; a state whose bounds leave more
/// than [`crate::streams::BOX_MAX`] tuples is not judged (no workload the
/// explorer makes comes near), nor is a recording in which ordo answered
/// ENOSPC (a failed operation changed nothing, which the candidates do
/// not know).
pub struct StreamPrefix;

impl InvariantHook for StreamPrefix {
    fn name(&self) -> &'static str {
        "stream-prefix"
    }
    fn check(&self, ctx: &HookContext) -> Vec<String> {
        let rec = ctx.recording;
        if rec.out_of_space > 0 {
            return Vec::new();
        }
        let j = ctx
            .state
            .op_in_flight(&rec.events)
            .min(rec.snapshots.len() - 1);
        let promised: Vec<usize> = promises_to_check(rec, ctx.state)
            .iter()
            .map(|&p| rec.promises[p].op)
            .filter(|&op| op > 0)
            .collect();
        let cands = rec.stream_candidates();
        let lo = cands.analysis().lower_bound(&promised);
        let hi = cands.analysis().prefix(j).clone();
        let mut reader = Reader::new(ctx.fs);
        let (recovered, inos) = match recovered_listing(&mut reader) {
            Ok(l) => l,
            Err(e) => return vec![e],
        };
        // A file both have with other bytes: where they start to differ.
        let offset = |tree: &Tree, path: &str| {
            let want = tree.node(tree.resolve(path)?)?.content()?;
            let have = reader.file(*inos.get(path)?).ok()?;
            let at = have
                .iter()
                .zip(want.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(have.len().min(want.len()));
            Some(format!(" (bytes differ from offset {at})"))
        };
        match cands.check(&recovered, &lo, &hi, offset) {
            crate::streams::Verdict::Mismatch(m) => vec![m],
            crate::streams::Verdict::Match(_) | crate::streams::Verdict::TooMany(_) => Vec::new(),
        }
    }
}

/// The operations `(lo, j)` whose trees a recovered state may be, for
/// [`PrefixOfOperations`]: `j` is the operation in flight, `lo` the one
/// after which the last promise logged before the crash was made (the
/// base's, op 0, if none was). `lo <= j` always holds for a recorded log
/// (a promise's mark is tagged with its operation); `lo` is capped at `j`
/// regardless.
fn prefix_window(rec: &Recording, state: &StateSpec) -> (usize, usize) {
    let j = state.op_in_flight(&rec.events).min(rec.snapshots.len() - 1);
    let lo = promises_to_check(rec, state)
        .iter()
        .map(|&p| rec.promises[p].op)
        .max()
        .unwrap_or(0);
    (lo.min(j), j)
}

/// The tree of a mounted (recovered) file system as [`PrefixOfOperations`]
/// and [`StreamPrefix`] compare it with the model's: every reachable path,
/// its kind, a file's bytes, a symlink's target.
pub fn tree_listing(fs: &Fs) -> Result<Listing, String> {
    recovered_listing(&mut Reader::new(fs)).map(|(l, _)| l)
}

/// The recovered tree as [`PrefixOfOperations`] compares it, and the
/// inode of each path.
fn recovered_listing(reader: &mut Reader) -> Result<(Listing, HashMap<String, Ino>), String> {
    let (reachable, errors) = walk(reader);
    if let Some(e) = errors.first() {
        return Err(format!("walking the recovered tree: {e}"));
    }
    let mut names = Vec::with_capacity(reachable.len());
    let mut inos = HashMap::with_capacity(reachable.len());
    for (path, ino, kind) in reachable {
        inos.insert(path.clone(), ino);
        let shape = match kind {
            FileType::Directory => Shape::Dir,
            FileType::Regular => {
                let data = reader.file(ino).map_err(|e| format!("{path}: {e}"))?;
                Shape::File {
                    len: data.len() as u64,
                    hash: content_hash(&data),
                }
            }
            FileType::Symlink => {
                let target = reader
                    .fs
                    .readlink(ino)
                    .map_err(|e| format!("{path}: readlink: {e}"))?;
                Shape::Symlink {
                    hash: content_hash(&target),
                }
            }
            _ => Shape::Other,
        };
        names.push((path, shape));
    }
    Ok((Listing::new(names), inos))
}

/// `None` if `recovered` is `snapshot(k)` for some `k` in `lo..=j`
/// (tried from `j` down, stopping at the first match; listings with a
/// different digest cost one comparison). Otherwise what is wrong, against
/// the two distinct trees of the window closest to it; `detail(k, path)`
/// may add to the description of a file whose bytes differ from op `k`'s.
fn prefix_mismatch<'a>(
    recovered: &Listing,
    lo: usize,
    j: usize,
    snapshot: impl Fn(usize) -> &'a Listing,
    mut detail: impl FnMut(usize, &str) -> Option<String>,
) -> Option<String> {
    if (lo..=j).rev().any(|k| snapshot(k).same(recovered)) {
        return None;
    }
    // (differences, -k) orders the closest first, the later op on a tie;
    // a tree equal to an earlier one's is left out (it is named by the
    // operation that made it).
    let mut closest: Vec<(usize, usize)> = Vec::new();
    let mut seen = HashSet::new();
    for k in lo..=j {
        let l = snapshot(k);
        if seen.insert(l.digest) {
            closest.push((recovered.diff(l).1, k));
        }
    }
    closest.sort_by_key(|&(n, k)| (n, std::cmp::Reverse(k)));
    let near: Vec<String> = closest
        .iter()
        .take(2)
        .map(|&(n, k)| {
            let (first, _) = recovered.diff(snapshot(k));
            let what = |s: Option<Shape>| s.map_or("nothing".to_string(), |s| s.to_string());
            match first {
                Some((path, have, want)) => {
                    let both_files = matches!(
                        (have, want),
                        (Some(Shape::File { .. }), Some(Shape::File { .. }))
                    );
                    let more = if both_files { detail(k, path) } else { None };
                    format!(
                        "op {k}: {n} path(s) differ, first {path}: recovered {}, model {}{}",
                        what(have),
                        what(want),
                        more.unwrap_or_default()
                    )
                }
                None => format!("op {k}: equal"),
            }
        })
        .collect();
    let ops = if lo == j {
        format!("op {j}")
    } else {
        format!("any of ops {lo}..={j}")
    };
    Some(format!(
        "the recovered tree is not the model's after {ops}; closest {}",
        near.join("; ")
    ))
}

/// The hooks of a protocol.
pub fn hooks_for(mode: ProtocolKind) -> Vec<Box<dyn InvariantHook>> {
    let mut hooks: Vec<Box<dyn InvariantHook>> = Vec::new();
    // A log-replaying mount stamps the superblock (mount count, times),
    // so its idempotence is checked on the replayed blocks by the log's
    // own tests, not block for block here.
    if !mode.caps().log_replay {
        hooks.push(Box::new(RecoveryIdempotent { mode }));
    }
    if mode.caps().prefix_after_crash {
        hooks.push(Box::new(PrefixOfOperations));
    }
    if mode.caps().stream_prefix_after_crash {
        hooks.push(Box::new(StreamPrefix));
    }
    hooks
}

/// Build the crash image of `state` (base + its writes, copy-on-write).
pub fn build_image(rec: &Recording, state: &StateSpec) -> Arc<MemDevice> {
    Arc::new(image_of(&rec.base, &rec.events, state))
}

/// The crash image of `state` of the write log `events` over `base`.
pub fn image_of(base: &MemDevice, events: &[LogEvent], state: &StateSpec) -> MemDevice {
    let image = base.snapshot();
    let torn_event = state.torn.as_ref().map(|t| t.event);
    let mut order: Vec<usize> = state.writes.clone();
    if let Some(t) = torn_event {
        order.push(t);
        order.sort_unstable();
    }
    for i in order {
        if let EventKind::Write(w) = &events[i].kind {
            let sectors = match &state.torn {
                Some(t) if t.event == i => Some(t.sectors.as_slice()),
                _ => None,
            };
            apply_write(&image, w, sectors);
        }
    }
    image
}

/// Run the protocol's recovery on `image` in place. `Ok` carries ordo's
/// fsck verdict on the recovered image (for comparison with e2fsck); `Err`
/// means recovery failed or left unsafe problems.
pub fn recover(
    mode: ProtocolKind,
    data: ordo_fs::DataMode,
    image: &Arc<MemDevice>,
) -> Result<backend::FsckVerdict, String> {
    if mode.caps().data_consistent_after_scan {
        // NoFS: no recovery pass. The scanners rebuild the allocation
        // state in memory, a clean unmount writes it, and then the image
        // must be clean with no repair at all.
        let dev: Arc<dyn BlockDevice> = image.clone();
        let fs = backend::mount(dev, mode, data, false)
            .map_err(|e| format!("mount with no recovery: {e}"))?;
        fs.scan_to_end().map_err(|e| format!("scan_to_end: {e}"))?;
        fs.unmount()
            .map_err(|e| format!("unmount after the scan: {e}"))?;
        return clean_or_err(
            backend::fsck(image.as_ref(), false)?,
            "problems after the scan and a clean unmount",
        );
    }
    match mode.caps().after_crash {
        AfterCrash::NoPromise | AfterCrash::ConsistentAfterRepair => {
            let v = backend::fsck(image.as_ref(), true)?;
            if !v.unsafe_problems.is_empty() {
                return Err(format!(
                    "unsafe problems (benign repair refused): {}",
                    v.unsafe_problems.join("; ")
                ));
            }
            if !v.benign_problems.is_empty() {
                return Err(format!(
                    "the benign repair left problems: {}",
                    v.benign_problems.join("; ")
                ));
            }
            Ok(v)
        }
        AfterCrash::ConsistentAfterReplay => {
            let dev: Arc<dyn BlockDevice> = image.clone();
            let fs = backend::mount(dev, mode, data, false)
                .map_err(|e| format!("mount with log replay: {e}"))?;
            fs.unmount()
                .map_err(|e| format!("unmount after replay: {e}"))?;
            // After replay the image must be clean with no repair at all
            // (docs/DESIGN.md): benign problems count too.
            clean_or_err(
                backend::fsck(image.as_ref(), false)?,
                "problems after log replay",
            )
        }
    }
}

/// Check one state: build its image, recover, run every oracle. The image
/// after recovery is returned for `--keep`.
pub fn check_state(
    rec: &Recording,
    state: &StateSpec,
    params: &CheckParams,
    hooks: &[Box<dyn InvariantHook>],
) -> (Vec<Failure>, Arc<MemDevice>) {
    let (f, _, image) = check_state_noted(rec, state, params, hooks);
    (f, image)
}

/// [`check_state`], with the notes the checks took.
pub fn check_state_noted(
    rec: &Recording,
    state: &StateSpec,
    params: &CheckParams,
    hooks: &[Box<dyn InvariantHook>],
) -> (Vec<Failure>, Vec<Note>, Arc<MemDevice>) {
    let image = build_image(rec, state);
    let mut notes = Vec::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_image(rec, state, params, hooks, &image, &mut notes)
    }));
    let failures = match result {
        Ok(f) => f,
        Err(p) => vec![Failure::new(FailureClass::Panic, panic_message(p))],
    };
    (failures, notes, image)
}

/// What a caught panic said.
pub(crate) fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

fn check_image(
    rec: &Recording,
    state: &StateSpec,
    params: &CheckParams,
    hooks: &[Box<dyn InvariantHook>],
    image: &Arc<MemDevice>,
    notes: &mut Vec<Note>,
) -> Vec<Failure> {
    // NoFS: no recovery pass, the scanners, then data consistency rather
    // than the repair verdicts and tree checks below (`crate::nofs`).
    if params.mode.caps().data_consistent_after_scan {
        return crate::nofs::check_image(rec, state, params, image, notes);
    }
    let mut out = Vec::new();
    let judge = params.judge && crate::judge::applies_to(params.mode);
    // The crash image as the crash left it, for the second judge.
    let crash = judge.then(|| image.snapshot());
    let verdict = match recover(params.mode, params.data, image) {
        Ok(v) => v,
        Err(e) => {
            out.push(Failure::new(FailureClass::Recovery, e));
            // The judge still says whether the kernel would have recovered
            // the crash image to what ordo's recovery left.
            if let Some(crash) = &crash {
                judge_into(crash, image, params.mode, &mut out, notes);
            }
            if params.e2fsck {
                // Record whether e2fsck agrees the state is broken.
                if let Ok(true) = e2fsck_clean(image) {
                    out.push(Failure::new(
                        FailureClass::FsckDisagree,
                        "e2fsck -fn finds the image clean but ordo's recovery failed",
                    ));
                }
            }
            return out;
        }
    };
    if params.e2fsck {
        match e2fsck_clean(image) {
            Ok(true) => {
                if !verdict.is_clean() {
                    out.push(Failure::new(
                        FailureClass::FsckDisagree,
                        format!(
                            "e2fsck -fn is clean, ordo fsck still reports: {}",
                            verdict.benign_problems.join("; ")
                        ),
                    ));
                }
            }
            Ok(false) => {
                out.push(Failure::new(
                    FailureClass::E2fsck,
                    "e2fsck -fn reports problems in the recovered image",
                ));
                if verdict.is_clean() {
                    out.push(Failure::new(
                        FailureClass::FsckDisagree,
                        "ordo fsck finds the recovered image clean, e2fsck -fn does not",
                    ));
                }
            }
            Err(e) => out.push(Failure::new(FailureClass::E2fsck, e)),
        }
    }
    if let Some(crash) = &crash {
        judge_into(crash, image, params.mode, &mut out, notes);
    }
    let fs = match backend::mount(image.clone(), params.mode, params.data, true) {
        Ok(fs) => fs,
        Err(e) => {
            out.push(Failure::new(
                FailureClass::Mount,
                format!("read-only mount: {e}"),
            ));
            return out;
        }
    };
    let j = state.op_in_flight(&rec.events);
    let mut reader = Reader::new(&fs);
    // ext4's data=writeback makes no promise about unpromised data: a
    // crash may expose a freed block's old contents in a file (the
    // metadata committed before the data was written).
    let stale_data_allowed =
        params.mode.caps().stale_data_with_writeback && params.data == ordo_fs::DataMode::Writeback;
    out.extend(check_foreign(rec, j, stale_data_allowed, &mut reader));
    for p in promises_to_check(rec, state) {
        out.extend(check_promise(rec, p, j, &mut reader));
    }
    if out.is_empty() {
        let ctx = HookContext {
            recording: rec,
            state,
            image,
            fs: &fs,
            verdict: &verdict,
        };
        for h in hooks {
            for msg in h.check(&ctx) {
                out.push(Failure::new(
                    FailureClass::Hook,
                    format!("{}: {msg}", h.name()),
                ));
            }
        }
    }
    out
}

/// Run the kernel / e2fsck judge on a state and add what it found.
fn judge_into(
    crash: &MemDevice,
    recovered: &Arc<MemDevice>,
    mode: ProtocolKind,
    out: &mut Vec<Failure>,
    notes: &mut Vec<Note>,
) {
    let v = crate::judge::judge(crash, recovered, mode);
    for d in v.kernel {
        out.push(Failure::new(FailureClass::KernelReplay, d));
    }
    for d in v.e2fsck {
        out.push(Failure::new(FailureClass::E2fsckReplay, d));
    }
    if v.e2fsck_stale_head {
        notes.push(Note::E2fsckStaleFcHead);
    }
    if v.torn_superblock {
        notes.push(Note::JudgeTornSuperblock);
    }
    if v.e2fsck_multiply_claimed {
        notes.push(Note::E2fsckMultiplyClaimed);
    }
    if v.e2fsck_torn_commit {
        notes.push(Note::E2fsckTornCommit);
    }
    if v.e2fsck_rehashed_dirs {
        notes.push(Note::E2fsckRehashedDirs);
    }
}

/// Where temporary images go: memory (`/dev/shm`) when there is one, so
/// that e2fsck's input never touches a disk.
fn scratch_dir() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The promises a state must keep, minus those a later one subsumes: a
/// promise covering everything (`sync`, the base) made after operation `q`
/// checks every object that existed at `q` against the window `q..=j`,
/// which is stricter than any earlier promise's wider window, and an
/// earlier promise's object that is gone by `q` is skipped by that promise
/// anyway. So checking starts at the last such promise.
pub(crate) fn promises_to_check(rec: &Recording, state: &StateSpec) -> Vec<usize> {
    let mut promises = vec![0];
    promises.extend(state.promises(&rec.events));
    let last_all = promises
        .iter()
        .rposition(|&p| rec.promises[p].what == Promised::All)
        .unwrap_or(0);
    promises.split_off(last_all)
}

/// Write the image to a temporary file and run `e2fsck -fn` on it.
pub fn e2fsck_clean(image: &MemDevice) -> Result<bool, String> {
    let dir = scratch_dir();
    let file = tempfile::Builder::new()
        .prefix("ordo-crash-")
        .suffix(".img")
        .tempfile_in(&dir)
        .map_err(|e| format!("temporary image: {e}"))?;
    backend::write_image(image, file.path())
        .map_err(|e| format!("writing temporary image: {e}"))?;
    let out = std::process::Command::new("e2fsck")
        .args(["-fn"])
        .arg(file.path())
        .output()
        .map_err(|e| format!("running e2fsck: {e}"))?;
    match out.status.code() {
        Some(0) => Ok(true),
        Some(c) if c & 8 != 0 => Err(format!(
            "e2fsck operational error (exit {c}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        _ => Ok(false),
    }
}

/// A directory as read back: name -> (inode, type).
type Entries = BTreeMap<Vec<u8>, (Ino, FileType)>;

/// Reads of the recovered file system, cached per state.
struct Reader<'a> {
    fs: &'a Fs,
    files: HashMap<Ino, Result<Arc<Vec<u8>>, String>>,
    dirs: HashMap<Ino, Result<Entries, String>>,
}

/// Bound on entries read from one directory (a corrupted directory can not
/// make the oracle loop).
const DIR_ENTRIES_MAX: usize = 100_000;

impl<'a> Reader<'a> {
    fn new(fs: &'a Fs) -> Self {
        Reader {
            fs,
            files: HashMap::new(),
            dirs: HashMap::new(),
        }
    }

    fn file(&mut self, ino: Ino) -> Result<Arc<Vec<u8>>, String> {
        let fs = self.fs;
        self.files
            .entry(ino)
            .or_insert_with(|| {
                let attr = fs.getattr(ino).map_err(|e| format!("getattr: {e}"))?;
                if attr.kind != FileType::Regular {
                    return Err(format!("inode {ino} is a {:?}", attr.kind));
                }
                if attr.size > 1 << 26 {
                    return Err(format!("size {} is beyond anything written", attr.size));
                }
                crate::read::whole_file(fs, ino, attr.size).map(Arc::new)
            })
            .clone()
    }

    /// Every extended attribute of `ino` (as a privileged caller sees them).
    fn xattrs(&mut self, ino: Ino) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, String> {
        let names = self
            .fs
            .listxattr(ino, true)
            .map_err(|e| format!("listxattr: {e}"))?;
        let mut out = BTreeMap::new();
        for n in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            let v = self
                .fs
                .getxattr(ino, n)
                .map_err(|e| format!("getxattr {}: {e}", String::from_utf8_lossy(n)))?;
            out.insert(n.to_vec(), v);
        }
        Ok(out)
    }

    fn dir(&mut self, ino: Ino) -> Result<Entries, String> {
        let fs = self.fs;
        self.dirs
            .entry(ino)
            .or_insert_with(|| {
                let entries = crate::read::dir_entries(fs, ino, DIR_ENTRIES_MAX)
                    .map_err(|e| format!("directory inode {ino}: {e}"))?;
                Ok(entries
                    .into_iter()
                    .map(|e| (e.name, (e.ino, e.kind)))
                    .collect::<BTreeMap<_, _>>())
            })
            .clone()
    }
}

/// Everything reachable from the root: (path, inode, type).
fn walk(reader: &mut Reader) -> (Vec<(String, Ino, FileType)>, Vec<String>) {
    let mut out = vec![("/".to_string(), ordo_fs::ROOT_INO, FileType::Directory)];
    let mut errors = Vec::new();
    let mut visited = HashSet::from([ordo_fs::ROOT_INO]);
    let mut i = 0;
    while i < out.len() {
        let (path, ino, kind) = out[i].clone();
        i += 1;
        if kind != FileType::Directory {
            continue;
        }
        match reader.dir(ino) {
            Ok(entries) => {
                for (name, (cino, ckind)) in entries {
                    let p = if path == "/" {
                        format!("/{}", String::from_utf8_lossy(&name))
                    } else {
                        format!("{path}/{}", String::from_utf8_lossy(&name))
                    };
                    if ckind == FileType::Directory && !visited.insert(cino) {
                        errors.push(format!("directory inode {cino} reachable twice ({p})"));
                        continue;
                    }
                    out.push((p, cino, ckind));
                }
            }
            Err(e) => errors.push(format!("{path}: {e}")),
        }
    }
    (out, errors)
}

/// The model nodes that had inode `ino` at some point in snapshots
/// `0..=j`, with every version of them in that range.
fn candidates(rec: &Recording, ino: Ino, j: usize) -> Vec<(NodeId, Vec<&crate::model::Node>)> {
    rec.versions_of(ino, j.min(rec.snapshots.len() - 1))
}

/// Fast path of the byte checks: `data` is wholly one of `contents` (zeros
/// past that version's end), so no byte-by-byte search is needed.
fn is_one_version(data: &[u8], contents: &[&Arc<Vec<u8>>]) -> bool {
    contents.iter().any(|c| {
        let n = c.len().min(data.len());
        data[..n] == c[..n] && ordo_dev::is_zero(&data[n..])
    })
}

fn describe_bytes(data: &[u8], off: usize) -> String {
    match pattern::decode(data, 0, off as u64) {
        Some(o) => format!(
            "bytes written by model file {} (write {}) for offset {}",
            o.file_id, o.write_seq, o.offset
        ),
        None => format!(
            "unrecognized bytes {:02x?}",
            &data[off..(off + 8).min(data.len())]
        ),
    }
}

/// Oracle 5: no foreign or stale bytes, entries or targets anywhere.
fn check_foreign(
    rec: &Recording,
    j: usize,
    stale_data_allowed: bool,
    reader: &mut Reader,
) -> Vec<Failure> {
    let mut out = Vec::new();
    let (reachable, errors) = walk(reader);
    for e in errors {
        out.push(Failure::new(FailureClass::ForeignData, e));
    }
    for (path, ino, kind) in reachable {
        let cands = candidates(rec, ino, j);
        if cands.is_empty() {
            out.push(Failure::new(
                FailureClass::ForeignData,
                format!("{path}: inode {ino} never belonged to any file of the workload"),
            ));
            continue;
        }
        let versions: Vec<&crate::model::Node> =
            cands.iter().flat_map(|(_, v)| v).copied().collect();
        match kind {
            FileType::Regular => {
                let contents: Vec<&Arc<Vec<u8>>> =
                    versions.iter().filter_map(|n| n.content()).collect();
                if contents.is_empty() {
                    out.push(Failure::new(
                        FailureClass::ForeignData,
                        format!("{path}: inode {ino} is a regular file, the model's is not"),
                    ));
                    continue;
                }
                let data = match reader.file(ino) {
                    Ok(d) => d,
                    Err(e) => {
                        out.push(Failure::new(
                            FailureClass::ForeignData,
                            format!("{path}: {e}"),
                        ));
                        continue;
                    }
                };
                let max_len = contents.iter().map(|c| c.len()).max().unwrap_or(0);
                if data.len() > max_len {
                    out.push(Failure::new(
                        FailureClass::ForeignData,
                        format!(
                            "{path}: size {} is larger than any size the file had ({max_len})",
                            data.len()
                        ),
                    ));
                }
                if stale_data_allowed {
                    continue;
                }
                if let Some(off) = (!is_one_version(&data, &contents))
                    .then(|| {
                        data.iter().enumerate().position(|(o, &b)| {
                            b != 0 && !contents.iter().any(|c| c.get(o) == Some(&b))
                        })
                    })
                    .flatten()
                {
                    out.push(Failure::new(
                        FailureClass::ForeignData,
                        format!(
                            "{path}: offset {off} holds {} never written there",
                            describe_bytes(&data, off)
                        ),
                    ));
                }
            }
            FileType::Directory => {
                if let Ok(entries) = reader.dir(ino) {
                    for name in entries.keys() {
                        if !rec.had_entry(ino, name, j) {
                            out.push(Failure::new(
                                FailureClass::ForeignData,
                                format!(
                                    "{path}: entry '{}' the directory never had",
                                    String::from_utf8_lossy(name)
                                ),
                            ));
                        }
                    }
                }
            }
            FileType::Symlink => {
                let targets: Vec<&Vec<u8>> = versions
                    .iter()
                    .filter_map(|n| match &n.data {
                        NodeData::Symlink { target } => Some(target),
                        _ => None,
                    })
                    .collect();
                match reader.fs.readlink(ino) {
                    Ok(t) if targets.contains(&&t) => {}
                    Ok(t) => out.push(Failure::new(
                        FailureClass::ForeignData,
                        format!(
                            "{path}: symlink target '{}' was never written",
                            String::from_utf8_lossy(&t)
                        ),
                    )),
                    Err(e) => out.push(Failure::new(
                        FailureClass::ForeignData,
                        format!("{path}: readlink: {e}"),
                    )),
                }
            }
            other => out.push(Failure::new(
                FailureClass::ForeignData,
                format!("{path}: unexpected file type {other:?}"),
            )),
        }
    }
    out
}

/// The window a promise is judged against: the snapshots from the
/// promise's to the crash, with the operations between them, which is what
/// a checker needs to tell a change the crash may have left half done from
/// one that cannot have happened.
pub(crate) struct Window<'a> {
    /// The snapshots from the promise's to the one after the operation in
    /// flight at the crash.
    pub(crate) trees: &'a [Arc<Tree>],
    /// The operations from the promise's on: `ops[k - 1]` ran between
    /// `trees[k - 1]` and `trees[k]`.
    ops: &'a [Op],
    /// Whether the crash came after the promise's operation: the window
    /// then ends with the operation in flight.
    past: bool,
    /// The operation in flight at the crash, when it came after the
    /// promise.
    partial: Option<&'a Op>,
}

impl<'a> Window<'a> {
    /// The window of the promise made after op `p`, judged when op `j` was
    /// in flight.
    pub(crate) fn of(rec: &'a Recording, p: usize, j: usize) -> Window<'a> {
        let end = j.max(p).min(rec.snapshots.len() - 1);
        Window {
            trees: &rec.snapshots[p..=end],
            ops: rec.sequence.ops.get(p..).unwrap_or_default(),
            past: j > p,
            partial: (j > p).then(|| rec.sequence.ops.get(j - 1)).flatten(),
        }
    }

    /// The operation between `trees[k - 1]` and `trees[k]`.
    pub(crate) fn op(&self, k: usize) -> Option<&'a Op> {
        (1..self.trees.len())
            .contains(&k)
            .then(|| self.ops.get(k - 1))
            .flatten()
    }

    /// Whether the operation in flight at the crash, if it came after the
    /// promise, writes data into `node`.
    pub(crate) fn in_flight_writes_to(&self, node: NodeId) -> bool {
        self.partial
            .is_some_and(|op| writes_to_at(op, self.trees, self.trees.len() - 1, node))
    }

    /// Whether any operation of the window wrote bytes into block `lblk`
    /// (of `bs` bytes) of `node`, whatever bytes they were.
    pub(crate) fn writes_block(&self, node: NodeId, lblk: u64, bs: u64) -> bool {
        (1..self.trees.len()).any(|k| {
            self.op(k)
                .is_some_and(|op| writes_block_at(op, self.trees, k, node, lblk, bs))
        })
    }
}

/// Oracle 4: promise `idx` holds.
fn check_promise(rec: &Recording, idx: usize, j: usize, reader: &mut Reader) -> Vec<Failure> {
    let promise = &rec.promises[idx];
    let w = Window::of(rec, promise.op, j);
    let win = w.trees;
    // The writes a crash may leave split: the operation in flight, when the
    // window extends past the promise; through FUSE, every write of the
    // window, since the kernel sends one write as several requests and no
    // file system can make those one unit (an unsynced `pwrite` on the
    // kernel's ext4 may also be left at a page boundary).
    let split: Vec<(usize, &Op)> = (1..win.len())
        .filter(|&k| rec.through_fuse || k == win.len() - 1)
        .filter(|_| w.past)
        .filter_map(|k| w.op(k).map(|op| (k, op)))
        .collect();
    let at = &win[0];
    let broken = |d: String| {
        Failure::new(
            FailureClass::BrokenPromise,
            format!("{}: {d}", promise.label),
        )
    };
    let mut out = Vec::new();
    match &promise.what {
        Promised::All => {
            for (path, node) in at.walk() {
                match at.node(node).map(|n| &n.data) {
                    Some(NodeData::File { .. }) => out.extend(
                        check_file(win, node, &path, None, &split, reader)
                            .into_iter()
                            .map(&broken),
                    ),
                    Some(NodeData::Dir { .. }) => {
                        out.extend(check_dir(win, node, &path, reader).into_iter().map(&broken))
                    }
                    _ => {}
                }
            }
        }
        Promised::File { node, name, .. } => {
            out.extend(
                check_file(win, *node, "", name.as_ref(), &split, reader)
                    .into_iter()
                    .map(&broken),
            );
        }
        Promised::Dir { node } => {
            out.extend(check_dir(win, *node, "", reader).into_iter().map(&broken));
        }
        // What one stream of several did: the stream-prefix hook checks
        // it, where the protocol keeps order per stream.
        Promised::Stream { .. } => {}
    }
    out
}

/// A promised file: size and bytes are one of the window's versions (byte
/// by byte), and the covered name still names it if no later operation
/// changed that entry.
fn check_file(
    win: &[Arc<Tree>],
    node: NodeId,
    path: &str,
    name: Option<&(NodeId, Vec<u8>)>,
    split: &[(usize, &Op)],
    reader: &mut Reader,
) -> Vec<String> {
    let mut out = Vec::new();
    let versions: Vec<&crate::model::Node> = match win.iter().map(|t| t.node(node)).collect() {
        Some(v) => v,
        // Removed by a later operation in flight: nothing left to promise.
        None => return out,
    };
    let ino = versions[0].ino;
    let what = if path.is_empty() {
        format!("inode {ino}")
    } else {
        format!("{path} (inode {ino})")
    };
    // One entry per distinct content: a window holds a snapshot per
    // operation, most of them sharing the file's content.
    let mut contents: Vec<&Arc<Vec<u8>>> = Vec::new();
    for c in versions.iter().filter_map(|n| n.content()) {
        if !contents.iter().any(|d| Arc::ptr_eq(d, c) || d == &c) {
            contents.push(c);
        }
    }
    match reader.file(ino) {
        Err(e) => out.push(format!("{what}: {e}")),
        Ok(data) => {
            // A write may be split in several requests (FUSE sends at most
            // a page or `max_write` per request), each of which may have
            // reached the disk: any size between the sizes before and after
            // it is one a crash can leave (`split`: which writes).
            let len_at = |k: usize| win[k].node(node).and_then(|n| n.content()).map(|c| c.len());
            let split_ranges: Vec<std::ops::RangeInclusive<usize>> = split
                .iter()
                .filter(|(k, op)| writes_to_at(op, win, *k, node))
                .filter_map(|&(k, _)| match (len_at(k - 1), len_at(k)) {
                    (Some(b), Some(a)) => Some(b.min(a)..=b.max(a)),
                    _ => None,
                })
                .collect();
            let size_ok = contents.iter().any(|c| c.len() == data.len())
                || split_ranges.iter().any(|r| r.contains(&data.len()));
            if !size_ok {
                let sizes: Vec<usize> = contents.iter().map(|c| c.len()).collect();
                out.push(format!(
                    "{what}: size {} but promised {:?}",
                    data.len(),
                    dedup(sizes)
                ));
            }
            if let Some(off) = (!is_one_version(&data, &contents))
                .then(|| {
                    data.iter().enumerate().position(|(o, &b)| {
                        !contents.iter().any(|c| c.get(o).copied().unwrap_or(0) == b)
                    })
                })
                .flatten()
            {
                let promised = contents[0].get(off).copied().unwrap_or(0);
                out.push(format!(
                    "{what}: offset {off} holds {} (promised byte {promised:#04x})",
                    describe_bytes(&data, off)
                ));
            }
        }
    }
    // Its extended attributes (ACLs included) are those of one version.
    match reader.xattrs(ino) {
        Err(e) => out.push(format!("{what}: {e}")),
        Ok(have) => {
            if !versions.iter().any(|n| n.xattrs == have) {
                let names = |m: &BTreeMap<Vec<u8>, Vec<u8>>| {
                    m.iter()
                        .map(|(k, v)| format!("{}={}B", String::from_utf8_lossy(k), v.len()))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                out.push(format!(
                    "{what}: attributes [{}] but promised [{}]",
                    names(&have),
                    names(&versions[versions.len() - 1].xattrs)
                ));
            }
        }
    }
    if let Some((parent, entry)) = name {
        let stable = win.iter().all(|t| {
            t.node(*parent)
                .and_then(|p| p.entries())
                .and_then(|e| e.get(entry))
                == Some(&node)
        });
        if stable {
            let pino = win[0].node(*parent).map(|p| p.ino).unwrap_or(0);
            match reader.dir(pino) {
                Ok(entries) => match entries.get(entry) {
                    Some((i, _)) if *i == ino => {}
                    Some((i, _)) => out.push(format!(
                        "name '{}' names inode {i}, not {ino}",
                        String::from_utf8_lossy(entry)
                    )),
                    None => out.push(format!(
                        "name '{}' of {what} is missing from its directory",
                        String::from_utf8_lossy(entry)
                    )),
                },
                Err(e) => out.push(format!("parent of {what}: {e}")),
            }
        }
    }
    out
}

/// Whether `op`, the operation between `win[k - 1]` and `win[k]`, writes
/// to `node`.
pub(crate) fn writes_to_at(op: &Op, win: &[Arc<Tree>], k: usize, node: NodeId) -> bool {
    let path = match op {
        Op::Write { path, .. } | Op::Append { path, .. } => path,
        _ => return false,
    };
    k >= 1 && k < win.len() && win[k - 1].resolve(path) == Some(node)
}

/// Whether `op`, the operation between `win[k - 1]` and `win[k]`, writes
/// bytes into block `lblk` (of `bs` bytes) of `node`, whatever bytes they
/// are.
pub(crate) fn writes_block_at(
    op: &Op,
    win: &[Arc<Tree>],
    k: usize,
    node: NodeId,
    lblk: u64,
    bs: u64,
) -> bool {
    if !writes_to_at(op, win, k, node) {
        return false;
    }
    let (off, len) = match op {
        Op::Write { off, len, .. } => (*off, *len),
        Op::Append { len, .. } => {
            let size = win[k - 1]
                .node(node)
                .and_then(|n| n.content())
                .map(|c| c.len() as u64);
            match size {
                Some(size) => (size, *len),
                // Not a file before: it wrote somewhere, say anywhere.
                None => return true,
            }
        }
        _ => return false,
    };
    len > 0 && off < (lblk + 1) * bs && off + len > lblk * bs
}

pub(crate) fn dedup(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v.dedup();
    v
}

/// A promised directory: every entry it had is there (unless a later
/// operation in the window changed that entry), and every entry it has is
/// one the window knows.
fn check_dir(win: &[Arc<Tree>], node: NodeId, path: &str, reader: &mut Reader) -> Vec<String> {
    let mut out = Vec::new();
    let versions: Vec<&crate::model::Node> = match win.iter().map(|t| t.node(node)).collect() {
        Some(v) => v,
        None => return out,
    };
    let ino = versions[0].ino;
    let what = if path.is_empty() {
        format!("directory inode {ino}")
    } else {
        format!("{path} (inode {ino})")
    };
    let entries = match reader.dir(ino) {
        Ok(e) => e,
        Err(e) => {
            out.push(format!("{what}: {e}"));
            return out;
        }
    };
    let ino_in = |t: &Tree, id: NodeId| t.node(id).map(|n| n.ino);
    let Some(first) = versions[0].entries() else {
        return out;
    };
    for (name, &child) in first {
        let stable = win.iter().all(|t| {
            t.node(node)
                .and_then(|n| n.entries())
                .and_then(|e| e.get(name))
                == Some(&child)
        });
        if !stable {
            continue;
        }
        let want = ino_in(&win[0], child).unwrap_or(0);
        match entries.get(name) {
            Some((i, _)) if *i == want => {}
            Some((i, _)) => out.push(format!(
                "{what}: entry '{}' names inode {i}, promised {want}",
                String::from_utf8_lossy(name)
            )),
            None => out.push(format!(
                "{what}: entry '{}' is missing",
                String::from_utf8_lossy(name)
            )),
        }
    }
    for (name, (i, _)) in &entries {
        let known = win.iter().any(|t| {
            t.node(node)
                .and_then(|n| n.entries())
                .and_then(|e| e.get(name))
                .and_then(|&c| ino_in(t, c))
                == Some(*i)
        });
        if !known {
            out.push(format!(
                "{what}: entry '{}' -> inode {i} was never there after the promise",
                String::from_utf8_lossy(name)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::preset;

    /// The listings of the trees after each of `ops`, on the preset tree
    /// (`[0]` the base).
    fn snapshots(ops: &[Op]) -> Vec<Listing> {
        let mut t = Tree::new();
        let mut serial = 0;
        for op in preset() {
            serial += 1;
            t.apply(&op, serial).unwrap();
        }
        let mut out = vec![t.listing()];
        for op in ops {
            serial += 1;
            t.apply(op, serial).unwrap();
            out.push(t.listing());
        }
        out
    }

    fn rename(src: &str, dst: &str) -> Op {
        Op::Rename {
            src: src.into(),
            dst: dst.into(),
        }
    }

    fn write(path: &str) -> Op {
        Op::Write {
            path: path.into(),
            off: 0,
            len: 4096,
        }
    }

    #[test]
    fn a_prefix_matches_and_anything_else_is_named() {
        let ops = [rename("/A/bar", "/C/bar"), write("/foo"), Op::Sync];
        let snaps = snapshots(&ops);
        let at = |k: usize| &snaps[k];
        // Every snapshot is a prefix of itself, within the window.
        let none = |_: usize, _: &str| None;
        for (k, l) in snaps.iter().enumerate() {
            assert_eq!(prefix_mismatch(l, 0, 3, at, none), None);
            assert_eq!(prefix_mismatch(l, k, k, at, none), None);
        }
        // Below `lo` (a promise after op 2): the base no longer counts.
        let msg = prefix_mismatch(&snaps[0], 2, 3, at, none).unwrap();
        assert!(msg.contains("ops 2..=3"), "{msg}");
        assert!(
            msg.contains("op 2: 3 path(s) differ, first /A/bar"),
            "{msg}"
        );
        // Op 2's write without op 1's rename: no operation's tree. The
        // closest trees are named (op 2's, equal to op 3's, once).
        let mut names = snaps[0].names.clone();
        let foo = snaps[2].names.iter().find(|(p, _)| p == "/foo").unwrap();
        for n in names.iter_mut().filter(|(p, _)| p == "/foo") {
            n.1 = foo.1;
        }
        let torn = Listing::new(names);
        let msg = prefix_mismatch(&torn, 0, 3, at, |k, p| Some(format!(" <{k} {p}>"))).unwrap();
        assert!(msg.contains("any of ops 0..=3"), "{msg}");
        assert!(msg.contains("op 0: 1 path(s) differ, first /foo"), "{msg}");
        assert!(msg.contains(" <0 /foo>"), "{msg}");
        assert!(
            msg.contains("op 2: 2 path(s) differ, first /A/bar"),
            "{msg}"
        );
        assert!(!msg.contains("op 3"), "{msg}");
    }
}
