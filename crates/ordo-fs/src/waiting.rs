//! Telling the server when a call is about to wait.
//!
//! A FUSE server with a few worker threads lets one of them read requests
//! while it runs (ordo-fuse's readers on demand): another worker reads only
//! while that one waits. The core says when a call waits on something other
//! than its own CPU work: on the device (a plan's writes and flushes, a
//! read's uncached blocks), or on another thread (a commit another caller
//! leads, the plans ahead of its own). Nothing else: a wait for the core's
//! lock is a wait for work the reading worker could not do in parallel
//! anyway.
//!
//! A read of a file's uncached blocks counts as a wait only from
//! [`READ_WAIT_BYTES`] on: a small file's read from the device takes tens
//! of microseconds, and handing the requests to another worker and back
//! around it cost a single reader of cold small files about a tenth of its
//! rate (docs/DESIGN.md, "Readers on demand").
//!
//! The hooks are process-wide and set once ([`set_hooks`]); without them a
//! [`Waiting`] section costs a load and a branch.

use std::sync::OnceLock;

/// The server's two calls: a wait begins, a wait ends.
struct Hooks {
    begin: fn(),
    end: fn(),
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

/// The uncached bytes from which a read's device requests are a wait.
pub const READ_WAIT_BYTES: u64 = 128 << 10;

/// Call `begin` when a thread starts waiting inside the core and `end`
/// when it stops (sections nest; each `begin` gets its `end` on the same
/// thread). Set once per process: false if hooks were set already (the
/// first stay).
pub fn set_hooks(begin: fn(), end: fn()) -> bool {
    HOOKS.set(Hooks { begin, end }).is_ok()
}

/// A section in which the calling thread waits (see the module).
pub(crate) struct Waiting {
    end: Option<fn()>,
}

impl Waiting {
    pub(crate) fn begin() -> Self {
        let end = HOOKS.get().map(|h| {
            (h.begin)();
            h.end
        });
        Waiting { end }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(end) = self.end {
            end();
        }
    }
}
