//! The `sync` protocol keeps Ganger and Patt's rules at every crash point.
//!
//! A workload of namespace and data operations runs in `sync` mode on a
//! recording device. Every prefix of the recorded writes is a state a crash
//! can leave (metadata writes are FUA, one after another, and fresh data is
//! flushed before them). Each state is mounted read-only by ordo and walked:
//! every entry must name an initialized inode of the right type whose
//! checksum holds, no inode may have fewer links than names (too many is a
//! benign leak), every file's extent tree and blocks must read, and no block
//! may belong to two files. The same checker, run on a state the `async`
//! protocol can leave (a directory block written without the inode it
//! names), must find the damage: the test can fail.

mod core_common;

use std::collections::HashMap;
use std::sync::Arc;

use core_common::*;
use ordo_dev::{BlockDevice, EventKind, MemDevice, RecordingDevice, WriteFlags};
use ordo_fs::{Creds, FileType, Fs, Ino, MountOptions, ProtocolKind, RenameFlags, ROOT_INO};

fn base_image(block_size: u32) -> Arc<MemDevice> {
    let (_dir, img) = scratch();
    mkfs(&img, 16, block_size, "^has_journal");
    let bytes = std::fs::read(&img).unwrap();
    Arc::new(MemDevice::from_image(block_size, &bytes).unwrap())
}

/// Walk a crash state; `Err` describes the first non-benign inconsistency.
fn check_state(dev: MemDevice) -> Result<(), String> {
    let fs = Fs::mount(
        Arc::new(dev),
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .map_err(|e| format!("mount: {e}"))?;
    let mut refs: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    let mut todo = vec![ROOT_INO];
    let mut visited = std::collections::HashSet::from([ROOT_INO]);
    let mut seen_dirs = 0;
    while let Some(dir) = todo.pop() {
        seen_dirs += 1;
        if seen_dirs > 10_000 {
            return Err("directory loop".into());
        }
        let mut cookie = 0;
        loop {
            let page = fs
                .readdir(dir, cookie, 64)
                .map_err(|e| format!("readdir {dir}: {e}"))?;
            let Some(last) = page.last() else { break };
            cookie = last.next_offset;
            for e in page {
                if e.name == b".." {
                    // A directory counts its subdirectories' `..` entries.
                    *subdirs.entry(e.ino).or_default() += 1;
                    continue;
                }
                if e.name == b"." {
                    continue;
                }
                let a = fs.getattr(e.ino).map_err(|er| {
                    format!(
                        "entry {dir}/{} names inode {} that is not initialized: {er}",
                        String::from_utf8_lossy(&e.name),
                        e.ino
                    )
                })?;
                if a.kind != e.kind {
                    return Err(format!(
                        "entry type {:?} but inode {} is {:?}",
                        e.kind, e.ino, a.kind
                    ));
                }
                *refs.entry(e.ino).or_default() += 1;
                match a.kind {
                    FileType::Directory if visited.insert(e.ino) => todo.push(e.ino),
                    FileType::Regular => {
                        fs.read(e.ino, 0, a.size.min(1 << 24) as u32)
                            .map_err(|er| format!("read {}: {er}", e.ino))?;
                    }
                    FileType::Symlink => {
                        fs.readlink(e.ino)
                            .map_err(|er| format!("readlink {}: {er}", e.ino))?;
                    }
                    _ => {}
                }
            }
        }
    }
    for (&ino, &n) in &refs {
        let a = fs.getattr(ino).unwrap();
        let want = if a.kind == FileType::Directory {
            2 + subdirs.get(&ino).copied().unwrap_or(0)
        } else {
            n
        };
        // A directory moved to another parent has its new entry written
        // before the old one is removed (rule 3), so a crash in between
        // leaves it with two names; fsck removes the stale one, as FFS's
        // does. More than two is damage.
        if a.kind == FileType::Directory && n > 2 {
            return Err(format!("directory {ino} has {n} names"));
        }
        if a.nlink < want && !(a.kind == FileType::Directory && a.nlink == 1) {
            return Err(format!(
                "inode {ino} has {} links but {want} references",
                a.nlink
            ));
        }
    }
    let root = fs.getattr(ROOT_INO).unwrap();
    // The root's own `..` names itself.
    if root.nlink + 1 < 2 + subdirs.get(&ROOT_INO).copied().unwrap_or(0) {
        return Err("root link count too low".into());
    }
    Ok(())
}

/// Which of the writes not yet made durable by a flush reach the disk.
#[derive(Clone, Copy)]
enum Volatile {
    All,
    None,
    /// A pseudo-random subset, by seed.
    Some(u64),
}

/// The disk after a crash following the first `k` writes of `log`: writes
/// made durable (FUA, or followed by a flush before the crash) are there;
/// the others per `volatile`.
fn state(
    base: &Arc<MemDevice>,
    log: &[ordo_dev::Event],
    k: usize,
    volatile: Volatile,
) -> MemDevice {
    let d = base.snapshot();
    let mut writes = 0;
    let mut pending: Vec<&ordo_dev::Event> = Vec::new();
    let mut x = match volatile {
        Volatile::Some(seed) => seed | 1,
        _ => 1,
    };
    let apply = |ev: &ordo_dev::Event| {
        if let EventKind::Write { block, data, .. } = &ev.kind {
            d.write(*block, data, WriteFlags::new(ordo_dev::BlockClass::Other))
                .unwrap();
        }
    };
    for ev in log {
        if writes == k {
            break;
        }
        match &ev.kind {
            EventKind::Flush => {
                for p in pending.drain(..) {
                    apply(p);
                }
            }
            EventKind::Write { fua: true, .. } => {
                writes += 1;
                apply(ev);
            }
            EventKind::Write { .. } => {
                writes += 1;
                pending.push(ev);
            }
            EventKind::Mark(_) => {}
        }
    }
    for p in pending {
        let keep = match volatile {
            Volatile::All => true,
            Volatile::None => false,
            Volatile::Some(_) => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x & 1 == 1
            }
        };
        if keep {
            apply(p);
        }
    }
    d
}

fn workload(fs: &Fs) {
    let c = Creds::root();
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, &c).unwrap();
    let b = fs.mkdir(ROOT_INO, b"b", 0o755, &c).unwrap();
    let f = fs
        .create(a.ino, b"f", FileType::Regular, 0o644, 0, &c)
        .unwrap();
    fs.write(f.ino, 0, &vec![1u8; 50_000]).unwrap();
    fs.link(f.ino, b.ino, b"hard").unwrap();
    fs.symlink(a.ino, b"slow", &[b's'; 200], &c).unwrap();
    for i in 0..40 {
        fs.create(
            a.ino,
            format!("many-{i}").as_bytes(),
            FileType::Regular,
            0o644,
            0,
            &c,
        )
        .unwrap();
    }
    fs.rename(a.ino, b"f", b.ino, b"g", RenameFlags::default())
        .unwrap();
    let v = fs
        .create(b.ino, b"victim", FileType::Regular, 0o644, 0, &c)
        .unwrap();
    fs.write(v.ino, 0, &vec![2u8; 9000]).unwrap();
    fs.rename(b.ino, b"g", b.ino, b"victim", RenameFlags::default())
        .unwrap();
    fs.mkdir(a.ino, b"sub", 0o755, &c).unwrap();
    fs.rename(a.ino, b"sub", b.ino, b"sub2", RenameFlags::default())
        .unwrap();
    fs.rename(
        a.ino,
        b"slow",
        b.ino,
        b"hard",
        RenameFlags {
            exchange: true,
            ..Default::default()
        },
    )
    .unwrap();
    for i in 0..40 {
        fs.unlink(a.ino, format!("many-{i}").as_bytes()).unwrap();
    }
    fs.setattr(
        f.ino,
        &ordo_fs::SetAttr {
            size: Some(100),
            ..Default::default()
        },
    )
    .unwrap();
    fs.rmdir(b.ino, b"sub2").unwrap();
    fs.rmdir(ROOT_INO, b"a").unwrap_err();
}

fn run(block_size: u32) {
    if !have("mkfs.ext4") {
        return;
    }
    let base = base_image(block_size);
    let rec = Arc::new(RecordingDevice::from_base(base.clone()));
    let fs = Fs::mount(
        rec.clone(),
        MountOptions {
            mode: ProtocolKind::named("sync"),
            ..Default::default()
        },
    )
    .unwrap();
    workload(&fs);
    fs.unmount().unwrap();
    let log = rec.log();
    let writes = log
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Write { .. }))
        .count();
    assert!(writes > 50, "only {writes} writes recorded");
    let mut fua = 0;
    for e in &log {
        if let EventKind::Write { fua: true, .. } = e.kind {
            fua += 1;
        }
    }
    assert!(
        fua * 2 > writes,
        "sync mode should write metadata FUA ({fua} of {writes})"
    );
    for k in 0..=writes {
        for v in [
            Volatile::All,
            Volatile::None,
            Volatile::Some(k as u64 * 7919),
        ] {
            if let Err(e) = check_state(state(&base, &log, k, v)) {
                panic!("crash after write {k} of {writes} leaves a non-benign state: {e}");
            }
        }
    }
}

#[test]
fn sync_every_crash_prefix_is_benign_4k() {
    run(4096);
}

#[test]
fn sync_every_crash_prefix_is_benign_1k() {
    run(1024);
}

#[test]
fn checker_finds_async_damage() {
    if !have("mkfs.ext4") {
        return;
    }
    let base = base_image(4096);
    let rec = Arc::new(RecordingDevice::from_base(base.clone()));
    let fs = Fs::mount(rec.clone(), MountOptions::default()).unwrap();
    let c = Creds::root();
    fs.sync().unwrap();
    rec.take_log();
    for i in 0..10 {
        fs.create(
            ROOT_INO,
            format!("f{i}").as_bytes(),
            FileType::Regular,
            0o644,
            0,
            &c,
        )
        .unwrap();
    }
    fs.sync().unwrap();
    let log = rec.take_log();
    drop(fs);
    // The state where, of the second sync's writes, only the root
    // directory's block reached the disk: its entries name inodes that were
    // never initialized there.
    let mut wrote_dir = false;
    let st = base.snapshot();
    for ev in &log {
        if let EventKind::Write {
            block, data, class, ..
        } = &ev.kind
        {
            if *class == ordo_dev::BlockClass::Directory {
                st.write(*block, data, WriteFlags::new(*class)).unwrap();
                wrote_dir = true;
            }
        }
    }
    assert!(wrote_dir);
    assert!(
        check_state(st).is_err(),
        "the checker missed a dangling entry"
    );
}
