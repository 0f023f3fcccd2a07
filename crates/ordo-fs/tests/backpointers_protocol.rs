//! `mode=backpointers` (NoFS) at the library level: a clean image is
//! plain ext4 (e2fsck-clean, every file back exactly after a remount), no
//! fsync orders one write before another (one flush per fsync), and after
//! random crashes of a disk that reorders and drops writes freely, a mount
//! with no recovery plus the scanners gives data consistency: every name
//! resolves to an inode that names its directory back or fails, every
//! block read is this file's (any version) or EIO, the image is
//! e2fsck-clean after a clean unmount, and filling the disk afterwards
//! disturbs no surviving file. The crash explorer checks the same on every
//! crash state (`ordo crash --mode backpointers`).

mod fast_commit_common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use fast_commit_common::e2fsck_fn;
use ordo_dev::{BlockDevice, CrashPolicy, MemDevice, WriteCacheDevice};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::random::SplitMix64;
use ordo_fs::{
    Creds, FileType, Fs, Ino, MountOptions, ProtocolKind, RenameFlags, SetAttr, ROOT_INO,
};

const BS: usize = 4096;

fn mode() -> ProtocolKind {
    ProtocolKind::named("backpointers")
}

/// A fresh 32 MiB image formatted for `mode=backpointers`, in memory.
fn image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(BS as u32, 8192).unwrap());
    let features = parse_features(mode().spec().mkfs_features, DEFAULT_FEATURES).unwrap();
    let opts = MkfsOptions {
        block_size: BS as u32,
        features,
        uuid: Some(*b"ordo-nofs-test!!"),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.as_ref(), &opts).unwrap();
    dev
}

fn opts() -> MountOptions {
    MountOptions {
        mode: mode(),
        seed: Some(7),
        ..MountOptions::default()
    }
}

fn stat(fs: &Fs, name: &str) -> u64 {
    let (_, stats) = fs.protocol_stats();
    stats
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no statistic {name}"))
}

/// Block `lblk` of version `ver` of file `id`: its first 12 bytes say
/// whose it is, the rest is a function of them.
fn block(id: u32, ver: u32, lblk: u32) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    b[0..4].copy_from_slice(&id.to_le_bytes());
    b[4..8].copy_from_slice(&ver.to_le_bytes());
    b[8..12].copy_from_slice(&lblk.to_le_bytes());
    for (k, x) in b[12..].iter_mut().enumerate() {
        *x = (id as usize * 31 + ver as usize * 7 + lblk as usize * 3 + k) as u8 | 1;
    }
    b
}

/// Whose block `b` is, if it is one of [`block`]'s.
fn decode(b: &[u8]) -> Option<(u32, u32, u32)> {
    let id = u32::from_le_bytes(b[0..4].try_into().unwrap());
    let ver = u32::from_le_bytes(b[4..8].try_into().unwrap());
    let lblk = u32::from_le_bytes(b[8..12].try_into().unwrap());
    (block(id, ver, lblk) == b).then_some((id, ver, lblk))
}

fn dump(dev: &MemDevice, name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("ordo-nofs-{}-{name}.img", std::process::id()));
    let mut buf = vec![0u8; BS];
    let mut out = Vec::with_capacity(dev.block_count() as usize * BS);
    for b in 0..dev.block_count() {
        dev.read(b, &mut buf, ordo_dev::BlockClass::Data).unwrap();
        out.extend_from_slice(&buf);
    }
    std::fs::write(&path, out).unwrap();
    path
}

fn assert_e2fsck_clean(dev: &MemDevice, what: &str) {
    let path = dump(dev, what);
    let (code, out) = e2fsck_fn(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(code, 0, "{what}: e2fsck -fn is not clean:\n{out}");
}

#[test]
fn clean_images_are_plain_ext4_and_read_back() {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let root = Creds::root();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, &root).unwrap().ino;
    let a = fs
        .create(d, b"a", FileType::Regular, 0o644, 0, &root)
        .unwrap()
        .ino;
    for l in 0..5 {
        fs.write(a, l as u64 * BS as u64, &block(1, 0, l)).unwrap();
    }
    fs.link(a, ROOT_INO, b"a2").unwrap();
    fs.rename(d, b"a", ROOT_INO, b"a3", RenameFlags::default())
        .unwrap();
    fs.fsync(a, false).unwrap();
    fs.unmount().unwrap();
    assert_e2fsck_clean(&dev, "clean");
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    assert!(!fs.scan_pending(), "a clean image needs no scan");
    let at = fs.lookup(ROOT_INO, b"a3").unwrap();
    assert_eq!(at.ino, fs.lookup(ROOT_INO, b"a2").unwrap().ino);
    assert_eq!(at.nlink, 2);
    let data = fs.read(at.ino, 0, 5 * BS as u32).unwrap();
    for l in 0..5u32 {
        assert_eq!(
            decode(&data[l as usize * BS..(l as usize + 1) * BS]),
            Some((1, 0, l))
        );
    }
    assert_eq!(stat(&fs, "owner_mismatches"), 0);
    fs.unmount().unwrap();
}

/// `base` mounted over a write cache, with an empty file `f` in the root.
fn mount_with_file(base: &MemDevice) -> (Arc<WriteCacheDevice<MemDevice>>, Fs, Ino) {
    let dev = Arc::new(WriteCacheDevice::new(base.snapshot()));
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let f = fs
        .create(ROOT_INO, b"f", FileType::Regular, 0o644, 0, &Creds::root())
        .unwrap()
        .ino;
    (dev, fs, f)
}

/// Set `ino`'s size.
fn truncate(fs: &Fs, ino: Ino, size: u64) {
    let set = SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    fs.setattr(ino, &set).unwrap();
}

#[test]
fn an_fsync_is_one_flush_and_nothing_is_ordered() {
    let (_dev, fs, f) = mount_with_file(&image());
    fs.fsync(f, false).unwrap();
    let before = fs.counters();
    for k in 0..10u32 {
        fs.write(f, u64::from(k) * BS as u64, &block(2, 0, k))
            .unwrap();
        fs.fsync(f, false).unwrap();
    }
    let after = fs.counters();
    assert_eq!(after.flushes - before.flushes, 10, "one flush per fsync");
    fs.unmount().unwrap();
}

/// The one place an fsync orders writes: a file whose extent tree grows
/// a level (a fifth extent moves the inode's four into a new node) has
/// the node written behind a flush of its own before the inode that
/// points to it. Only that fsync pays the second flush.
#[test]
fn a_tree_that_grows_a_level_goes_home_node_first() {
    let (_dev, fs, f) = mount_with_file(&image());
    let tree_flushes = |fs: &Fs| {
        let (_, stats) = fs.protocol_stats();
        stats
            .iter()
            .find(|(k, _)| k == "tree_flushes")
            .map(|(_, v)| *v)
            .expect("backpointers counts its tree flushes")
    };
    // Four extents, one block apart, fit in the inode.
    for k in 0..4u32 {
        fs.write(f, u64::from(2 * k) * BS as u64, &block(3, 0, 2 * k))
            .unwrap();
    }
    fs.fsync(f, false).unwrap();
    let before = fs.counters();
    assert_eq!(tree_flushes(&fs), 0);
    fs.write(f, 8 * BS as u64, &block(3, 0, 8)).unwrap();
    fs.fsync(f, false).unwrap();
    let after = fs.counters();
    assert_eq!(tree_flushes(&fs), 1, "the new node goes home first");
    assert_eq!(
        after.flushes - before.flushes,
        2,
        "node, flush, the rest, flush"
    );
    // Writing into the grown tree changes no shape: one flush again.
    fs.write(f, 8 * BS as u64, &block(3, 1, 8)).unwrap();
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.counters().flushes - after.flushes, 1);
    for k in [0u32, 2, 4, 6] {
        assert_eq!(
            fs.read(f, u64::from(k) * BS as u64, BS as u32).unwrap(),
            block(3, 0, k)
        );
    }
    fs.unmount().unwrap();
}

/// What the workload did to one file, by file id.
#[derive(Default)]
struct Model {
    /// Every (version, lblk) ever written, by file id.
    written: HashMap<u32, Vec<(u32, u32)>>,
    /// The file id of each (inode, generation) created.
    id_of: HashMap<(Ino, u32), u32>,
    /// Files fsynced and not written, truncated or unlinked since: what
    /// each block held at the fsync (file id, version, lblk).
    promised: HashMap<Ino, Vec<(u32, u32, u32)>>,
}

/// A random workload of creates, writes, overwrites, appends, truncates,
/// links, renames, unlinks, mkdir/rmdir and fsyncs.
fn workload(fs: &Fs, rng: &mut SplitMix64, ops: usize, model: &mut Model) {
    let root = Creds::root();
    // Names: (dir, name, inode); per inode: (file id, version, blocks).
    let mut files: Vec<(Ino, Vec<u8>, Ino)> = Vec::new();
    let mut state: HashMap<Ino, (u32, u32, u32)> = HashMap::new();
    // What each block of each file holds: (version) by lblk.
    let mut held: HashMap<Ino, Vec<u32>> = HashMap::new();
    let mut dirs: Vec<(Ino, Vec<u8>, Ino)> = vec![(ROOT_INO, b"/".to_vec(), ROOT_INO)];
    let mut next_id = 1u32;
    let mut n = 0;
    let below = |rng: &mut SplitMix64, k: usize| (rng.next_u64() % k as u64) as usize;
    for _ in 0..ops {
        n += 1;
        let pick = below(rng, 100);
        if pick < 20 || files.is_empty() {
            let d = dirs[below(rng, dirs.len())].2;
            let name = format!("f{n}").into_bytes();
            let Ok(a) = fs.create(d, &name, FileType::Regular, 0o644, 0, &root) else {
                continue;
            };
            let id = next_id;
            next_id += 1;
            model.id_of.insert((a.ino, a.generation), id);
            let want = 1 + below(rng, 4) as u32;
            let mut blocks = 0;
            for l in 0..want {
                if fs
                    .write(a.ino, u64::from(l) * BS as u64, &block(id, 0, l))
                    .is_err()
                {
                    break;
                }
                model.written.entry(id).or_default().push((0, l));
                blocks += 1;
            }
            files.push((d, name, a.ino));
            state.insert(a.ino, (id, 0, blocks));
            held.insert(a.ino, vec![0; blocks as usize]);
        } else if pick < 35 {
            let ino = files[below(rng, files.len())].2;
            let (id, ver, blocks) = state.get_mut(&ino).unwrap();
            if *blocks == 0 {
                continue;
            }
            *ver += 1;
            let l = below(rng, *blocks as usize) as u32;
            model.written.entry(*id).or_default().push((*ver, l));
            model.promised.remove(&ino);
            if fs
                .write(ino, u64::from(l) * BS as u64, &block(*id, *ver, l))
                .is_ok()
            {
                held.get_mut(&ino).unwrap()[l as usize] = *ver;
            }
        } else if pick < 45 {
            let ino = files[below(rng, files.len())].2;
            let (id, ver, blocks) = state.get_mut(&ino).unwrap();
            let l = *blocks;
            model.written.entry(*id).or_default().push((*ver, l));
            model.promised.remove(&ino);
            if fs
                .write(ino, u64::from(l) * BS as u64, &block(*id, *ver, l))
                .is_ok()
            {
                *blocks += 1;
                held.get_mut(&ino).unwrap().push(*ver);
            }
        } else if pick < 52 {
            let ino = files[below(rng, files.len())].2;
            let (_, _, blocks) = state.get_mut(&ino).unwrap();
            let keep = below(rng, *blocks as usize + 1) as u32;
            let set = SetAttr {
                size: Some(u64::from(keep) * BS as u64),
                ..SetAttr::default()
            };
            model.promised.remove(&ino);
            if fs.setattr(ino, &set).is_ok() {
                *blocks = keep;
                held.get_mut(&ino).unwrap().truncate(keep as usize);
            }
        } else if pick < 62 {
            let k = below(rng, files.len());
            let (d, name, ino) = files.remove(k);
            model.promised.remove(&ino);
            let _ = fs.unlink(d, &name);
        } else if pick < 70 {
            let k = below(rng, files.len());
            let nd = dirs[below(rng, dirs.len())].2;
            let newname = format!("r{n}").into_bytes();
            let (d, name, _) = files[k].clone();
            if fs
                .rename(d, &name, nd, &newname, RenameFlags::default())
                .is_ok()
            {
                files[k].0 = nd;
                files[k].1 = newname;
            }
        } else if pick < 75 {
            let k = below(rng, files.len());
            let nd = dirs[below(rng, dirs.len())].2;
            let newname = format!("l{n}").into_bytes();
            let ino = files[k].2;
            if fs.link(ino, nd, &newname).is_ok() {
                files.push((nd, newname, ino));
            }
        } else if pick < 82 {
            let d = dirs[below(rng, dirs.len())].2;
            let name = format!("d{n}").into_bytes();
            if let Ok(a) = fs.mkdir(d, &name, 0o755, &root) {
                dirs.push((d, name, a.ino));
            }
        } else if pick < 85 && dirs.len() > 1 {
            let k = 1 + below(rng, dirs.len() - 1);
            let (p, name, _) = dirs[k].clone();
            if fs.rmdir(p, &name).is_ok() {
                dirs.remove(k);
            }
        } else if pick < 92 {
            let ino = files[below(rng, files.len())].2;
            if fs.fsync(ino, false).is_ok() {
                let id = state[&ino].0;
                let blocks = held[&ino]
                    .iter()
                    .enumerate()
                    .map(|(l, &v)| (id, v, l as u32))
                    .collect();
                model.promised.insert(ino, blocks);
            }
        } else {
            fs.write_back().unwrap();
        }
    }
}

/// Walk the tree; check every name and every block; the files seen, by
/// inode, with what each block read.
fn check_tree(fs: &Fs, model: &Model, what: &str) -> BTreeMap<Ino, Vec<Option<Vec<u8>>>> {
    let mut seen = BTreeMap::new();
    let mut stack = vec![ROOT_INO];
    let mut dirs_seen = std::collections::HashSet::from([ROOT_INO]);
    while let Some(d) = stack.pop() {
        let entries = match fs.readdir(d, 0, usize::MAX) {
            Ok(v) => v,
            // Before the scan a directory block may still fail its
            // checksum (the name walk resets it): EIO, never a stranger.
            Err(e) if e.errno() == libc::EIO && fs.scan_pending() => continue,
            Err(e) => panic!("{what}: readdir {d}: {e}"),
        };
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let a = match fs.lookup(d, &e.name) {
                Ok(a) => a,
                Err(err) => {
                    let code = err.errno();
                    assert!(
                        code == libc::ENOENT || code == libc::EIO,
                        "{what}: lookup {:?} in {d}: {err}",
                        String::from_utf8_lossy(&e.name)
                    );
                    continue;
                }
            };
            match a.kind {
                FileType::Directory => {
                    assert!(
                        dirs_seen.insert(a.ino),
                        "{what}: directory {} reached twice",
                        a.ino
                    );
                    stack.push(a.ino);
                }
                FileType::Regular => {
                    if seen.contains_key(&a.ino) {
                        continue;
                    }
                    let nblocks = a.size.div_ceil(BS as u64) as u32;
                    let mut blocks = Vec::new();
                    let mut owner: Option<u32> = None;
                    for l in 0..nblocks {
                        match fs.read(a.ino, u64::from(l) * BS as u64, BS as u32) {
                            Ok(b) => {
                                let full = b.len() == BS;
                                let who = if full { decode(&b) } else { None };
                                if full && b.iter().all(|&x| x == 0) {
                                    // A hole: the size reached the disk and
                                    // the mapping did not (a tree block in
                                    // flight, or a map rebuilt from the
                                    // records, which have none for a block
                                    // whose record never landed). Zeros
                                    // are where a version of the file ended
                                    // (the crash explorer's rule); a
                                    // promised block must still read as
                                    // promised (checked by the caller).
                                    blocks.push(Some(b));
                                    continue;
                                }
                                let Some((id, ver, lb)) = who else {
                                    // A short last block is the file's own
                                    // bytes cut by a truncate.
                                    panic!(
                                        "{what}: inode {} block {l} holds bytes no write put there \
                                         (first {:?}); size {}, {} blocks mapped",
                                        a.ino,
                                        &b[..b.len().min(16)],
                                        a.size,
                                        fs.mapped_blocks(a.ino).unwrap_or(0)
                                    );
                                };
                                assert_eq!(
                                    lb, l,
                                    "{what}: inode {} block {l} is block {lb}",
                                    a.ino
                                );
                                assert!(
                                    model
                                        .written
                                        .get(&id)
                                        .is_some_and(|w| w.contains(&(ver, l))),
                                    "{what}: inode {} block {l}: version {ver} of file {id} never \
                                     written there",
                                    a.ino
                                );
                                if let Some(&mine) = model.id_of.get(&(a.ino, a.generation)) {
                                    assert_eq!(
                                        id, mine,
                                        "{what}: inode {} (file {mine}) block {l} holds file {id}'s \
                                         bytes",
                                        a.ino
                                    );
                                }
                                if let Some(o) = owner {
                                    assert_eq!(
                                        o, id,
                                        "{what}: inode {} shows file {o}'s and file {id}'s bytes",
                                        a.ino
                                    );
                                }
                                owner = Some(id);
                                blocks.push(Some(b));
                            }
                            Err(err) => {
                                assert_eq!(err.errno(), libc::EIO, "{what}: read: {err}");
                                blocks.push(None);
                            }
                        }
                    }
                    seen.insert(a.ino, blocks);
                }
                _ => {}
            }
        }
    }
    seen
}

/// Fill the disk with new files, then every file seen reads as before.
fn fill_and_recheck(fs: &Fs, before: &BTreeMap<Ino, Vec<Option<Vec<u8>>>>, what: &str) {
    let root = Creds::root();
    let d = fs.mkdir(ROOT_INO, b"filler", 0o755, &root).unwrap().ino;
    let mut k = 0u32;
    'fill: loop {
        let name = format!("x{k}").into_bytes();
        let Ok(a) = fs.create(d, &name, FileType::Regular, 0o644, 0, &root) else {
            break;
        };
        for l in 0..64u32 {
            if fs
                .write(a.ino, u64::from(l) * BS as u64, &block(900_000 + k, 0, l))
                .is_err()
            {
                break 'fill;
            }
        }
        k += 1;
    }
    for (&ino, blocks) in before {
        for (l, want) in blocks.iter().enumerate() {
            let got = fs.read(ino, l as u64 * BS as u64, BS as u32).ok();
            assert_eq!(
                got.as_ref().map(|b| decode(b)),
                want.as_ref().map(|b| decode(b)),
                "{what}: inode {ino} block {l} changed when the disk was filled"
            );
        }
    }
}

/// Run [`workload`] (80 operations of `seed`) on a copy of `base` and
/// crash it with the mount still live: the crash image, and the model
/// of what was promised.
fn crashed_workload(base: &MemDevice, seed: u64) -> (MemDevice, Model) {
    let dev = Arc::new(WriteCacheDevice::new(base.snapshot()));
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let mut rng = SplitMix64::new(seed);
    let mut model = Model::default();
    workload(&fs, &mut rng, 80, &mut model);
    let crashed = dev.crash(seed, CrashPolicy::default()).unwrap();
    drop(fs);
    (crashed, model)
}

#[test]
fn random_crashes_leave_data_consistency_after_the_scan() {
    let base = image();
    let mut checked = 0;
    let mut eio = 0u64;
    let mut stale = 0u64;
    let mut promises = 0usize;
    let mut holes = 0usize;
    // NOFS_SEEDS=N runs more (a soak); NOFS_E2FSCK_EVERY=K checks every
    // K-th image with e2fsck (default 6).
    let seeds: u64 = std::env::var("NOFS_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let every: u64 = std::env::var("NOFS_E2FSCK_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    for seed in 0..seeds {
        // Crash with the mount still live.
        let (crashed, model) = crashed_workload(&base, seed);
        let crashed = Arc::new(crashed);
        let what = format!("seed {seed}");
        let fs = Fs::mount(crashed.clone(), opts()).unwrap();
        fs.scan_to_end().unwrap();
        if std::env::var("NOFS_DEBUG").ok() == Some(seed.to_string()) {
            let raw = dump(&crashed_workload(&base, seed).0, "raw");
            std::fs::copy(&raw, "/tmp/nofs-raw.img").unwrap();
            fs.sync().unwrap();
            let p = dump(&crashed, "debug");
            std::fs::copy(&p, "/tmp/nofs-debug.img").unwrap();
            eprintln!("{:?}", fs.protocol_stats());
        }
        let seen = check_tree(&fs, &model, &what);
        promises += model.promised.len();
        holes += seen
            .values()
            .flatten()
            .filter(|b| b.as_ref().is_some_and(|b| b.iter().all(|&x| x == 0)))
            .count();
        for (ino, blocks) in &model.promised {
            let got = seen.get(ino).unwrap_or_else(|| {
                panic!(
                    "{what}: inode {ino} was fsynced and not removed since, but no name reaches it"
                )
            });
            let got: Vec<Option<(u32, u32, u32)>> = got
                .iter()
                .map(|b| b.as_ref().and_then(|b| decode(b)))
                .collect();
            let want: Vec<Option<(u32, u32, u32)>> = blocks.iter().copied().map(Some).collect();
            assert_eq!(
                got, want,
                "{what}: inode {ino} does not hold what was fsynced"
            );
        }
        eio += stat(&fs, "owner_mismatches") + stat(&fs, "crc_mismatches");
        stale += stat(&fs, "nofs_entries_removed");
        fill_and_recheck(&fs, &seen, &what);
        fs.unmount().unwrap();
        if seed % every == 0 {
            assert_e2fsck_clean(&crashed, &what);
        }
        checked += 1;
    }
    assert_eq!(checked, seeds);
    eprintln!(
        "{checked} crashes: {eio} reads refused, {stale} stale names removed, \
         {promises} fsynced files held, {holes} blocks read as holes"
    );
    assert!(promises > 0, "no fsync promise was checked");
    // The crashes did leave something to detect.
    assert!(eio + stale > 0, "no crash left a stale pointer or name");
}

/// The physical blocks of inode 5 (the owner table), from its extents in
/// the inode (a small table fits the root).
fn table_blocks_of(dev: &MemDevice) -> Vec<u64> {
    let fs = Fs::mount(
        Arc::new(dev.snapshot()),
        MountOptions {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    let n = fs.mapped_blocks(5).unwrap();
    drop(fs);
    // The table is allocated contiguously from group 0: find its header.
    let mut buf = vec![0u8; BS];
    let start = (0..dev.block_count())
        .find(|&b| {
            dev.read(b, &mut buf, ordo_dev::BlockClass::Data).unwrap();
            &buf[..8] == b"ORDOBPT1"
        })
        .expect("a header");
    (start..start + n).collect()
}

#[test]
fn a_corrupt_owner_table_is_rebuilt_and_a_corrupt_block_is_eio() {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let root = Creds::root();
    let a = fs
        .create(ROOT_INO, b"a", FileType::Regular, 0o644, 0, &root)
        .unwrap()
        .ino;
    let b = fs
        .create(ROOT_INO, b"b", FileType::Regular, 0o644, 0, &root)
        .unwrap()
        .ino;
    for l in 0..3 {
        fs.write(a, l as u64 * BS as u64, &block(1, 0, l)).unwrap();
        fs.write(b, l as u64 * BS as u64, &block(2, 0, l)).unwrap();
    }
    fs.unmount().unwrap();
    let table = table_blocks_of(&dev);
    assert!(table.len() >= 2);

    // A record block with a flipped byte: the table is not trusted, every
    // record is rebuilt from the (clean) tree, and the files read back.
    let mut buf = vec![0u8; BS];
    dev.read(table[1], &mut buf, ordo_dev::BlockClass::Data)
        .unwrap();
    buf[100] ^= 0x40;
    dev.write(
        table[1],
        &buf,
        ordo_dev::WriteFlags::new(ordo_dev::BlockClass::Data),
    )
    .unwrap();
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    assert!(stat(&fs, "nofs_records_rebuilt") >= 6);
    let data = fs.read(a, 0, 3 * BS as u32).unwrap();
    assert_eq!(decode(&data[BS..2 * BS]), Some((1, 0, 1)));
    fs.unmount().unwrap();
    assert_e2fsck_clean(&dev, "rebuilt table");

    // A file block whose bytes changed behind ordo's back: EIO for that
    // block alone, counted; the others and the other file read.
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let a_attr = fs.getattr(a).unwrap();
    assert_eq!(a_attr.size, 3 * BS as u64);
    fs.unmount().unwrap();
    // Find a's block 1 on the device by its contents.
    let want = block(1, 0, 1);
    let pblk = (0..dev.block_count())
        .find(|&p| {
            dev.read(p, &mut buf, ordo_dev::BlockClass::Data).unwrap();
            buf == want
        })
        .expect("a's block 1");
    let mut bad = want.clone();
    bad[2000] ^= 1;
    dev.write(
        pblk,
        &bad,
        ordo_dev::WriteFlags::new(ordo_dev::BlockClass::Data),
    )
    .unwrap();
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let e = fs.read(a, BS as u64, BS as u32).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert_eq!(stat(&fs, "crc_mismatches"), 1);
    assert_eq!(decode(&fs.read(a, 0, BS as u32).unwrap()), Some((1, 0, 0)));
    assert_eq!(
        decode(&fs.read(a, 2 * BS as u64, BS as u32).unwrap()),
        Some((1, 0, 2))
    );
    assert_eq!(
        decode(&fs.read(b, BS as u64, BS as u32).unwrap()),
        Some((2, 0, 1))
    );
    // A partial overwrite of the bad block fails too (its other bytes
    // are not known to be a's); a whole-block overwrite heals it.
    assert_eq!(
        fs.write(a, BS as u64 + 10, b"xy").unwrap_err().errno(),
        libc::EIO
    );
    fs.write(a, BS as u64, &block(1, 1, 1)).unwrap();
    assert_eq!(
        decode(&fs.read(a, BS as u64, BS as u32).unwrap()),
        Some((1, 1, 1))
    );
    fs.unmount().unwrap();
    assert_e2fsck_clean(&dev, "after the bad block");
}

#[test]
fn mount_options_and_images_it_cannot_use_are_refused_cleanly() {
    // An image without metadata_csum: directories could not prove their
    // owner, so the mount is refused with a message, not a panic.
    let dev = Arc::new(MemDevice::new(BS as u32, 8192).unwrap());
    let features = parse_features("^metadata_csum", DEFAULT_FEATURES).unwrap();
    let o = MkfsOptions {
        block_size: BS as u32,
        features,
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.as_ref(), &o).unwrap();
    let e = Fs::mount(dev.clone(), opts()).err().expect("refused");
    assert!(e.to_string().contains("metadata_csum"), "{e}");
}

/// The nofs_* figures that say what a scan found (not how far it got).
fn scan_findings(fs: &Fs) -> Vec<(String, u64)> {
    let (_, stats) = fs.protocol_stats();
    stats
        .into_iter()
        .filter(|(n, _)| {
            n.starts_with("nofs_") && !n.starts_with("nofs_scan") && n != "nofs_stale_names"
        })
        .collect()
}

#[test]
fn the_scan_in_batches_between_reads_finds_what_one_pass_finds() {
    let base = image();
    let mut found = 0u64;
    for seed in 0..24u64 {
        let (crashed, model) = crashed_workload(&base, seed);
        let what = format!("batched-{seed}");

        // One pass.
        let one = Arc::new(crashed.snapshot());
        let fs = Fs::mount(one.clone(), opts()).unwrap();
        fs.scan_to_end().unwrap();
        let want = scan_findings(&fs);
        let want_tree = check_tree(&fs, &model, &what);
        fs.unmount().unwrap();

        // Batches of 7 inodes, with a walk that reads every file between
        // two of them: the reads do not finish the scan, the progress
        // moves, and the scan finds what the one pass found.
        let batched = Arc::new(crashed.snapshot());
        let fs = Fs::mount(batched.clone(), opts()).unwrap();
        assert!(fs.scan_pending(), "{what}: an unclean image needs the scan");
        let last = stat(&fs, "nofs_scan_last_inode");
        let mut at = stat(&fs, "nofs_scan_next_inode");
        assert_eq!(at, u64::from(ROOT_INO));
        let mut steps = 0;
        while !fs.scan_step(7).unwrap() {
            let next = stat(&fs, "nofs_scan_next_inode");
            assert!(
                next > at && next <= last,
                "{what}: progress {at} -> {next} of {last}"
            );
            at = next;
            steps += 1;
            if steps == 2 {
                check_tree(&fs, &model, &format!("{what}, mid-scan"));
                assert!(fs.scan_pending(), "{what}: reads finished the scan");
            }
        }
        assert!(steps >= 2, "{what}: the scan took {steps} batches of 7");
        assert_eq!(stat(&fs, "nofs_scan_next_inode"), last + 1);
        assert!(
            fs.scan_pending(),
            "{what}: the metadata scanner alone wrote"
        );
        fs.scan_to_end().unwrap();
        assert!(!fs.scan_pending());
        assert_eq!(scan_findings(&fs), want, "{what}: batches found otherwise");
        assert_eq!(check_tree(&fs, &model, &what), want_tree, "{what}");
        found += stat(&fs, "nofs_entries_removed") + stat(&fs, "nofs_inodes_reclaimed");
        fs.unmount().unwrap();
        assert_e2fsck_clean(&batched, &what);
    }
    assert!(found > 0, "no crash left the scan anything to do");
}

#[test]
fn an_unmount_before_the_scan_runs_it() {
    let base = image();
    let mut fixed = 0u64;
    for seed in 0..24u64 {
        let crashed = Arc::new(crashed_workload(&base, seed).0);
        let what = format!("unmounted-{seed}");
        // Mounted, half scanned, unmounted: the image is marked clean,
        // so the unmount must have finished the scan (the next mount
        // trusts the bitmaps).
        let fs = Fs::mount(crashed.clone(), opts()).unwrap();
        assert!(fs.scan_pending());
        fs.scan_step(20).unwrap();
        fs.unmount().unwrap();
        let fs = Fs::mount(crashed.clone(), opts()).unwrap();
        assert!(!fs.scan_pending(), "{what}: not clean after the unmount");
        fs.unmount().unwrap();
        assert_e2fsck_clean(&crashed, &what);
        let fs = Fs::mount(crashed.clone(), opts()).unwrap();
        fixed += 1;
        fs.unmount().unwrap();
    }
    assert_eq!(fixed, 24);
}

#[test]
fn the_background_scan_keeps_its_rate_lets_reads_in_and_an_allocation_finishes_it() {
    let base = image();
    let (crashed, model) = crashed_workload(&base, 3);

    // One inode a second: the scan is far from done while the tree is
    // read, and the first create finishes it.
    let slow = Arc::new(crashed.snapshot());
    let fs = Fs::mount(
        slow.clone(),
        MountOptions {
            background: true,
            scan_rate: 1,
            ..opts()
        },
    )
    .unwrap();
    check_tree(&fs, &model, "slow scan");
    assert!(
        fs.scan_pending(),
        "the reads finished a scan bounded to 1 inode/s"
    );
    assert!(stat(&fs, "nofs_scan_next_inode") < stat(&fs, "nofs_scan_last_inode"));
    let c = Creds::root();
    fs.create(
        ROOT_INO,
        b"after-the-crash",
        FileType::Regular,
        0o644,
        0,
        &c,
    )
    .unwrap();
    assert!(!fs.scan_pending(), "the create did not finish the scan");
    assert_eq!(stat(&fs, "nofs_scans"), 1);
    fs.unmount().unwrap();
    assert_e2fsck_clean(&slow, "slow scan");

    // No bound: the background thread finishes the scan by itself.
    let fast = Arc::new(crashed.snapshot());
    let fs = Fs::mount(
        fast.clone(),
        MountOptions {
            background: true,
            ..opts()
        },
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while fs.scan_pending() {
        assert!(
            std::time::Instant::now() < deadline,
            "the background scan never finished"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(stat(&fs, "nofs_scans"), 1);
    assert_eq!(
        stat(&fs, "nofs_scan_next_inode"),
        stat(&fs, "nofs_scan_last_inode") + 1
    );
    fs.unmount().unwrap();
    assert_e2fsck_clean(&fast, "background scan");
}

/// A truncate's write-back can reach the disk in any part: the inode that
/// still maps the synced blocks, with its synced size, must then still read
/// them. The records of freed blocks are cleared only once the free is
/// durable (and the blocks reused only once the clearing is), so no part of
/// the write-back leaves a synced block without its record.
#[test]
fn a_truncate_in_flight_leaves_the_synced_blocks_readable() {
    let base = image();
    let mut old = 0;
    let mut new = 0;
    for seed in 0..48u64 {
        let (dev, fs, f) = mount_with_file(&base);
        for k in 0..4u32 {
            fs.write(f, u64::from(k) * BS as u64, &block(1, 0, k))
                .unwrap();
        }
        fs.sync().unwrap();
        truncate(&fs, f, if seed % 2 == 0 { 0 } else { BS as u64 });
        // Every dirty block goes home, no flush: a crash keeps any part.
        fs.write_back().unwrap();
        let crashed = Arc::new(dev.crash(seed, CrashPolicy::default()).unwrap());
        drop(fs);
        let what = format!("seed {seed}");
        let fs = Fs::mount(crashed.clone(), opts()).unwrap();
        fs.scan_to_end().unwrap();
        let size = fs.getattr(f).unwrap().size;
        let data = fs.read(f, 0, 4 * BS as u32).unwrap();
        assert_eq!(data.len() as u64, size, "{what}");
        for (k, b) in data.chunks(BS).enumerate() {
            assert_eq!(decode(b), Some((1, 0, k as u32)), "{what}: block {k}");
        }
        if size == 4 * BS as u64 {
            old += 1;
        } else {
            new += 1;
        }
        assert_eq!(stat(&fs, "owner_mismatches"), 0, "{what}");
        fs.unmount().unwrap();
        assert_e2fsck_clean(&crashed, &what);
    }
    // Both outcomes were seen: the crashes cut the write-back both ways.
    assert!(old > 0 && new > 0, "old size {old} times, new size {new}");
}

/// After a sync, the blocks a truncate freed are reusable: the sync
/// makes the free durable, then the cleared records.
#[test]
fn a_sync_leaves_freed_blocks_reusable() {
    let (_dev, fs, f) = mount_with_file(&image());
    let free0 = fs.statfs().unwrap().blocks_free;
    // Fill all but a few blocks, free them, and fill again after a sync:
    // the writes of the second round need no commit to find space (an
    // allocation short of space with frees pending would flush).
    let blocks = (free0 - 64) as u32;
    for round in 0..2u32 {
        let before = fs.counters().flushes;
        for k in 0..blocks {
            fs.write(f, u64::from(k) * BS as u64, &block(1, round, k))
                .unwrap();
        }
        assert_eq!(fs.counters().flushes, before, "round {round}");
        fs.sync().unwrap();
        truncate(&fs, f, 0);
        fs.sync().unwrap();
    }
    let free1 = fs.statfs().unwrap().blocks_free;
    assert_eq!(free0, free1);
    fs.unmount().unwrap();
}
