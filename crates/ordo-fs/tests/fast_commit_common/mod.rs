//! Shared helpers of the fast-commit tests: kernel captures of fast-commit
//! logs (a loop mount with a long commit interval, fsyncs, and a copy of
//! the loop device taken while it is still mounted, before any full
//! commit), replay by ordo and by `e2fsck -fy`, and a comparison of the
//! trees the two produce through read-only loop mounts.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use ordo_dev::{BlockDevice, FileDevice, OpenOptions};
use ordo_format::Superblock;
use ordo_fs::protocol::{self, DataMode, ProtocolEnv, ProtocolKind, RecoveryReport};
use ordo_fs::{Attr, FileType, Fs, ROOT_INO};

/// Whether a tool is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool} >/dev/null 2>&1"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Fail, naming the tool, when a tool the test needs is missing:
/// `scripts/test.sh` installs them, and a comparison that quietly does not
/// run proves nothing.
pub fn require(tool: &str) {
    assert!(
        have(tool),
        "`{tool}` is not installed (scripts/test.sh installs e2fsprogs and util-linux)"
    );
}

/// Whether kernel loop mounts are possible: running as root on a machine
/// with loop devices. The tools they need must then be installed.
pub fn can_loop_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/loop-control").exists() {
        return false;
    }
    for t in [
        "losetup",
        "mount",
        "umount",
        "mkfs.ext4",
        "e2fsck",
        "debugfs",
        "dd",
    ] {
        require(t);
    }
    true
}

/// Run a command that must succeed; its standard output.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `mkfs.ext4 -O fast_commit` on a fresh image. Inode tables are left to
/// lazy initialization as mke2fs does by default: e2fsck 1.47.0 replays a
/// fast-commit log against the group descriptors it read before replaying
/// the JBD2 log, and with zeroed-table descriptors (`-E
/// lazy_itable_init=0`) it then misses inodes the last full commit
/// allocated.
pub fn mkfs_fc(img: &Path, size: &str, block_size: u32) {
    require("mkfs.ext4");
    let _ = std::fs::remove_file(img);
    run(Command::new("truncate").args(["-s", size]).arg(img));
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", &block_size.to_string()])
        .args(["-O", "fast_commit"])
        .arg(img));
}

/// `img` mounted by the kernel on a loop device and a temporary directory
/// of its own (`losetup` + `mount -t ext4 -o OPTS`); unmounted, detached
/// and removed when dropped.
pub fn kernel_mount(img: &Path, opts: &str) -> ordo_dev::KernelMount {
    ordo_dev::KernelMount::mount_temp(img, opts).unwrap_or_else(|e| panic!("{e}"))
}

/// Mount `img` with `-o commit=600` (no timer commit during the test),
/// force one full commit (the kernel only fast-commits after one), run
/// `work` in the mount, then copy the loop device with O_DIRECT while it
/// is still mounted: the copy holds the fast-commit log and nothing the
/// next full commit or checkpoint would write.
pub fn capture_fast_commits(img: &Path, captured: &Path, work: impl FnOnce(&Path)) {
    let m = kernel_mount(img, "commit=600");
    // Something to commit, so that the sync below is a real full commit.
    write_fsync(&m.mountpoint().join("seed"), b"seed\n");
    run(Command::new("sync").arg("-f").arg(m.mountpoint()));
    work(m.mountpoint());
    run(Command::new("dd")
        .arg(format!("if={}", m.device().display()))
        .arg(format!("of={}", captured.display()))
        .args(["bs=1M", "iflag=direct", "status=none"]));
}

/// Whether the kernel replays `img` (a copy of it, mounted read-write and
/// unmounted): a copy of a live mount taken while the kernel was writing
/// (an `iput` finishing an unlink, say) can hold a log it refuses.
pub fn kernel_can_replay(img: &Path) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe.img");
    std::fs::copy(img, &probe).unwrap();
    ordo_dev::KernelMount::mount_temp(&probe, "rw").is_ok()
}

/// Mount read-write (the kernel replays the JBD2 log and the fast
/// commits), then unmount.
pub fn kernel_replay(img: &Path) {
    drop(kernel_mount(img, "rw"));
}

/// Make directories in an image before it is mounted (debugfs), so that
/// they are on disk rather than in the JBD2 log of the capture.
pub fn premake_dirs(img: &Path, dirs: &[&str]) {
    for d in dirs {
        run(Command::new("debugfs")
            .args(["-w", "-R", &format!("mkdir {d}")])
            .arg(img));
    }
}

/// Write a file and fsync it.
pub fn write_fsync(path: &Path, data: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// Open a file read-write, run `f`, fsync.
pub fn edit_fsync(path: &Path, f: impl FnOnce(&mut std::fs::File)) {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    f(&mut file);
    file.sync_all().unwrap();
}

/// fsync an existing path (a file or a directory).
pub fn fsync_path(path: &Path) {
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}

fn open_rw(img: &Path) -> FileDevice {
    let data = std::fs::read(img).unwrap();
    let log = u32::from_le_bytes(data[1024 + 0x18..1024 + 0x1C].try_into().unwrap());
    let opts = OpenOptions {
        exclusive: false,
        ..OpenOptions::read_write()
    };
    FileDevice::open(img, 1024 << log, opts).unwrap()
}

/// The protocol environment of an image, as mount builds it.
pub fn env_of(dev: &dyn BlockDevice) -> ProtocolEnv {
    let bs = dev.block_size();
    let mut buf = vec![0u8; bs as usize];
    let (blk, off) = if bs == 1024 { (1, 0) } else { (0, 1024) };
    dev.read(blk, &mut buf, ordo_dev::BlockClass::Super)
        .unwrap();
    let s = Superblock::decode(&buf[off..off + 1024]).unwrap();
    ProtocolEnv {
        block_size: bs,
        block_count: s.blocks_count,
        uuid: s.uuid,
        journal_runs: Vec::new(),
        commit_interval_ms: 5000,
        flush_interval_ms: 1000,
        data_mode: DataMode::Ordered,
        metadata_csum: s.has_metadata_csum(),
        clock: ordo_fs::clock::system(),
        variant: "",
    }
}

/// Run ordo's `mode=fast_commit` recovery on an image file.
pub fn ordo_recover(img: &Path) -> RecoveryReport {
    let dev = open_rw(img);
    let env = env_of(&dev);
    let r = protocol::recover(ProtocolKind::named("fast_commit"), &dev, &env).unwrap();
    dev.flush().unwrap();
    r
}

/// What ordo's scan of the fast-commit area of an image finds.
pub fn fc_state(img: &Path) -> ordo_fs::fc_replay::FcState {
    let dev = open_rw(img);
    ordo_fs::fc_replay::fc_state(&dev)
        .unwrap()
        .expect("a fast-commit area")
}

/// `e2fsck -fy`; returns its exit code.
pub fn e2fsck_fy(img: &Path) -> i32 {
    e2fsck_fy_output(img).0
}

/// `e2fsck -fy`; returns its exit code and what it printed.
pub fn e2fsck_fy_output(img: &Path) -> (i32, String) {
    require("e2fsck");
    let out = Command::new("e2fsck").arg("-fy").arg(img).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `e2fsck -fn`: its exit code and what it printed.
pub fn e2fsck_fn(img: &Path) -> (i32, String) {
    require("e2fsck");
    let out = Command::new("e2fsck").arg("-fn").arg(img).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `e2fsck -fn` must find nothing.
pub fn assert_fsck_clean(img: &Path) {
    require("e2fsck");
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

/// One object of a tree, as a comparison sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Obj {
    pub kind: &'static str,
    pub perm: u32,
    pub nlink: u64,
    pub size: u64,
    pub content: Vec<u8>,
}

fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<String, Obj>, lost_found: bool) {
    for e in std::fs::read_dir(root.join(rel)).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if !lost_found && rel.as_os_str().is_empty() && name == "lost+found" {
            continue;
        }
        let r = rel.join(&name);
        let p = root.join(&r);
        let m = std::fs::symlink_metadata(&p).unwrap();
        let ft = m.file_type();
        let (kind, content) = if ft.is_dir() {
            ("dir", Vec::new())
        } else if ft.is_symlink() {
            (
                "symlink",
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes(),
            )
        } else if ft.is_file() {
            ("file", std::fs::read(&p).unwrap())
        } else {
            ("other", Vec::new())
        };
        out.insert(
            r.display().to_string(),
            Obj {
                kind,
                perm: m.permissions().mode() & 0o7777,
                nlink: m.nlink(),
                size: if ft.is_dir() { 0 } else { m.size() },
                content,
            },
        );
        if ft.is_dir() {
            walk(root, &r, out, lost_found);
        }
    }
}

/// The tree of an image, read through a read-only kernel mount, without
/// `lost+found`.
pub fn tree_of(img: &Path) -> BTreeMap<String, Obj> {
    tree_of_with(img, false)
}

/// The whole tree of an image, `lost+found` and what e2fsck may have
/// reconnected there included, read through a read-only kernel mount.
pub fn full_tree_of(img: &Path) -> BTreeMap<String, Obj> {
    tree_of_with(img, true)
}

fn tree_of_with(img: &Path, lost_found: bool) -> BTreeMap<String, Obj> {
    let m = kernel_mount(img, "ro,noload");
    let mut out = BTreeMap::new();
    walk(m.mountpoint(), Path::new(""), &mut out, lost_found);
    out
}

/// Every object below the root of `fs` as ordo serves it, depth first:
/// (path relative to the root, attributes). `.` and `..` are skipped, and
/// the root's `lost+found` (with what is in it) unless `lost_found`.
pub fn ordo_walk(fs: &Fs, lost_found: bool) -> Vec<(String, Attr)> {
    let mut out = Vec::new();
    let mut todo = vec![(ROOT_INO, String::new())];
    while let Some((dir, path)) = todo.pop() {
        let mut off = 0;
        loop {
            let ents = fs.readdir(dir, off, 256).unwrap();
            if ents.is_empty() {
                break;
            }
            for e in &ents {
                off = e.next_offset;
                let name = String::from_utf8_lossy(&e.name).to_string();
                if name == "." || name == ".." {
                    continue;
                }
                if !lost_found && dir == ROOT_INO && name == "lost+found" {
                    continue;
                }
                let p = if path.is_empty() {
                    name
                } else {
                    format!("{path}/{name}")
                };
                if e.kind == FileType::Directory {
                    todo.push((e.ino, p.clone()));
                }
                out.push((p, fs.getattr(e.ino).unwrap()));
            }
        }
    }
    out
}

/// Assert two trees are the same, naming the first difference.
pub fn assert_same_tree(a: &BTreeMap<String, Obj>, b: &BTreeMap<String, Obj>) {
    let ka: Vec<_> = a.keys().collect();
    let kb: Vec<_> = b.keys().collect();
    assert_eq!(ka, kb, "the two trees name different paths");
    for (k, va) in a {
        let vb = &b[k];
        assert_eq!(
            (va.kind, va.perm, va.nlink, va.size),
            (vb.kind, vb.perm, vb.nlink, vb.size),
            "{k}: attributes differ"
        );
        assert!(va.content == vb.content, "{k}: contents differ");
    }
}

/// One of the protocol's statistics (0 when it has none of that name).
pub fn stat(fs: &Fs, name: &str) -> u64 {
    let (_, s) = fs.protocol_stats();
    s.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or(0)
}
