//! Stopping an exploration between crash states.
//!
//! Checking a state may hold a loop device, a kernel mount and temporary
//! images (the kernel judge, `e2fsck` on a copy); a process killed in the
//! middle leaves them behind. `ordo crash` turns SIGINT and SIGTERM into
//! [`request`]: every worker finishes the state it is checking, releases
//! what it holds as usual, and checks no more; the exploration then ends
//! with [`crate::CrashError::Interrupted`] and reports nothing half-done
//! (a soak keeps the seeds it finished, so the same command resumes it).

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Ask every exploration of this process to stop between states. Returns
/// true if a stop had already been asked for.
pub fn request() -> bool {
    REQUESTED.swap(true, Ordering::SeqCst)
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
