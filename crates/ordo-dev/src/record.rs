//! A recorder: forwards every request and logs every write and flush, in
//! the order the device saw them (the role of Linux's dm-log-writes).
//!
//! The crash explorer rebuilds crash states from this log: a state is the
//! base image plus every write durable at the crash point plus a subset of
//! the others. So the log must be exactly the device's order: the recorder
//! holds its log lock across the forwarded call, so that a write and a flush
//! issued concurrently are logged in the order the inner device ran them.
//! That serializes writes and flushes (reads are not); the recorder is a
//! test instrument, not a production path.
//!
//! Besides I/O, the log holds *marks*: labels the workload inserts at the
//! moment it learns something ("fsync returned for ino 12"), so that a crash
//! state knows which promises were made before it.
//!
//! Recording usually starts from a known image: [`RecordingDevice::from_base`]
//! records on a copy of a [`MemDevice`] and keeps the base so the explorer
//! can replay the log onto it.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::mem::MemDevice;
use crate::{BlockClass, BlockDevice, Counters, Ticket, WriteFlags};

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// An acknowledged write of `data.len() / block_size` blocks from `block`.
    Write {
        /// First block.
        block: u64,
        /// The bytes written (a whole number of blocks).
        data: Arc<[u8]>,
        /// Written with FUA (durable when acknowledged).
        fua: bool,
        /// What the caller said the blocks are.
        class: BlockClass,
        /// The ticket the inner device returned.
        ticket: Ticket,
    },
    /// A completed flush: every write logged before it is durable.
    Flush,
    /// A label inserted by the caller (a promise, a phase of a workload).
    Mark(String),
}

/// One entry of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Position in the whole recording, from 0, never reused (also across
    /// [`RecordingDevice::take_log`]).
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
}

impl Event {
    /// For a write, the image of its `i`-th block (`block + i`).
    pub fn block_image(&self, i: usize, block_size: u32) -> Option<&[u8]> {
        match &self.kind {
            EventKind::Write { data, .. } => {
                let bs = block_size as usize;
                data.get(i * bs..(i + 1) * bs)
            }
            _ => None,
        }
    }

    /// For a write, the blocks it covers with their images.
    pub fn blocks(&self, block_size: u32) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        let (start, data): (u64, &[u8]) = match &self.kind {
            EventKind::Write { block, data, .. } => (*block, data),
            _ => (0, &[]),
        };
        data.chunks_exact(block_size as usize)
            .enumerate()
            .map(move |(i, d)| (start + i as u64, d))
    }
}

struct Log {
    next_seq: u64,
    events: Vec<Event>,
}

/// A device wrapper that logs every write, flush and mark.
pub struct RecordingDevice<D: BlockDevice> {
    inner: D,
    base: Option<Arc<MemDevice>>,
    log: Mutex<Log>,
}

impl<D: BlockDevice> RecordingDevice<D> {
    /// Records everything done to `inner` from now on.
    pub fn new(inner: D) -> Self {
        RecordingDevice {
            inner,
            base: None,
            log: Mutex::new(Log {
                next_seq: 0,
                events: Vec::new(),
            }),
        }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Unwraps the device (the log is dropped).
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// The image recording started from, if it was started with
    /// [`RecordingDevice::from_base`].
    pub fn base(&self) -> Option<&Arc<MemDevice>> {
        self.base.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        // Each critical section appends whole events; a panic in the inner
        // device leaves the log consistent, so poisoning is ignored.
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(log: &mut Log, kind: EventKind) -> u64 {
        let seq = log.next_seq;
        log.next_seq += 1;
        log.events.push(Event { seq, kind });
        seq
    }

    /// Inserts a marker event and returns its sequence number.
    pub fn mark(&self, label: impl Into<String>) -> u64 {
        let mut log = self.lock();
        Self::push(&mut log, EventKind::Mark(label.into()))
    }

    /// A copy of the log so far (block images are shared, not copied).
    pub fn log(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// Takes the log so far, leaving it empty; sequence numbers continue.
    pub fn take_log(&self) -> Vec<Event> {
        std::mem::take(&mut self.lock().events)
    }

    /// Number of events logged and not yet taken.
    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    /// True if no event is waiting in the log.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RecordingDevice<MemDevice> {
    /// Records on a copy of `base` (block images shared, so this is cheap);
    /// `base` itself is never written and stays available through
    /// [`RecordingDevice::base`].
    pub fn from_base(base: Arc<MemDevice>) -> Self {
        let mut r = RecordingDevice::new(base.snapshot());
        r.base = Some(base);
        r
    }
}

impl<D: BlockDevice> BlockDevice for RecordingDevice<D> {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }

    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()> {
        self.inner.read(block, buf, class)
    }

    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket> {
        let mut log = self.lock();
        let ticket = self.inner.write(block, data, flags)?;
        Self::push(
            &mut log,
            EventKind::Write {
                block,
                data: Arc::from(data),
                fua: flags.fua,
                class: flags.class,
                ticket,
            },
        );
        Ok(ticket)
    }

    fn flush(&self) -> io::Result<()> {
        let mut log = self.lock();
        self.inner.flush()?;
        Self::push(&mut log, EventKind::Flush);
        Ok(())
    }

    fn durable(&self) -> Ticket {
        self.inner.durable()
    }

    fn counters(&self) -> Counters {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_writes_flushes_and_marks_in_order() {
        let base = Arc::new(MemDevice::new(1024, 32).unwrap());
        base.put_block(0, Arc::from(vec![0xaa; 1024]));
        let rec = RecordingDevice::from_base(base.clone());
        let t1 = rec
            .write(4, &[1u8; 2048], WriteFlags::new(BlockClass::Directory))
            .unwrap();
        rec.flush().unwrap();
        let m = rec.mark("fsync returned for ino 12");
        let t2 = rec
            .write(0, &[2u8; 1024], WriteFlags::fua(BlockClass::Super))
            .unwrap();
        // A failed write is not logged.
        assert!(rec
            .write(40, &[0u8; 1024], WriteFlags::new(BlockClass::Data))
            .is_err());
        let log = rec.log();
        assert_eq!(log.len(), 4);
        assert_eq!(m, 2);
        for (i, e) in log.iter().enumerate() {
            assert_eq!(e.seq, i as u64);
        }
        match &log[0].kind {
            EventKind::Write {
                block,
                data,
                fua,
                class,
                ticket,
            } => {
                assert_eq!(
                    (*block, data.len(), *fua, *class, *ticket),
                    (4, 2048, false, BlockClass::Directory, t1)
                );
            }
            k => panic!("unexpected {k:?}"),
        }
        assert_eq!(log[1].kind, EventKind::Flush);
        assert_eq!(
            log[2].kind,
            EventKind::Mark("fsync returned for ino 12".into())
        );
        assert!(matches!(log[3].kind, EventKind::Write { fua: true, ticket, .. } if ticket == t2));
        let blocks: Vec<u64> = log[0].blocks(1024).map(|(b, _)| b).collect();
        assert_eq!(blocks, vec![4, 5]);
        assert_eq!(log[0].block_image(1, 1024).unwrap(), &[1u8; 1024][..]);

        // The base is untouched; the recorded device holds the writes.
        assert_eq!(base.block(0).unwrap()[0], 0xaa);
        assert!(base.block(4).is_none());
        assert_eq!(rec.inner().block(0).unwrap()[0], 2);
        assert!(Arc::ptr_eq(rec.base().unwrap(), &base));

        let taken = rec.take_log();
        assert_eq!(taken.len(), 4);
        assert!(rec.is_empty());
        rec.flush().unwrap();
        assert_eq!(rec.log()[0].seq, 4, "sequence numbers continue");
        assert_eq!(rec.durable(), rec.inner().durable());
        assert_eq!(rec.counters().flushes, 2);
    }
}
