//! Shared pieces of the mount tests: images in temporary directories, an
//! `ordo mount` child process, kernel loop mounts, and running programs.
//!
//! These tests need root, `/dev/fuse` and loop devices. Where one is
//! missing they fail with a message that says which: a test that cannot
//! run must never pass.

#![allow(dead_code)]

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The `ordo` binary under test.
pub fn ordo_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ordo")
}

/// Fail loudly unless the machine can mount FUSE and loop file systems.
pub fn require_mount_privileges() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests mount file systems and must run as root (euid is {euid})"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: load the fuse module (modprobe fuse) or run where FUSE exists"
    );
    assert!(
        which("fusermount3"),
        "fusermount3 is missing: apt-get install fuse3 (scripts/test.sh does this)"
    );
}

/// Fail loudly unless loop devices can be used.
pub fn require_loop_devices() {
    require_mount_privileges();
    assert!(
        Path::new("/dev/loop-control").exists(),
        "/dev/loop-control is missing: loop devices are needed for the kernel ext4 side"
    );
}

/// Whether `cmd` is on the PATH.
pub fn which(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Run a command, returning its output; panics if it cannot be started.
pub fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"))
}

/// Run a shell snippet in `dir`, asserting success.
pub fn sh(dir: &Path, script: &str) -> String {
    let out = Command::new("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
    assert!(
        out.status.success(),
        "in {}: `{script}` failed ({}):\nstdout: {}\nstderr: {}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run `ordo ARGS`.
pub fn ordo(args: &[&str]) -> Output {
    run(ordo_bin(), args)
}

/// Format a fresh ordo image of `size` ("64M") at `image`.
pub fn mkfs(image: &Path, size: &str) {
    let out = ordo(&["mkfs", image.to_str().unwrap(), "--size", size]);
    assert!(
        out.status.success(),
        "ordo mkfs failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `path` is a mount point, per /proc/mounts.
pub fn is_mounted(path: &Path) -> bool {
    let canon = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let want = canon.to_string_lossy().replace(' ', "\\040");
    fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

/// A running `ordo mount`.
pub struct OrdoMount {
    pub mountpoint: PathBuf,
    child: Option<Child>,
}

impl OrdoMount {
    /// Mount `image` on `mountpoint` with `-o options` and wait until the
    /// kernel shows the mount.
    pub fn start(image: &Path, mountpoint: &Path, options: &str) -> OrdoMount {
        let mut cmd = Command::new(ordo_bin());
        cmd.arg("mount").arg("-f").arg(image).arg(mountpoint);
        if !options.is_empty() {
            cmd.arg("-o").arg(options);
        }
        OrdoMount::spawn(cmd, mountpoint)
    }

    /// Mount the FUSE floor (`ordo fuse-floor`) on `mountpoint` with
    /// `args`, and wait until the kernel shows the mount.
    pub fn floor(mountpoint: &Path, args: &[&str]) -> OrdoMount {
        let mut cmd = Command::new(ordo_bin());
        cmd.arg("fuse-floor").arg(mountpoint).args(args);
        OrdoMount::spawn(cmd, mountpoint)
    }

    /// Run `cmd` (a FUSE server in the foreground: `ordo mount -f`, the
    /// floor, another server) and wait until the kernel shows its mount on
    /// `mountpoint`.
    pub fn spawn(mut cmd: Command, mountpoint: &Path) -> OrdoMount {
        require_mount_privileges();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ordo mount");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if is_mounted(mountpoint) {
                break;
            }
            if let Some(status) = child.try_wait().expect("wait ordo mount") {
                let mut err = String::new();
                child.stderr.take().unwrap().read_to_string(&mut err).ok();
                panic!("ordo mount exited early ({status}): {err}");
            }
            assert!(
                Instant::now() < deadline,
                "ordo mount did not appear in /proc/mounts within 30 s"
            );
            sleep(Duration::from_millis(20));
        }
        OrdoMount {
            mountpoint: mountpoint.to_path_buf(),
            child: Some(child),
        }
    }

    /// Unmount with `fusermount3 -u` and wait for `ordo mount` to exit;
    /// returns its exit status and standard error.
    pub fn stop(self) -> (ExitStatus, String) {
        let mp = self.mountpoint.to_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        // The kernel refuses while something still uses the mount (EBUSY),
        // which a just-finished program can cause for a moment.
        loop {
            let out = run("fusermount3", &["-u", &mp]);
            if out.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "fusermount3 -u {mp} kept failing: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            sleep(Duration::from_millis(100));
        }
        self.wait()
    }

    /// Wait (up to 60 s) for `ordo mount` to exit after an unmount made
    /// elsewhere (a lazy one, say); returns its exit status and standard
    /// error. Past 60 s it is killed, and the panic shows what it printed.
    pub fn wait(self) -> (ExitStatus, String) {
        self.wait_for("ordo mount did not exit after being unmounted")
    }

    fn wait_for(mut self, what: &str) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait ordo mount") {
                break Some(s);
            }
            if Instant::now() >= deadline {
                break None;
            }
            sleep(Duration::from_millis(20));
        };
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).ok();
        match status {
            Some(s) => (s, err),
            None => panic!("{what} within 60 s; it printed:\n{err}"),
        }
    }

    /// Unmount and assert `ordo mount` exited 0.
    pub fn stop_ok(self) {
        let (status, err) = self.stop();
        assert!(status.success(), "ordo mount exited with {status}: {err}");
    }

    /// Send a signal to `ordo mount` (SIGINT, SIGTERM) and wait for its
    /// exit.
    pub fn signal(self, sig: i32) -> (ExitStatus, String) {
        self.send(sig);
        self.wait_for(&format!("ordo mount ignored signal {sig}"))
    }

    /// Send a signal to `ordo mount` without waiting.
    pub fn send(&self, sig: i32) {
        let child = self.child.as_ref().unwrap();
        // SAFETY: kill on a child we own, not yet reaped.
        unsafe { libc::kill(child.id() as i32, sig) };
    }

    /// Whether `ordo mount` is still running.
    pub fn running(&mut self) -> bool {
        let child = self.child.as_mut().unwrap();
        child.try_wait().expect("wait ordo mount").is_none()
    }
}

impl Drop for OrdoMount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let mp = self.mountpoint.to_str().unwrap().to_string();
            let _ = run("fusermount3", &["-u", "-z", &mp]);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A kernel ext4 mount of an image through a loop device of its own
/// ([`ordo_dev::KernelMount`]).
pub struct KernelMount {
    mount: ordo_dev::KernelMount,
}

impl KernelMount {
    /// Mount `image` on `mountpoint` (`options` as for mount -o).
    pub fn start(image: &Path, mountpoint: &Path, options: &str) -> KernelMount {
        require_loop_devices();
        match ordo_dev::KernelMount::mount(image, mountpoint, options) {
            Ok(mount) => KernelMount { mount },
            Err(e) => panic!("kernel mount: {e}"),
        }
    }

    /// Unmount (retrying while busy) and detach the loop device.
    pub fn stop(self) {
        if let Err(e) = self.mount.unmount() {
            panic!("kernel unmount: {e}");
        }
    }
}

/// `e2fsck -fn IMAGE`: assert it finds nothing.
pub fn assert_e2fsck_clean(image: &Path) {
    let out = run("e2fsck", &["-fn", image.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "e2fsck -fn {} is not clean ({}):\n{}{}",
        image.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temporary directory with an image and mount points in it.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::Builder::new()
                .prefix("ordo-test-")
                .tempdir()
                .expect("temp dir"),
        }
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// A fresh, empty directory named `name`.
    pub fn mkdir(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        fs::create_dir_all(&p).unwrap();
        p
    }
}
