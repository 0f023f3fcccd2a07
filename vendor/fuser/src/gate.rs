//! Readers on demand (`Config::readers_on_demand`).
//!
//! With several worker threads each reading `/dev/fuse`, consecutive
//! requests of one caller land on different threads in turn: each request
//! then wakes a thread of its own, and on a small machine the file
//! system's state moves between CPUs with every request. With readers on
//! demand one worker reads and serves while it runs; another worker reads
//! only while every worker that reads is *blocked*: inside a section the
//! file system marked with [`blocking_begin`] / [`blocking_end`] (a wait on
//! a device, or on another thread). When the blocked worker comes back and
//! finds another worker reading, it stands by again. So the common path
//! costs one uncontended lock per request, and a worker that waits on I/O
//! never leaves the queue unread.
//!
//! A section that waits for *another request* to be served (a reply that
//! depends on a later FORGET, say) must be marked, or nothing reads that
//! request while it waits.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct State {
    /// Workers admitted to read and serve (blocked ones included).
    active: usize,
    /// Admitted workers inside a blocking section.
    blocked: usize,
    /// A worker left its loop (the session ends): every worker reads, so
    /// that each sees the end for itself.
    closed: bool,
}

impl State {
    fn running(&self) -> usize {
        debug_assert!(self.blocked <= self.active, "{self:?}");
        self.active - self.blocked
    }
}

/// The gate the worker threads of one session share (the session makes
/// one; public so that a file system can test its own use of it).
#[derive(Debug, Default)]
pub struct ReaderGate {
    state: Mutex<State>,
    wake: Condvar,
}

thread_local! {
    /// The gate of the worker this thread is, and whether it is admitted.
    static WORKER: RefCell<Option<(Arc<ReaderGate>, bool)>> = const { RefCell::new(None) };
    /// Depth of nested blocking sections on this thread.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

impl ReaderGate {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make the calling thread a worker of this gate (once, when its loop
    /// starts).
    pub fn join(self: &Arc<Self>) {
        WORKER.with(|w| *w.borrow_mut() = Some((self.clone(), false)));
    }

    /// Before a worker reads its next request: a worker already admitted
    /// keeps reading unless another unblocked worker reads too; otherwise
    /// it waits until no admitted worker runs, and is admitted.
    pub fn before_read(&self) {
        WORKER.with(|w| {
            let mut w = w.borrow_mut();
            let Some((_, admitted)) = w.as_mut() else {
                return;
            };
            let mut s = self.lock();
            if s.closed {
                return;
            }
            if *admitted {
                if s.running() <= 1 {
                    return;
                }
                s.active -= 1;
                *admitted = false;
            }
            while s.running() > 0 && !s.closed {
                s = self.wake.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.active += 1;
            *admitted = true;
        });
    }

    /// A worker left its loop: the session is ending, so every worker
    /// standing by goes to read (and sees the end).
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        self.wake.notify_all();
    }

    /// The calling worker stops serving for good (its share of the
    /// session is done) without ending the session.
    pub fn leave(&self) {
        WORKER.with(|w| {
            if let Some((_, admitted)) = w.borrow_mut().as_mut() {
                if std::mem::take(admitted) {
                    let mut s = self.lock();
                    s.active -= 1;
                    self.wake.notify_one();
                }
            }
        });
    }

    /// Workers admitted and not blocked.
    pub fn running(&self) -> usize {
        self.lock().running()
    }

    /// Workers admitted (blocked ones included).
    pub fn admitted(&self) -> usize {
        self.lock().active
    }

    fn begin(&self) {
        let mut s = self.lock();
        s.blocked += 1;
        if s.running() == 0 {
            self.wake.notify_one();
        }
    }

    fn end(&self) {
        let mut s = self.lock();
        debug_assert!(s.blocked > 0, "{s:?}");
        s.blocked -= 1;
    }
}

/// The gate of the calling thread, if it is an admitted worker of a
/// session with readers on demand.
fn admitted_gate() -> Option<Arc<ReaderGate>> {
    WORKER.with(|w| match &*w.borrow() {
        Some((g, true)) => Some(g.clone()),
        _ => None,
    })
}

/// The calling thread is about to wait (on a device, or on another
/// thread): if it is a worker of a session with readers on demand,
/// another worker reads requests meanwhile. Sections nest; each
/// `blocking_begin` needs its `blocking_end`. Does nothing on any other
/// thread.
pub fn blocking_begin() {
    let depth = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get()
    });
    if depth == 1 {
        if let Some(g) = admitted_gate() {
            g.begin();
        }
    }
}

/// The end of the section [`blocking_begin`] opened.
pub fn blocking_end() {
    let depth = DEPTH.with(|d| {
        let v = d.get();
        debug_assert!(v > 0, "blocking_end without blocking_begin");
        d.set(v.saturating_sub(1));
        v
    });
    if depth == 1 {
        if let Some(g) = admitted_gate() {
            g.end();
        }
    }
}
