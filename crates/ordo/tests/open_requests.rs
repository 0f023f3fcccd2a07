//! `open_requests=off`: the kernel opens and closes regular files without
//! asking ordo (FUSE's `no_open`), so ordo keeps an unlinked inode alive by
//! the kernel's references to it instead of by open handles.
//!
//! The kernel's FORGET for an inode whose last reference went may be read
//! after the program's next requests (on Linux 6.18 even with one worker
//! thread), so a test that looks for freed space waits for it
//! (`settled`), except where the adapter itself waits for it (a write short
//! of space, with several workers).

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;

use common::*;

/// Free blocks of the file system holding `dir`.
fn free_blocks(dir: &Path) -> u64 {
    sh(dir, "stat -f -c %f .").trim().parse().unwrap()
}

/// `read()` once it satisfies `done`, or its last value after 10 s. The
/// last close is not always the last reference: the other tests of this
/// binary run beside it and spawn programs, and a child forked before its
/// `exec` holds a copy of every descriptor of this process for a moment
/// (close-on-exec closes them only at the `exec`). The kernel evicts the
/// file, and sends its FORGET, when that copy goes too.
fn settled<T>(mut read: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let v = read();
        if done(&v) || std::time::Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn an_unlinked_open_file_lives_until_its_last_close() {
    require_mount_privileges();
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "64M");
    let mp = s.mkdir("mnt");
    let m = OrdoMount::start(&image, &mp, "mode=journal,open_requests=off,threads=1");
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
    fs::write(mp.join("big"), &data).unwrap();
    // Read once so that the kernel holds the file in its cache, then open
    // it again: no OPEN reaches ordo for either.
    assert_eq!(fs::read(mp.join("big")).unwrap(), data);
    let before_unlink = free_blocks(&mp);
    let mut f = fs::File::open(mp.join("big")).unwrap();
    fs::remove_file(mp.join("big")).unwrap();
    assert!(!mp.join("big").exists());
    let while_open = free_blocks(&mp);
    assert!(
        while_open <= before_unlink,
        "the blocks of an unlinked open file were freed: {before_unlink} -> {while_open}"
    );
    // Its bytes are still there, through the descriptor, from the device
    // (the page cache was dropped by the kernel for the unlinked file or
    // not: either way the bytes must be the file's).
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert!(back == data, "an unlinked open file read other bytes");
    drop(f);
    let after_close = settled(|| free_blocks(&mp), |&n| n >= while_open + 2048);
    assert!(
        after_close >= while_open + 2048,
        "8 MiB not freed by the last close: {while_open} -> {after_close} free blocks"
    );
    m.stop_ok();
    assert_e2fsck_clean(&image);
}

#[test]
fn a_lazy_unmount_frees_what_only_the_open_files_kept() {
    require_mount_privileges();
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "64M");
    let mp = s.mkdir("mnt");
    let m = OrdoMount::start(&image, &mp, "mode=journal,open_requests=off");
    let free_empty = free_blocks(&mp);
    fs::write(mp.join("kept"), vec![7u8; 1 << 20]).unwrap();
    fs::write(mp.join("gone"), vec![9u8; 4 << 20]).unwrap();
    let f = fs::File::open(mp.join("gone")).unwrap();
    fs::remove_file(mp.join("gone")).unwrap();
    let out = run("fusermount3", &["-u", "-z", mp.to_str().unwrap()]);
    assert!(out.status.success(), "lazy unmount failed");
    // The last user goes: the session ends, and ordo frees the orphan
    // before it marks the image clean.
    drop(f);
    let (status, err) = m.wait();
    assert!(status.success(), "ordo mount exited with {status}: {err}");
    assert_e2fsck_clean(&image);
    let dump = run("dumpe2fs", &["-h", image.to_str().unwrap()]);
    let header = String::from_utf8_lossy(&dump.stdout);
    assert!(
        !header.contains("First orphan inode"),
        "a clean unmount left an orphan list:\n{header}"
    );
    let km = s.mkdir("k");
    let k = KernelMount::start(&image, &km, "ro");
    assert_eq!(fs::read(km.join("kept")).unwrap(), vec![7u8; 1 << 20]);
    assert!(!km.join("gone").exists());
    let free_now = free_blocks(&km);
    k.stop();
    assert!(
        free_now + 300 >= free_empty,
        "the unlinked file's 4 MiB were not freed: {free_empty} free when empty, {free_now} now"
    );
}

/// `open(O_TRUNC)` arrives as a SETATTR of size 0 when the kernel opens
/// files itself. What it does must be what the kernel's ext4 does: the
/// size goes to 0, mtime and ctime move even for an empty file, and a
/// caller other than root loses set-user-ID (and set-group-ID with group
/// execute).
#[test]
fn o_trunc_without_open_requests_matches_the_kernels_ext4() {
    truncation_matches_the_kernels_ext4("open_requests=off");
}

/// The same with OPEN served (atomic O_TRUNC), and truncate(2) in both.
#[test]
fn o_trunc_with_open_requests_matches_the_kernels_ext4() {
    truncation_matches_the_kernels_ext4("");
}

fn truncation_matches_the_kernels_ext4(options: &str) {
    require_loop_devices();
    let s = Scratch::new();
    sh(s.dir.path(), "chmod 0755 .");
    let kimg = s.path("kernel.img");
    let oimg = s.path("ordo.img");
    mkfs(&kimg, "64M");
    mkfs(&oimg, "64M");
    let kmp = s.mkdir("k");
    let omp = s.mkdir("o");
    let km = KernelMount::start(&kimg, &kmp, "");
    let om = OrdoMount::start(&oimg, &omp, options);
    let script = "set -e
        printf 'some bytes' > suid && chmod 06777 suid
        printf 'some bytes' > sgid-noexec && chmod 02766 sgid-noexec
        : > empty && touch -d '2001-01-01 00:00:00' empty
        printf 'x' > rootown && chmod 04777 rootown
        printf 'some bytes' > t-sgid-noexec && chmod 02766 t-sgid-noexec
        printf 'some bytes' > t-suid && chmod 04777 t-suid
        setpriv --reuid 1000 --regid 1000 --clear-groups sh -c ': > suid; : > sgid-noexec'
        setpriv --reuid 1000 --regid 1000 --clear-groups truncate -s 3 t-sgid-noexec t-suid
        : > empty
        : > rootown
        for f in suid sgid-noexec rootown t-sgid-noexec t-suid; do stat -c \"$f %a %s\" $f; done
        test $(stat -c %Y empty) -gt 978307200 && echo empty-mtime-moved";
    let kernel = sh(&kmp, script);
    let ordo = sh(&omp, script);
    assert_eq!(kernel, ordo, "kernel:\n{kernel}\nordo:\n{ordo}");
    assert!(kernel.contains("suid 777 0"), "{kernel}");
    assert!(kernel.contains("empty-mtime-moved"), "{kernel}");
    om.stop_ok();
    km.stop();
    assert_e2fsck_clean(&oimg);
}

/// Free inodes of the file system holding `dir`.
fn free_inodes(dir: &Path) -> u64 {
    sh(dir, "stat -f -c %d .").trim().parse().unwrap()
}

/// The FUSE floor with `--open-requests off` is served as ordo is with
/// `open_requests=off`: opens reach it not at all, and an unlinked file
/// lives on the kernel's references until its last close (one worker, as
/// above, so the FORGET is served before the next request).
#[test]
fn the_floor_without_open_requests_keeps_an_unlinked_open_file() {
    require_mount_privileges();
    let s = Scratch::new();
    let mp = s.mkdir("mnt");
    let m = OrdoMount::floor(&mp, &["--threads", "1", "--open-requests", "off"]);
    let empty = free_inodes(&mp);
    fs::write(mp.join("f"), vec![1u8; 10_000]).unwrap();
    // The floor keeps sizes, not bytes: a re-open (no OPEN request) reads
    // 10,000 zeros.
    assert_eq!(fs::read(mp.join("f")).unwrap(), vec![0u8; 10_000]);
    assert_eq!(free_inodes(&mp), empty - 1);
    let f = fs::File::open(mp.join("f")).unwrap();
    fs::remove_file(mp.join("f")).unwrap();
    assert!(!mp.join("f").exists());
    assert_eq!(
        free_inodes(&mp),
        empty - 1,
        "the unlinked open file was dropped while open"
    );
    assert_eq!(f.metadata().unwrap().len(), 10_000);
    drop(f);
    assert_eq!(
        settled(|| free_inodes(&mp), |&n| n == empty),
        empty,
        "the unlinked file outlived its last close"
    );
    m.stop_ok();
}

/// On a full file system, deleting a file makes room for the next write at
/// once, with the kernel opening files and several workers serving: the
/// file's space comes back with the FORGET that its unlink queues, which
/// another worker may still be serving when the next write arrives
/// (`ForgetGate` in ordo-fuse), as on the kernel's ext4, where the unlink
/// itself frees it. The write goes to a file held open, so that nothing
/// but the FORGET stands between the unlink and it.
#[test]
fn a_delete_on_a_full_file_system_makes_room_at_once_without_open_requests() {
    use std::os::unix::fs::FileExt;
    require_mount_privileges();
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "64M");
    let mp = s.mkdir("mnt");
    let m = OrdoMount::start(&image, &mp, "mode=journal,open_requests=off,threads=4");
    const ROUNDS: usize = 1000;
    let small = vec![5u8; 64 << 10];
    let z = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(mp.join("z"))
        .unwrap();
    z.write_all_at(&small, 0).unwrap();
    // Fill what is left, to the last block.
    {
        use std::io::Write;
        let mut fill = fs::File::create(mp.join("fill")).unwrap();
        let chunk = vec![1u8; 1 << 20];
        let mut n = chunk.len();
        loop {
            match fill.write(&chunk[..n]) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && n > 4096 => n /= 2,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling: {e}"),
            }
        }
    }
    let free = free_blocks(&mp);
    assert!(free < 16, "not full: {free} blocks free");
    for round in 0..ROUNDS {
        // z's blocks go back at once (a truncation frees in the request
        // itself) and x takes them; then x goes, by its FORGET, and z
        // needs them again.
        z.set_len(0).unwrap();
        fs::write(mp.join("x"), &small).unwrap();
        fs::remove_file(mp.join("x")).unwrap();
        if let Err(e) = z.write_all_at(&small, 0) {
            panic!("round {round}: a 64 KiB write just after deleting a 64 KiB file: {e}");
        }
    }
    let mut back = vec![0u8; small.len()];
    z.read_exact_at(&mut back, 0).unwrap();
    assert!(back == small, "z reads back other bytes");
    drop(z);
    m.stop_ok();
    assert_e2fsck_clean(&image);
}
