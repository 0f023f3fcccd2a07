//! The threads that serve FSYNC and FSYNCDIR, apart from the request
//! workers.
//!
//! An fsync waits for the device: a log write and a flush, a few hundred
//! microseconds on a fast disk and tens of milliseconds on a slow one. Served
//! by a request worker, it holds that worker for the whole wait, so a mount
//! needed as many workers as it wanted fsyncs waiting at once (JBD2's group
//! commit shares one commit among every fsync waiting when it starts), and
//! those workers cost every other request their wake-ups. A worker now hands
//! the fsync to this pool and goes back to reading requests; the pool's
//! thread calls the core and sends the reply (FUSE replies may come in any
//! order, each names its request).
//!
//! Threads are started as fsyncs arrive and no thread is idle, up to a
//! bound (`-o fsync_threads=N`); past it, fsyncs queue and are served in
//! order. Started threads stay for the life of the mount, waiting. At the
//! end of the session, [`SyncPool::drain`] waits until every fsync handed
//! over has replied, so none runs after the core is released.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One fsync to serve: it calls the core and replies.
pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Threads started (none ever ends before [`SyncPool::drain`]).
    threads: usize,
    /// Threads waiting for a job.
    idle: usize,
    /// Jobs taken and not yet finished.
    running: usize,
    /// The session ended: threads leave once the queue is empty.
    closed: bool,
}

struct Inner {
    state: Mutex<State>,
    /// A job was queued, or the pool closed.
    work: Condvar,
    /// The last running job finished with none queued.
    quiet: Condvar,
    max_threads: usize,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A pool of at most `max_threads` threads serving handed-over fsyncs.
pub(crate) struct SyncPool {
    inner: Arc<Inner>,
}

impl SyncPool {
    /// A pool that starts no thread until the first job.
    pub(crate) fn new(max_threads: usize) -> Self {
        assert!(max_threads >= 1, "a pool needs a thread");
        SyncPool {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                quiet: Condvar::new(),
                max_threads,
            }),
        }
    }

    /// Serve `job` on a pool thread; after [`SyncPool::drain`], or when no
    /// thread can be started, on the caller's thread.
    pub(crate) fn submit(&self, job: Job) {
        let mut st = self.inner.lock();
        if st.closed {
            drop(st);
            job();
            return;
        }
        st.jobs.push_back(job);
        if st.idle > 0 {
            drop(st);
            self.inner.work.notify_one();
            return;
        }
        if st.threads >= self.inner.max_threads {
            // Every thread is busy: the job waits its turn.
            return;
        }
        st.threads += 1;
        let n = st.threads;
        drop(st);
        let inner = self.inner.clone();
        let started = std::thread::Builder::new()
            .name(format!("ordo-fsync-{n}"))
            .spawn(move || serve(&inner));
        if started.is_err() {
            // No thread (the process is at its limit). A started thread
            // serves the queue, this job included, when it is free; with
            // none, nothing would: serve the queue here, as before the
            // pool.
            let mut st = self.inner.lock();
            st.threads -= 1;
            while st.threads == 0 {
                let Some(job) = st.jobs.pop_front() else {
                    break;
                };
                st.running += 1;
                drop(st);
                job();
                st = self.inner.lock();
                st.running -= 1;
            }
            if st.running == 0 && st.jobs.is_empty() {
                self.inner.quiet.notify_all();
            }
        }
    }

    /// Wait until every job handed over has finished, then let the threads
    /// go; later jobs run on their caller's thread.
    pub(crate) fn drain(&self) {
        let mut st = self.inner.lock();
        st.closed = true;
        self.inner.work.notify_all();
        while !st.jobs.is_empty() || st.running > 0 {
            st = self.inner.quiet.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Threads started so far (for tests).
    #[cfg(test)]
    fn threads(&self) -> usize {
        self.inner.lock().threads
    }
}

/// A pool thread: take jobs until the pool closes with none left.
fn serve(inner: &Inner) {
    let mut st = inner.lock();
    loop {
        if let Some(job) = st.jobs.pop_front() {
            st.running += 1;
            drop(st);
            job();
            st = inner.lock();
            st.running -= 1;
            if st.running == 0 && st.jobs.is_empty() {
                inner.quiet.notify_all();
            }
            continue;
        }
        if st.closed {
            return;
        }
        st.idle += 1;
        st = inner.work.wait(st).unwrap_or_else(|e| e.into_inner());
        st.idle -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    #[test]
    fn jobs_that_wait_together_each_get_a_thread() {
        // Four jobs that can only finish once all four run at once: a
        // pool that served them one at a time would never return.
        let pool = SyncPool::new(8);
        let barrier = Arc::new(Barrier::new(4));
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..4 {
            let (b, d) = (barrier.clone(), done.clone());
            pool.submit(Box::new(move || {
                b.wait();
                d.fetch_add(1, Ordering::SeqCst);
            }));
        }
        pool.drain();
        assert_eq!(done.load(Ordering::SeqCst), 4);
        assert_eq!(pool.threads(), 4);
    }

    #[test]
    fn past_the_bound_jobs_queue_and_all_run() {
        let pool = SyncPool::new(2);
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..50 {
            let d = done.clone();
            pool.submit(Box::new(move || {
                std::thread::yield_now();
                d.fetch_add(1, Ordering::SeqCst);
            }));
        }
        pool.drain();
        assert_eq!(done.load(Ordering::SeqCst), 50);
        assert!(pool.threads() <= 2, "{} threads", pool.threads());
    }

    #[test]
    fn after_drain_a_job_runs_on_its_caller() {
        let pool = SyncPool::new(4);
        pool.drain();
        let here = std::thread::current().id();
        let ran_on = Arc::new(Mutex::new(None));
        let r = ran_on.clone();
        pool.submit(Box::new(move || {
            *r.lock().unwrap() = Some(std::thread::current().id());
        }));
        assert_eq!(*ran_on.lock().unwrap(), Some(here));
        assert_eq!(pool.threads(), 0);
    }
}
