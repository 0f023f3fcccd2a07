//! Extended attributes and ACLs between ordo and the kernel, both ways:
//!
//! - ordo, under every protocol, sets attributes on many files (in the
//!   inode, in blocks of their own, in blocks shared by hundreds of files,
//!   past the 1024-user limit of one block), replaces and removes them,
//!   sets ACLs and default ACLs that new files inherit, and deletes files
//!   that share blocks; `e2fsck -fn` and `ordo fsck` find the image clean
//!   and the kernel reads back exactly what ordo was told;
//! - the kernel writes attributes, ordo reads them back exactly, changes
//!   them (copying the kernel's shared blocks), and `e2fsck -fn` is clean.

mod core_common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use core_common::*;
use ordo_fs::{Creds, FileType, Fs, Ino, ProtocolKind, ROOT_INO};

type Attrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// Every attribute of `path` as the kernel lists them.
fn kernel_attrs(path: &Path) -> Attrs {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: a NUL-terminated path, a buffer of its length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "llistxattr {path:?}");
    let mut out = Attrs::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|x| !x.is_empty())
    {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: NUL-terminated strings, a buffer of its length.
        let l = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(
            l >= 0,
            "lgetxattr {path:?} {}",
            String::from_utf8_lossy(name)
        );
        v.truncate(l as usize);
        out.insert(name.to_vec(), v);
    }
    out
}

fn kernel_set(path: &Path, name: &str, value: &[u8]) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated strings, a live buffer.
    let rc = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "lsetxattr {path:?} {name}");
}

/// Every attribute of `ino` as ordo lists them.
fn ordo_attrs(fs: &Fs, ino: Ino) -> Attrs {
    let names = fs.listxattr(ino, true).unwrap();
    names
        .split(|&b| b == 0)
        .filter(|x| !x.is_empty())
        .map(|n| (n.to_vec(), fs.getxattr(ino, n).unwrap()))
        .collect()
}

/// An ACL in the VFS's form: owner rw, user `uid` rw, group r, mask rw,
/// other r.
fn acl(uid: u32) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 6, uid),
        (4, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn value(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 7 + seed) as u8).collect()
}

/// ordo writes, the kernel and both checkers read.
fn ordo_writes(block_size: u32, features: &str, mode: &str, files: usize) {
    if !can_mount() || !have("mkfs.ext4") {
        eprintln!("skipped: needs root, mkfs.ext4 and loop devices");
        return;
    }
    let (_d, img) = scratch();
    mkfs(&img, 256, block_size, features);
    let fs = mount(&img, ProtocolKind::named(mode));
    let root = Creds::root();
    let mut want: BTreeMap<String, Attrs> = BTreeMap::new();
    let set = |fs: &Fs, ino: Ino, name: &str, v: &[u8]| {
        fs.setxattr(ino, name.as_bytes(), v, 0, &root)
            .unwrap_or_else(|e| panic!("{mode}: setxattr {ino} {name}: {e}"));
    };
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, &root).unwrap().ino;
    // A directory whose default ACL its new files inherit.
    let inh = fs.mkdir(ROOT_INO, b"inherit", 0o755, &root).unwrap().ino;
    set(&fs, inh, "system.posix_acl_default", &acl(1000));
    let mut inos = Vec::new();
    let free_before = fs.statfs().unwrap().blocks_free;
    // Sizes that fit one block together (1 KiB blocks with 128-byte
    // inodes keep everything in the block).
    let bs = block_size as usize;
    let shared = value(1, bs * 7 / 40);
    for i in 0..files {
        let name = format!("f{i:05}");
        let ino = fs
            .create(dir, name.as_bytes(), FileType::Regular, 0o644, 0, &root)
            .unwrap()
            .ino;
        let mut a = Attrs::new();
        let put = |a: &mut Attrs, n: &str, v: Vec<u8>| {
            set(&fs, ino, n, &v);
            a.insert(n.as_bytes().to_vec(), v);
        };
        put(&mut a, "user.small", value(i, 10));
        if i % 2 == 0 {
            // The same block for every second file (past 1024 users).
            put(&mut a, "user.shared", shared.clone());
        }
        if i % 5 == 0 {
            put(&mut a, "user.own", value(i, bs / 4 + i % 50));
        }
        if i % 7 == 0 {
            put(&mut a, "system.posix_acl_access", acl(1000 + i as u32 % 3));
        }
        if i % 11 == 0 {
            put(&mut a, "trusted.t", value(i, 20));
            put(&mut a, "security.s", value(i, 40));
        }
        if i % 13 == 0 && a.contains_key(&b"user.shared"[..]) {
            fs.removexattr(ino, b"user.shared", &root).unwrap();
            a.remove(&b"user.shared"[..]);
        }
        if i % 17 == 0 {
            // Replaced in place, then by a value too large for the inode.
            put(&mut a, "user.small", value(i + 1, 12));
            put(&mut a, "user.small", value(i + 2, bs / 4));
        }
        want.insert(format!("d/{name}"), a);
        inos.push((name, ino));
    }
    // Blocks: one for each distinct attribute set that does not fit its
    // inode (files with `user.own`, `trusted.t` or a replaced `user.small`
    // have their own), the shared sets (with and without an ACL that did
    // not fit the inode) once per 1024 users, and the directory's.
    let used = free_before - fs.statfs().unwrap().blocks_free;
    let own = want
        .values()
        .filter(|a| {
            a.contains_key(&b"user.own"[..])
                || a.contains_key(&b"trusted.t"[..])
                || a.get(&b"user.small"[..]).is_some_and(|v| v.len() > 12)
        })
        .count() as u64;
    let sharing = want.len() as u64 - own;
    assert!(
        used <= own + sharing.div_ceil(1024) * 4 + 16 + files as u64 / 40,
        "{mode}: {used} blocks for {files} files, {own} of them with their own block: identical blocks are shared"
    );
    // Files sharing blocks go away.
    for (name, _) in inos.iter().step_by(9) {
        fs.unlink(dir, name.as_bytes()).unwrap();
        want.remove(&format!("d/{name}"));
    }
    // Inheritance: a file and a directory created under the default ACL.
    let f = fs
        .create(inh, b"file", FileType::Regular, 0o666, 0, &root)
        .unwrap();
    assert_eq!(
        f.perm & 0o777,
        0o664,
        "{mode}: the ACL's mask decides the group bits"
    );
    let sub = fs.mkdir(inh, b"sub", 0o777, &root).unwrap();
    fs.sync().unwrap();
    let inherited_file = ordo_attrs(&fs, f.ino);
    let inherited_dir = ordo_attrs(&fs, sub.ino);
    assert_eq!(inherited_file.len(), 1, "{mode}: {inherited_file:?}");
    assert_eq!(inherited_dir.len(), 2, "{mode}: {inherited_dir:?}");
    want.insert("inherit/file".into(), inherited_file);
    want.insert("inherit/sub".into(), inherited_dir);
    for (path, a) in &want {
        let ino = match path.split_once('/') {
            Some(("d", n)) => fs.lookup(dir, n.as_bytes()).unwrap().ino,
            Some(("inherit", n)) => fs.lookup(inh, n.as_bytes()).unwrap().ino,
            _ => unreachable!(),
        };
        assert_eq!(&ordo_attrs(&fs, ino), a, "{mode}: ordo reads back {path}");
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
    let report = ordo_fs::fsck::check(
        device(&img).as_ref(),
        &ordo_fs::fsck::FsckOptions::default(),
    )
    .unwrap();
    assert!(report.is_clean(), "{mode}: ordo fsck: {report:?}");
    let m = kernel_mount(&img, "rw");
    for (path, a) in &want {
        assert_eq!(
            &kernel_attrs(&m.mountpoint().join(path)),
            a,
            "{mode}: the kernel reads {path} as ordo wrote it"
        );
    }
}

#[test]
fn ordo_writes_attributes_under_every_protocol_and_the_kernel_reads_them() {
    for mode in [
        "async",
        "sync",
        "journal",
        "fast_commit",
        "softdep",
        "sched-flag",
        "sched-chain",
    ] {
        let features = if mode == "fast_commit" {
            "fast_commit"
        } else {
            ""
        };
        ordo_writes(4096, features, mode, 400);
    }
}

#[test]
fn more_than_1024_files_share_attribute_blocks() {
    ordo_writes(4096, "", "journal", 2300);
}

#[test]
fn attributes_on_1k_blocks_without_checksums() {
    ordo_writes(1024, "^metadata_csum", "sync", 300);
}

#[test]
fn kernel_writes_attributes_and_ordo_reads_and_changes_them() {
    if !can_mount() || !have("mkfs.ext4") {
        eprintln!("skipped: needs root, mkfs.ext4 and loop devices");
        return;
    }
    let (_d, img) = scratch();
    mkfs(&img, 128, 4096, "");
    let mut want: BTreeMap<String, Attrs> = BTreeMap::new();
    {
        let m = kernel_mount(&img, "rw");
        let root = m.mountpoint();
        std::fs::create_dir(root.join("d")).unwrap();
        for i in 0..200usize {
            let p = root.join(format!("d/k{i:03}"));
            std::fs::write(&p, b"x").unwrap();
            kernel_set(&p, "user.small", &value(i, 8));
            if i % 2 == 0 {
                kernel_set(&p, "user.shared", &value(3, 900));
            }
            if i % 3 == 0 {
                kernel_set(&p, "system.posix_acl_access", &acl(1000));
            }
            if i % 4 == 0 {
                kernel_set(&p, "user.own", &value(i, 1200));
            }
            want.insert(format!("k{i:03}"), kernel_attrs(&p));
        }
    }
    assert_fsck_clean(&img);
    let fs = mount(&img, ProtocolKind::named("journal"));
    let root = Creds::root();
    let dir = fs.lookup(ROOT_INO, b"d").unwrap().ino;
    for (name, a) in &want {
        let ino = fs.lookup(dir, name.as_bytes()).unwrap().ino;
        assert_eq!(&ordo_attrs(&fs, ino), a, "ordo reads the kernel's {name}");
    }
    // Change them: shared kernel blocks are copied, own ones edited.
    for (i, (name, a)) in want.iter_mut().enumerate() {
        let ino = fs.lookup(dir, name.as_bytes()).unwrap().ino;
        if i % 2 == 0 {
            fs.setxattr(ino, b"user.added", &value(i, 100), 0, &root)
                .unwrap();
            a.insert(b"user.added".to_vec(), value(i, 100));
        }
        if i % 6 == 0 {
            fs.removexattr(ino, b"user.shared", &root).unwrap();
            a.remove(&b"user.shared"[..]);
        }
        assert_eq!(&ordo_attrs(&fs, ino), a, "ordo changed {name}");
    }
    for name in ["k010", "k020", "k100"] {
        fs.unlink(dir, name.as_bytes()).unwrap();
        want.remove(name);
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
    let m = kernel_mount(&img, "rw");
    for (name, a) in &want {
        assert_eq!(
            &kernel_attrs(&m.mountpoint().join("d").join(name)),
            a,
            "the kernel reads ordo's changes of {name}"
        );
    }
}

/// The library's `access` follows an access ACL as the kernel does: named
/// users and groups under the mask, the owning group among the groups,
/// other last.
#[test]
fn library_access_follows_acls() {
    if !have("mkfs.ext4") {
        eprintln!("skipped: needs mkfs.ext4");
        return;
    }
    let (_d, img) = scratch();
    mkfs(&img, 32, 4096, "");
    let fs = mount(&img, ProtocolKind::named("journal"));
    let root = Creds::root();
    let f = fs
        .create(ROOT_INO, b"f", FileType::Regular, 0o600, 0, &root)
        .unwrap()
        .ino;
    let user = |uid: u32, gid: u32| Creds {
        uid,
        gid,
        groups: vec![],
        umask: 0,
    };
    // Mode 0600: nobody but root and the owner.
    assert!(fs.access(f, 4, &user(1000, 1000)).is_err());
    // owner rw, user 1000 rw, group r, group 2000 rw, mask r, other none.
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 6, 1000),
        (4, 4, u32::MAX),
        (8, 6, 2000),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    fs.setxattr(f, b"system.posix_acl_access", &v, 0, &root)
        .unwrap();
    assert_eq!(
        fs.getattr(f).unwrap().perm & 0o777,
        0o640,
        "the mask is the group class"
    );
    assert!(
        fs.access(f, 4, &user(1000, 1000)).is_ok(),
        "named user, read"
    );
    assert!(
        fs.access(f, 2, &user(1000, 1000)).is_err(),
        "named user, write masked"
    );
    assert!(
        fs.access(f, 4, &user(1001, 2000)).is_ok(),
        "named group, read"
    );
    assert!(
        fs.access(f, 2, &user(1001, 2000)).is_err(),
        "named group, write masked"
    );
    assert!(fs.access(f, 4, &user(1001, 0)).is_ok(), "owning group");
    assert!(fs.access(f, 4, &user(1001, 1001)).is_err(), "other");
    // chmod rewrites the mask: now the named user may write.
    let set = ordo_fs::SetAttr {
        perm: Some(0o660),
        ..Default::default()
    };
    fs.setattr(f, &set).unwrap();
    assert!(
        fs.access(f, 2, &user(1000, 1000)).is_ok(),
        "mask raised by chmod"
    );
    fs.unmount().unwrap();
    assert_fsck_clean(&img);
}
