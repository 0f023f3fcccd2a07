//! `mode=streams` (ccfs) at the library level: an fsync commits only its
//! stream (the paper's Table 4 in miniature), two streams' changes to one
//! block commit separately (hybrid granularity, delta journaling of the
//! shared counters), related operations merge their streams, IGNORE_FSYNC
//! keeps order without durability, and every crashed image replays to an
//! e2fsck-clean file system. The crash explorer checks the crash states
//! (`ordo crash --mode streams`).

mod fast_commit_common;

use std::sync::Arc;

use fast_commit_common::{e2fsck_fn, have};
use ordo_dev::{BlockClass, BlockDevice, CrashPolicy, MemDevice, WriteCacheDevice};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Creds, FileType, Fs, Ino, MountOptions, ProtocolKind, ROOT_INO};

fn mode() -> ProtocolKind {
    ProtocolKind::named("streams")
}

/// A fresh 64 MiB image formatted for `mode=streams`, in memory.
fn image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(4096, 16384).unwrap());
    let features = parse_features(mode().spec().mkfs_features, DEFAULT_FEATURES).unwrap();
    let opts = MkfsOptions {
        block_size: 4096,
        features,
        uuid: Some(*b"ordo-ccfs-test!!"),
        journal_blocks: Some(4096),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.as_ref(), &opts).unwrap();
    dev
}

fn opts() -> MountOptions {
    MountOptions {
        mode: mode(),
        ..MountOptions::default()
    }
}

fn create_in(fs: &Fs, dir: Ino, name: &[u8]) -> Ino {
    fs.create(dir, name, FileType::Regular, 0o644, 0, &Creds::root())
        .unwrap()
        .ino
}

fn stat(fs: &Fs, name: &str) -> u64 {
    let (_, stats) = fs.protocol_stats();
    stats
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no statistic {name}"))
}

fn in_stream(fs: &Fs, name: &[u8]) {
    let id = fs.stream_id(name).unwrap();
    fs.set_thread_stream(id).unwrap();
}

/// Bytes written to the device so far.
fn written(fs: &Fs) -> u64 {
    fs.counters().total().write_bytes
}

/// Cut power (every write not flushed is lost), replay the log, and
/// check the image with e2fsck when it is installed.
fn crash_and_mount(dev: &WriteCacheDevice<Arc<MemDevice>>, fs: Fs) -> Fs {
    let crashed = Arc::new(dev.crash(1, CrashPolicy::lose_all()).unwrap());
    drop(fs);
    let fs = Fs::mount(crashed.clone(), opts()).unwrap();
    if have("e2fsck") {
        fs.unmount().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        std::fs::write(&path, crashed.to_image()).unwrap();
        let (code, out) = e2fsck_fn(&path);
        assert_eq!(code, 0, "e2fsck -fn after recovery:\n{out}");
        return Fs::mount(crashed, opts()).unwrap();
    }
    fs
}

/// Table 4: 2 MiB appended to A in one stream, one byte to B in another,
/// fsync(B). The fsync writes B's block and its metadata, not A's data;
/// after a power cut B has its byte and A is empty. With both files in
/// one stream the fsync must carry A's data (ccfs-1). (The files exist
/// first; `two_streams_creating_in_one_directory_stay_apart` creates them
/// in their streams.)
#[test]
fn an_fsync_commits_only_its_stream() {
    for shared in [false, true] {
        let dev = Arc::new(WriteCacheDevice::new(image()));
        let fs = Fs::mount(dev.clone(), opts()).unwrap();
        let a = create_in(&fs, ROOT_INO, b"A");
        let b = create_in(&fs, ROOT_INO, b"B");
        fs.sync().unwrap();
        in_stream(&fs, b"a");
        fs.write(a, 0, &vec![7u8; 2 << 20]).unwrap();
        if !shared {
            in_stream(&fs, b"b");
        }
        fs.write(b, 0, b"x").unwrap();
        let before = written(&fs);
        fs.fsync(b, false).unwrap();
        let cost = written(&fs) - before;
        if shared {
            assert!(cost >= 2 << 20, "one stream: fsync(B) wrote {cost} bytes");
        } else {
            assert!(
                cost < 256 << 10,
                "a stream each: fsync(B) wrote {cost} bytes, A's data included?"
            );
        }
        let fs = crash_and_mount(&dev, fs);
        let b = fs.lookup(ROOT_INO, b"B").expect("B was fsynced").ino;
        assert_eq!(fs.read(b, 0, 16).unwrap(), b"x");
        let a = fs.lookup(ROOT_INO, b"A").unwrap().ino;
        let data = fs.read(a, 0, 2 << 20).unwrap();
        if shared {
            assert!(data == vec![7u8; 2 << 20], "A is earlier in B's stream");
        } else {
            assert!(
                data.is_empty(),
                "A's stream was never committed: {} bytes",
                data.len()
            );
        }
        fs.unmount().unwrap();
    }
}

/// Hybrid granularity: two files made and synced first, in two
/// directories, so their inodes share an inode-table block and their
/// allocations share a bitmap, a group descriptor and the free counts.
/// Each stream writes its own file; the fsync of one commits that file's
/// inode, bits and counters on the last committed images, and the other
/// file stays as it was committed.
#[test]
fn two_streams_share_blocks_and_commit_apart() {
    let dev = Arc::new(WriteCacheDevice::new(image()));
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let root = Creds::root();
    let d1 = fs
        .create(ROOT_INO, b"d1", FileType::Directory, 0o755, 0, &root)
        .unwrap()
        .ino;
    let d2 = fs
        .create(ROOT_INO, b"d2", FileType::Directory, 0o755, 0, &root)
        .unwrap()
        .ino;
    let f1 = create_in(&fs, d1, b"f");
    let f2 = create_in(&fs, d2, b"f");
    fs.sync().unwrap();
    in_stream(&fs, b"one");
    fs.write(f1, 0, &[1u8; 40960]).unwrap();
    in_stream(&fs, b"two");
    fs.write(f2, 0, &[2u8; 20480]).unwrap();
    let merges = stat(&fs, "stream_merges");
    fs.fsync(f2, false).unwrap();
    assert_eq!(merges, 0, "unrelated writes merged their streams");
    assert!(
        stat(&fs, "superimposed_blocks") > 0,
        "no block was committed on its last committed image"
    );
    let fs = crash_and_mount(&dev, fs);
    let f1 = fs.lookup(d1, b"f").unwrap().ino;
    let f2 = fs.lookup(d2, b"f").unwrap().ino;
    let (d2, d1) = (
        fs.read(f2, 0, 1 << 20).unwrap(),
        fs.read(f1, 0, 1 << 20).unwrap(),
    );
    assert!(
        d2 == vec![2u8; 20480],
        "the fsynced file has {} bytes",
        d2.len()
    );
    assert!(
        d1.is_empty(),
        "the other stream's file has {} bytes",
        d1.len()
    );
    fs.unmount().unwrap();
}

/// ccfs's related operations: a directory made in one stream and a file
/// created in it by another merge the two streams, so the fsync of the
/// file brings the directory along.
#[test]
fn an_entry_in_another_streams_directory_merges_them() {
    let dev = Arc::new(WriteCacheDevice::new(image()));
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    in_stream(&fs, b"a");
    let d = fs
        .create(
            ROOT_INO,
            b"d",
            FileType::Directory,
            0o755,
            0,
            &Creds::root(),
        )
        .unwrap()
        .ino;
    in_stream(&fs, b"b");
    let f = create_in(&fs, d, b"f");
    fs.write(f, 0, b"data").unwrap();
    assert!(stat(&fs, "stream_merges") >= 1);
    fs.fsync(f, false).unwrap();
    let fs = crash_and_mount(&dev, fs);
    let d = fs.lookup(ROOT_INO, b"d").expect("d came with f").ino;
    let f = fs.lookup(d, b"f").unwrap().ino;
    assert_eq!(fs.read(f, 0, 16).unwrap(), b"data");
    fs.unmount().unwrap();
}

/// Two streams creating files in one directory stay apart: the second
/// does not split the entry the first made (that would rewrite the
/// first's `rec_len` and merge them); its entry goes to other room, here a
/// new block. fsync(B) then carries neither A's create nor its data, and
/// after a crash B is there and A is not.
#[test]
fn two_streams_creating_in_one_directory_stay_apart() {
    let dev = Arc::new(WriteCacheDevice::new(image()));
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, &Creds::root()).unwrap().ino;
    fs.sync().unwrap();
    in_stream(&fs, b"a");
    let a = create_in(&fs, d, b"A");
    fs.write(a, 0, &vec![7u8; 1 << 20]).unwrap();
    in_stream(&fs, b"b");
    let b = create_in(&fs, d, b"B");
    fs.write(b, 0, b"x").unwrap();
    assert_eq!(stat(&fs, "stream_merges"), 0, "the two creates merged");
    let before = written(&fs);
    fs.fsync(b, false).unwrap();
    let cost = written(&fs) - before;
    assert!(
        cost < 256 << 10,
        "fsync(B) wrote {cost} bytes, A's data included?"
    );
    let fs = crash_and_mount(&dev, fs);
    let b = fs.lookup(d, b"B").expect("B was fsynced").ino;
    assert_eq!(fs.read(b, 0, 16).unwrap(), b"x");
    assert!(
        fs.lookup(d, b"A").is_err(),
        "A's stream never committed, yet A is there"
    );
    fs.unmount().unwrap();
}

/// Order-less reuse: an inode and a directory slot freed by one stream are
/// not reused by another until the freeing transaction commits, so the
/// streams never merge: the other stream's fsync leaves the unlink
/// uncommitted, and the removed file is back after a crash. Once the
/// unlink has committed, its inode is reused.
#[test]
fn a_freed_inode_and_slot_wait_for_the_freeing_commit() {
    let dev = Arc::new(WriteCacheDevice::new(image()));
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, &Creds::root()).unwrap().ino;
    let x = create_in(&fs, d, b"x");
    fs.write(x, 0, b"old").unwrap();
    fs.sync().unwrap();
    in_stream(&fs, b"a");
    fs.unlink(d, b"x").unwrap();
    in_stream(&fs, b"b");
    let y = create_in(&fs, d, b"y");
    assert_ne!(
        y, x,
        "stream b reused the inode stream a freed before its commit"
    );
    fs.write(y, 0, b"new").unwrap();
    assert_eq!(stat(&fs, "stream_merges"), 0, "the two streams merged");
    fs.fsync(y, false).unwrap();
    let fs = crash_and_mount(&dev, fs);
    let x2 = fs
        .lookup(d, b"x")
        .expect("x's unlink was never committed")
        .ino;
    assert_eq!(x2, x);
    assert_eq!(fs.read(x, 0, 16).unwrap(), b"old");
    let y = fs.lookup(d, b"y").expect("y was fsynced").ino;
    assert_eq!(fs.read(y, 0, 16).unwrap(), b"new");

    // After the freeing commit the inode is free for anyone.
    let a = fs.stream_id(b"a").unwrap();
    fs.set_thread_stream(a).unwrap();
    fs.unlink(d, b"x").unwrap();
    fs.streamsync(a).unwrap();
    in_stream(&fs, b"b");
    let z = create_in(&fs, d, b"z");
    assert_eq!(z, x, "the committed free was not reused");
    fs.unmount().unwrap();
}

/// IGNORE_FSYNC: the stream's fsyncs write nothing, its order holds, and
/// a streamsync makes it durable.
#[test]
fn ignore_fsync_keeps_order_without_durability() {
    let dev = Arc::new(WriteCacheDevice::new(image()));
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let id = fs.stream_id(b"db").unwrap();
    fs.set_thread_stream(id).unwrap();
    fs.set_stream_flags(id, ordo_fs::stream::IGNORE_FSYNC)
        .unwrap();
    let f = create_in(&fs, ROOT_INO, b"db");
    fs.write(f, 0, b"row1").unwrap();
    let flushes = fs.counters().flushes;
    fs.fsync(f, false).unwrap();
    assert_eq!(fs.counters().flushes, flushes, "an ignored fsync flushed");
    fs.streamsync(id).unwrap();
    assert!(fs.counters().flushes > flushes);
    let fs = crash_and_mount(&dev, fs);
    let f = fs.lookup(ROOT_INO, b"db").unwrap().ino;
    assert_eq!(fs.read(f, 0, 16).unwrap(), b"row1");
    fs.unmount().unwrap();
}

/// A clean unmount leaves plain ext4: the log is empty and the last
/// committed images are home.
#[test]
fn a_clean_unmount_leaves_plain_ext4() {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    for (i, s) in [b"x", b"y", b"z"].iter().enumerate() {
        in_stream(&fs, *s);
        let f = create_in(&fs, ROOT_INO, format!("f{i}").as_bytes());
        fs.write(f, 0, &vec![i as u8; 10000]).unwrap();
    }
    fs.unmount().unwrap();
    let mut sb = vec![0u8; 4096];
    dev.read(0, &mut sb, BlockClass::Super).unwrap();
    if have("e2fsck") {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        std::fs::write(&path, dev.to_image()).unwrap();
        let (code, out) = e2fsck_fn(&path);
        assert_eq!(code, 0, "e2fsck -fn after a clean unmount:\n{out}");
    }
    let fs = Fs::mount(dev, opts()).unwrap();
    for i in 0..3u8 {
        let f = fs.lookup(ROOT_INO, format!("f{i}").as_bytes()).unwrap().ino;
        assert!(fs.read(f, 0, 20000).unwrap() == vec![i; 10000], "f{i}");
    }
    fs.unmount().unwrap();
}

/// A file of [`random_streams_replay_clean`]: where it is, what it
/// holds, and whether it was fsynced and not touched since.
struct Tracked {
    dir: Ino,
    name: Vec<u8>,
    ino: Ino,
    data: Vec<u8>,
    synced: bool,
}

/// Random work in three streams (creates, writes, truncates, unlinks, renames and
/// mkdirs in two shared directories, fsyncs, streamsyncs, commit-interval
/// ticks), cut at random moments with a random subset of the pending
/// writes kept: every image replays to an e2fsck-clean file system, and a
/// file fsynced and not touched since has its bytes. (The crash explorer
/// checks each stream's prefix; this checks the protocol's images on
/// their own, over many more interleavings than the explorer enumerates.)
#[test]
fn random_streams_replay_clean() {
    if !have("e2fsck") {
        eprintln!("e2fsck not installed: skipped");
        return;
    }
    let mut checked = 0;
    for seed in 0..24u64 {
        let mut rng = ordo_fs::random::SplitMix64::new(seed);
        let dev = Arc::new(WriteCacheDevice::new(image()));
        let fs = Fs::mount(dev.clone(), opts()).unwrap();
        let root = Creds::root();
        let dirs = [
            fs.create(ROOT_INO, b"p", FileType::Directory, 0o755, 0, &root)
                .unwrap()
                .ino,
            fs.create(ROOT_INO, b"q", FileType::Directory, 0o755, 0, &root)
                .unwrap()
                .ino,
        ];
        fs.sync().unwrap();
        let streams: Vec<_> = [b"s0", b"s1", b"s2"]
            .iter()
            .map(|n| fs.stream_id(*n).unwrap())
            .collect();
        let mut files: Vec<Tracked> = Vec::new();
        for step in 0..60u64 {
            fs.set_thread_stream(streams[(rng.next_u64() % 3) as usize])
                .unwrap();
            let dir = dirs[(rng.next_u64() % 2) as usize];
            match rng.next_u64() % 10 {
                8 if !files.is_empty() => {
                    let i = (rng.next_u64() % files.len() as u64) as usize;
                    let set = ordo_fs::SetAttr {
                        size: Some(0),
                        ..Default::default()
                    };
                    fs.setattr(files[i].ino, &set).unwrap();
                    files[i].data.clear();
                    files[i].synced = false;
                }
                0 | 1 => {
                    let name = format!("f{step}").into_bytes();
                    let ino = create_in(&fs, dir, &name);
                    files.push(Tracked {
                        dir,
                        name,
                        ino,
                        data: Vec::new(),
                        synced: false,
                    });
                }
                2 | 3 if !files.is_empty() => {
                    let i = (rng.next_u64() % files.len() as u64) as usize;
                    let len = 1 + (rng.next_u64() % 9000) as usize;
                    let data = vec![(step % 251) as u8; len];
                    let off = files[i].data.len() as u64;
                    fs.write(files[i].ino, off, &data).unwrap();
                    files[i].data.extend_from_slice(&data);
                    files[i].synced = false;
                }
                4 if !files.is_empty() => {
                    let i = (rng.next_u64() % files.len() as u64) as usize;
                    let gone = files.remove(i);
                    fs.unlink(gone.dir, &gone.name).unwrap();
                }
                5 if !files.is_empty() => {
                    let i = (rng.next_u64() % files.len() as u64) as usize;
                    let new = format!("r{step}").into_bytes();
                    let (d, name) = (files[i].dir, files[i].name.clone());
                    fs.rename(d, &name, dir, &new, Default::default()).unwrap();
                    files[i].dir = dir;
                    files[i].name = new;
                    files[i].synced = false;
                }
                6 if !files.is_empty() => {
                    let i = (rng.next_u64() % files.len() as u64) as usize;
                    fs.fsync(files[i].ino, false).unwrap();
                    files[i].synced = true;
                }
                7 => fs.streamsync(fs.getstream()).unwrap(),
                _ => fs.write_back().unwrap(),
            }
        }
        let crashed = Arc::new(dev.crash(seed, CrashPolicy::default()).unwrap());
        drop(fs);
        let fs = Fs::mount(crashed.clone(), opts()).unwrap();
        for f in files.iter().filter(|f| f.synced) {
            {
                let ino = fs.lookup(f.dir, &f.name).expect("an fsynced file").ino;
                let have = fs.read(ino, 0, 1 << 20).unwrap();
                assert!(
                    have == f.data,
                    "seed {seed}: fsynced file has {} bytes",
                    have.len()
                );
            }
        }
        fs.unmount().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        std::fs::write(&path, crashed.to_image()).unwrap();
        let (code, out) = e2fsck_fn(&path);
        assert_eq!(code, 0, "seed {seed}: e2fsck -fn after recovery:\n{out}");
        checked += 1;
    }
    assert_eq!(checked, 24);
}

/// `dev`'s image in a file of a temporary directory, which `e2fsck -fn`
/// must find clean.
fn clean_image_file(dev: &MemDevice) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    std::fs::write(&path, dev.to_image()).unwrap();
    let (code, out) = e2fsck_fn(&path);
    assert_eq!(code, 0, "{out}");
    (dir, path)
}

/// The extents `debugfs` lists for `path` of image `img` (leaf extents).
fn extents_of(img: &std::path::Path, path: &str) -> usize {
    fast_commit_common::require("debugfs");
    let out = std::process::Command::new("debugfs")
        .arg("-R")
        .arg(format!("ex {path}"))
        .arg(img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // "Level Entries Logical Physical Length Flags", then one line per
    // extent-tree entry; leaves are at the deepest level.
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .filter(|r: &Vec<&str>| !r.is_empty())
        .collect();
    assert!(!rows.is_empty(), "debugfs ex {path}: {text}");
    let depth = |r: &Vec<&str>| r[0].split('/').next().unwrap().to_string();
    let leaf = rows.iter().map(depth).max().unwrap();
    rows.iter().filter(|r| depth(r) == leaf).count()
}

/// Four files appended 4 KiB at a time in turn, then fsynced, on a fresh
/// image; returns the image and the figures of delayed allocation.
fn interleaved_appends(
    mode: ProtocolKind,
) -> (tempfile::TempDir, std::path::PathBuf, (u64, u64, u64)) {
    let dev = image();
    let fs = Fs::mount(
        dev.clone(),
        MountOptions {
            mode,
            ..MountOptions::default()
        },
    )
    .unwrap();
    let inos: Vec<Ino> = (0..4)
        .map(|k| create_in(&fs, ROOT_INO, format!("f{k}").as_bytes()))
        .collect();
    for round in 0..50u64 {
        for (k, &ino) in inos.iter().enumerate() {
            let data = vec![(round as u8) ^ (k as u8); 4096];
            fs.write(ino, round * 4096, &data).unwrap();
        }
    }
    let before = fs.delalloc_stats();
    for &ino in &inos {
        fs.fsync(ino, false).unwrap();
        // Every byte reads back, from its place now.
        let back = fs.read(ino, 0, 50 * 4096).unwrap();
        assert_eq!(back.len(), 50 * 4096);
    }
    fs.unmount().unwrap();
    let (dir, path) = clean_image_file(&dev);
    (dir, path, before)
}

/// Order-preserving delayed allocation: appends of four files interleaved
/// in time are each placed in one run when a commit is about to be made
/// (ext4 with delalloc does the same); with `nodelalloc` every 4 KiB append
/// is allocated when written, so the files interleave block by block.
#[test]
fn interleaved_appends_are_placed_one_run_per_file() {
    let (_d, img, (delayed, settled, _)) = interleaved_appends(mode());
    assert_eq!(
        (delayed, settled),
        (200, 0),
        "every block delayed until the fsync"
    );
    for k in 0..4 {
        assert_eq!(extents_of(&img, &format!("/f{k}")), 1, "f{k}");
    }
    let now = mode().with_variant("nodelalloc").unwrap();
    let (_d, img, (delayed, settled, _)) = interleaved_appends(now);
    assert_eq!((delayed, settled), (0, 0));
    for k in 0..4 {
        assert_eq!(
            extents_of(&img, &format!("/f{k}")),
            50,
            "f{k} under nodelalloc"
        );
    }
}

/// Delayed blocks before their commit: they read back, count in `stat`
/// and `statfs`, are seen by SEEK_DATA, are placed before a truncate cuts
/// them, and a file unlinked before its commit never gets any.
#[test]
fn delayed_blocks_read_count_truncate_and_vanish() {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let a = create_in(&fs, ROOT_INO, b"a");
    let b = create_in(&fs, ROOT_INO, b"b");
    fs.sync().unwrap();
    let free0 = fs.statfs().unwrap().blocks_free;
    let data: Vec<u8> = (0..5 * 4096 + 100).map(|i| (i % 251) as u8).collect();
    fs.write(a, 0, &data).unwrap();
    fs.write(b, 8192, &data[..4096]).unwrap();
    assert_eq!(fs.delalloc_stats().0, 6 + 1);
    assert_eq!(fs.read(a, 0, data.len() as u32).unwrap(), data);
    assert_eq!(
        fs.getattr(a).unwrap().blocks,
        6 * 8,
        "st_blocks counts delayed blocks"
    );
    assert_eq!(fs.statfs().unwrap().blocks_free, free0 - 7);
    assert_eq!(
        fs.seek(b, 0, ordo_fs::SeekWhence::Data).unwrap(),
        8192,
        "SEEK_DATA finds the delayed block"
    );
    // A partial overwrite of a delayed block stays delayed.
    fs.write(a, 4096 + 10, b"xyz").unwrap();
    assert_eq!(fs.delalloc_stats().0, 7);
    // Truncating into the file places its blocks, then cuts them.
    let set = ordo_fs::SetAttr {
        size: Some(4096 + 12),
        ..Default::default()
    };
    fs.setattr(a, &set).unwrap();
    let (delayed, settled, _) = fs.delalloc_stats();
    assert_eq!((delayed, settled), (1, 6));
    let back = fs.read(a, 0, 2 * 4096).unwrap();
    assert_eq!(back.len(), 4096 + 12);
    assert_eq!(&back[..4096], &data[..4096]);
    assert_eq!(&back[4096 + 10..], b"xy");
    // b is unlinked before any commit: its delayed block was never placed.
    fs.unlink(ROOT_INO, b"b").unwrap();
    assert_eq!(fs.delalloc_stats(), (0, 6, 1));
    fs.unmount().unwrap();
    let _img = clean_image_file(&dev);
    let fs = Fs::mount(dev, opts()).unwrap();
    let back = fs.read(a, 0, 2 * 4096).unwrap();
    assert_eq!(&back[..4096], &data[..4096]);
    assert_eq!(fs.getattr(a).unwrap().blocks, 2 * 8);
}

/// A full file system: writes are delayed only while the space for them
/// (and their extent-tree blocks) can be promised, so giving the delayed
/// blocks their places never fails for space. Fill the image with files
/// written in turn until ENOSPC, then sync: every byte a write returned is
/// there after a remount, and e2fsck is clean.
#[test]
fn a_full_file_system_places_every_delayed_block() {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts()).unwrap();
    let inos: Vec<Ino> = (0..8)
        .map(|k| create_in(&fs, ROOT_INO, format!("fill{k}").as_bytes()))
        .collect();
    let mut sizes = vec![0u64; inos.len()];
    let chunk = vec![0x5au8; 64 * 1024];
    'fill: for _ in 0..100_000 {
        for (k, &ino) in inos.iter().enumerate() {
            match fs.write(ino, sizes[k], &chunk) {
                Ok(n) => sizes[k] += u64::from(n),
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                    break 'fill;
                }
            }
        }
    }
    let total: u64 = sizes.iter().sum();
    assert!(total > 40 << 20, "only {total} bytes written");
    // Root's writes went into root's reserve too. A caller without that
    // right truncating a file with delayed blocks places them first: the
    // places were promised, reserve included, so it does not fail.
    assert!(fs.delalloc_stats().0 > 0, "nothing left delayed to place");
    let user = Creds {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
        umask: 0,
    };
    for (k, &ino) in inos.iter().enumerate() {
        let rw = ordo_fs::SetAttr {
            perm: Some(0o666),
            ..Default::default()
        };
        fs.setattr(ino, &rw).unwrap();
        let cut = ordo_fs::SetAttr {
            size: Some(sizes[k] - 100),
            ..Default::default()
        };
        fs.setattr_as(ino, &cut, &user).unwrap();
        sizes[k] -= 100;
    }
    assert_eq!(
        fs.delalloc_stats().0,
        0,
        "every truncated file's blocks placed"
    );
    fs.sync().unwrap();
    assert_eq!(fs.delalloc_stats().0, 0);
    fs.unmount().unwrap();
    let _img = clean_image_file(&dev);
    let fs = Fs::mount(dev, opts()).unwrap();
    for (k, &ino) in inos.iter().enumerate() {
        let a = fs.getattr(ino).unwrap();
        assert_eq!(a.size, sizes[k]);
        let tail = fs.read(ino, sizes[k].saturating_sub(4096), 4096).unwrap();
        assert!(tail.iter().all(|&x| x == 0x5a), "fill{k} ends in its bytes");
    }
}
