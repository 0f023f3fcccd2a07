//! Helpers shared by the core's integration tests: images made by the
//! system's `mkfs.ext4`, `e2fsck -fn`, and mounting through `FileDevice`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ordo_dev::{BlockDevice, FileDevice, OpenOptions};
use ordo_fs::{Fs, MountOptions, ProtocolKind};

/// Whether a tool is installed (tests that need it are skipped otherwise).
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Whether we may use loop devices and mount (root).
pub fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() == 0 };
    root && have("mount") && have("losetup")
}

/// Make an ext4 image with `mkfs.ext4` (`features` like "^has_journal").
pub fn mkfs(path: &Path, size_mib: u64, block_size: u32, features: &str) {
    let mut cmd = Command::new("mkfs.ext4");
    cmd.arg("-F")
        .arg("-q")
        .arg("-b")
        .arg(block_size.to_string());
    if !features.is_empty() {
        cmd.arg("-O").arg(features);
    }
    cmd.arg("-E").arg("lazy_itable_init=1,nodiscard");
    cmd.arg(path).arg(format!("{size_mib}M"));
    let out = cmd.output().expect("run mkfs.ext4");
    assert!(
        out.status.success(),
        "mkfs.ext4 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run `e2fsck -fn`; returns (exit code, output).
pub fn e2fsck(path: &Path) -> (i32, String) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(path)
        .output()
        .expect("run e2fsck");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Assert `e2fsck -fn` finds the image clean.
pub fn assert_fsck_clean(path: &Path) {
    let (code, text) = e2fsck(path);
    assert_eq!(code, 0, "e2fsck -fn reported problems:\n{text}");
}

/// The block size of an image (from its superblock).
pub fn image_block_size(path: &Path) -> u32 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).expect("open image");
    let mut d = [0u8; 4];
    f.read_exact_at(&mut d, 1024 + 0x18)
        .expect("read superblock");
    1024u32 << u32::from_le_bytes(d)
}

/// Open an image as a device.
pub fn device(path: &Path) -> Arc<dyn BlockDevice> {
    let bs = image_block_size(path);
    Arc::new(FileDevice::open(path, bs, OpenOptions::read_write()).expect("open image"))
}

/// Mount an image in `mode`.
pub fn mount(path: &Path, mode: ProtocolKind) -> Fs {
    let opts = MountOptions {
        mode,
        cache_bytes: 32 << 20,
        ..MountOptions::default()
    };
    Fs::mount(device(path), opts).expect("mount")
}

/// A scratch directory for images.
pub fn scratch() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("img");
    (dir, p)
}

/// An image mounted by the Linux kernel on a loop device of its own,
/// unmounted and detached when dropped.
///
/// The device is attached here (`losetup --find`), not with mount's
/// `-o loop`: mount(8) reuses a loop device still attached to the same file,
/// and one whose automatic detach after the previous unmount has not run
/// yet still holds that mount's cached blocks, so the kernel would read
/// the image as it was before ordo changed it.
pub struct KernelMount {
    dir: tempfile::TempDir,
    dev: String,
}

impl KernelMount {
    /// Mount `img` (`opts` as for mount's `-o`, e.g. "ro").
    pub fn new(img: &Path, opts: &str) -> KernelMount {
        let mut losetup = Command::new("losetup");
        losetup.args(["--find", "--show"]);
        if opts.split(',').any(|o| o == "ro") {
            losetup.arg("--read-only");
        }
        let out = losetup.arg(img).output().expect("losetup");
        assert!(
            out.status.success(),
            "losetup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let dir = tempfile::tempdir().expect("tempdir");
        let st = Command::new("mount")
            .args(["-o", opts, &dev])
            .arg(dir.path())
            .status()
            .expect("mount");
        if !st.success() {
            let _ = Command::new("losetup").args(["-d", &dev]).status();
            panic!("kernel mount of {dev} failed");
        }
        KernelMount { dir, dev }
    }
    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        // A process another test thread forks holds copies of this one's
        // descriptors until it execs, so an unmount may meet EBUSY for a
        // moment: retry, then detach lazily rather than leave the mount.
        let unmounted = (0..100).any(|_| {
            let ok = Command::new("umount")
                .arg(self.dir.path())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            ok
        });
        if !unmounted {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}
