//! Fast commits that touch hashed (htree) directories.
//!
//! A directory the kernel indexed (more than one block of entries) is the
//! common case for a busy directory, so a fast-commit log that adds or
//! removes entries in one must replay: ordo drops the index (clears
//! `EXT4_INDEX_FL`, rewrites the dx root and nodes as empty linear blocks)
//! and edits the directory as a linear one.
//!
//! - Kernel-written logs (4 KiB and 1 KiB blocks): a directory of 2,000
//!   entries made and synced in a first mount, then creates, links,
//!   unlinks and renames in it with fsyncs in a second mount, captured
//!   while mounted. ordo, `e2fsck -fy` and a kernel read-write mount
//!   replay the capture to the same tree (names, inode numbers, sizes,
//!   contents); ordo's result is `e2fsck -fn` clean and the directory is
//!   linear. A power cut after every prefix of ordo's replay writes,
//!   followed by another replay, gives the same image, byte for byte
//!   (ordo writes the replay's result through a JBD2 transaction).
//! - A kernel log whose INODE record carries the index flag of a
//!   directory the same log creates (the kernel indexed it in memory; its
//!   blocks are not in the log): ordo's replay leaves it linear and valid.
//! - ordo as the writer on a kernel-made htree directory: the change that
//!   drops the index is a full commit (`fc_ineligible_htree_conversion`),
//!   later changes are fast commits; after a power cut ordo and the kernel
//!   replay to the same tree.
//!
//! Skipped unless running as root with loop devices.

mod fast_commit_common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use fast_commit_common::*;
use ordo_dev::{
    BlockClass, BlockDevice, CrashPolicy, EventKind, MemDevice, RecordingDevice, WriteCacheDevice,
    WriteFlags,
};
use ordo_fs::protocol::ProtocolKind;
use ordo_fs::{Creds, FileType, Fs, MountOptions, ROOT_INO};

/// Entries made in the big directory before the fast commits.
const BIG_ENTRIES: usize = 2000;
/// Files created in the big directory before the last fsync.
const LATE: usize = 40;
/// Entries of a directory created and grown in the fast-commit window:
/// more than one 4 KiB block of them, few enough for the 15-block
/// fast-commit area of a 64 MiB image.
const GROWN: usize = 150;
/// `EXT4_INDEX_FL`.
const INDEX_FL: u32 = 0x1000;

fn big_name(i: usize) -> String {
    format!("entry-with-a-longish-name-{i:05}")
}

/// Contents of the `i`-th file of the big directory (most are empty).
fn big_content(i: usize) -> Vec<u8> {
    if i.is_multiple_of(100) {
        format!("file {i}\n").repeat(i / 100 + 1).into_bytes()
    } else {
        Vec::new()
    }
}

/// Format, then make `/big` with [`BIG_ENTRIES`] files through a kernel
/// mount and unmount it: the directory is indexed and checkpointed home.
fn image_with_big_dir(img: &Path, block_size: u32) {
    mkfs_fc(img, "64M", block_size);
    {
        let m = kernel_mount(img, "rw");
        let big = m.mountpoint().join("big");
        std::fs::create_dir(&big).unwrap();
        for i in 0..BIG_ENTRIES {
            std::fs::write(big.join(big_name(i)), big_content(i)).unwrap();
        }
    }
    assert!(
        inode_flags(img, "/big") & INDEX_FL != 0,
        "the kernel did not index /big"
    );
}

/// `i_flags` of a path, as debugfs reads it.
fn inode_flags(img: &Path, path: &str) -> u32 {
    let out = run(Command::new("debugfs")
        .args(["-R", &format!("stat {path}")])
        .arg(img));
    let at = out.find("Flags: 0x").expect("debugfs prints the flags") + 9;
    let hex: String = out[at..]
        .chars()
        .take_while(|c| c.is_ascii_hexdigit())
        .collect();
    u32::from_str_radix(&hex, 16).unwrap()
}

/// One object of a tree: inode number, kind, size, contents.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    ino: u64,
    kind: &'static str,
    nlink: u64,
    size: u64,
    content: Vec<u8>,
}

fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<String, Node>) {
    for e in std::fs::read_dir(root.join(rel)).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if rel.as_os_str().is_empty() && name == "lost+found" {
            continue;
        }
        let r = rel.join(&name);
        let p = root.join(&r);
        let m = std::fs::symlink_metadata(&p).unwrap();
        let ft = m.file_type();
        let (kind, content) = if ft.is_dir() {
            ("dir", Vec::new())
        } else if ft.is_file() {
            ("file", std::fs::read(&p).unwrap())
        } else {
            ("other", Vec::new())
        };
        out.insert(
            r.display().to_string(),
            Node {
                ino: m.ino(),
                kind,
                nlink: m.nlink(),
                size: if ft.is_dir() { 0 } else { m.size() },
                content,
            },
        );
        if ft.is_dir() {
            walk(root, &r, out);
        }
    }
}

/// The tree of an image through a read-only kernel mount.
fn kernel_tree(img: &Path) -> BTreeMap<String, Node> {
    let m = kernel_mount(img, "ro,noload");
    let mut out = BTreeMap::new();
    walk(m.mountpoint(), Path::new(""), &mut out);
    out
}

/// The tree of an image as ordo reads it (read-only mount).
fn ordo_tree(dev: Arc<dyn BlockDevice>) -> BTreeMap<String, Node> {
    let fs = Fs::mount(
        dev,
        MountOptions {
            read_only: true,
            ..fc_opts()
        },
    )
    .unwrap();
    ordo_walk(&fs, false)
        .into_iter()
        .map(|(p, a)| {
            let (kind, size, content) = match a.kind {
                FileType::Directory => ("dir", 0, Vec::new()),
                FileType::Regular => ("file", a.size, fs.read(a.ino, 0, a.size as u32).unwrap()),
                _ => ("other", a.size, Vec::new()),
            };
            let node = Node {
                ino: a.ino as u64,
                kind,
                nlink: a.nlink as u64,
                size,
                content,
            };
            (p, node)
        })
        .collect()
}

/// Assert two trees are equal, naming the first difference.
fn assert_same(a: &BTreeMap<String, Node>, b: &BTreeMap<String, Node>, what: &str) {
    for (k, va) in a {
        let Some(vb) = b.get(k) else {
            panic!("{what}: {k} only in the first tree");
        };
        assert_eq!(
            (va.ino, va.kind, va.nlink, va.size),
            (vb.ino, vb.kind, vb.nlink, vb.size),
            "{what}: {k} differs"
        );
        assert!(
            va.content == vb.content,
            "{what}: {k}: contents differ ({} and {} bytes, {:?} and {:?} first)",
            va.content.len(),
            vb.content.len(),
            va.content.iter().take(16).collect::<Vec<_>>(),
            vb.content.iter().take(16).collect::<Vec<_>>()
        );
    }
    if let Some(k) = b.keys().find(|k| !a.contains_key(*k)) {
        panic!("{what}: {k} only in the second tree");
    }
}

fn fc_opts() -> MountOptions {
    MountOptions {
        mode: ProtocolKind::named("fast_commit"),
        commit_interval_ms: 600_000,
        ..MountOptions::default()
    }
}

fn block_size_of(img: &[u8]) -> u32 {
    let log = u32::from_le_bytes(img[1024 + 0x18..1024 + 0x1C].try_into().unwrap());
    1024 << log
}

/// Record one uninterrupted ordo replay of `cap`, then cut the power
/// after prefixes of its writes, replay again, and check each result is
/// `e2fsck -fn` clean and the very image (so the tree) of the
/// uninterrupted replay.
fn replay_is_idempotent_under_crashes(cap: &Path, scratch: &Path) {
    let raw = std::fs::read(cap).unwrap();
    let bs = block_size_of(&raw);
    let crashed = MemDevice::from_image(bs, &raw).unwrap();
    let env = env_of(&crashed);
    let rec = RecordingDevice::new(crashed.snapshot());
    ordo_fs::protocol::recover(ProtocolKind::named("fast_commit"), &rec, &env).unwrap();
    let log = rec.log();
    let replayed = rec.into_inner();
    let reference_image = replayed.to_image();
    let reference = ordo_tree(Arc::new(replayed));
    let writes: Vec<_> = log
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Write { .. }))
        .collect();
    assert!(writes.len() > 3, "{} writes", writes.len());
    // Every prefix while they are few, an even spread beyond.
    let step = (writes.len() / 40).max(1);
    let mut cuts: Vec<usize> = (1..writes.len()).step_by(step).collect();
    cuts.push(writes.len() - 1);
    for k in cuts {
        let cut = crashed.snapshot();
        for e in &writes[..k] {
            for (b, data) in e.blocks(bs) {
                cut.write(b, data, WriteFlags::new(BlockClass::Other))
                    .unwrap();
            }
        }
        ordo_fs::protocol::recover(ProtocolKind::named("fast_commit"), &cut, &env).unwrap();
        let p = scratch.join("cut.img");
        std::fs::write(&p, cut.to_image()).unwrap();
        assert_fsck_clean(&p);
        assert!(
            cut.to_image() == reference_image,
            "power cut after {k} of {} replay writes: another image",
            writes.len()
        );
        assert_same(
            &ordo_tree(Arc::new(cut)),
            &reference,
            &format!("power cut after {k} of {} replay writes", writes.len()),
        );
    }
}

/// The kernel's fast commits into an htree directory, replayed three ways.
fn kernel_log_into_htree(block_size: u32) {
    if !can_loop_mount() || !have("debugfs") {
        eprintln!("skipped: needs root, loop devices, e2fsprogs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("base.img");
    let cap = dir.path().join("cap.img");
    image_with_big_dir(&img, block_size);
    capture_fast_commits(&img, &cap, |m| {
        let big = m.join("big");
        write_fsync(&big.join("new-one"), b"created after the full commit\n");
        write_fsync(&big.join("new-two"), &[5u8; 9000]);
        std::fs::hard_link(big.join(big_name(100)), big.join("hard-link")).unwrap();
        fsync_path(&big.join("hard-link"));
        // The creates below reuse these inode slots; the second file owns
        // a data block, which the replay must free exactly once.
        std::fs::remove_file(big.join(big_name(7))).unwrap();
        std::fs::remove_file(big.join(big_name(1500))).unwrap();
        write_fsync(&m.join("outside"), b"outside the big directory\n");
        std::fs::rename(big.join(big_name(20)), big.join("renamed-20")).unwrap();
        std::fs::rename(big.join(big_name(300)), m.join("moved-out-300")).unwrap();
        std::fs::rename(m.join("outside"), big.join("moved-in")).unwrap();
        fsync_path(&big.join("new-one"));
        // Files written without their own fsync: their names and inodes are
        // in the next fast commit, their data (delayed allocation) is not.
        // At 4 KiB the fast-commit area is 15 blocks: stay well below.
        for i in 0..LATE {
            std::fs::write(big.join(format!("late-{i:03}")), format!("{i}\n")).unwrap();
        }
        fsync_path(&big.join("late-000"));
    });
    let st = fc_state(&cap);
    assert!(st.scan.commits >= 4, "{:?}", st.scan.end);

    // ordo.
    let by_ordo = dir.path().join("ordo.img");
    std::fs::copy(&cap, &by_ordo).unwrap();
    let report = ordo_recover(&by_ordo);
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.contains("fast commit: replayed")),
        "{:?}",
        report.lines
    );
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.contains("result written through JBD2 transaction")),
        "{:?}",
        report.lines
    );
    assert_fsck_clean(&by_ordo);
    assert_eq!(
        inode_flags(&by_ordo, "/big") & INDEX_FL,
        0,
        "ordo's replay leaves /big linear"
    );
    let before = std::fs::read(&by_ordo).unwrap();
    ordo_recover(&by_ordo);
    assert!(
        before == std::fs::read(&by_ordo).unwrap(),
        "second recovery wrote"
    );
    let t_ordo = kernel_tree(&by_ordo);
    // What the workload promised.
    assert_eq!(
        t_ordo["big/new-one"].content,
        b"created after the full commit\n"
    );
    assert_eq!(t_ordo["big/new-two"].content, vec![5u8; 9000]);
    assert_eq!(
        t_ordo["big/hard-link"].ino,
        t_ordo[&format!("big/{}", big_name(100))].ino
    );
    assert_eq!(t_ordo["big/hard-link"].nlink, 2);
    assert!(!t_ordo.contains_key(&format!("big/{}", big_name(7))));
    assert!(!t_ordo.contains_key(&format!("big/{}", big_name(1500))));
    assert!(!t_ordo.contains_key(&format!("big/{}", big_name(20))));
    assert!(t_ordo.contains_key("big/renamed-20"));
    assert_eq!(t_ordo["moved-out-300"].content, big_content(300));
    assert_eq!(
        t_ordo["big/moved-in"].content,
        b"outside the big directory\n"
    );
    assert!(t_ordo.contains_key(&format!("big/late-{:03}", LATE - 1)));
    let in_big = t_ordo.keys().filter(|k| k.starts_with("big/")).count();
    assert_eq!(in_big, BIG_ENTRIES - 4 + 2 + 1 + 1 + LATE + 1);

    // The kernel.
    let by_kernel = dir.path().join("kernel.img");
    std::fs::copy(&cap, &by_kernel).unwrap();
    kernel_replay(&by_kernel);
    assert_same(&t_ordo, &kernel_tree(&by_kernel), "ordo vs kernel");

    // e2fsck.
    let by_e2fsck = dir.path().join("e2fsck.img");
    std::fs::copy(&cap, &by_e2fsck).unwrap();
    let out = Command::new("e2fsck")
        .arg("-fy")
        .arg(&by_e2fsck)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert!(code == 0 || code == 1, "e2fsck -fy exit {code}");
    let t_e2fsck = kernel_tree(&by_e2fsck);
    if String::from_utf8_lossy(&out.stdout).contains("Multiply-claimed") {
        // e2fsck 1.47.0's replay can hand a block an ADD_RANGE maps to a
        // directory block it allocates (its INODE replay frees the blocks
        // of the inode it overwrites, including ones the log mapped);
        // its own fsck pass then clones the doubly claimed block, so the
        // file holds directory bytes. The namespace must still agree.
        eprintln!("e2fsck's replay double-allocated a block: names compared, not contents");
        let names = |t: &BTreeMap<String, Node>| -> BTreeMap<String, (u64, &'static str, u64)> {
            t.iter()
                .map(|(k, v)| (k.clone(), (v.ino, v.kind, v.size)))
                .collect()
        };
        assert_eq!(names(&t_ordo), names(&t_e2fsck), "ordo vs e2fsck");
    } else {
        assert_same(&t_ordo, &t_e2fsck, "ordo vs e2fsck");
    }

    replay_is_idempotent_under_crashes(&cap, dir.path());
}

#[test]
fn kernel_fast_commits_into_an_htree_directory_4k() {
    kernel_log_into_htree(4096);
}

#[test]
fn kernel_fast_commits_into_an_htree_directory_1k() {
    kernel_log_into_htree(1024);
}

/// A directory created after the full commit and grown past one block
/// before the fsync: the kernel logs its INODE with the index flag it has
/// in memory, and none of its blocks. ordo's replay builds it linear and
/// must not set the flag over those blocks.
#[test]
fn logged_index_flag_over_a_directory_the_replay_builds() {
    if !can_loop_mount() || !have("debugfs") {
        eprintln!("skipped: needs root, loop devices, e2fsprogs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("base.img");
    let cap = dir.path().join("cap.img");
    mkfs_fc(&img, "64M", 4096);
    premake_dirs(&img, &["parent"]);
    capture_fast_commits(&img, &cap, |m| {
        let grown = m.join("parent/grown");
        std::fs::create_dir(&grown).unwrap();
        for i in 0..GROWN {
            std::fs::write(grown.join(big_name(i)), format!("{i}\n")).unwrap();
        }
        fsync_path(&grown.join(big_name(0)));
    });
    let st = fc_state(&cap);
    assert!(st.scan.commits >= 1, "{:?}", st.scan.end);
    // The log names the new directory with the index flag set.
    let logged_indexed = st.scan.tags.iter().any(|t| match t {
        ordo_format::fc::Tag::Inode { raw, .. } => {
            let mode = u16::from_le_bytes([raw[0], raw[1]]);
            let flags = u32::from_le_bytes(raw[0x20..0x24].try_into().unwrap());
            mode & 0o170000 == 0o040000 && flags & INDEX_FL != 0
        }
        _ => false,
    });
    assert!(
        logged_indexed,
        "the kernel logged no indexed directory inode"
    );
    let by_ordo = dir.path().join("ordo.img");
    std::fs::copy(&cap, &by_ordo).unwrap();
    ordo_recover(&by_ordo);
    assert_fsck_clean(&by_ordo);
    assert_eq!(inode_flags(&by_ordo, "/parent/grown") & INDEX_FL, 0);
    let t = kernel_tree(&by_ordo);
    assert_eq!(
        t.keys().filter(|k| k.starts_with("parent/grown/")).count(),
        GROWN
    );
    replay_is_idempotent_under_crashes(&cap, dir.path());
}

fn create_in(fs: &Fs, dir: u32, name: &str, data: &[u8]) -> u32 {
    let a = fs
        .create(
            dir,
            name.as_bytes(),
            FileType::Regular,
            0o644,
            0,
            &Creds::root(),
        )
        .unwrap();
    if !data.is_empty() {
        fs.write(a.ino, 0, data).unwrap();
    }
    a.ino
}

/// ordo writes fast commits around its own conversion of a kernel-made
/// htree directory; ordo and the kernel replay them alike.
fn ordo_writer_on_htree(block_size: u32) {
    if !can_loop_mount() || !have("debugfs") {
        eprintln!("skipped: needs root, loop devices, e2fsprogs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("base.img");
    image_with_big_dir(&img, block_size);
    let raw = std::fs::read(&img).unwrap();
    let mem = MemDevice::from_image(block_size, &raw).unwrap();
    let dev = Arc::new(WriteCacheDevice::new(mem));
    let fs = Fs::mount(dev.clone(), fc_opts()).unwrap();
    // The first fsync of a mount is a full commit (no live log yet).
    let seed = create_in(&fs, ROOT_INO, "seed", b"seed\n");
    fs.fsync(seed, false).unwrap();
    let fast0 = stat(&fs, "fc_fast_commits");
    let big = fs.lookup(ROOT_INO, b"big").unwrap().ino;
    // The first change to /big drops its index: a full commit.
    let a = create_in(&fs, big, "ordo-first", b"first change\n");
    fs.fsync(a, false).unwrap();
    assert_eq!(stat(&fs, "fc_ineligible_htree_conversion"), 1);
    assert_eq!(stat(&fs, "fc_fast_commits"), fast0);
    // Then fast commits, in the now linear directory.
    let b = create_in(&fs, big, "ordo-second", &[7u8; 6000]);
    fs.fsync(b, false).unwrap();
    let x100 = fs.lookup(big, big_name(100).as_bytes()).unwrap().ino;
    fs.link(x100, big, b"ordo-link").unwrap();
    fs.unlink(big, big_name(3).as_bytes()).unwrap();
    fs.rename(
        big,
        big_name(4).as_bytes(),
        big,
        b"ordo-renamed",
        Default::default(),
    )
    .unwrap();
    fs.fsync(b, false).unwrap();
    for i in 0..60 {
        create_in(
            &fs,
            big,
            &format!("ordo-late-{i:02}"),
            format!("{i}\n").as_bytes(),
        );
    }
    fs.fsync(b, false).unwrap();
    assert_eq!(stat(&fs, "fc_ineligible_htree_conversion"), 1);
    assert!(
        stat(&fs, "fc_fast_commits") >= fast0 + 3,
        "{:?}",
        fs.protocol_stats()
    );
    // Power cut: only what was made durable survives.
    let crashed = dev.crash(1, CrashPolicy::lose_all()).unwrap();
    drop(fs);
    let cap = dir.path().join("cap.img");
    std::fs::write(&cap, crashed.to_image()).unwrap();
    assert!(fc_state(&cap).scan.commits >= 3);

    let by_ordo = dir.path().join("ordo.img");
    std::fs::copy(&cap, &by_ordo).unwrap();
    let report = ordo_recover(&by_ordo);
    assert!(
        report
            .lines
            .iter()
            .any(|l| l.contains("result written through JBD2 transaction")),
        "{:?}",
        report.lines
    );
    assert_fsck_clean(&by_ordo);
    assert_eq!(inode_flags(&by_ordo, "/big") & INDEX_FL, 0);
    let t_ordo = kernel_tree(&by_ordo);
    assert_eq!(t_ordo["big/ordo-first"].content, b"first change\n");
    assert_eq!(t_ordo["big/ordo-second"].content, vec![7u8; 6000]);
    assert_eq!(t_ordo["big/ordo-link"].ino, x100 as u64);
    assert_eq!(t_ordo["big/ordo-link"].nlink, 2);
    assert!(!t_ordo.contains_key(&format!("big/{}", big_name(3))));
    assert!(!t_ordo.contains_key(&format!("big/{}", big_name(4))));
    assert!(t_ordo.contains_key("big/ordo-renamed"));
    assert_eq!(t_ordo["big/ordo-late-59"].content, b"59\n");
    assert_same(
        &t_ordo,
        &ordo_tree(Arc::new(
            MemDevice::from_image(block_size, &std::fs::read(&by_ordo).unwrap()).unwrap(),
        )),
        "kernel reading vs ordo reading ordo's replay",
    );

    let by_kernel = dir.path().join("kernel.img");
    std::fs::copy(&cap, &by_kernel).unwrap();
    kernel_replay(&by_kernel);
    assert_same(&t_ordo, &kernel_tree(&by_kernel), "ordo vs kernel");
    assert_fsck_clean(&by_kernel);

    replay_is_idempotent_under_crashes(&cap, dir.path());
}

#[test]
fn ordo_fast_commits_around_its_htree_conversion_4k() {
    ordo_writer_on_htree(4096);
}

#[test]
fn ordo_fast_commits_around_its_htree_conversion_1k() {
    ordo_writer_on_htree(1024);
}
