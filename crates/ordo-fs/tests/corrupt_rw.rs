//! Bad input, read-write: an image written by ordo under each protocol
//! (cleanly unmounted, or left as a crash leaves it, with a live log) is
//! damaged at random (bytes flipped in blocks that hold something), then
//! mounted read-write under the same protocol and used: walked and read,
//! then changed (creates, writes, mkdir, renames, unlinks, truncates,
//! xattrs, fsync, sync) and unmounted.
//!
//! Every case runs on the test thread, without `catch_unwind`: a panic
//! anywhere in the core (an assertion that a corrupted image can reach
//! is a bug: damage must be caught as an error first) fails the test with
//! the case's label printed just before it. Every failure must be an
//! errno a damaged image can give; the walk is bounded, so a cycle cannot
//! make it endless.
//!
//! `ORDO_RW_CASES` sets the random cases per protocol and base (default
//! 3); `ORDO_RW_SEED` replays a run.

mod fsck_common;

use std::path::Path;
use std::sync::Arc;

use fsck_common::{walk_tree, WalkBounds, WalkVisitor, READ_ERRNOS};

use ordo_dev::{BlockDevice, FileDevice, OpenOptions};
use ordo_fs::mkfs::{mkfs, MkfsOptions};
use ordo_fs::{
    Creds, FileType, Fs, FsError, Ino, MountOptions, ProtocolKind, RenameFlags, SetAttr, ROOT_INO,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BS: u32 = 1024;
const IMAGE_BYTES: u64 = 16 << 20;
const WALK_ENTRIES_MAX: usize = 3000;
const WALK_DEPTH_MAX: usize = 16;
const READ_BYTES_MAX: u64 = 256 << 10;

/// errnos an operation on a damaged image may return: a read's, and
/// those a change can meet.
fn allowed(e: &FsError) -> bool {
    READ_ERRNOS.contains(&e.errno())
        || [
            libc::ENOSPC,
            libc::EEXIST,
            libc::ENOTEMPTY,
            libc::EMLINK,
            libc::EROFS,
            libc::ENODATA,
            libc::ESTALE,
            libc::EBUSY,
            // link(2) of a directory.
            libc::EPERM,
        ]
        .contains(&e.errno())
}

fn device(img: &Path) -> Arc<dyn BlockDevice> {
    Arc::new(
        FileDevice::open(
            img,
            BS,
            OpenOptions {
                read_only: false,
                direct: false,
                exclusive: false,
            },
        )
        .expect("open image"),
    )
}

fn options(mode: ProtocolKind) -> MountOptions {
    MountOptions {
        mode,
        seed: Some(7),
        cache_bytes: 4 << 20,
        ..MountOptions::default()
    }
}

/// Every feature some protocol needs: one kind of image serves them all.
fn mkfs_options() -> MkfsOptions {
    let mut o = MkfsOptions {
        size_bytes: IMAGE_BYTES,
        block_size: BS,
        seed: Some(1),
        time_sec: Some(1_700_000_000),
        ..MkfsOptions::default()
    };
    for k in ProtocolKind::all() {
        let r = k.required_features();
        o.features.compat |= r.compat;
        o.features.incompat |= r.incompat;
        o.features.ro_compat |= r.ro_compat;
    }
    o
}

fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag.wrapping_mul(31).wrapping_add(i as u64 / 7) % 251) as u8)
        .collect()
}

fn ok<T>(label: &str, what: &str, r: ordo_fs::Result<T>) -> Option<T> {
    r.map_err(|e| check(label, what, &e)).ok()
}

/// An error is allowed only on a damaged image, and only if damage can
/// cause it.
fn check(label: &str, what: &str, e: &FsError) {
    assert!(
        !label.ends_with("(undamaged)"),
        "{label}: {what}: {e} ({e:?})"
    );
    assert!(allowed(e), "{label}: {what}: unexpected error {e} ({e:?})");
}

/// Files, directories, links, a symlink, an xattr, a file with an extent
/// tree deeper than the inode, a directory with an index.
fn populate(fs: &Fs, label: &str) {
    let root = Creds::root();
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, &root).unwrap();
    let b = fs.mkdir(a.ino, b"b", 0o755, &root).unwrap();
    let big = fs
        .create(b.ino, b"big", FileType::Regular, 0o644, 0, &root)
        .unwrap();
    // Every other block: many extents, an index block.
    for i in 0..600u64 {
        fs.write(big.ino, i * 2 * BS as u64, &pattern(i, BS as usize))
            .unwrap();
    }
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, &root).unwrap();
    for i in 0..400u64 {
        let name = format!("entry_with_a_fairly_long_name_{i}");
        let f = fs
            .create(d.ino, name.as_bytes(), FileType::Regular, 0o644, 0, &root)
            .unwrap();
        if i % 5 == 0 {
            fs.write(f.ino, 0, &pattern(i, 100 + i as usize * 13))
                .unwrap();
        }
    }
    let f1 = fs
        .create(a.ino, b"f1", FileType::Regular, 0o644, 0, &root)
        .unwrap();
    fs.write(f1.ino, 0, b"hello\n").unwrap();
    fs.link(f1.ino, ROOT_INO, b"hl").unwrap();
    fs.symlink(ROOT_INO, b"sl", b"a/f1", &root).unwrap();
    fs.symlink(ROOT_INO, b"longsl", &[b'l'; 200], &root)
        .unwrap();
    fs.setxattr(f1.ino, b"user.k", b"value", 0, &root)
        .unwrap_or_else(|e| panic!("{label}: setxattr: {e}"));
    fs.fsync(big.ino, false).unwrap();
}

/// Read-only walk (readdir, lookup, read, readlink, getattr, listxattr):
/// collects the files and directories seen, for the changes after it.
struct Seen<'a> {
    fs: &'a Fs,
    label: &'a str,
    seen: &'a mut Vec<(Ino, Ino, Vec<u8>, FileType)>,
}

impl WalkVisitor for Seen<'_> {
    fn entry(&mut self, parent: Ino, name: &[u8], attr: &ordo_fs::Attr) {
        self.seen.push((parent, attr.ino, name.to_vec(), attr.kind));
        let _ = ok(self.label, "listxattr", self.fs.listxattr(attr.ino, true));
    }
    fn error(&mut self, what: &str, e: &FsError) {
        check(self.label, what, e);
    }
}

fn walk(fs: &Fs, label: &str, seen: &mut Vec<(Ino, Ino, Vec<u8>, FileType)>) {
    const BOUNDS: WalkBounds = WalkBounds {
        entries_max: WALK_ENTRIES_MAX,
        depth_max: WALK_DEPTH_MAX,
        read_bytes_max: READ_BYTES_MAX,
        read_chunk: 32 << 10,
    };
    walk_tree(fs, label, ROOT_INO, &BOUNDS, &mut Seen { fs, label, seen });
}

/// Change what the walk found, and add to it.
fn change(fs: &Fs, label: &str, seen: &[(Ino, Ino, Vec<u8>, FileType)], rng: &mut ChaCha8Rng) {
    let root = Creds::root();
    let mut made = Vec::new();
    for i in 0..40u64 {
        let name = format!("new{i}");
        if let Some(a) = ok(
            label,
            "create",
            fs.create(
                ROOT_INO,
                name.as_bytes(),
                FileType::Regular,
                0o644,
                0,
                &root,
            ),
        ) {
            let _ = ok(
                label,
                "write new",
                fs.write(a.ino, 0, &pattern(i, 1 + (i as usize * 997) % 9000)),
            );
            made.push((name, a.ino));
        }
    }
    let _ = ok(label, "mkdir", fs.mkdir(ROOT_INO, b"newdir", 0o755, &root));
    let mut touched = Vec::new();
    for _ in 0..60 {
        if seen.is_empty() {
            break;
        }
        let (parent, ino, name, kind) = &seen[rng.gen_range(0..seen.len())];
        match rng.gen_range(0..8) {
            0 | 1 if *kind == FileType::Regular => {
                let off = rng.gen_range(0..64u64) * 512;
                let _ = ok(label, "write", fs.write(*ino, off, &pattern(off, 3000)));
                touched.push(*ino);
            }
            2 if *kind == FileType::Regular => {
                let set = SetAttr {
                    size: Some(rng.gen_range(0..20_000)),
                    ..SetAttr::default()
                };
                let _ = ok(label, "truncate", fs.setattr(*ino, &set));
            }
            3 => {
                let _ = ok(
                    label,
                    "rename",
                    fs.rename(
                        *parent,
                        name,
                        ROOT_INO,
                        format!("moved{}", rng.gen::<u32>()).as_bytes(),
                        RenameFlags::default(),
                    ),
                );
            }
            4 if *kind != FileType::Directory => {
                let _ = ok(label, "unlink", fs.unlink(*parent, name));
            }
            5 if *kind == FileType::Directory => {
                let _ = ok(label, "rmdir", fs.rmdir(*parent, name));
            }
            6 => {
                let _ = ok(
                    label,
                    "setxattr",
                    fs.setxattr(*ino, b"user.n", &[b'v'; 300], 0, &root),
                );
            }
            _ => {
                let _ = ok(label, "link", fs.link(*ino, ROOT_INO, b"newlink"));
            }
        }
    }
    for ino in made.iter().map(|(_, i)| i).chain(&touched).take(10) {
        let _ = ok(label, "fsync", fs.fsync(*ino, false));
    }
    for (name, ino) in made.iter().step_by(2) {
        let _ = ok(label, "unlink new", fs.unlink(ROOT_INO, name.as_bytes()));
        let _ = ok(label, "getattr new", fs.getattr(*ino));
    }
    let _ = ok(label, "sync", fs.sync());
}

/// Mount read-write, walk, change, unmount: anything but a panic.
fn run_case(label: &str, img: &Path, mode: ProtocolKind, rng: &mut ChaCha8Rng) {
    let fs = match Fs::mount(device(img), options(mode)) {
        Ok(fs) => fs,
        Err(e) => {
            assert!(allowed(&e), "{label}: mount: unexpected error {e} ({e:?})");
            return;
        }
    };
    if fs.scan_pending() {
        let _ = ok(label, "scan", fs.scan_to_end());
    }
    let mut seen = Vec::new();
    walk(&fs, label, &mut seen);
    change(&fs, label, &seen, rng);
    let _ = ok(label, "unmount", fs.unmount());
    // The repaired image mounts again (or refuses with an error).
    if let Ok(fs) = Fs::mount(device(img), options(mode)) {
        let mut seen = Vec::new();
        walk(&fs, &format!("{label} (again)"), &mut seen);
        let _ = fs.unmount();
    }
}

/// Blocks of `img` that hold anything: where damage can matter.
fn nonzero_blocks(img: &Path) -> Vec<u64> {
    let bytes = std::fs::read(img).unwrap();
    bytes
        .chunks(BS as usize)
        .enumerate()
        .filter(|(_, c)| c.iter().any(|&b| b != 0))
        .map(|(i, _)| i as u64)
        .collect()
}

/// Both bases of protocol `mode`, undamaged and then `per` damaged
/// copies each. Returns the damaged cases run.
fn run_protocol(mode: ProtocolKind, dir: &Path, seed: u64, per: usize) -> usize {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ crc(mode.name()));
    let mut cases = 0;
    for clean in [true, false] {
        let base = dir.join(format!("{}-{clean}.img", mode.name()));
        std::fs::File::create(&base)
            .unwrap()
            .set_len(IMAGE_BYTES)
            .unwrap();
        mkfs(device(&base).as_ref(), &mkfs_options()).unwrap();
        let name = format!(
            "{} {}",
            mode.name(),
            if clean { "clean" } else { "crashed" }
        );
        let fs = Fs::mount(device(&base), options(mode)).unwrap();
        populate(&fs, &name);
        if clean {
            fs.unmount().unwrap();
        } else {
            // A crash after a sync and a few changes: what reached
            // the disk stays, nothing more.
            fs.sync().unwrap();
            let a = fs.lookup(ROOT_INO, b"a").unwrap();
            fs.unlink(a.ino, b"f1").unwrap();
            fs.rename(ROOT_INO, b"hl", a.ino, b"hl2", RenameFlags::default())
                .unwrap();
            let x = fs
                .create(
                    ROOT_INO,
                    b"late",
                    FileType::Regular,
                    0o644,
                    0,
                    &Creds::root(),
                )
                .unwrap();
            fs.write(x.ino, 0, &pattern(9, 5000)).unwrap();
            fs.fsync(x.ino, false).unwrap();
            drop(fs);
        }
        // The undamaged image: no error at all.
        {
            let img = dir.join(format!("{}-case.img", mode.name()));
            std::fs::copy(&base, &img).unwrap();
            let fs = Fs::mount(device(&img), options(mode))
                .unwrap_or_else(|e| panic!("{name}: undamaged image: {e}"));
            if fs.scan_pending() {
                fs.scan_to_end().unwrap();
            }
            let mut seen = Vec::new();
            walk(&fs, &format!("{name} (undamaged)"), &mut seen);
            assert!(
                seen.len() > 400,
                "{name}: walk saw {} entries: {:?}",
                seen.len(),
                seen
            );
            fs.unmount().unwrap();
        }
        let blocks = nonzero_blocks(&base);
        for k in 0..per {
            let img = dir.join(format!("{}-case.img", mode.name()));
            std::fs::copy(&base, &img).unwrap();
            let mut what = Vec::new();
            {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&img)
                    .unwrap();
                for _ in 0..rng.gen_range(1..=4) {
                    let b = blocks[rng.gen_range(0..blocks.len())];
                    let off = rng.gen_range(0..BS as u64);
                    let mask: u8 = rng.gen_range(1..=255);
                    let mut byte = [0u8];
                    f.read_exact_at(&mut byte, b * BS as u64 + off).unwrap();
                    byte[0] ^= mask;
                    f.write_all_at(&byte, b * BS as u64 + off).unwrap();
                    what.push(format!("block {b} byte {off} ^{mask:#04x}"));
                }
            }
            let label = format!("{name} #{k} ({})", what.join(", "));
            println!("case: {label}");
            run_case(&label, &img, mode, &mut rng);
            cases += 1;
        }
    }
    cases
}

/// A stable number from a protocol's name, to give each its own seed.
fn crc(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn damaged_images_mounted_read_write_give_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let seed: u64 = std::env::var("ORDO_RW_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0bad);
    let per: usize = std::env::var("ORDO_RW_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    println!("seed {seed} (ORDO_RW_SEED replays), {per} cases per protocol and base");
    // Two threads, each a half of the registry: a panic in either fails
    // the test with its case's label.
    let modes: Vec<ProtocolKind> = ProtocolKind::all().collect();
    let half = modes.len().div_ceil(2);
    let cases: usize = std::thread::scope(|s| {
        let workers: Vec<_> = modes
            .chunks(half)
            .map(|chunk| {
                let dir = dir.path();
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|&m| run_protocol(m, dir, seed, per))
                        .sum::<usize>()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert_eq!(cases, modes.len() * 2 * per);
}
