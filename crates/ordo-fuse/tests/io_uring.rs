//! FUSE over io_uring (`MountConfig::io_uring`, `-o io_uring`).
//!
//! With the kernel's `enable_uring` on, a mount that asks for the ring
//! serves its requests from per-CPU io_uring queues: files written, renamed,
//! fsynced (their replies sent from the fsync threads, not the queue's
//! thread), read back, listed and given xattrs through the ring are what a
//! mount over `/dev/fuse` then reads, and e2fsck finds the image clean.
//! With `enable_uring` off the same mount falls back to `/dev/fuse` and
//! serves everything as before.
//!
//! Both cases are in one test: `enable_uring` is the kernel's, one switch
//! for every FUSE mount on the machine, and the test sets it back to what
//! it was. On a kernel without the transport only the fallback is checked,
//! and the test says so.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ordo_dev::MemDevice;
use ordo_fs::{Fs, MountOptions, ProtocolKind};
use ordo_fuse::uring_switch::{kernel_has_ring, RingSwitch, ENABLE_URING};
use ordo_fuse::MountConfig;

fn image() -> Arc<MemDevice> {
    Arc::new(common::journaled_image(16384))
}

fn mount_fs(dev: &Arc<MemDevice>) -> Arc<Fs> {
    let opts = MountOptions {
        mode: ProtocolKind::named("journal"),
        background: false,
        ..MountOptions::default()
    };
    Arc::new(Fs::mount(dev.clone(), opts).unwrap())
}

fn config(io_uring: bool) -> MountConfig {
    MountConfig {
        allow_other: false,
        io_uring,
        ..MountConfig::for_mode(ProtocolKind::named("journal"))
    }
}

/// The bytes of file `i` of worker `w`: sizes from empty to past one
/// request (1 MiB), so that replies and payloads of every size cross the
/// ring.
fn content(w: usize, i: usize) -> Vec<u8> {
    let len = match i % 5 {
        0 => 0,
        1 => 1 + i * 37,
        2 => 4096 * (i % 7 + 1),
        3 => 65_536 + i,
        _ => (1 << 20) + 4096 * (i % 3) + 17,
    };
    (0..len)
        .map(|b| {
            (b as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add((w * 1000 + i) as u32) as u8
        })
        .collect()
}

/// What one worker leaves in `dir`: name -> bytes.
fn work(dir: &Path, w: usize) -> BTreeMap<String, Vec<u8>> {
    let mut want = BTreeMap::new();
    fs::create_dir(dir).unwrap();
    for i in 0..25 {
        let data = content(w, i);
        let tmp = dir.join(format!("tmp{i}"));
        let mut f = fs::File::create(&tmp).unwrap();
        // Written in pieces of odd sizes, one of them rewritten in place.
        for piece in data.chunks(200_003) {
            f.write_all(piece).unwrap();
        }
        if data.len() > 10 {
            f.write_all_at(&data[3..9], 3).unwrap();
        }
        if i % 4 == 0 {
            // Answered from an fsync thread, not the queue's own.
            f.sync_all().unwrap();
        }
        drop(f);
        let name = format!("f{i}");
        fs::rename(&tmp, dir.join(&name)).unwrap();
        if i % 6 == 5 {
            fs::remove_file(dir.join(&name)).unwrap();
            continue;
        }
        want.insert(name, data);
    }
    let x = dir.join("f1");
    xattr_set(&x, "user.ordo", b"ring");
    assert_eq!(xattr_get(&x, "user.ordo"), b"ring");
    std::os::unix::fs::symlink("f1", dir.join("link")).unwrap();
    assert_eq!(
        fs::read_link(dir.join("link")).unwrap(),
        PathBuf::from("f1")
    );
    fs::remove_file(dir.join("link")).unwrap();
    let t = dir.join("f2");
    let f = fs::OpenOptions::new().write(true).open(&t).unwrap();
    f.set_len(4000).unwrap();
    drop(f);
    let d = want.get_mut("f2").unwrap();
    d.resize(4000, 0);
    // A sparse file: a read is filled straight into the buffer the
    // transport lends (the ring entry's payload, which last held another
    // reply), so its holes must be written as zeros, not left as they were.
    let f = fs::File::create(dir.join("sparse")).unwrap();
    let mut d = vec![0u8; 3 << 20];
    for (at, bytes) in [(0, &b"head"[..]), ((2 << 20) + 7, &b"middle"[..])] {
        f.write_all_at(bytes, at as u64).unwrap();
        d[at..at + bytes.len()].copy_from_slice(bytes);
    }
    f.set_len(d.len() as u64).unwrap();
    want.insert("sparse".to_string(), d);
    want
}

fn xattr_set(p: &Path, name: &str, value: &[u8]) {
    let p = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr: {}", std::io::Error::last_os_error());
}

fn xattr_get(p: &Path, name: &str) -> Vec<u8> {
    let p = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "getxattr: {}", std::io::Error::last_os_error());
    buf.truncate(r as usize);
    buf
}

/// Every file under `root` as worker directory -> name -> bytes.
fn tree(root: &Path) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
    let mut all = BTreeMap::new();
    for d in fs::read_dir(root).unwrap() {
        let d = d.unwrap();
        let name = d.file_name().into_string().unwrap();
        if !name.starts_with('w') {
            continue;
        }
        let mut files = BTreeMap::new();
        for f in fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            let mut bytes = Vec::new();
            fs::File::open(f.path())
                .unwrap()
                .read_to_end(&mut bytes)
                .unwrap();
            files.insert(f.file_name().into_string().unwrap(), bytes);
        }
        all.insert(name, files);
    }
    all
}

fn e2fsck_clean(dev: &MemDevice) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    fs::write(&img, dev.to_image()).unwrap();
    let out = std::process::Command::new("e2fsck")
        .args(["-fn"])
        .arg(&img)
        .output()
        .expect("e2fsck (scripts/deps.sh installs e2fsprogs)");
    assert!(
        out.status.success(),
        "e2fsck -fn: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn requests_go_through_the_ring_and_fall_back_to_dev_fuse_when_not_offered() {
    let dev = image();
    let mnt = tempfile::tempdir().unwrap();
    let mut want: BTreeMap<String, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    if kernel_has_ring() {
        let _on = RingSwitch::set(true).unwrap();
        let fs = mount_fs(&dev);
        let session = ordo_fuse::mount(fs.clone(), mnt.path(), &config(true)).unwrap();
        assert!(
            session.io_uring(),
            "the kernel offered the ring but it was not taken"
        );
        let stats = session.transport_stats();
        let session = session.spawn().unwrap();
        // Four writers at once, so that requests come from both CPUs'
        // queues and several entries of one queue are in flight.
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let dir = mnt.path().join(format!("w{w}"));
                std::thread::spawn(move || (format!("w{w}"), work(&dir, w)))
            })
            .collect();
        want = workers.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(tree(mnt.path()), want, "read back through the ring");
        assert!(statfs_blocks(mnt.path()) > 0);
        session.umount_and_join().unwrap();
        // The kernel uses the ring only once a queue per possible CPU has
        // registered; which of them served depends on where the writers ran.
        let served = stats.ring_requests.load(Ordering::Relaxed);
        let queues = stats.ring_queues.load(Ordering::Relaxed);
        assert!(
            (1..=possible_cpus()).contains(&queues),
            "{queues} queues served requests"
        );
        assert!(
            served > 1000,
            "only {served} requests came through the ring"
        );
        Arc::try_unwrap(fs).ok().unwrap().unmount().unwrap();
        e2fsck_clean(&dev);
    } else {
        eprintln!(
            "this kernel cannot serve FUSE over io_uring ({ENABLE_URING} missing or io_uring \
disabled): only the fallback to /dev/fuse is checked"
        );
    }

    // The kernel does not offer the ring: the same mount asks for it, is
    // served over /dev/fuse, and reads what the ring wrote.
    let _off = Path::new(ENABLE_URING)
        .exists()
        .then(|| RingSwitch::set(false).unwrap());
    let fs = mount_fs(&dev);
    let session = ordo_fuse::mount(fs.clone(), mnt.path(), &config(true)).unwrap();
    assert!(!session.io_uring());
    let stats = session.transport_stats();
    let session = session.spawn().unwrap();
    assert_eq!(tree(mnt.path()), want, "read back over /dev/fuse");
    want.insert("w9".to_string(), work(&mnt.path().join("w9"), 9));
    assert_eq!(tree(mnt.path()), want);
    session.umount_and_join().unwrap();
    assert_eq!(stats.ring_requests.load(Ordering::Relaxed), 0);
    assert_eq!(stats.ring_queues.load(Ordering::Relaxed), 0);
    Arc::try_unwrap(fs).ok().unwrap().unmount().unwrap();
    e2fsck_clean(&dev);
}

fn statfs_blocks(p: &Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statvfs is a valid out-parameter.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and out-parameter.
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    assert_eq!(r, 0, "statvfs: {}", std::io::Error::last_os_error());
    s.f_blocks
}

/// The kernel's count of possible CPUs (`nr_cpu_ids`), one queue each:
/// the highest number in `/sys/devices/system/cpu/possible` ("0-1",
/// "0,2-5"), plus one.
fn possible_cpus() -> u64 {
    let list = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    list.trim()
        .split(',')
        .map(|r| r.rsplit('-').next().unwrap().parse::<u64>().unwrap() + 1)
        .max()
        .unwrap()
}
