//! Shared bookkeeping of every backend: I/O counters and durability tickets.
//!
//! Counters are lock-free atomics so that counting never serializes I/O. The
//! ticket tracker is the one place that decides what `durable()` means, so
//! that every backend answers the same way:
//!
//! * every write takes the next ticket when it starts;
//! * a flush covers every write that had *completed* when the flush started
//!   (a write still in flight on another thread is not covered);
//! * a FUA write is durable by itself once it completes;
//! * `durable()` is the highest ticket `t` such that every write with a
//!   ticket `<= t` is durable. A FUA write therefore moves it only when every
//!   earlier write is already durable (as after a preceding flush), which is
//!   the contract of [`BlockDevice::durable`](crate::BlockDevice::durable).
//!
//! Failed writes are treated as settled (they no longer hold the watermark
//! back): the caller saw the error and no ticket was handed out.

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::{BlockClass, ClassCounters, Counters, Ticket, WriteFlags, BLOCK_CLASS_COUNT};

#[derive(Default)]
struct ClassAtomics {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    fua_writes: AtomicU64,
}

/// Lock-free counters of one device, by [`BlockClass`].
#[derive(Default)]
pub struct AtomicCounters {
    by_class: [ClassAtomics; BLOCK_CLASS_COUNT],
    flushes: AtomicU64,
}

impl AtomicCounters {
    /// All counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one read request of `bytes` bytes.
    pub fn record_read(&self, class: BlockClass, bytes: u64) {
        let c = &self.by_class[class as usize];
        c.reads.fetch_add(1, Ordering::Relaxed);
        c.read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts one write request of `bytes` bytes (however many blocks).
    pub fn record_write(&self, class: BlockClass, bytes: u64, fua: bool) {
        let c = &self.by_class[class as usize];
        c.writes.fetch_add(1, Ordering::Relaxed);
        c.write_bytes.fetch_add(bytes, Ordering::Relaxed);
        if fua {
            c.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one flush.
    pub fn record_flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot (each counter read atomically; the set is not a single
    /// atomic snapshot while I/O is running).
    pub fn snapshot(&self) -> Counters {
        let mut out = Counters::default();
        for (o, c) in out.by_class.iter_mut().zip(&self.by_class) {
            *o = ClassCounters {
                reads: c.reads.load(Ordering::Relaxed),
                read_bytes: c.read_bytes.load(Ordering::Relaxed),
                writes: c.writes.load(Ordering::Relaxed),
                write_bytes: c.write_bytes.load(Ordering::Relaxed),
                fua_writes: c.fua_writes.load(Ordering::Relaxed),
            };
        }
        out.flushes = self.flushes.load(Ordering::Relaxed);
        out
    }
}

struct TrackerState {
    /// Last ticket handed out (0 = none yet).
    last_issued: Ticket,
    /// Tickets whose write has started but not completed.
    in_flight: BTreeSet<Ticket>,
    /// Completed FUA writes above the watermark.
    fua_done: BTreeSet<Ticket>,
    /// Every ticket `<= durable` is durable.
    durable: Ticket,
}

/// Hands out write tickets and computes the durable watermark.
pub struct TicketTracker {
    state: Mutex<TrackerState>,
    /// Mirror of `state.durable`, readable without the lock.
    durable: AtomicU64,
}

impl Default for TicketTracker {
    fn default() -> Self {
        Self::new()
    }
}

/// What a flush will cover; obtained before the flush, applied after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushCover(Ticket);

impl TicketTracker {
    /// No writes yet; `durable()` is 0.
    pub fn new() -> Self {
        TicketTracker {
            state: Mutex::new(TrackerState {
                last_issued: 0,
                in_flight: BTreeSet::new(),
                fua_done: BTreeSet::new(),
                durable: 0,
            }),
            durable: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TrackerState> {
        // A panic while holding this lock leaves the state consistent (every
        // critical section is a few set operations), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a write: returns its ticket.
    pub fn begin_write(&self) -> Ticket {
        let mut s = self.lock();
        s.last_issued += 1;
        let t = s.last_issued;
        s.in_flight.insert(t);
        t
    }

    /// Ends a write. `durable_now` is true for a FUA write that succeeded.
    pub fn end_write(&self, ticket: Ticket, durable_now: bool) {
        let mut s = self.lock();
        let was_in_flight = s.in_flight.remove(&ticket);
        debug_assert!(was_in_flight, "ticket {ticket} ended twice");
        if durable_now && ticket > s.durable {
            s.fua_done.insert(ticket);
            let d = s.durable;
            self.advance(&mut s, d);
        }
    }

    /// Called before a flush starts: what the flush will cover (every write
    /// completed so far, up to the first still in flight).
    pub fn flush_cover(&self) -> FlushCover {
        let s = self.lock();
        let upto = match s.in_flight.first() {
            Some(&first) => first - 1,
            None => s.last_issued,
        };
        FlushCover(upto)
    }

    /// Called after a flush succeeded.
    pub fn flush_done(&self, cover: FlushCover) {
        let mut s = self.lock();
        self.advance(&mut s, cover.0);
    }

    fn advance(&self, s: &mut TrackerState, to: Ticket) {
        let mut d = s.durable.max(to);
        // Drop FUA tickets now covered, then extend over contiguous ones.
        while let Some(&first) = s.fua_done.first() {
            if first <= d {
                s.fua_done.pop_first();
            } else if first == d + 1 {
                s.fua_done.pop_first();
                d = first;
            } else {
                break;
            }
        }
        debug_assert!(d >= s.durable);
        s.durable = d;
        self.durable.store(d, Ordering::Release);
    }

    /// Every write with a ticket `<=` this is durable.
    pub fn durable(&self) -> Ticket {
        self.durable.load(Ordering::Acquire)
    }

    /// The last ticket handed out (0 if none).
    pub fn last_issued(&self) -> Ticket {
        self.lock().last_issued
    }
}

/// The counters and tickets of one backend, with the order in which every
/// backend applies them: a write takes its ticket before it starts, is
/// counted once it succeeded, and is durable by itself only as a FUA write
/// that succeeded; a flush covers what had completed when it started.
#[derive(Default)]
pub struct Bookkeeping {
    counters: AtomicCounters,
    tickets: TicketTracker,
}

impl Bookkeeping {
    /// Nothing counted, nothing written.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts a read of `bytes` bytes that succeeded.
    pub fn record_read(&self, class: BlockClass, bytes: u64) {
        self.counters.record_read(class, bytes);
    }

    /// Runs `write` (given its ticket) as one write request of `bytes`
    /// bytes, and returns the ticket once it succeeded.
    pub fn write(
        &self,
        flags: WriteFlags,
        bytes: u64,
        write: impl FnOnce(Ticket) -> io::Result<()>,
    ) -> io::Result<Ticket> {
        let ticket = self.tickets.begin_write();
        let r = write(ticket);
        self.tickets.end_write(ticket, flags.fua && r.is_ok());
        r?;
        self.counters.record_write(flags.class, bytes, flags.fua);
        Ok(ticket)
    }

    /// Runs `flush` as one flush request: once it succeeded, every write
    /// completed before it started is durable.
    pub fn flush(&self, flush: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let cover = self.tickets.flush_cover();
        flush()?;
        self.counters.record_flush();
        self.tickets.flush_done(cover);
        Ok(())
    }

    /// See [`BlockDevice::durable`](crate::BlockDevice::durable).
    pub fn durable(&self) -> Ticket {
        self.tickets.durable()
    }

    /// The last ticket handed out (0 if none).
    pub fn last_issued(&self) -> Ticket {
        self.tickets.last_issued()
    }

    /// Every write with a ticket `<= upto` reached the medium without a
    /// flush (a write cache destaged it): the durable horizon moves there.
    pub fn destaged(&self, upto: Ticket) {
        self.tickets.flush_done(FlushCover(upto));
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        self.counters.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_covers_completed_writes_only() {
        let t = TicketTracker::new();
        let a = t.begin_write();
        t.end_write(a, false);
        let b = t.begin_write(); // still in flight when the flush starts
        let c = t.begin_write();
        t.end_write(c, false);
        let cover = t.flush_cover();
        t.flush_done(cover);
        assert_eq!(t.durable(), a);
        t.end_write(b, false);
        assert_eq!(t.durable(), a, "completion alone is not durability");
        let cover = t.flush_cover();
        t.flush_done(cover);
        assert_eq!(t.durable(), c);
    }

    #[test]
    fn fua_moves_watermark_only_when_contiguous() {
        let t = TicketTracker::new();
        let a = t.begin_write();
        t.end_write(a, false);
        let b = t.begin_write();
        t.end_write(b, true);
        assert_eq!(
            t.durable(),
            0,
            "a is not durable, so neither is the watermark"
        );
        let cover = t.flush_cover();
        t.flush_done(cover);
        assert_eq!(t.durable(), b);
        let c = t.begin_write();
        t.end_write(c, true);
        assert_eq!(t.durable(), c, "FUA right after a flush is durable at once");
        let d = t.begin_write();
        let e = t.begin_write();
        t.end_write(e, true);
        assert_eq!(t.durable(), c);
        t.end_write(d, true);
        assert_eq!(t.durable(), e);
    }

    #[test]
    fn counters_count_by_class() {
        let c = AtomicCounters::new();
        c.record_write(BlockClass::Journal, 8192, true);
        c.record_write(BlockClass::Data, 4096, false);
        c.record_read(BlockClass::Data, 4096);
        c.record_flush();
        let s = c.snapshot();
        assert_eq!(s.class(BlockClass::Journal).writes, 1);
        assert_eq!(s.class(BlockClass::Journal).write_bytes, 8192);
        assert_eq!(s.class(BlockClass::Journal).fua_writes, 1);
        assert_eq!(s.class(BlockClass::Data).fua_writes, 0);
        assert_eq!(s.total().writes, 2);
        assert_eq!(s.total().reads, 1);
        assert_eq!(s.flushes, 1);
    }
}
