//! A second judge: the kernel's and e2fsck's own recovery of a crash image,
//! compared with ordo's.
//!
//! For protocols whose log the kernel replays (`journal`, `fast_commit`),
//! ordo's recovery claims to do what the kernel would. On a sample of
//! states the explorer takes the crash image *before* ordo touches it and
//! recovers two more copies:
//!
//! 1. **the kernel**: the image on a loop device, mounted read-write as
//!    ext4 (the kernel replays the journal and its fast commits, processes
//!    orphans), then unmounted;
//! 2. **e2fsck**: `e2fsck -fy` on the image (it replays the journal itself,
//!    then checks and repairs).
//!
//! Each result is read back through ordo (read-only) and compared with
//! ordo's recovered image: the tree (every path, its inode number, type,
//! size, link count, contents or target) and the allocation bitmaps (every
//! block and inode marked in use). A difference is a failure of its own
//! class (`kernel_replay`, `e2fsck_replay`): the crash image is one the
//! kernel can recover, so ordo must recover it to the same file system.
//!
//! One difference is documented and allowed (`docs/CRASH.md`): e2fsck
//! replays a fast-commit UNLINK by removing the name only and then
//! reconnects the still-allocated inode to `lost+found`. For fast-commit
//! images the e2fsck comparison therefore skips `lost+found`, requires
//! every extra inode of e2fsck's result to be one it reconnected there,
//! and every extra block to belong to one of those inodes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ordo_dev::{BlockClass, BlockDevice, MemDevice};
use ordo_format::group::{
    uninit_block_bitmap, uninit_inode_bitmap, BG_BLOCK_UNINIT, BG_INODE_UNINIT,
};
use ordo_format::superblock::{super_block_nr, super_offset, SUPERBLOCK_SIZE};
use ordo_format::{bitmap, Superblock};
use ordo_fs::{DataMode, FileType, Fs, Ino, ProtocolKind, ROOT_INO};

use crate::backend;
use crate::backend::write_image;

/// One object of a recovered tree, as the judge compares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Obj {
    /// Inode number.
    pub ino: Ino,
    /// Type.
    pub kind: FileType,
    /// Size in bytes.
    pub size: u64,
    /// Link count.
    pub nlink: u32,
    /// Contents (regular files) or target (symlinks), hashed; 0 otherwise.
    pub content: u64,
}

/// What is allocated: blocks and inodes marked in use by the bitmaps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    /// Blocks in use.
    pub blocks: BTreeSet<u64>,
    /// Inodes in use.
    pub inodes: BTreeSet<u32>,
}

/// A recovered file system as the judge sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// path -> object, `/` included.
    pub tree: BTreeMap<String, Obj>,
    /// inode -> blocks it holds (`i_blocks`, in file-system blocks, extent
    /// tree included).
    pub held: BTreeMap<Ino, u64>,
    /// The bitmaps.
    pub alloc: Allocation,
    /// Directories without an htree index (`EXT4_INDEX_FL`).
    pub linear_dirs: BTreeSet<Ino>,
}

/// Bound on what the judge reads from one file (the explorer's files are
/// small; a corrupted size must not make it read gigabytes).
const FILE_BYTES_MAX: u64 = 1 << 26;

fn hash(bytes: &[u8]) -> u64 {
    // FNV-1a: no dependency, stable across runs.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A walked tree: path -> object, and inode -> blocks it holds.
pub type Walked = (BTreeMap<String, Obj>, BTreeMap<Ino, u64>);

/// Walk a mounted file system: every reachable path, and the blocks each
/// inode holds.
pub fn tree_of(fs: &Fs) -> Result<Walked, String> {
    let sectors_per_block = u64::from(fs.block_size() / 512).max(1);
    let mut held = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut stack = vec![("/".to_string(), ROOT_INO)];
    let mut seen_dirs = BTreeSet::from([ROOT_INO]);
    while let Some((path, ino)) = stack.pop() {
        let attr = fs
            .getattr(ino)
            .map_err(|e| format!("{path}: getattr: {e}"))?;
        let content = match attr.kind {
            FileType::Regular => {
                if attr.size > FILE_BYTES_MAX {
                    return Err(format!("{path}: size {} too large", attr.size));
                }
                let data = crate::read::whole_file(fs, ino, attr.size)
                    .map_err(|e| format!("{path}: {e}"))?;
                hash(&data)
            }
            FileType::Symlink => hash(
                &fs.readlink(ino)
                    .map_err(|e| format!("{path}: readlink: {e}"))?,
            ),
            _ => 0,
        };
        held.insert(ino, attr.blocks / sectors_per_block);
        out.insert(
            path.clone(),
            Obj {
                ino,
                kind: attr.kind,
                size: attr.size,
                nlink: attr.nlink,
                content,
            },
        );
        if attr.kind != FileType::Directory {
            continue;
        }
        let entries =
            crate::read::dir_entries(fs, ino, 100_000).map_err(|e| format!("{path}: {e}"))?;
        for e in entries {
            let child = if path == "/" {
                format!("/{}", String::from_utf8_lossy(&e.name))
            } else {
                format!("{path}/{}", String::from_utf8_lossy(&e.name))
            };
            if e.kind == FileType::Directory && !seen_dirs.insert(e.ino) {
                return Err(format!("{child}: directory reachable twice"));
            }
            stack.push((child, e.ino));
        }
    }
    Ok((out, held))
}

/// The blocks and inodes the bitmaps mark in use (uninitialised groups as
/// the kernel reads them).
pub fn allocation_of(dev: &dyn BlockDevice) -> Result<Allocation, String> {
    let read = |b: u64| backend::read_raw_block(dev, b);
    let (sb, descs) = backend::raw_groups(dev)?;
    let mut alloc = Allocation::default();
    for (g, desc) in (0u64..).zip(&descs) {
        let bbm = if desc.has_flag(BG_BLOCK_UNINIT) {
            uninit_block_bitmap(&sb, g, desc)
        } else {
            read(desc.block_bitmap)?
        };
        let first_block = sb.group_first_block(g);
        for i in 0..sb.blocks_in_group(g) as usize {
            if bitmap::test(&bbm, i) {
                alloc.blocks.insert(first_block + i as u64);
            }
        }
        let ibm = if desc.has_flag(BG_INODE_UNINIT) {
            uninit_inode_bitmap(&sb)
        } else {
            read(desc.inode_bitmap)?
        };
        for i in 0..sb.inodes_per_group as usize {
            if bitmap::test(&ibm, i) {
                alloc
                    .inodes
                    .insert(g as u32 * sb.inodes_per_group + i as u32 + 1);
            }
        }
    }
    Ok(alloc)
}

/// Read a recovered image through ordo (read-only, no replay: the image is
/// clean) and its bitmaps.
pub fn recovered_of(dev: Arc<dyn BlockDevice>, mode: ProtocolKind) -> Result<Recovered, String> {
    let alloc = allocation_of(dev.as_ref())?;
    let fs = backend::mount(dev, mode, DataMode::Ordered, true)
        .map_err(|e| format!("read-only mount: {e}"))?;
    let (tree, held) = tree_of(&fs)?;
    let mut linear_dirs = BTreeSet::new();
    for o in tree.values().filter(|o| o.kind == FileType::Directory) {
        let attr = fs
            .getattr(o.ino)
            .map_err(|e| format!("getattr {}: {e}", o.ino))?;
        if attr.flags & ordo_format::inode::flags::INDEX == 0 {
            linear_dirs.insert(o.ino);
        }
    }
    Ok(Recovered {
        tree,
        held,
        alloc,
        linear_dirs,
    })
}

/// A temporary copy of a crash image, in memory (`/dev/shm`) when there is
/// one.
struct TempImage {
    _file: tempfile::NamedTempFile,
    path: PathBuf,
}

impl TempImage {
    fn of(image: &MemDevice) -> Result<TempImage, String> {
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let file = tempfile::Builder::new()
            .prefix("ordo-judge-")
            .suffix(".img")
            .tempfile_in(dir)
            .map_err(|e| format!("temporary image: {e}"))?;
        let path = file.path().to_path_buf();
        write_image(image, &path).map_err(|e| format!("writing temporary image: {e}"))?;
        Ok(TempImage { _file: file, path })
    }

    fn load(&self, block_size: u32) -> Result<Arc<MemDevice>, String> {
        let bytes = std::fs::read(&self.path).map_err(|e| format!("reading back: {e}"))?;
        MemDevice::from_image(block_size, &bytes)
            .map(Arc::new)
            .map_err(|e| format!("reading back: {e}"))
    }
}

fn run(cmd: &mut Command) -> Result<std::process::Output, String> {
    cmd.output()
        .map_err(|e| format!("running {:?}: {e}", cmd.get_program()))
}

/// The kernel's recovery of `crash`: loop mount read-write, unmount.
pub fn kernel_recover(crash: &MemDevice) -> Result<Arc<MemDevice>, String> {
    let img = TempImage::of(crash)?;
    let mount = ordo_dev::KernelMount::mount_temp(&img.path, "rw")
        .map_err(|e| format!("the kernel cannot mount the crash image: {e}"))?;
    mount.unmount().map_err(|e| format!("kernel umount: {e}"))?;
    img.load(crash.block_size())
}

/// e2fsck's recovery of `crash`: `e2fsck -fy` (journal replay, then check
/// and repair). Returns the image and e2fsck's output.
pub fn e2fsck_recover(crash: &MemDevice) -> Result<(Arc<MemDevice>, String), String> {
    let img = TempImage::of(crash)?;
    // No optional rewrites: only what recovery and repair need.
    let out = run(Command::new("e2fsck")
        .args(["-fy", "-E", "no_optimize_extents"])
        .arg(&img.path))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    match out.status.code() {
        // 0: clean; 1: errors corrected (a journal replay counts as one).
        Some(0) | Some(1) => Ok((img.load(crash.block_size())?, text)),
        c => Err(format!(
            "e2fsck -fy exit {c:?}: {}",
            text.lines().rev().take(6).collect::<Vec<_>>().join(" / ")
        )),
    }
}

fn diff_trees(
    ours: &BTreeMap<String, Obj>,
    theirs: &BTreeMap<String, Obj>,
    skip: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let keys: BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    for k in keys {
        if skip(k) {
            continue;
        }
        match (ours.get(k), theirs.get(k)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => out.push(format!("{k}: ordo {a:?}, theirs {b:?}")),
            (Some(_), None) => out.push(format!("{k}: only in ordo's recovery")),
            (None, Some(_)) => out.push(format!("{k}: missing from ordo's recovery")),
            (None, None) => {}
        }
    }
    out
}

fn diff_sets<T: Ord + Copy + std::fmt::Display>(
    what: &str,
    ours: &BTreeSet<T>,
    theirs: &BTreeSet<T>,
) -> Vec<String> {
    let only_ours: Vec<String> = ours
        .difference(theirs)
        .take(8)
        .map(|x| x.to_string())
        .collect();
    let only_theirs: Vec<String> = theirs
        .difference(ours)
        .take(8)
        .map(|x| x.to_string())
        .collect();
    let mut out = Vec::new();
    if !only_ours.is_empty() {
        out.push(format!(
            "{what} in use after ordo's recovery only: {}",
            only_ours.join(", ")
        ));
    }
    if !only_theirs.is_empty() {
        out.push(format!(
            "{what} in use after theirs only: {}",
            only_theirs.join(", ")
        ));
    }
    out
}

/// Compare ordo's recovery with the kernel's: everything must agree.
pub fn compare_kernel(ours: &Recovered, kernel: &Recovered) -> Vec<String> {
    let mut out = diff_trees(&ours.tree, &kernel.tree, |_| false);
    out.extend(diff_sets(
        "block(s)",
        &ours.alloc.blocks,
        &kernel.alloc.blocks,
    ));
    out.extend(diff_sets(
        "inode(s)",
        &ours.alloc.inodes,
        &kernel.alloc.inodes,
    ));
    out
}

fn in_lost_found(path: &str) -> bool {
    path == "/lost+found" || path.starts_with("/lost+found/")
}

/// Compare ordo's recovery with e2fsck's. With `fc_unlinked` (a
/// fast-commit image: the inodes the replayed fast commits UNLINK) e2fsck
/// may differ where its UNLINK replay does: it removes the name only, so an
/// inode ordo's replay freed stays allocated with its blocks, and e2fsck
/// reconnects it to `lost+found`, or, when a later CREAT of the log reused
/// its number, the new file inherits the old size and blocks. Those inodes
/// (in `lost+found`, or named in `fc_unlinked`) and no more blocks than
/// they hold are the only allowed difference; everything ordo's recovery
/// has in use must be in use in e2fsck's too.
pub fn compare_e2fsck(
    ours: &Recovered,
    e2fsck: &Recovered,
    fc_unlinked: Option<&BTreeSet<Ino>>,
) -> Vec<String> {
    let Some(unlinked) = fc_unlinked else {
        return compare_kernel(ours, e2fsck);
    };
    let mut out = diff_trees(&ours.tree, &e2fsck.tree, |p| {
        in_lost_found(p)
            || [&ours.tree, &e2fsck.tree]
                .iter()
                .any(|t| t.get(p).is_some_and(|o| unlinked.contains(&o.ino)))
    });
    let reconnected: BTreeSet<Ino> = e2fsck
        .tree
        .iter()
        .filter(|(p, o)| p.starts_with("/lost+found/") && ours.tree.get(*p) != Some(*o))
        .map(|(_, o)| o.ino)
        .collect();
    let allowed_inodes: BTreeSet<u32> = reconnected.iter().chain(unlinked).copied().collect();
    let theirs_inodes: BTreeSet<u32> = e2fsck
        .alloc
        .inodes
        .difference(&allowed_inodes)
        .copied()
        .collect();
    let ours_inodes: BTreeSet<u32> = ours
        .alloc
        .inodes
        .difference(&allowed_inodes)
        .copied()
        .collect();
    out.extend(diff_sets("inode(s)", &ours_inodes, &theirs_inodes));
    // e2fsck's fast-commit replay rebuilds a touched inode's extent tree
    // from scratch, so its index blocks may sit elsewhere than the
    // kernel's and ordo's (who keep them): blocks are compared by count.
    // A block ordo's recovery leaks, or one it frees while in use, still
    // shows: the counts no longer balance.
    let only_ours = ours.alloc.blocks.difference(&e2fsck.alloc.blocks).count() as i64;
    let only_theirs = e2fsck.alloc.blocks.difference(&ours.alloc.blocks).count() as i64;
    let held = |set: &BTreeSet<Ino>| -> i64 {
        set.iter()
            .map(|i| e2fsck.held.get(i).copied().unwrap_or(0) as i64)
            .sum()
    };
    let from_lost_found = held(&reconnected);
    let from_reused = held(&unlinked.difference(&reconnected).copied().collect());
    let extra = only_theirs - only_ours;
    // Exactly what the reconnected inodes hold; at most that plus what the
    // reused ones hold (their new incarnation may hold blocks of its own).
    let ok = if unlinked.is_empty() {
        extra == from_lost_found
    } else {
        extra >= 0 && extra <= from_lost_found + from_reused
    };
    if !ok {
        out.push(format!(
            "blocks in use: {only_ours} only after ordo's recovery, {only_theirs} only after e2fsck's; the {} inode(s) e2fsck reconnected to lost+found hold {from_lost_found}, the unlinked ones {from_reused}",
            reconnected.len()
        ));
    }
    out
}

/// The inodes the valid fast commits of a crash image UNLINK.
pub fn fc_unlinked(crash: &MemDevice) -> BTreeSet<Ino> {
    match ordo_fs::fc_replay::fc_state(crash) {
        Ok(Some(st)) => st
            .scan
            .tags
            .iter()
            .filter_map(|t| match t {
                ordo_format::fc::Tag::Unlink(d) => Some(d.ino),
                _ => None,
            })
            .collect(),
        _ => BTreeSet::new(),
    }
}

/// Whether the judge applies to a protocol: the kernel replays its log.
pub fn applies_to(mode: ProtocolKind) -> bool {
    mode.caps().kernel_replays
}

/// Whether the crash image was made with fast commits (the ext4
/// superblock's `fast_commit` feature): e2fsprogs' fast-commit replay has
/// the known faults the comparisons below make room for.
pub fn has_fast_commits(crash: &MemDevice) -> bool {
    let bs = crash.block_size();
    use ordo_format::superblock::{super_block_nr, super_offset};
    let (blk, off) = (super_block_nr(bs), super_offset(bs));
    let mut buf = vec![0u8; bs as usize];
    if crash
        .read(blk, &mut buf, ordo_dev::BlockClass::Super)
        .is_err()
    {
        return false;
    }
    ordo_format::Superblock::decode(&buf[off..off + 1024]).is_ok_and(|s| {
        s.features
            .has_compat(ordo_format::features::compat::FAST_COMMIT)
    })
}

/// What the judge found on one state.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Differences between ordo's recovery and the kernel's (or why the
    /// kernel could not recover).
    pub kernel: Vec<String>,
    /// Differences between ordo's recovery and e2fsck's.
    pub e2fsck: Vec<String>,
    /// e2fsck's recovery differs only because of e2fsprogs' stale
    /// fast-commit HEAD bug (`docs/FORMAT.md`): the crash image's
    /// fast-commit area starts with a HEAD of an already committed
    /// transaction, which the kernel skips and e2fsck 1.47 takes for a
    /// corrupt journal, abandoning the whole replay. Not a failure of
    /// ordo's; counted apart.
    pub e2fsck_stale_head: bool,
    /// The crash image's primary superblock does not verify (a torn write
    /// of it, `--torn`): the kernel and e2fsck refuse such an image (e2fsck
    /// points at a backup superblock) while ordo repairs it from the
    /// journal's committed copy. Nothing to compare; counted apart.
    pub torn_superblock: bool,
    /// e2fsck's own replay claimed a block twice ("Multiply-claimed");
    /// only the shape of its tree was compared.
    pub e2fsck_multiply_claimed: bool,
    /// e2fsck's recovery differs only because the log ends in a commit
    /// block torn after its header, which the kernel (and ordo) replay
    /// and e2fsprogs 1.47.0 does not (`docs/CRASH.md`). Counted apart.
    pub e2fsck_torn_commit: bool,
    /// e2fsck's pass 3A rebuilt a big directory without an index
    /// ([`forgive_dir_rehash`]); its size and freed blocks were taken as
    /// ordo's. Counted apart.
    pub e2fsck_rehashed_dirs: bool,
}

/// Compare only names, inode numbers, types and sizes (outside
/// `lost+found` and the inodes the log unlinks).
pub fn compare_shapes(
    ours: &Recovered,
    theirs: &Recovered,
    unlinked: &BTreeSet<Ino>,
) -> Vec<String> {
    let shape = |t: &BTreeMap<String, Obj>| -> BTreeMap<String, (Ino, FileType, u64)> {
        t.iter()
            .filter(|(p, o)| !in_lost_found(p) && !unlinked.contains(&o.ino))
            .map(|(p, o)| (p.clone(), (o.ino, o.kind, o.size)))
            .collect()
    };
    let (a, b) = (shape(&ours.tree), shape(&theirs.tree));
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("{k}: ordo {:?}, theirs {:?}", a.get(k), b.get(k)))
        .collect()
}

/// Whether the primary superblock of an image verifies (magic, checksum).
pub fn superblock_verifies(dev: &MemDevice) -> bool {
    let bs = dev.block_size() as usize;
    let mut buf = vec![0u8; bs];
    if dev
        .read(super_block_nr(bs as u32), &mut buf, BlockClass::Super)
        .is_err()
    {
        return false;
    }
    let off = super_offset(bs as u32);
    Superblock::decode(&buf[off..off + SUPERBLOCK_SIZE]).is_ok()
}

/// Whether the crash image's fast-commit area starts with a HEAD naming a
/// transaction other than the one replay expects.
pub fn has_stale_fc_head(crash: &MemDevice) -> bool {
    matches!(
        ordo_fs::fc_replay::fc_state(crash),
        Ok(Some(ordo_fs::fc_replay::FcState {
            scan: ordo_format::fc::Scan {
                end: ordo_format::fc::ScanEnd::StaleHead { .. },
                ..
            },
            ..
        }))
    )
}

/// e2fsck -fy's pass 3A rebuilds every directory without an index that
/// spans three blocks or more (`check_blocks`: `i_size / blocksize >= 3`
/// puts it on `dirs_to_hash` whenever the file system has `dir_index`),
/// which packs its entries and gives the blocks it no longer needs back.
/// That is an optimisation, not a repair: where e2fsck's result has such a
/// directory of ordo's, same inode and links, smaller, its size is taken
/// as ordo's, and the blocks only ordo's recovery has in use are taken as
/// e2fsck's too when they are exactly as many as those directories gave
/// back. Returns whether it forgave anything.
pub fn forgive_dir_rehash(ours: &Recovered, e2fsck: &mut Recovered, block_size: u64) -> bool {
    let mut freed: u64 = 0;
    let mut any = false;
    for (path, o) in &ours.tree {
        if o.kind != FileType::Directory
            || !ours.linear_dirs.contains(&o.ino)
            || o.size / block_size < 3
        {
            continue;
        }
        let Some(t) = e2fsck.tree.get_mut(path) else {
            continue;
        };
        if t.ino != o.ino || t.kind != o.kind || t.nlink != o.nlink || t.size >= o.size {
            continue;
        }
        t.size = o.size;
        let (a, b) = (
            ours.held.get(&o.ino).copied().unwrap_or(0),
            e2fsck.held.get(&o.ino).copied().unwrap_or(0),
        );
        freed += a.saturating_sub(b);
        e2fsck.held.insert(o.ino, a);
        any = true;
    }
    if any {
        let only_ours: Vec<u64> = ours
            .alloc
            .blocks
            .difference(&e2fsck.alloc.blocks)
            .copied()
            .collect();
        if only_ours.len() as u64 == freed {
            e2fsck.alloc.blocks.extend(only_ours);
        }
    }
    any
}

/// Judge one state: `crash` is the image before any recovery, `ours` the
/// image after ordo's.
pub fn judge(crash: &MemDevice, ours: &Arc<MemDevice>, mode: ProtocolKind) -> Verdict {
    let mut v = Verdict::default();
    if !superblock_verifies(crash) {
        v.torn_superblock = true;
        return v;
    }
    let ours = match recovered_of(ours.clone(), mode) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("reading ordo's recovery: {e}");
            v.kernel.push(msg.clone());
            v.e2fsck.push(msg);
            return v;
        }
    };
    match kernel_recover(crash).and_then(|img| recovered_of(img, mode)) {
        Ok(k) => v.kernel = compare_kernel(&ours, &k),
        Err(e) => v.kernel.push(e),
    }
    let fast_commits = has_fast_commits(crash);
    match e2fsck_recover(crash) {
        Ok((img, text)) => {
            let dev: Arc<dyn BlockDevice> = img.clone();
            let recovered = recovered_of(dev, mode).map(|mut e| {
                if text.contains("Pass 3A") {
                    let bs = u64::from(crash.block_size());
                    v.e2fsck_rehashed_dirs = forgive_dir_rehash(&ours, &mut e, bs);
                }
                e
            });
            match recovered {
                Ok(e) if fast_commits && text.contains("Multiply-claimed") => {
                    // e2fsck's fast-commit replay handed one block to two
                    // inodes and its pass 1D then cloned it: contents and
                    // blocks are e2fsck's own invention, so only names,
                    // inode numbers, types and sizes are compared (the
                    // kernel comparison stays full).
                    v.e2fsck = compare_shapes(&ours, &e, &fc_unlinked(crash));
                    v.e2fsck_multiply_claimed = true;
                }
                Ok(e) => {
                    let unlinked = fast_commits.then(|| fc_unlinked(crash));
                    v.e2fsck = compare_e2fsck(&ours, &e, unlinked.as_ref());
                }
                Err(e) => v.e2fsck.push(format!("reading e2fsck's recovery: {e}")),
            }
        }
        Err(e) => v.e2fsck.push(e),
    }
    if !v.e2fsck.is_empty() && fast_commits && has_stale_fc_head(crash) {
        v.e2fsck.clear();
        v.e2fsck_stale_head = true;
    }
    if !v.e2fsck.is_empty() && v.kernel.is_empty() && has_torn_commit(crash) {
        v.e2fsck.clear();
        v.e2fsck_torn_commit = true;
    }
    v
}

/// Whether the crash image's log has a transaction whose commit block is
/// torn after its header (replayed by the kernel and by ordo).
pub fn has_torn_commit(crash: &MemDevice) -> bool {
    matches!(
        ordo_fs::recovery::journal_state(crash),
        Ok(Some(s)) if s.torn_commits > 0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(ino: Ino, size: u64) -> Obj {
        Obj {
            ino,
            kind: FileType::Directory,
            size,
            nlink: 2,
            content: 0,
        }
    }

    /// ordo's `/A`: a directory without an index over three blocks, 100,
    /// 101 and 102. e2fsck's pass 3A packed it into block 100.
    fn pair(indexed: bool, leaked: bool) -> (Recovered, Recovered) {
        let mut ours = Recovered::default();
        ours.tree.insert("/A".into(), dir(12, 3 * 4096));
        ours.held.insert(12, 3);
        ours.alloc.blocks.extend([100, 101, 102]);
        if leaked {
            ours.alloc.blocks.insert(200);
        }
        if !indexed {
            ours.linear_dirs.insert(12);
        }
        let mut theirs = Recovered::default();
        theirs.tree.insert("/A".into(), dir(12, 4096));
        theirs.held.insert(12, 1);
        theirs.alloc.blocks.insert(100);
        (ours, theirs)
    }

    #[test]
    fn a_directory_e2fsck_packed_is_forgiven_and_nothing_else() {
        let (ours, mut theirs) = pair(false, false);
        assert!(!compare_kernel(&ours, &theirs).is_empty());
        assert!(forgive_dir_rehash(&ours, &mut theirs, 4096));
        assert_eq!(compare_kernel(&ours, &theirs), Vec::<String>::new());

        // A block ordo leaked besides: the counts no longer match.
        let (ours, mut theirs) = pair(false, true);
        forgive_dir_rehash(&ours, &mut theirs, 4096);
        let d = compare_kernel(&ours, &theirs);
        assert!(
            d.iter().any(|l| l.contains("after ordo's recovery only")),
            "{d:?}"
        );

        // An indexed directory is not one pass 3A rebuilds.
        let (ours, mut theirs) = pair(true, false);
        assert!(!forgive_dir_rehash(&ours, &mut theirs, 4096));
        assert!(!compare_kernel(&ours, &theirs).is_empty());
    }
}
