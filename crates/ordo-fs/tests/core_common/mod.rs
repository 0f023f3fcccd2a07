//! Helpers shared by the core's integration tests: images made by the
//! system's `mkfs.ext4`, `e2fsck -fn`, and mounting through `FileDevice`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ordo_dev::{BlockDevice, FileDevice, OpenOptions};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, ROOT_INO};

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
    mkfs_with(path, size_mib, block_size, features, &[]);
}

/// [`mkfs`] with more `mkfs.ext4` arguments (e.g. `["-I", "1024"]`).
pub fn mkfs_with(path: &Path, size_mib: u64, block_size: u32, features: &str, more: &[&str]) {
    let mut cmd = Command::new("mkfs.ext4");
    cmd.arg("-F")
        .arg("-q")
        .arg("-b")
        .arg(block_size.to_string());
    if !features.is_empty() {
        cmd.arg("-O").arg(features);
    }
    cmd.args(more);
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

/// Create regular file `name` in the root directory as root, with
/// `data` written at offset 0; its inode number.
pub fn create_file(fs: &Fs, name: &str, data: &[u8]) -> u32 {
    let a = fs
        .create(
            ROOT_INO,
            name.as_bytes(),
            FileType::Regular,
            0o644,
            0,
            &Creds::root(),
        )
        .expect("create");
    if !data.is_empty() {
        fs.write(a.ino, 0, data).expect("write");
    }
    a.ino
}

/// A scratch directory for images.
pub fn scratch() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("img");
    (dir, p)
}

/// `img` mounted by the Linux kernel on a loop device and a temporary
/// directory of its own (`opts` as for mount's `-o`, e.g. "ro"); unmounted,
/// detached and removed when dropped.
pub fn kernel_mount(img: &Path, opts: &str) -> ordo_dev::KernelMount {
    ordo_dev::KernelMount::mount_temp(img, opts).unwrap_or_else(|e| panic!("kernel mount: {e}"))
}
