//! Shared helpers of the journal tests: images made by `mkfs.ext4`,
//! recovery by `e2fsck` next to ordo's, block-level comparison, and kernel
//! loop mounts (only when running as root with `losetup` and `mount`).
#![allow(dead_code)]

pub mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;

use ordo_dev::{BlockDevice, FileDevice, OpenOptions};

/// Whether a tool is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool} >/dev/null 2>&1"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Make an ext4 image with mke2fs defaults (journal, metadata_csum unless
/// `extra` turns it off), fully initialized so nothing changes it later.
pub fn mkfs(img: &Path, size: &str, block_size: u32, extra: &[&str]) {
    let _ = std::fs::remove_file(img);
    let st = Command::new("truncate")
        .args(["-s", size])
        .arg(img)
        .status()
        .unwrap();
    assert!(st.success());
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", &block_size.to_string()])
        .args(["-E", "lazy_itable_init=0,lazy_journal_init=0"])
        .args(extra)
        .arg(img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The block size recorded in an image's superblock.
pub fn image_block_size(img: &Path) -> u32 {
    let data = std::fs::read(img).unwrap();
    let log = u32::from_le_bytes(data[1024 + 0x18..1024 + 0x1C].try_into().unwrap());
    1024 << log
}

pub fn with_file_dev<T>(img: &Path, f: impl FnOnce(&dyn BlockDevice) -> T) -> T {
    // Not exclusive: a process another test thread forks may briefly
    // inherit the descriptor, and with it an flock.
    let opts = OpenOptions {
        exclusive: false,
        ..OpenOptions::read_only()
    };
    let dev = FileDevice::open(img, image_block_size(img), opts).unwrap();
    f(&dev)
}

pub fn with_file_dev_rw<T>(img: &Path, f: impl FnOnce(&dyn BlockDevice) -> T) -> T {
    let opts = OpenOptions {
        exclusive: false,
        ..OpenOptions::read_write()
    };
    let dev = FileDevice::open(img, image_block_size(img), opts).unwrap();
    let r = f(&dev);
    dev.flush().unwrap();
    r
}

pub fn read_block(img: &Path, block: u64, bs: u32) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(img).unwrap();
    f.seek(SeekFrom::Start(block * bs as u64)).unwrap();
    let mut b = vec![0u8; bs as usize];
    f.read_exact(&mut b).unwrap();
    b
}

pub fn write_block(img: &Path, block: u64, data: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    f.seek(SeekFrom::Start(block * data.len() as u64)).unwrap();
    f.write_all(data).unwrap();
}

/// Run a debugfs script with `-w`.
pub fn debugfs_script(img: &Path, script: &str) {
    use std::io::Write;
    let mut child = Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg("-")
        .arg(img)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "debugfs failed");
}

/// `e2fsck -fy`; returns its exit code (0 or 1 expected).
pub fn e2fsck_fy(img: &Path) -> i32 {
    let out = Command::new("e2fsck").arg("-fy").arg(img).output().unwrap();
    out.status.code().unwrap_or(-1)
}

/// `e2fsck -fn` must find nothing.
pub fn assert_fsck_clean(img: &Path) {
    let out = Command::new("e2fsck").arg("-fn").arg(img).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "e2fsck -fn {}:\n{}{}",
        img.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `e2fsck -fn` finds nothing but the superblock's free block and inode
/// counts, which the kernel does not keep exact on disk (it recomputes
/// them from the group descriptors at mount), so an image replayed from a
/// kernel journal may have them stale whoever replays it.
pub fn assert_fsck_clean_but_super_counts(img: &Path) {
    let out = Command::new("e2fsck").arg("-fn").arg(img).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut problems = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if l.starts_with("Pass ") || l.is_empty() || l.contains("files (") {
            continue;
        }
        if (l.starts_with("Free blocks count wrong (")
            || l.starts_with("Free inodes count wrong ("))
            && !l.contains("group")
        {
            // Its "Fix? no" follows.
            lines.next();
            continue;
        }
        if l.starts_with("Fix? no") {
            continue;
        }
        problems.push(l.to_string());
    }
    assert!(problems.is_empty(), "e2fsck -fn {}:\n{text}", img.display());
}

/// Copy `img` twice; recover one copy with `e2fsck -fy` and the other with
/// ordo. Returns (ordo's, e2fsck's).
pub fn recover_both(img: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let ordo = dir.join("by-ordo.img");
    let e2 = dir.join("by-e2fsck.img");
    std::fs::copy(img, &ordo).unwrap();
    std::fs::copy(img, &e2).unwrap();
    let code = e2fsck_fy(&e2);
    assert!(code == 0 || code == 1, "e2fsck -fy exit {code}");
    let rep = with_file_dev_rw(&ordo, |dev| {
        ordo_fs::recovery::recover_device(dev, None).unwrap()
    });
    eprintln!("ordo recovery: {:?}", rep.lines);
    (ordo, e2)
}

/// ordo's replay and e2fsck's give the same image: e2fsck also repairs
/// what it finds after its replay (summary counts, `bg_itable_unused`,
/// which the kernel leaves stale), so `by_ordo` gets the same `e2fsck -fy`
/// on a copy before every block is compared.
pub fn assert_same_as_e2fsck(by_ordo: &Path, by_e2fsck: &Path) {
    let fixed = by_ordo.with_extension("fixed");
    std::fs::copy(by_ordo, &fixed).unwrap();
    let code = e2fsck_fy(&fixed);
    assert!(code == 0 || code == 1, "e2fsck -fy exit {code}");
    assert_same_except_supers(&fixed, by_e2fsck);
}

/// Every block equal except the primary superblock's and the journal
/// superblock's (e2fsck stamps check times and recomputes summary counts
/// in the former).
pub fn assert_same_except_supers(a: &Path, b: &Path) {
    let bs = image_block_size(a) as usize;
    let da = std::fs::read(a).unwrap();
    let db = std::fs::read(b).unwrap();
    assert_eq!(da.len(), db.len());
    let jsb = with_file_dev(a, |dev| {
        let runs = ordo_fs::recovery::locate_journal(dev).unwrap().unwrap();
        ordo_fs::recovery::JournalMap::new(runs).phys(0).unwrap()
    });
    let super_block = (1024 / bs) as u64;
    let mut differ = Vec::new();
    for (i, (x, y)) in da.chunks(bs).zip(db.chunks(bs)).enumerate() {
        let i = i as u64;
        if x != y && i != super_block && i != jsb {
            differ.push(i);
        }
    }
    if !differ.is_empty() {
        if let Ok(keep) = std::env::var("ORDO_TEST_KEEP") {
            let _ = std::fs::copy(a, Path::new(&keep).join("a.img"));
            let _ = std::fs::copy(b, Path::new(&keep).join("b.img"));
        }
    }
    assert!(
        differ.is_empty(),
        "blocks differ between {} and {}: {:?}",
        a.display(),
        b.display(),
        &differ[..differ.len().min(40)]
    );
    // The journal superblocks agree on what matters: empty log, sequence.
    let ja = read_block(a, jsb, bs as u32);
    let jb = read_block(b, jsb, bs as u32);
    assert_eq!(&ja[0x18..0x20], &jb[0x18..0x20], "s_sequence / s_start");
}

/// Kernel loop mounts, when available.
pub struct LoopCtx;

impl LoopCtx {
    pub fn new() -> Option<LoopCtx> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root && have("losetup") && have("mount") && Path::new("/dev/loop-control").exists() {
            Some(LoopCtx)
        } else {
            None
        }
    }

    /// Loop-mount `img`, run `work` in the mount, `syncfs` so the journal
    /// commits, copy the backing file to `captured` while still mounted
    /// (committed transactions not yet checkpointed), then unmount.
    pub fn capture_after_sync(
        &self,
        img: &Path,
        captured: &Path,
        mount_opts: &str,
        work: impl FnOnce(&Path),
    ) {
        let mnt = tempfile::tempdir().unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(img)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let loopdev = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let _guard = LoopGuard {
            dev: loopdev.clone(),
            mnt: mnt.path().to_path_buf(),
        };
        let mut mount = Command::new("mount");
        mount.args(["-t", "ext4"]);
        if !mount_opts.is_empty() {
            mount.args(["-o", mount_opts]);
        }
        let st = mount.arg(&loopdev).arg(mnt.path()).status().unwrap();
        assert!(st.success(), "mount failed");
        work(mnt.path());
        let st = Command::new("sync")
            .arg("-f")
            .arg(mnt.path())
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::copy(img, captured).unwrap();
    }
}

impl LoopCtx {
    /// Loop-mount `img` (the kernel replays its journal) and unmount it.
    pub fn mount_and_unmount(&self, img: &Path) {
        self.capture_after_sync(img, &img.with_extension("after-mount"), "", |_| {});
    }
}

struct LoopGuard {
    dev: String,
    mnt: PathBuf,
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}
