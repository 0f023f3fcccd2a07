//! `mode=optimistic` (OptFS) at the library level: the flushes osync and
//! dsync cost, `fsync=osync`, delayed checkpoints, the journal feature that
//! keeps the kernel and e2fsck from replaying its log, plain ext4 after a
//! clean unmount or a recovery, and recovery of corrupted logs to a
//! consistent prefix. The crash explorer checks the crash states
//! (`ordo crash --mode optimistic`).

mod fast_commit_common;

use std::path::Path;
use std::sync::Arc;

use fast_commit_common::{can_loop_mount, e2fsck_fn, env_of, have, kernel_mount};
use ordo_dev::{BlockDevice, CrashPolicy, MemDevice, WriteCacheDevice};
use ordo_format::jbd2::{self, JournalSuperblock};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Creds, FileType, Fs, FsyncMeaning, MountOptions, ProtocolKind, ROOT_INO};

fn mode() -> ProtocolKind {
    ProtocolKind::named("optimistic")
}

/// A fresh 32 MiB image formatted for `mode=optimistic`, in memory.
fn image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(4096, 8192).unwrap());
    let features = parse_features(mode().spec().mkfs_features, DEFAULT_FEATURES).unwrap();
    let opts = MkfsOptions {
        block_size: 4096,
        features,
        uuid: Some(*b"ordo-optfs-test!"),
        journal_blocks: Some(1024),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.as_ref(), &opts).unwrap();
    dev
}

fn opts(fsync: FsyncMeaning) -> MountOptions {
    MountOptions {
        mode: mode(),
        fsync,
        ..MountOptions::default()
    }
}

fn create(fs: &Fs, name: &[u8], data: &[u8]) -> ordo_fs::Ino {
    let a = fs
        .create(ROOT_INO, name, FileType::Regular, 0o644, 0, &Creds::root())
        .unwrap();
    fs.write(a.ino, 0, data).unwrap();
    a.ino
}

fn flushes(fs: &Fs) -> u64 {
    fs.counters().flushes
}

fn stat(fs: &Fs, name: &str) -> u64 {
    let (_, stats) = fs.protocol_stats();
    stats
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no statistic {name}"))
}

/// The journal superblock of an image.
fn journal_super(dev: &dyn BlockDevice) -> JournalSuperblock {
    let runs = ordo_fs::recovery::locate_journal(dev).unwrap().unwrap();
    let map = ordo_fs::recovery::JournalMap::new(runs);
    ordo_fs::recovery::read_journal_super(dev, &map).unwrap()
}

fn has_data_tags_feature(dev: &dyn BlockDevice) -> bool {
    journal_super(dev).feature_incompat & jbd2::FEATURE_INCOMPAT_ORDO_DATA_TAGS != 0
}

fn write_file(dev: &MemDevice, path: &Path) {
    std::fs::write(path, dev.to_image()).unwrap();
}

#[test]
fn osync_costs_no_flush_and_dsync_exactly_one() {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts(FsyncMeaning::Dsync)).unwrap();
    let a = create(&fs, b"a", &[1; 8192]);
    let f0 = flushes(&fs);
    fs.osync(a).unwrap();
    assert_eq!(flushes(&fs), f0, "osync flushes nothing");
    fs.write(a, 8192, &[2; 4096]).unwrap();
    let f1 = flushes(&fs);
    fs.dsync(a).unwrap();
    assert_eq!(flushes(&fs), f1 + 1, "dsync: one flush");
    fs.write(a, 0, &[3; 4096]).unwrap();
    let f2 = flushes(&fs);
    fs.fsync(a, false).unwrap();
    assert_eq!(
        flushes(&fs),
        f2 + 1,
        "fsync=dsync: a plain fsync is a dsync"
    );
    // Nothing new: everything is known durable, no flush at all.
    let f3 = flushes(&fs);
    fs.dsync(a).unwrap();
    assert_eq!(flushes(&fs), f3, "a dsync with nothing to make durable");
    assert!(stat(&fs, "data_tags") >= 3, "fresh blocks were tagged");
    assert!(
        stat(&fs, "journaled_data_blocks") >= 1,
        "the overwrite was journaled"
    );
    fs.unmount().unwrap();

    let fs = Fs::mount(dev.clone(), opts(FsyncMeaning::Osync)).unwrap();
    let a = fs.lookup(ROOT_INO, b"a").unwrap().ino;
    fs.write(a, 12288, &[4; 4096]).unwrap();
    let f = flushes(&fs);
    fs.fsync(a, false).unwrap();
    assert_eq!(
        flushes(&fs),
        f,
        "fsync=osync: a plain fsync flushes nothing"
    );
    assert_eq!(stat(&fs, "osyncs"), 1);
    // The background tick makes it durable with one flush.
    fs.write_back().unwrap();
    assert_eq!(flushes(&fs), f + 1);
    assert_eq!(stat(&fs, "background_flushes"), 1);
    fs.unmount().unwrap();
}

/// Durability notifications without a flush: a disk that wrote its cache
/// back on its own (idle destage) made every commit durable, the next tick
/// learns it from the device's durable horizon, and neither the tick nor a
/// dsync then flushes. A power cut that loses every pending write keeps
/// what was destaged.
#[test]
fn a_cache_that_destages_on_its_own_saves_the_flushes() {
    let dev = Arc::new(WriteCacheDevice::new(image()));
    let fs = Fs::mount(dev.clone(), opts(FsyncMeaning::Dsync)).unwrap();
    let a = create(&fs, b"a", &[1; 8192]);
    fs.osync(a).unwrap();
    // Nothing destaged: the tick owes the osync one flush.
    let f = flushes(&fs);
    fs.write_back().unwrap();
    assert_eq!(flushes(&fs), f + 1);
    assert_eq!(stat(&fs, "background_flushes"), 1);

    let b = create(&fs, b"b", &[2; 12288]);
    fs.osync(b).unwrap();
    dev.destage_all().unwrap();
    let f = flushes(&fs);
    fs.write_back().unwrap();
    assert_eq!(
        flushes(&fs),
        f,
        "the destage made the commit durable: no flush"
    );
    assert_eq!(stat(&fs, "background_flushes"), 1);
    fs.dsync(b).unwrap();
    assert_eq!(flushes(&fs), f, "nothing left to make durable");

    let crashed = Arc::new(dev.crash(3, CrashPolicy::lose_all()).unwrap());
    drop(fs);
    let env = env_of(crashed.as_ref());
    ordo_fs::protocol::recover(mode(), crashed.as_ref(), &env).unwrap();
    let fs = Fs::mount(crashed, opts(FsyncMeaning::Dsync)).unwrap();
    let b = fs.lookup(ROOT_INO, b"b").expect("b was destaged").ino;
    assert_eq!(fs.read(b, 0, 12288).unwrap(), vec![2; 12288]);
    fs.unmount().unwrap();
}

#[test]
fn fsync_osync_is_refused_where_osync_is_not_native() {
    let dev = image();
    let err = Fs::mount(
        dev,
        MountOptions {
            mode: ProtocolKind::named("journal"),
            fsync: FsyncMeaning::Osync,
            ..MountOptions::default()
        },
    )
    .err()
    .expect("journal has no osync of its own");
    assert!(err.to_string().contains("fsync=osync"), "{err}");
}

#[test]
fn checkpoints_wait_for_durability_and_the_log_is_released() {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts(FsyncMeaning::Dsync)).unwrap();
    let a = create(&fs, b"big", &[0; 131072]);
    fs.dsync(a).unwrap();
    // Overwrites are journaled: 32 blocks per osync fill half the log.
    for i in 0..20u8 {
        fs.write(a, 0, &[i; 131072]).unwrap();
        fs.osync(a).unwrap();
    }
    let f = flushes(&fs);
    fs.write_back().unwrap();
    assert!(stat(&fs, "checkpoints") >= 1, "the tick checkpointed");
    assert!(
        flushes(&fs) >= f + 2,
        "a flush before the checkpoint (its commits were not durable) and one after it"
    );
    assert_eq!(fs.read(a, 0, 131072).unwrap(), vec![19; 131072]);
    fs.unmount().unwrap();
}

#[test]
fn a_live_log_is_refused_by_others_and_recovered_by_ordo() {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts(FsyncMeaning::Dsync)).unwrap();
    let a = create(&fs, b"durable", &[7; 20000]);
    fs.dsync(a).unwrap();
    let b = create(&fs, b"ordered", &[8; 5000]);
    fs.osync(b).unwrap();
    // The crash: every acknowledged write reached the memory device.
    let crashed = Arc::new(dev.snapshot());
    drop(fs);
    assert!(has_data_tags_feature(crashed.as_ref()));
    let env = env_of(crashed.as_ref());
    // ordo's JBD2 recovery (mode=journal, fast_commit) refuses it by name.
    let copy = crashed.snapshot();
    let err = ordo_fs::protocol::recover(ProtocolKind::named("journal"), &copy, &env)
        .expect_err("mode=journal must not replay unverified data tags");
    assert!(err.to_string().contains("mode=optimistic"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("crash.img");
    write_file(&crashed, &img);
    if have("e2fsck") {
        let (code, out) = e2fsck_fn(&img);
        assert_ne!(code, 0, "e2fsck must refuse the journal: {out}");
        assert!(
            out.contains("unsupported feature") || out.contains("unknown incompat"),
            "e2fsck names the feature: {out}"
        );
    }
    if can_loop_mount() && ordo_dev::KernelMount::mount_temp(&img, "").is_ok() {
        panic!("the kernel mounted a journal with ordo's data-tag feature");
    }
    // ordo's recovery replays both, clears the feature: plain ext4.
    let report = ordo_fs::protocol::recover(mode(), crashed.as_ref(), &env).unwrap();
    assert!(report.replayed >= 2, "{:?}", report.lines);
    assert!(!has_data_tags_feature(crashed.as_ref()));
    write_file(&crashed, &img);
    if have("e2fsck") {
        let (code, out) = e2fsck_fn(&img);
        assert_eq!(code, 0, "{out}");
    }
    let fs = Fs::mount(
        crashed,
        MountOptions {
            read_only: true,
            ..opts(FsyncMeaning::Dsync)
        },
    )
    .unwrap();
    let a = fs.lookup(ROOT_INO, b"durable").unwrap().ino;
    assert_eq!(fs.read(a, 0, 20000).unwrap(), vec![7; 20000]);
    let b = fs.lookup(ROOT_INO, b"ordered").unwrap().ino;
    assert_eq!(fs.read(b, 0, 5000).unwrap(), vec![8; 5000]);
}

#[test]
fn a_clean_unmount_leaves_plain_ext4_the_kernel_mounts() {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts(FsyncMeaning::Dsync)).unwrap();
    let a = create(&fs, b"f", &[5; 70000]);
    fs.osync(a).unwrap();
    fs.write(a, 4096, &[6; 4096]).unwrap();
    fs.unmount().unwrap();
    assert!(!has_data_tags_feature(dev.as_ref()));
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("clean.img");
    write_file(&dev, &img);
    if have("e2fsck") {
        let (code, out) = e2fsck_fn(&img);
        assert_eq!(code, 0, "{out}");
    }
    if can_loop_mount() {
        let m = kernel_mount(&img, "ro");
        let data = std::fs::read(m.mountpoint().join("f"));
        drop(m);
        let data = data.unwrap();
        let mut want = vec![5; 70000];
        want[4096..8192].fill(6);
        assert_eq!(data, want);
    }
}

/// A crash image whose log holds several transactions: returns it with
/// the journal's block map.
fn log_of_transactions() -> (Arc<MemDevice>, Vec<u64>) {
    let dev = image();
    let fs = Fs::mount(dev.clone(), opts(FsyncMeaning::Dsync)).unwrap();
    for i in 0..12u8 {
        let ino = create(
            &fs,
            format!("f{i}").as_bytes(),
            &vec![i + 1; 4096 * (1 + i as usize % 3)],
        );
        if i % 4 == 3 {
            fs.dsync(ino).unwrap();
        } else {
            fs.osync(ino).unwrap();
        }
    }
    let crashed = Arc::new(dev.snapshot());
    drop(fs);
    let runs = ordo_fs::recovery::locate_journal(crashed.as_ref())
        .unwrap()
        .unwrap();
    let mut blocks = Vec::new();
    for (_, p, len) in runs {
        blocks.extend(p..p + len as u64);
    }
    (crashed, blocks)
}

/// Recover `img` (never a panic); when it succeeds, the result must pass
/// ordo's fsck with no repair, and every file present must hold exactly
/// what was written to it.
fn recovers_to_a_prefix(img: &Arc<MemDevice>) -> Result<u64, String> {
    let env = env_of(img.as_ref());
    let report =
        ordo_fs::protocol::recover(mode(), img.as_ref(), &env).map_err(|e| e.to_string())?;
    let fsck = ordo_fs::fsck::check(img.as_ref(), &ordo_fs::fsck::FsckOptions::default())
        .expect("fsck reads a recovered image");
    assert!(
        fsck.is_clean(),
        "fsck after recovery: {:?} ({:?})",
        fsck.problems
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>(),
        report.lines
    );
    let fs = Fs::mount(
        img.clone(),
        MountOptions {
            read_only: true,
            ..opts(FsyncMeaning::Dsync)
        },
    )
    .map_err(|e| e.to_string())?;
    for i in 0..12u8 {
        if let Ok(a) = fs.lookup(ROOT_INO, format!("f{i}").as_bytes()) {
            let want = vec![i + 1; 4096 * (1 + i as usize % 3)];
            assert_eq!(
                fs.read(a.ino, 0, want.len() as u32 + 1).unwrap(),
                want,
                "f{i} after recovery ({:?})",
                report.lines
            );
        }
    }
    // A prefix: f0..fk exist for some k.
    let present: Vec<bool> = (0..12u8)
        .map(|i| fs.lookup(ROOT_INO, format!("f{i}").as_bytes()).is_ok())
        .collect();
    let k = present.iter().take_while(|p| **p).count();
    assert!(
        present[k..].iter().all(|p| !p),
        "not a prefix: {present:?} ({:?})",
        report.lines
    );
    Ok(k as u64)
}

#[test]
fn corrupted_logs_recover_to_a_consistent_prefix() {
    let (crashed, journal) = log_of_transactions();
    let whole = crashed.snapshot();
    assert_eq!(recovers_to_a_prefix(&Arc::new(whole)).unwrap(), 12);
    let populated: Vec<u64> = journal
        .iter()
        .copied()
        .filter(|b| crashed.block(*b).is_some_and(|d| d.iter().any(|&x| x != 0)))
        .collect();
    assert!(populated.len() > 12, "the log holds the transactions");
    let bs = 4096usize;
    let mut cases = 0;
    // A bit flipped in every block of the log, at three places.
    for &b in &populated {
        for off in [0usize, 0x40 + 9, bs - 3] {
            let img = Arc::new(crashed.snapshot());
            let mut d = img.block(b).unwrap().to_vec();
            d[off] ^= 0x10;
            img.put_block(b, d.into());
            let _ = recovers_to_a_prefix(&img);
            cases += 1;
        }
    }
    // The log truncated after each of its blocks.
    for cut in 1..populated.len() {
        let img = Arc::new(crashed.snapshot());
        for &b in &populated[cut..] {
            if b != populated[0] {
                img.put_block(b, vec![0u8; bs].into());
            }
        }
        let _ = recovers_to_a_prefix(&img);
        cases += 1;
    }
    // Data that never arrived, in many transactions at once: every file
    // block zeroed, then every other one.
    let fs_blocks: Vec<u64> = crashed
        .populated_blocks()
        .into_iter()
        .filter(|b| {
            !journal.contains(b)
                && crashed
                    .block(*b)
                    .is_some_and(|d| d.iter().all(|&x| (1..=12).contains(&x)))
        })
        .collect();
    assert!(fs_blocks.len() >= 12, "file data blocks found");
    for step in [1usize, 2, 3] {
        let img = Arc::new(crashed.snapshot());
        for &b in fs_blocks.iter().step_by(step) {
            img.put_block(b, vec![0u8; bs].into());
        }
        let k = recovers_to_a_prefix(&img).expect("data mismatches are a clean cut");
        assert!(k < 12, "a transaction whose data is gone is not replayed");
        cases += 1;
    }
    assert!(cases > 50);
}
