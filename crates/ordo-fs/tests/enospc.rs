//! A full file system: every operation that needs space fails with ENOSPC
//! and leaves nothing behind, in every protocol. For each operation the
//! file system is filled (blocks, or separately inodes), the operation is
//! attempted until it fails, and then: ENOSPC, the tree exactly as before
//! the failing attempt, `e2fsck -fn` clean after unmount, and the same tree
//! after a remount. Also: freed space is usable at once (the commit that
//! makes frees reusable is forced), and the blocks reserved for root
//! (`mkfs -m`) are refused to other users only.

mod core_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use core_common::*;
use ordo_fs::{
    Creds, DataMode, FallocFlags, FileType, Fs, MountOptions, ProtocolKind, RenameFlags, SetAttr,
    ROOT_INO,
};

const BS: u32 = 4096;

/// One protocol configuration: its name, mode, data mode, mkfs features.
struct Mode {
    name: &'static str,
    kind: &'static str,
    data: DataMode,
    features: &'static str,
}

const MODES: &[Mode] = &[
    Mode {
        name: "async",
        kind: "async",
        data: DataMode::Ordered,
        features: "^has_journal",
    },
    Mode {
        name: "sync",
        kind: "sync",
        data: DataMode::Ordered,
        features: "^has_journal",
    },
    Mode {
        name: "journal/ordered",
        kind: "journal",
        data: DataMode::Ordered,
        features: "",
    },
    Mode {
        name: "journal/writeback",
        kind: "journal",
        data: DataMode::Writeback,
        features: "",
    },
    Mode {
        name: "journal/journal",
        kind: "journal",
        data: DataMode::Journal,
        features: "",
    },
    Mode {
        name: "fast_commit",
        kind: "fast_commit",
        data: DataMode::Ordered,
        features: "fast_commit",
    },
];

fn require_tools() {
    assert!(
        have("mkfs.ext4") && have("e2fsck"),
        "these tests need mkfs.ext4 and e2fsck (e2fsprogs)"
    );
}

/// `mkfs.ext4` a 16 MiB image of 4 KiB blocks, with `-N inodes` when
/// given and `-m reserved_percent`.
fn make_image(path: &Path, features: &str, inodes: Option<u32>, reserved_percent: u32) {
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args(["-F", "-q", "-b", &BS.to_string()]);
    if !features.is_empty() {
        cmd.args(["-O", features]);
    }
    if let Some(n) = inodes {
        cmd.args(["-N", &n.to_string()]);
    }
    cmd.args(["-m", &reserved_percent.to_string()]);
    cmd.args(["-E", "lazy_itable_init=1,nodiscard"]);
    cmd.arg(path).arg("16M");
    let out = cmd.output().expect("run mkfs.ext4");
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn mount_mode(path: &Path, m: &Mode) -> Fs {
    let opts = MountOptions {
        mode: ProtocolKind::named(m.kind),
        data: m.data,
        cache_bytes: 32 << 20,
        ..MountOptions::default()
    };
    Fs::mount(device(path), opts).expect("mount")
}

/// What the tree holds, path by path: kind, permissions, links, size, and
/// the bytes (file contents or symlink target).
type Tree = BTreeMap<String, (FileType, u16, u32, u64, Vec<u8>)>;

fn walk(fs: &Fs) -> Tree {
    let mut out = Tree::new();
    let mut todo = vec![(ROOT_INO, String::new())];
    while let Some((dir, path)) = todo.pop() {
        let mut off = 0;
        loop {
            let ents = fs.readdir(dir, off, 128).expect("readdir");
            if ents.is_empty() {
                break;
            }
            for e in &ents {
                off = e.next_offset;
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
                let a = fs.getattr(e.ino).expect("getattr");
                let bytes = match a.kind {
                    FileType::Regular => fs.read(e.ino, 0, a.size as u32).expect("read"),
                    FileType::Symlink => fs.readlink(e.ino).expect("readlink"),
                    _ => Vec::new(),
                };
                if a.kind == FileType::Directory {
                    todo.push((e.ino, p.clone()));
                }
                out.insert(p, (a.kind, a.perm, a.nlink, a.size, bytes));
            }
        }
    }
    out
}

fn is_enospc<T: std::fmt::Debug>(r: &ordo_fs::Result<T>) -> bool {
    matches!(r, Err(e) if e.errno() == libc::ENOSPC)
}

fn root() -> Creds {
    Creds::root()
}

/// A user without root's right to the reserve (uid and gid 1000).
fn user() -> Creds {
    Creds {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
        umask: 0,
    }
}

/// A long name (rec_len 260: 15 entries to a 4 KiB block), numbered.
fn long_name(prefix: &str, i: usize) -> Vec<u8> {
    let mut n = format!("{prefix}{i:05}").into_bytes();
    n.resize(250, b'n');
    n
}

/// The starting tree: directories `d` (targets), `src` (rename sources),
/// `dt` (four full blocks, not contiguous: four extents that fill its
/// inode's root), a file `file`, a file `frag` whose four extents fill its
/// inode's root.
struct Fixture {
    frag3: u32,
    d: u32,
    dt: u32,
    src: u32,
    file: u32,
    frag: u32,
}

fn setup(fs: &Fs) -> Fixture {
    let c = root();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, &c).unwrap().ino;
    let src = fs.mkdir(ROOT_INO, b"src", 0o755, &c).unwrap().ino;
    for i in 0..40 {
        fs.create(
            src,
            format!("s{i}").as_bytes(),
            FileType::Regular,
            0o644,
            0,
            &c,
        )
        .unwrap();
    }
    let file = fs
        .create(ROOT_INO, b"file", FileType::Regular, 0o644, 0, &c)
        .unwrap()
        .ino;
    fs.write(file, 0, b"hello").unwrap();
    let frag = fs
        .create(ROOT_INO, b"frag", FileType::Regular, 0o644, 0, &c)
        .unwrap()
        .ino;
    for k in 0..4u64 {
        let block = vec![k as u8 + 1; BS as usize];
        fs.write(frag, k * 2 * BS as u64, &block).unwrap();
    }
    // Four extents, the first of three blocks: punching its middle block
    // splits it into a fifth extent, which needs a tree block.
    let frag3 = fs
        .create(ROOT_INO, b"frag3", FileType::Regular, 0o644, 0, &c)
        .unwrap()
        .ino;
    fs.write(frag3, 0, &[5u8; 3 * BS as usize]).unwrap();
    for k in [4u64, 6, 8] {
        fs.write(frag3, k * BS as u64, &[6u8; BS as usize]).unwrap();
    }
    fs.mkdir(ROOT_INO, b"x", 0o755, &c).unwrap();
    let dt = fs.mkdir(ROOT_INO, b"dt", 0o755, &c).unwrap().ino;
    let mut pads = 0;
    // 15 entries of rec_len 260 to a block: 60 fill four blocks.
    for i in 0..60 {
        fs.create(dt, &long_name("t", i), FileType::Regular, 0o644, 0, &c)
            .unwrap();
        let size = fs.getattr(dt).unwrap().size;
        if size > (pads + 1) * BS as u64 {
            // Take the block after the directory's new one.
            let p = fs
                .create(
                    ROOT_INO,
                    format!("pad{pads}").as_bytes(),
                    FileType::Regular,
                    0o644,
                    0,
                    &c,
                )
                .unwrap()
                .ino;
            fs.write(p, 0, &[2u8; BS as usize]).unwrap();
            pads += 1;
        }
    }
    Fixture {
        frag3,
        d,
        dt,
        src,
        file,
        frag,
    }
}

/// Use every free block: one large file, then one-block files until even
/// those fail. Returns the names of the one-block files (in `/x`).
fn fill_blocks(fs: &Fs) -> Vec<String> {
    let c = root();
    let big = fs
        .create(ROOT_INO, b"fill", FileType::Regular, 0o644, 0, &c)
        .unwrap()
        .ino;
    let chunk = vec![0xabu8; 1 << 20];
    let mut off = 0u64;
    loop {
        match fs.write(big, off, &chunk) {
            Ok(n) if n as usize == chunk.len() => off += n as u64,
            Ok(n) => off += n as u64,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "filling: {e}");
                break;
            }
        }
    }
    let x = fs.lookup(ROOT_INO, b"x").unwrap().ino;
    let mut small = Vec::new();
    for i in 0.. {
        let name = format!("b{i}");
        let f = match fs.create(x, name.as_bytes(), FileType::Regular, 0o644, 0, &c) {
            Ok(a) => a.ino,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "filling: {e}");
                break;
            }
        };
        match fs.write(f, 0, &[7u8; BS as usize]) {
            Ok(_) => small.push(name),
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "filling: {e}");
                fs.unlink(x, name.as_bytes()).unwrap();
                break;
            }
        }
    }
    assert_eq!(fs.statfs().unwrap().blocks_free, 0, "the fill left blocks");
    small
}

/// Use every free inode (empty files in `/x`).
fn fill_inodes(fs: &Fs) {
    let c = root();
    let x = fs.lookup(ROOT_INO, b"x").unwrap().ino;
    for i in 0.. {
        if let Err(e) = fs.create(
            x,
            format!("i{i}").as_bytes(),
            FileType::Regular,
            0o644,
            0,
            &c,
        ) {
            assert_eq!(e.errno(), libc::ENOSPC, "filling inodes: {e}");
            break;
        }
    }
    assert_eq!(fs.statfs().unwrap().files_free, 0, "the fill left inodes");
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    Blocks,
    Inodes,
}

/// Fill the file system, then run `attempt(fs, fixture, i)` for i = 0, 1,
/// ... until it fails: it must fail with ENOSPC, with the tree as it was
/// before that attempt, before and after an unmount (`e2fsck -fn` clean)
/// and a remount.
fn check_op(fill: Fill, what: &str, attempt: impl Fn(&Fs, &Fixture, usize) -> ordo_fs::Result<()>) {
    require_tools();
    for m in MODES {
        let (_dir, img) = scratch();
        let inodes = match fill {
            Fill::Blocks => None,
            Fill::Inodes => Some(128),
        };
        make_image(&img, m.features, inodes, 0);
        let fs = mount_mode(&img, m);
        let fx = setup(&fs);
        match fill {
            Fill::Blocks => {
                fill_blocks(&fs);
            }
            Fill::Inodes => fill_inodes(&fs),
        }
        let mut i = 0;
        let (before, r) = loop {
            let before = walk(&fs);
            let r = attempt(&fs, &fx, i);
            if r.is_err() {
                break (before, r);
            }
            i += 1;
            assert!(i < 10_000, "{what} ({}): never ran out of space", m.name);
        };
        assert!(
            is_enospc(&r),
            "{what} ({}, full of {fill:?}): {r:?}, not ENOSPC",
            m.name
        );
        assert_eq!(
            walk(&fs),
            before,
            "{what} ({}, full of {fill:?}): the failed call changed the tree",
            m.name
        );
        fs.unmount().expect("unmount");
        let (code, text) = e2fsck(&img);
        assert_eq!(
            code, 0,
            "{what} ({}, full of {fill:?}) after ENOSPC: e2fsck -fn:\n{text}",
            m.name
        );
        let fs = mount_mode(&img, m);
        assert_eq!(
            walk(&fs),
            before,
            "{what} ({}, full of {fill:?}): the tree after a remount",
            m.name
        );
        fs.unmount().expect("unmount");
    }
}

fn create_in_d(fs: &Fs, fx: &Fixture, i: usize) -> ordo_fs::Result<()> {
    fs.create(
        fx.d,
        &long_name("c", i),
        FileType::Regular,
        0o644,
        0,
        &root(),
    )
    .map(|_| ())
}

#[test]
fn create_full_of_blocks() {
    // Succeeds while the directory's block has room, then needs a block.
    check_op(Fill::Blocks, "create", create_in_d);
}

#[test]
fn create_full_of_inodes() {
    check_op(Fill::Inodes, "create", create_in_d);
}

#[test]
fn mknod_full_of_blocks() {
    check_op(Fill::Blocks, "mknod", |fs, fx, i| {
        fs.create(fx.d, &long_name("f", i), FileType::Fifo, 0o644, 0, &root())
            .map(|_| ())
    });
}

fn mkdir_in_d(fs: &Fs, fx: &Fixture, i: usize) -> ordo_fs::Result<()> {
    fs.mkdir(fx.d, &long_name("m", i), 0o755, &root())
        .map(|_| ())
}

#[test]
fn mkdir_full_of_blocks() {
    check_op(Fill::Blocks, "mkdir", mkdir_in_d);
}

#[test]
fn mkdir_full_of_inodes() {
    check_op(Fill::Inodes, "mkdir", mkdir_in_d);
}

fn slow_symlink(fs: &Fs, fx: &Fixture, i: usize) -> ordo_fs::Result<()> {
    let target = vec![b'x'; 200];
    fs.symlink(fx.d, format!("s{i}").as_bytes(), &target, &root())
        .map(|_| ())
}

fn fast_symlink(fs: &Fs, fx: &Fixture, i: usize) -> ordo_fs::Result<()> {
    fs.symlink(fx.d, &long_name("l", i), b"target", &root())
        .map(|_| ())
}

#[test]
fn slow_symlink_full_of_blocks() {
    check_op(Fill::Blocks, "slow symlink", slow_symlink);
}

#[test]
fn slow_symlink_full_of_inodes() {
    check_op(Fill::Inodes, "slow symlink", slow_symlink);
}

#[test]
fn fast_symlink_full_of_blocks() {
    check_op(Fill::Blocks, "fast symlink", fast_symlink);
}

#[test]
fn fast_symlink_full_of_inodes() {
    check_op(Fill::Inodes, "fast symlink", fast_symlink);
}

#[test]
fn link_into_full_directory() {
    check_op(Fill::Blocks, "link", |fs, fx, i| {
        fs.link(fx.file, fx.d, &long_name("h", i)).map(|_| ())
    });
}

#[test]
fn rename_into_full_directory() {
    check_op(Fill::Blocks, "rename", |fs, fx, i| {
        assert!(i < 40, "more renames than sources");
        fs.rename(
            fx.src,
            format!("s{i}").as_bytes(),
            fx.d,
            &long_name("r", i),
            RenameFlags::default(),
        )
    });
}

#[test]
fn write_full_of_blocks() {
    check_op(Fill::Blocks, "write", |fs, fx, i| {
        let at = (64 + i as u64) * BS as u64;
        fs.write(fx.file, at, &[1u8; 100]).map(|_| ())
    });
}

#[test]
fn fallocate_full_of_blocks() {
    check_op(Fill::Blocks, "fallocate", |fs, fx, _| {
        fs.fallocate(fx.file, 0, 64 * BS as u64, FallocFlags::default())
    });
}

#[test]
fn fallocate_keep_size_full_of_blocks() {
    let keep = FallocFlags {
        keep_size: true,
        ..FallocFlags::default()
    };
    check_op(Fill::Blocks, "fallocate keep_size", move |fs, fx, _| {
        fs.fallocate(fx.file, 0, 64 * BS as u64, keep)
    });
}

/// Truncate `/file` (one block) to nothing.
fn free_one_block(fs: &Fs, fx: &Fixture) -> ordo_fs::Result<()> {
    let set = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    fs.setattr(fx.file, &set)?;
    assert_eq!(fs.statfs()?.blocks_free, 1);
    Ok(())
}

/// The extent tree must grow (the inode's root holds four extents): with
/// one free block, the data block is found and the tree block is not.
#[test]
fn extent_tree_growth_with_one_free_block() {
    check_op(Fill::Blocks, "extent-tree growth", |fs, fx, i| {
        if i == 0 {
            // Free exactly one block: the write below then needs two.
            return free_one_block(fs, fx);
        }
        fs.write(fx.frag, 100 * BS as u64, &[9u8; BS as usize])
            .map(|_| ())
    });
}

/// Directory growth that needs an extent-tree block too: the directory's
/// four extents fill its root (its blocks are not contiguous), one free
/// block is left, and the next entry needs a directory block and a tree
/// block.
#[test]
fn directory_growth_needing_a_tree_block() {
    check_op(Fill::Blocks, "directory and tree growth", |fs, fx, i| {
        if i == 0 {
            return free_one_block(fs, fx);
        }
        fs.create(
            fx.dt,
            &long_name("g", i),
            FileType::Regular,
            0o644,
            0,
            &root(),
        )
        .map(|_| ())
    });
}

/// A hole punched in the middle of an extent splits it; with the inode's
/// root full the split needs a tree block the full file system lacks.
#[test]
fn punch_hole_needing_a_split() {
    let punch = FallocFlags {
        keep_size: true,
        punch_hole: true,
        zero_range: false,
        collapse_range: false,
        insert_range: false,
    };
    check_op(Fill::Blocks, "punch hole", move |fs, fx, _| {
        fs.fallocate(fx.frag3, BS as u64, BS as u64, punch)
    });
}

/// Truncating up allocates nothing: it works on a full file system.
#[test]
fn truncate_up_on_a_full_file_system() {
    require_tools();
    for m in MODES {
        let (_dir, img) = scratch();
        make_image(&img, m.features, None, 0);
        let fs = mount_mode(&img, m);
        let fx = setup(&fs);
        fill_blocks(&fs);
        let set = SetAttr {
            size: Some(1 << 30),
            ..SetAttr::default()
        };
        fs.setattr(fx.file, &set).expect("truncate up");
        let before = walk(&fs);
        fs.unmount().unwrap();
        assert_fsck_clean(&img);
        let fs = mount_mode(&img, m);
        assert_eq!(walk(&fs), before, "{}", m.name);
        fs.unmount().unwrap();
    }
}

/// Space freed on a full file system is usable at once: the allocation
/// that fails while the frees wait for their commit forces that commit
/// and tries again (the issue's `truncate -s 10 fill; echo hi > after`).
#[test]
fn freed_space_is_reusable_at_once() {
    require_tools();
    for m in MODES {
        let (_dir, img) = scratch();
        make_image(&img, m.features, None, 0);
        let fs = mount_mode(&img, m);
        setup(&fs);
        fill_blocks(&fs);
        let fill = fs.lookup(ROOT_INO, b"fill").unwrap().ino;
        let set = SetAttr {
            size: Some(10),
            ..SetAttr::default()
        };
        fs.setattr(fill, &set).unwrap();
        let after = fs
            .create(ROOT_INO, b"after", FileType::Regular, 0o644, 0, &root())
            .unwrap()
            .ino;
        assert_eq!(
            fs.write(after, 0, b"hi\n")
                .unwrap_or_else(|e| panic!("{}: a write after freeing space: {e}", m.name)),
            3
        );
        // And a large one: most of what the truncate freed.
        let big = vec![5u8; 4 << 20];
        assert_eq!(fs.write(after, 4096, &big).unwrap(), big.len() as u32);
        // Deleting a file makes room too.
        let x = fs.lookup(ROOT_INO, b"x").unwrap().ino;
        fill_blocks_again(&fs);
        fs.unlink(ROOT_INO, b"after").unwrap();
        let f = fs
            .create(x, b"after-unlink", FileType::Regular, 0o644, 0, &root())
            .unwrap()
            .ino;
        assert_eq!(
            fs.write(f, 0, &big)
                .unwrap_or_else(|e| panic!("{}: a write after an unlink: {e}", m.name)),
            big.len() as u32
        );
        fs.unmount().unwrap();
        assert_fsck_clean(&img);
    }
}

/// Fill what is free again, into `/fill` (appending).
fn fill_blocks_again(fs: &Fs) {
    let fill = fs.lookup(ROOT_INO, b"fill").unwrap();
    let chunk = vec![1u8; 1 << 20];
    let mut off = fill.size;
    loop {
        match fs.write(fill.ino, off, &chunk) {
            Ok(n) => off += n as u64,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC);
                break;
            }
        }
    }
}

/// `mkfs -m 5`: a user other than root gets ENOSPC while the reserved
/// blocks are left; root can still write into them.
#[test]
fn reserved_blocks_are_for_root() {
    require_tools();
    for m in MODES {
        let (_dir, img) = scratch();
        make_image(&img, m.features, None, 5);
        let fs = mount_mode(&img, m);
        let user = user();
        let d = fs.mkdir(ROOT_INO, b"u", 0o777, &root()).unwrap().ino;
        let f = fs
            .create(d, b"userfile", FileType::Regular, 0o644, 0, &user)
            .unwrap()
            .ino;
        let chunk = vec![3u8; 1 << 20];
        let mut off = 0u64;
        loop {
            match fs.write_as(f, off, &chunk, &user) {
                Ok(n) => off += n as u64,
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{}", m.name);
                    break;
                }
            }
        }
        let st = fs.statfs().unwrap();
        let reserved = st.blocks_free - st.blocks_avail;
        assert!(reserved > 0, "{}: mkfs -m 5 reserved nothing", m.name);
        assert!(
            st.blocks_free >= reserved,
            "{}: a user wrote into the reserve ({} free, {} reserved)",
            m.name,
            st.blocks_free,
            reserved
        );
        assert!(
            st.blocks_free <= reserved + 8,
            "{}: the user's write stopped early ({} free, {} reserved)",
            m.name,
            st.blocks_free,
            reserved
        );
        // Other space-needing calls of the user fail too.
        let r = fs.mkdir(d, b"userdir", 0o755, &user);
        assert!(is_enospc(&r), "{}: user mkdir: {r:?}", m.name);
        let r = fs.fallocate_as(f, off, 1 << 20, FallocFlags::default(), &user);
        assert!(is_enospc(&r), "{}: user fallocate: {r:?}", m.name);
        // Root is not held back.
        let n = fs
            .write_as(f, off, &chunk[..4 * BS as usize], &root())
            .unwrap();
        assert!(n > 0, "{}: root could not use the reserve", m.name);
        fs.mkdir(d, b"rootdir", 0o755, &root()).unwrap();
        fs.unmount().unwrap();
        assert_fsck_clean(&img);
    }
}

/// The reserve is also for `s_def_resuid` and for members of
/// `s_def_resgid` (tune2fs -u / -g), as ext4's `ext4_has_free_clusters`:
/// a user who is neither stops at the reserve, the reserved user and a
/// member of the reserved group (by a supplementary group) write into it.
#[test]
fn reserved_blocks_are_for_resuid_and_resgid() {
    require_tools();
    let m = &MODES[0];
    let (_dir, img) = scratch();
    make_image(&img, m.features, None, 5);
    let out = std::process::Command::new("tune2fs")
        .args(["-u", "1000", "-g", "3000"])
        .arg(&img)
        .output()
        .expect("tune2fs runs");
    assert!(out.status.success(), "tune2fs: {out:?}");
    let fs = mount_mode(&img, m);
    let who = |uid: u32, groups: Vec<u32>| Creds {
        uid,
        gid: uid,
        groups,
        umask: 0,
    };
    let (other, resuid, member) = (who(1002, vec![]), who(1000, vec![]), who(1001, vec![3000]));
    let d = fs.mkdir(ROOT_INO, b"u", 0o777, &root()).unwrap().ino;
    let chunk = vec![5u8; 1 << 20];
    let fill = |name: &[u8], c: &Creds| -> u64 {
        let f = fs
            .create(d, name, FileType::Regular, 0o644, 0, c)
            .unwrap()
            .ino;
        let mut off = 0u64;
        while let Ok(n) = fs.write_as(f, off, &chunk, c) {
            off += n as u64;
        }
        off
    };
    fill(b"other", &other);
    let st = fs.statfs().unwrap();
    let reserved = st.blocks_free - st.blocks_avail;
    assert!(reserved > 0 && st.blocks_free >= reserved, "{st:?}");
    // The reserved user goes past the point where the other stopped.
    let wrote = fill(b"resuid", &resuid);
    assert!(wrote > 0, "the reserved uid could not use the reserve");
    let after = fs.statfs().unwrap().blocks_free;
    assert!(
        after < reserved,
        "the reserved uid stopped at the reserve ({after} free)"
    );
    // Root's files freed, the reserve is whole again for the group member.
    fs.unlink(d, b"resuid").unwrap();
    fs.sync().unwrap();
    assert!(
        fill(b"member", &member) > 0,
        "a member of resgid could not use the reserve"
    );
    assert!(fs.statfs().unwrap().blocks_free < reserved);
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
}

/// Inodes freed on a file system out of inodes are usable at once.
#[test]
fn freed_inodes_are_reusable_at_once() {
    require_tools();
    for m in MODES {
        let (_dir, img) = scratch();
        make_image(&img, m.features, Some(128), 0);
        let fs = mount_mode(&img, m);
        setup(&fs);
        fill_inodes(&fs);
        let x = fs.lookup(ROOT_INO, b"x").unwrap().ino;
        let r = fs.create(x, b"more", FileType::Regular, 0o644, 0, &root());
        assert!(is_enospc(&r), "{}: {r:?}", m.name);
        fs.unlink(x, b"i0").unwrap();
        fs.unlink(x, b"i1").unwrap();
        fs.create(x, b"more", FileType::Regular, 0o644, 0, &root())
            .unwrap_or_else(|e| panic!("{}: create after an unlink: {e}", m.name));
        fs.mkdir(x, b"moredir", 0o755, &root())
            .unwrap_or_else(|e| panic!("{}: mkdir after an unlink: {e}", m.name));
        fs.unmount().unwrap();
        assert_fsck_clean(&img);
    }
}

/// A journal smaller than what is written between two commits is not a
/// full file system: transactions are committed and checkpointed as the
/// log fills, and nothing answers ENOSPC (data=journal logs the data too).
#[test]
fn a_full_journal_is_not_enospc() {
    require_tools();
    for m in MODES.iter().filter(|m| m.features != "^has_journal") {
        let (_dir, img) = scratch();
        let out = Command::new("mkfs.ext4")
            .args(["-F", "-q", "-b", "4096", "-J", "size=4", "-m", "0"])
            .args(if m.features.is_empty() {
                vec![]
            } else {
                vec!["-O", m.features]
            })
            .arg(&img)
            .arg("64M")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fs = mount_mode(&img, m);
        let c = root();
        // 32 MiB of data (eight times the log) and 2000 creates, no fsync.
        let f = fs
            .create(ROOT_INO, b"big", FileType::Regular, 0o644, 0, &c)
            .unwrap()
            .ino;
        let chunk = vec![4u8; 1 << 20];
        for k in 0..32u64 {
            let n = fs
                .write(f, k << 20, &chunk)
                .unwrap_or_else(|e| panic!("{}: write {k}: {e}", m.name));
            assert_eq!(n as usize, chunk.len());
        }
        let d = fs.mkdir(ROOT_INO, b"many", 0o755, &c).unwrap().ino;
        for i in 0..2000 {
            fs.create(
                d,
                format!("f{i}").as_bytes(),
                FileType::Regular,
                0o644,
                0,
                &c,
            )
            .unwrap_or_else(|e| panic!("{}: create {i}: {e}", m.name));
        }
        fs.unmount().unwrap();
        assert_fsck_clean(&img);
    }
}

/// ZERO_RANGE over a range with holes on a full file system: the blocks it
/// must allocate are not there, and the file keeps its contents (the range
/// was unmapped first in the same handle, which the failure undoes).
#[test]
fn zero_range_full_of_blocks() {
    let zero = FallocFlags {
        zero_range: true,
        ..FallocFlags::default()
    };
    check_op(Fill::Blocks, "fallocate zero_range", move |fs, fx, _| {
        fs.fallocate(fx.frag3, 0, 64 * BS as u64, zero)
    });
}

/// INSERT_RANGE inside an extent splits it first; with the inode's root
/// full the split needs a tree block the full file system lacks, and the
/// size (raised first, as ext4 does) goes back with the rest.
#[test]
fn insert_range_needing_a_split() {
    let insert = FallocFlags {
        insert_range: true,
        ..FallocFlags::default()
    };
    check_op(Fill::Blocks, "fallocate insert_range", move |fs, fx, _| {
        fs.fallocate(fx.frag3, BS as u64, BS as u64, insert)
    });
}

/// COLLAPSE_RANGE of a block in the middle of an extent cuts it in two
/// before anything moves: the same split, the same ENOSPC, nothing moved.
#[test]
fn collapse_range_needing_a_split() {
    let collapse = FallocFlags {
        collapse_range: true,
        ..FallocFlags::default()
    };
    check_op(
        Fill::Blocks,
        "fallocate collapse_range",
        move |fs, fx, _| fs.fallocate(fx.frag3, BS as u64, BS as u64, collapse),
    );
}

/// A caller without root's right checks every allocation against the
/// reserve, with the free blocks of all groups kept as a running sum
/// (`Core::free_sums`). On an image of eight groups, a user's creates,
/// writes that fail for space half-way (rolled back), truncations and
/// unlinks, and root's writes between them: in debug builds every check
/// compares the kept sum with a walk of the descriptors, and the free
/// blocks `statfs` reports end where e2fsck finds them.
#[test]
fn a_users_allocations_keep_the_free_sums() {
    require_tools();
    for m in MODES {
        let (_dir, img) = scratch();
        let out = Command::new("mkfs.ext4")
            .args(["-F", "-q", "-b", &BS.to_string(), "-g", "2048", "-m", "5"])
            .args(if m.features.is_empty() {
                vec![]
            } else {
                vec!["-O", m.features]
            })
            .args(["-E", "lazy_itable_init=1,nodiscard"])
            .arg(&img)
            .arg("64M")
            .output()
            .expect("run mkfs.ext4");
        assert!(out.status.success(), "mkfs.ext4: {:?}", out);
        let fs = mount_mode(&img, m);
        let user = user();
        let d = fs.mkdir(ROOT_INO, b"u", 0o777, &root()).unwrap().ino;
        let chunk = vec![7u8; 256 << 10];
        let mut files = Vec::new();
        let mut refused = 0;
        for i in 0..400u32 {
            let name = format!("f{i}");
            let f = match fs.create(d, name.as_bytes(), FileType::Regular, 0o644, 0, &user) {
                Ok(a) => a.ino,
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC, "{}", m.name);
                    refused += 1;
                    continue;
                }
            };
            let mut off = 0;
            while off < (i as u64 % 5 + 1) * chunk.len() as u64 {
                match fs.write_as(f, off, &chunk, &user) {
                    Ok(n) => off += n as u64,
                    Err(e) => {
                        assert_eq!(e.errno(), libc::ENOSPC, "{}", m.name);
                        refused += 1;
                        break;
                    }
                }
            }
            files.push((name, f));
            if i % 3 == 2 && files.len() > 1 {
                let (gone, _) = files.remove(files.len() / 2);
                fs.unlink(d, gone.as_bytes()).unwrap();
            }
            if i % 7 == 6 && !files.is_empty() {
                let (_, t) = files[0];
                let set = SetAttr {
                    size: Some(4096),
                    ..SetAttr::default()
                };
                fs.setattr_as(t, &set, &user).unwrap();
                fs.write_as(t, 1 << 20, &chunk[..8192], &root()).unwrap();
            }
        }
        // The user met the reserve (the checks that keep it ran), and
        // what the descriptors say is free is what statfs says.
        assert!(refused > 0, "{}: the user never ran out of space", m.name);
        let st = fs.statfs().unwrap();
        assert!(st.blocks_free > st.blocks_avail, "{}: {st:?}", m.name);
        fs.unmount().unwrap();
        assert_fsck_clean(&img);
    }
}
