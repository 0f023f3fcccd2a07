//! A device whose flushes wait at a gate: tests that must hold a commit
//! in its flush while they arrange what happens beside it (fsyncs that
//! arrive meanwhile, and must wait and share the next commit).
//!
//! Deterministic, not timed: a test closes the gate, waits until
//! [`GateDevice::blocked`] says a flush is waiting, does what it needs,
//! and opens the gate again. Reads and writes pass straight through.

use std::io;
use std::sync::{Condvar, Mutex};

use crate::{BlockClass, BlockDevice, Counters, Ticket, Timing, WriteFlags};

/// `inner`, whose flushes block while the gate is closed.
pub struct GateDevice<D: BlockDevice> {
    inner: D,
    /// (closed, flushes waiting at the gate now).
    state: Mutex<(bool, usize)>,
    cv: Condvar,
}

impl<D: BlockDevice> GateDevice<D> {
    /// Wrap `inner`, with the gate open.
    pub fn new(inner: D) -> Self {
        GateDevice {
            inner,
            state: Mutex::new((false, 0)),
            cv: Condvar::new(),
        }
    }

    /// The device below.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Close or open the gate; opening it lets every waiting flush go on.
    pub fn set_closed(&self, closed: bool) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0 = closed;
        self.cv.notify_all();
    }

    /// Flushes waiting at the gate right now.
    pub fn blocked(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1
    }
}

impl<D: BlockDevice> BlockDevice for GateDevice<D> {
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
        self.inner.write(block, data, flags)
    }
    fn write_vectored(&self, block: u64, parts: &[&[u8]], flags: WriteFlags) -> io::Result<Ticket> {
        self.inner.write_vectored(block, parts, flags)
    }
    fn flush(&self) -> io::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.1 += 1;
        while st.0 {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.1 -= 1;
        drop(st);
        self.inner.flush()
    }
    fn durable(&self) -> Ticket {
        self.inner.durable()
    }
    fn counters(&self) -> Counters {
        self.inner.counters()
    }
    fn timing(&self) -> Option<&dyn Timing> {
        self.inner.timing()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;
    use std::sync::Arc;

    #[test]
    fn a_flush_waits_while_the_gate_is_closed() {
        let dev = Arc::new(GateDevice::new(MemDevice::new(4096, 16).unwrap()));
        dev.set_closed(true);
        let d = dev.clone();
        let t = std::thread::spawn(move || d.flush());
        while dev.blocked() == 0 {
            std::thread::yield_now();
        }
        assert!(!t.is_finished(), "the flush went through a closed gate");
        dev.set_closed(false);
        t.join().unwrap().unwrap();
        assert_eq!(dev.blocked(), 0);
        // Open: a flush goes straight through.
        dev.flush().unwrap();
    }
}
