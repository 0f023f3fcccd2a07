//! Detaching `ordo mount` from its terminal once the mount is live, as
//! mount helpers do: `mount -t fuse.ordo` and an fstab line return when the
//! file system is usable, with mount(8)'s exit code if it is not.
//!
//! [`Detached::fork`] forks before any thread exists. The parent waits on
//! a pipe for one byte, the child's verdict, and exits with it: 0 once the
//! mount is live ([`Detached::live`]), the failure's exit code otherwise
//! ([`Detached::finish`]), 32 if the child dies without a word. Until then
//! the child shares the parent's terminal, so its messages are seen; once
//! live it starts a session of its own and points stdin, stdout and stderr
//! at `/dev/null`.

use std::os::fd::RawFd;

use crate::cmd_mount::EXIT_MOUNT_FAILED;

/// The child's end of the pipe to its waiting parent.
pub struct Detached {
    fd: Option<RawFd>,
}

impl Detached {
    /// Fork. Returns in the child only; the parent exits with the child's
    /// verdict. Must be called while the process has a single thread.
    pub fn fork() -> Result<Detached, String> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two descriptors for pipe(2).
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(format!(
                "cannot detach: pipe: {}",
                std::io::Error::last_os_error()
            ));
        }
        let (rd, wr) = (fds[0], fds[1]);
        // SAFETY: the caller guarantees no other thread runs, so the child
        // may continue to run Rust code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: closing the two descriptors pipe(2) returned.
            unsafe {
                libc::close(rd);
                libc::close(wr);
            }
            return Err(format!("cannot detach: fork: {e}"));
        }
        if pid > 0 {
            // SAFETY: closing our copy of the write end.
            unsafe { libc::close(wr) };
            let mut b = [0u8; 1];
            let n = loop {
                // SAFETY: reading one byte into a valid buffer.
                let n = unsafe { libc::read(rd, b.as_mut_ptr().cast(), 1) };
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                break n;
            };
            if n == 1 {
                std::process::exit(i32::from(b[0]));
            }
            eprintln!("ordo mount: the mount process ended before the mount was live");
            std::process::exit(i32::from(EXIT_MOUNT_FAILED));
        }
        // SAFETY: closing the child's copy of the read end.
        unsafe { libc::close(rd) };
        Ok(Detached { fd: Some(wr) })
    }

    fn send(&mut self, code: u8) {
        if let Some(fd) = self.fd.take() {
            // SAFETY: writing one byte from a valid buffer to our pipe end,
            // then closing it.
            unsafe {
                libc::write(fd, [code].as_ptr().cast(), 1);
                libc::close(fd);
            }
        }
    }

    /// The mount is live: release the parent with 0, leave the terminal.
    pub fn live(&mut self) {
        // SAFETY: setsid(2) and dup2(2) on descriptors we own; a failure
        // leaves the old ones in place, which is harmless.
        unsafe {
            libc::setsid();
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 {
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
                if null > 2 {
                    libc::close(null);
                }
            }
        }
        self.send(0);
    }

    /// The process is done: if the parent still waits (the mount never
    /// became live), it exits with `code`.
    pub fn finish(mut self, code: u8) {
        self.send(if code == 0 { EXIT_MOUNT_FAILED } else { code });
    }
}
