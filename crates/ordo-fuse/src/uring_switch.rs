//! The kernel's switch for FUSE over io_uring
//! (`/sys/module/fuse/parameters/enable_uring`), for the tests and the
//! benchmarks that turn it on for a while ([`RingSwitch`]). The switch is
//! the kernel's, for every FUSE mount, but only a server that asks for the
//! ring in INIT (`-o io_uring`) is served through it.

use std::io;
use std::path::Path;

/// The fuse module's switch.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether this kernel can serve FUSE over io_uring at all: the fuse module
/// has the switch, and io_uring itself is not disabled
/// (`/proc/sys/kernel/io_uring_disabled`).
pub fn kernel_has_ring() -> bool {
    let io_uring_on = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map_or(true, |s| s.trim() == "0");
    Path::new(ENABLE_URING).exists() && io_uring_on
}

/// The switch set to a value while this lives, then back to what it was.
#[derive(Debug)]
pub struct RingSwitch {
    was: String,
}

impl RingSwitch {
    /// Set the switch (it needs root); fails when the kernel has no such
    /// switch or it cannot be written.
    pub fn set(on: bool) -> io::Result<RingSwitch> {
        let was = std::fs::read_to_string(ENABLE_URING)?.trim().to_string();
        std::fs::write(ENABLE_URING, if on { "Y" } else { "N" })?;
        Ok(RingSwitch { was })
    }
}

impl Drop for RingSwitch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(ENABLE_URING, &self.was) {
            eprintln!("cannot set {ENABLE_URING} back to {}: {e}", self.was);
        }
    }
}
