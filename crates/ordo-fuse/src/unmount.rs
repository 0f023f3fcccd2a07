//! Unmounting when the server is told to stop (SIGTERM, SIGINT).
//!
//! `umount(2)` refuses a mount that something still uses (EBUSY): a shell
//! whose working directory is in it, a program holding a file open, or,
//! for a moment, a program that has just let go of one. A server that
//! gave up there would go on serving and ignore the signal for good.
//! [`SignalUnmounter`] tries again for [`BUSY_RETRY`], then detaches the
//! mount as `umount -l` does (`MNT_DETACH`): it leaves the namespace at
//! once, and the session ends when the last file open on it is closed, so
//! nothing written through those files is lost. (libfuse's servers detach
//! at once; an unprivileged unmount through `fusermount3` is always a
//! detach.)

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fuser::{Filesystem, Session, SessionUnmounter};
use ordo_dev::{loopdev, DevError};

/// How long a busy mount is retried before it is detached: the retries
/// of [`loopdev::unmount_retrying`], the first try being fuser's.
pub const BUSY_RETRY: Duration = loopdev::UMOUNT_PAUSE.saturating_mul(loopdev::UMOUNT_TRIES);

/// What [`SignalUnmounter::unmount`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// The mount is gone (or was already: unmounted from outside).
    Now,
    /// It stayed busy past [`BUSY_RETRY`] and was detached: the session
    /// ends when the last file open on it is closed.
    Detached,
}

/// Unmounts a session's mount from a signal handler, retrying a busy one
/// and detaching it if it stays busy (see the module's documentation).
pub struct SignalUnmounter {
    unmounter: SessionUnmounter,
    mountpoint: PathBuf,
    /// The mount's device (`MAJOR:MINOR` in `/proc/self/mountinfo`), read
    /// when the handler was made: only that mount is ever unmounted, never
    /// one mounted on the same path since.
    device: Option<String>,
    /// A detach was already made.
    detached: bool,
}

impl SignalUnmounter {
    /// The unmounter of `session`, mounted on `mountpoint`.
    pub fn new<FS: Filesystem>(session: &mut Session<FS>, mountpoint: &Path) -> Self {
        SignalUnmounter {
            unmounter: session.unmount_callable(),
            // The path as the kernel has it, whatever the working directory.
            mountpoint: std::fs::canonicalize(mountpoint)
                .unwrap_or_else(|_| mountpoint.to_path_buf()),
            device: crate::mounted_device(mountpoint).ok(),
            detached: false,
        }
    }

    /// Unmount: fuser's own unmount first (which detaches through
    /// `fusermount3` when unprivileged); while the kernel answers EBUSY,
    /// again for [`BUSY_RETRY`] ([`ordo_dev::loopdev::unmount_retrying`]);
    /// then detach.
    pub fn unmount(&mut self) -> io::Result<Unmounted> {
        if self.detached {
            return Ok(Unmounted::Detached);
        }
        match self.unmounter.unmount() {
            Ok(()) => return Ok(Unmounted::Now),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
        if !self.still_mounted() {
            return Ok(Unmounted::Now);
        }
        match loopdev::unmount_retrying(&self.mountpoint) {
            Ok(()) => return Ok(Unmounted::Now),
            Err(DevError::Io { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(io::Error::other(e)),
        }
        if !self.still_mounted() {
            return Ok(Unmounted::Now);
        }
        loopdev::unmount_lazy(&self.mountpoint).map_err(io::Error::other)?;
        self.detached = true;
        Ok(Unmounted::Detached)
    }

    /// [`SignalUnmounter::unmount`], with what happened on stderr as
    /// `program: ...`: the message for a handler to print.
    pub fn unmount_and_report(&mut self, program: &str) {
        let was_detached = self.detached;
        let done = self.unmount();
        let mp = self.mountpoint.display();
        match done {
            Ok(Unmounted::Now) => {}
            Ok(Unmounted::Detached) if was_detached => eprintln!(
                "{program}: {mp} is already detached; still waiting for the last file open on it to be closed"
            ),
            Ok(Unmounted::Detached) => eprintln!(
                "{program}: {mp} stayed busy for {:.0} s: detached it (as umount -l does); \
the session ends when the last file open on it is closed",
                BUSY_RETRY.as_secs_f64()
            ),
            Err(e) => eprintln!("{program}: unmounting {mp}: {e}"),
        }
    }

    /// Whether the last mount on the mount point is still this session's
    /// (by its device; without one known, whether anything is mounted
    /// there).
    fn still_mounted(&self) -> bool {
        match crate::mounted_device(&self.mountpoint) {
            Ok(dev) => self.device.as_ref().is_none_or(|d| *d == dev),
            Err(_) => false,
        }
    }
}
