//! The write log of a recorded run, and the device that records it.
//!
//! The device layer's [`RecordingDevice`] (ordo's dm-log-writes) logs each
//! write (with its FUA flag), each flush, and each mark; the explorer marks
//! every promise the workload receives when an fsync / fdatasync / sync
//! returns, and the start of every operation. Every event is
//! tagged with the workload operation that was running when it was issued:
//! that is how the oracle knows which operations may have reached the disk at
//! a crash point (`op` of the last event issued), whatever the protocol
//! buffered before.

use std::sync::{Arc, OnceLock};

use ordo_dev::{
    BlockClass, BlockDevice, Event, EventKind as DevEventKind, MemDevice, RecordingDevice,
};

/// One logged write request (possibly several consecutive blocks).
#[derive(Clone, Debug)]
pub struct LoggedWrite {
    /// First block.
    pub block: u64,
    /// Whole blocks of data.
    pub data: Arc<[u8]>,
    /// Written with FUA (durable on completion).
    pub fua: bool,
    /// What the file system said the block is.
    pub class: BlockClass,
    /// `data` cut into one shared image per block, made the first time a
    /// state applies the write whole: every later state that holds it
    /// shares those images instead of copying the bytes again (most of
    /// the cost of building a state, before).
    per_block: OnceLock<Box<[Arc<[u8]>]>>,
}

impl LoggedWrite {
    /// A write of `data` (whole blocks) at `block`.
    pub fn new(block: u64, data: Arc<[u8]>, fua: bool, class: BlockClass) -> Self {
        LoggedWrite {
            block,
            data,
            fua,
            class,
            per_block: OnceLock::new(),
        }
    }

    /// The image of each block, shared.
    fn per_block(&self, block_size: usize) -> &[Arc<[u8]>] {
        let v = self.per_block.get_or_init(|| {
            self.data
                .chunks_exact(block_size)
                .map(Arc::from)
                .collect::<Vec<_>>()
                .into_boxed_slice()
        });
        debug_assert_eq!(v.len(), self.data.len() / block_size, "one image per block");
        v
    }
}

/// What happened.
#[derive(Clone, Debug)]
pub enum EventKind {
    /// A write was acknowledged.
    Write(LoggedWrite),
    /// A cache flush completed.
    Flush,
    /// The workload received promise number `.0` (index into the
    /// recording's promises).
    Mark(usize),
}

/// One event of the log.
#[derive(Clone, Debug)]
pub struct LogEvent {
    /// The event.
    pub kind: EventKind,
    /// Index of the workload operation running when it happened (0 = mount,
    /// before the first operation; recorded operations count from 1).
    pub op: usize,
}

/// Mark labels the explorer puts in the device's log.
const OP_MARK: &str = "ordo-crash op ";
const PROMISE_MARK: &str = "ordo-crash promise ";

/// Records a run on [`RecordingDevice`] and tags its events with the
/// operation that issued them (as marks in the device's log, turned into
/// [`LogEvent::op`] by [`Recorder::events`]).
pub struct Recorder {
    dev: Arc<RecordingDevice<MemDevice>>,
}

impl Recorder {
    /// Record on a copy of `base`.
    pub fn new(base: Arc<MemDevice>) -> Self {
        Recorder {
            dev: Arc::new(RecordingDevice::from_base(base)),
        }
    }

    /// The device to mount.
    pub fn device(&self) -> Arc<RecordingDevice<MemDevice>> {
        self.dev.clone()
    }

    /// Tag the following events with operation `op`.
    pub fn set_op(&self, op: usize) {
        self.dev.mark(format!("{OP_MARK}{op}"));
    }

    /// Log promise number `promise` (the workload learned something is
    /// durable).
    pub fn mark(&self, promise: usize) {
        self.dev.mark(format!("{PROMISE_MARK}{promise}"));
    }

    /// The log so far, with operation tags.
    pub fn events(&self) -> Vec<LogEvent> {
        convert(&self.dev.log())
    }
}

/// Turn a device log into the explorer's: operation marks become tags,
/// promise marks stay, other marks are dropped.
pub fn convert(log: &[Event]) -> Vec<LogEvent> {
    let mut op = 0;
    let mut out = Vec::with_capacity(log.len());
    for e in log {
        let kind = match &e.kind {
            DevEventKind::Write {
                block,
                data,
                fua,
                class,
                ..
            } => EventKind::Write(LoggedWrite::new(*block, data.clone(), *fua, *class)),
            DevEventKind::Flush => EventKind::Flush,
            DevEventKind::Mark(label) => {
                if let Some(n) = label.strip_prefix(OP_MARK).and_then(|n| n.parse().ok()) {
                    op = n;
                    continue;
                }
                match label
                    .strip_prefix(PROMISE_MARK)
                    .and_then(|n| n.parse().ok())
                {
                    Some(p) => EventKind::Mark(p),
                    None => continue,
                }
            }
        };
        out.push(LogEvent { kind, op });
    }
    out
}

/// Apply `write` to a state image, optionally only the 512-byte sectors
/// whose bit is set in `sectors` (a torn write; bit `i` = sector `i` of the
/// request).
pub fn apply_write(image: &MemDevice, write: &LoggedWrite, sectors: Option<&[bool]>) {
    let bs = image.block_size() as usize;
    let Some(mask) = sectors else {
        for (i, data) in write.per_block(bs).iter().enumerate() {
            image.put_block(write.block + i as u64, data.clone());
        }
        return;
    };
    let per_block = bs / SECTOR_BYTES;
    for (i, chunk) in write.data.chunks_exact(bs).enumerate() {
        let block = write.block + i as u64;
        let mut cur = match image.block(block) {
            Some(b) => b.to_vec(),
            None => vec![0u8; bs],
        };
        for s in 0..per_block {
            if mask.get(i * per_block + s).copied().unwrap_or(false) {
                let r = s * SECTOR_BYTES..(s + 1) * SECTOR_BYTES;
                cur[r.clone()].copy_from_slice(&chunk[r]);
            }
        }
        image.put_block(block, Arc::from(cur));
    }
}

/// The atomic unit of a torn write.
pub const SECTOR_BYTES: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_logs_in_order_with_op_tags() {
        use ordo_dev::WriteFlags;
        let mem = Arc::new(MemDevice::new(1024, 16).unwrap());
        let r = Recorder::new(mem.clone());
        let dev = r.device();
        dev.write(1, &[1u8; 1024], WriteFlags::new(BlockClass::Data))
            .unwrap();
        r.set_op(3);
        dev.flush().unwrap();
        r.mark(0);
        dev.write(2, &[2u8; 2048], WriteFlags::fua(BlockClass::Directory))
            .unwrap();
        let ev = r.events();
        assert_eq!(ev.len(), 4);
        assert!(matches!(ev[0].kind, EventKind::Write(ref w) if w.block == 1 && !w.fua));
        assert_eq!(ev[0].op, 0);
        assert!(matches!(ev[1].kind, EventKind::Flush));
        assert_eq!(ev[1].op, 3);
        assert!(matches!(ev[2].kind, EventKind::Mark(0)));
        assert!(matches!(ev[3].kind, EventKind::Write(ref w) if w.fua && w.data.len() == 2048));
        // The base is never written.
        assert!(mem.block(3).is_none());
    }

    #[test]
    fn torn_write_applies_only_chosen_sectors() {
        let img = MemDevice::new(1024, 4).unwrap();
        let w = LoggedWrite::new(1, Arc::from(vec![7u8; 2048]), false, BlockClass::Data);
        apply_write(&img, &w, Some(&[true, false, false, true]));
        let b1 = img.block(1).unwrap();
        assert!(b1[..512].iter().all(|&x| x == 7));
        assert!(b1[512..].iter().all(|&x| x == 0));
        let b2 = img.block(2).unwrap();
        assert!(b2[..512].iter().all(|&x| x == 0));
        assert!(b2[512..].iter().all(|&x| x == 7));
    }
}
