//! Loop devices and the kernel's ext4 mounts of images: the one place ordo
//! hands an image to the kernel (the crash explorer's kernel judge, the
//! interoperability tests, the benchmarks' loop devices).
//!
//! Every mount gets a loop device of its own ([`LoopDevice::attach`],
//! `losetup --find --show`), never mount(8)'s `-o loop`: mount(8) reuses a
//! loop device still attached to the same file, and one whose automatic
//! detach after an earlier unmount has not run yet still holds that
//! mount's cached blocks, so the kernel would read the image as it was
//! before ordo changed it.
//!
//! An unmount (`umount2`, no process spawned) is retried while the mount
//! is busy ([`unmount_retrying`]): a process another thread forks holds
//! copies of the caller's descriptors until it execs, a loop device's
//! probe holds a fresh mount for a moment, and FUSE finishes a release
//! asynchronously. What is dropped without an explicit unmount is unmounted the
//! same way and, failing that, detached lazily, so nothing outlives its
//! owner.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::DevError;

/// Unmount attempts before [`unmount_retrying`] gives up.
pub const UMOUNT_TRIES: u32 = 100;
/// The pause between two unmount attempts.
pub const UMOUNT_PAUSE: Duration = Duration::from_millis(50);

/// Run `cmd`; its standard output when it succeeds, else an error naming
/// `path`, `op` and what the command printed.
fn run(cmd: &mut Command, path: &Path, op: &'static str) -> Result<String, DevError> {
    let out = cmd.output().map_err(|source| DevError::Io {
        path: path.to_path_buf(),
        op,
        source,
    })?;
    if !out.status.success() {
        let mut detail = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if detail.is_empty() {
            detail = format!("exited with {}", out.status);
        }
        return Err(DevError::Command {
            path: path.to_path_buf(),
            op,
            detail,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A loop device attached to an image file, detached when dropped (a
/// device still in use is then marked to go when its last user does).
#[derive(Debug)]
pub struct LoopDevice {
    path: PathBuf,
    attached: bool,
}

impl LoopDevice {
    /// Attach `file` to a free loop device (`losetup --find --show`),
    /// read-only if asked.
    pub fn attach(file: &Path, read_only: bool) -> Result<LoopDevice, DevError> {
        let mut cmd = Command::new("losetup");
        cmd.args(["--find", "--show"]);
        if read_only {
            cmd.arg("--read-only");
        }
        let out = run(cmd.arg(file), file, "losetup --find")?;
        let dev = out.trim();
        if !dev.starts_with("/dev/") {
            return Err(DevError::Command {
                path: file.to_path_buf(),
                op: "losetup --find",
                detail: format!("printed {dev:?}, not a device"),
            });
        }
        Ok(LoopDevice {
            path: PathBuf::from(dev),
            attached: true,
        })
    }

    /// The device node (`/dev/loopN`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Detach the device now, reporting a failure.
    pub fn detach(mut self) -> Result<(), DevError> {
        self.attached = false;
        run(
            Command::new("losetup").arg("-d").arg(&self.path),
            &self.path,
            "losetup -d",
        )
        .map(drop)
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if self.attached {
            let _ = Command::new("losetup").arg("-d").arg(&self.path).output();
        }
    }
}

fn umount2(path: &Path, flags: libc::c_int) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated path for the whole call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Unmount `mnt` (`umount2`), retrying while it is busy ([`UMOUNT_TRIES`]
/// times, [`UMOUNT_PAUSE`] apart); the `EBUSY` when it never succeeds. A
/// path that is no longer a mount point counts as unmounted.
pub fn unmount_retrying(mnt: &Path) -> Result<(), DevError> {
    let mut attempt = 1;
    loop {
        match umount2(mnt, 0) {
            Ok(()) => return Ok(()),
            // Not (or no longer) a mount point: someone unmounted it.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < UMOUNT_TRIES => {
                attempt += 1;
                std::thread::sleep(UMOUNT_PAUSE);
            }
            Err(source) => {
                return Err(DevError::Io {
                    path: mnt.to_path_buf(),
                    op: "umount",
                    source,
                })
            }
        }
    }
}

/// Detach `mnt` lazily (`MNT_DETACH`): it goes when its last user lets go.
pub fn unmount_lazy(mnt: &Path) -> Result<(), DevError> {
    umount2(mnt, libc::MNT_DETACH).map_err(|source| DevError::Io {
        path: mnt.to_path_buf(),
        op: "umount -l",
        source,
    })
}

/// An image mounted by the kernel's ext4 on a loop device of its own;
/// unmounted and detached when dropped.
#[derive(Debug)]
pub struct KernelMount {
    mnt: PathBuf,
    mounted: bool,
    // Dropped in this order, after `Drop::drop` has unmounted: the loop
    // device is detached, then the mount point of `mount_temp` removed.
    dev: LoopDevice,
    temp_dir: Option<tempfile::TempDir>,
}

impl KernelMount {
    /// Mount `image` on `mnt` with `mount -t ext4 -o OPTS` (no `-o` when
    /// `opts` is empty). With `ro` among the options the loop device is
    /// read-only too, so nothing (not even a journal replay) can write
    /// the image.
    pub fn mount(image: &Path, mnt: &Path, opts: &str) -> Result<KernelMount, DevError> {
        let read_only = opts.split(',').any(|o| o == "ro");
        let dev = LoopDevice::attach(image, read_only)?;
        let mut cmd = Command::new("mount");
        cmd.args(["-t", "ext4"]);
        if !opts.is_empty() {
            cmd.args(["-o", opts]);
        }
        run(cmd.arg(dev.path()).arg(mnt), image, "mount -t ext4")?;
        Ok(KernelMount {
            mnt: mnt.to_path_buf(),
            mounted: true,
            dev,
            temp_dir: None,
        })
    }

    /// [`KernelMount::mount`] on a new temporary directory
    /// (`ordo-mnt-*` under the temporary directory), removed after the
    /// unmount.
    pub fn mount_temp(image: &Path, opts: &str) -> Result<KernelMount, DevError> {
        let dir = tempfile::Builder::new()
            .prefix("ordo-mnt-")
            .tempdir()
            .map_err(|source| DevError::Io {
                path: std::env::temp_dir(),
                op: "creating a mount point",
                source,
            })?;
        let mut m = KernelMount::mount(image, dir.path(), opts)?;
        m.temp_dir = Some(dir);
        Ok(m)
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mnt
    }

    /// The loop device it is mounted from.
    pub fn device(&self) -> &Path {
        self.dev.path()
    }

    /// Unmount ([`unmount_retrying`]) and detach the loop device,
    /// reporting a failure (the mount is then detached lazily).
    pub fn unmount(mut self) -> Result<(), DevError> {
        self.mounted = false;
        if let Err(e) = unmount_retrying(&self.mnt) {
            let _ = unmount_lazy(&self.mnt);
            return Err(e);
        }
        Ok(())
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if self.mounted && unmount_retrying(&self.mnt).is_err() {
            // After a lazy unmount the device is still busy: dropping it
            // detaches it when the last user lets go.
            let _ = unmount_lazy(&self.mnt);
        }
    }
}
