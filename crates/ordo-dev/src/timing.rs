//! A timing model: charges each request virtual time, deterministically.
//!
//! The papers ordo reproduces measured disks ordo's machine does not have
//! (a 1994 HDD, a 2013 SSD, a provisioned cloud volume). Running the same
//! workload against [`TimedDevice`] gives their disk-bound figures in virtual
//! time, identically on every run and every machine, while the real I/O
//! goes to the inner device.
//!
//! Requests are served one at a time in arrival order (no queueing model, no
//! overlap): the virtual clock is the sum of service times. Queueing, and the
//! order requests reach the disk in, is the I/O scheduler's
//! ([`crate::sched`]), which asks the model for its clock and, on an HDD,
//! for the positioning cost of each candidate ([`Timing`]). The models are
//! deliberately simple and are documented on each [`DiskModel`] variant;
//! they capture what the crash-consistency papers' results depend on
//! (seeks and rotations for scattered synchronous writes, the cost of a
//! cache flush, an IOPS cap) and nothing else. Reads are always charged as
//! medium accesses (the file system's own cache absorbs re-reads).

use std::io;
use std::sync::{Mutex, MutexGuard};

use crate::{BlockClass, BlockDevice, Counters, DevError, Ticket, WriteFlags};

/// Mean of `sqrt(|x - y|)` for `x`, `y` uniform on [0, 1]: scales the seek
/// curve so that a random seek costs `seek_ms` on average.
const MEAN_SQRT_DISTANCE: f64 = 8.0 / 15.0;

/// Most write requests an HDD model holds in its cache before it must write
/// the oldest half back (a bound on the model's memory and on how much a
/// single flush can cost).
const HDD_CACHE_REQUESTS_MAX: usize = 4096;

/// With `rotation`: the time from a command's completion to the next
/// command reaching the disk (the host's interrupt, completion and
/// submission), nanoseconds. Long enough that the sector after the one
/// just written has passed under the head when the next command asks for
/// it.
pub const HDD_TURNAROUND_NS: f64 = 50_000.0;

/// Parameters of a modeled disk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DiskModel {
    /// A rotating disk.
    ///
    /// A medium access to a block other than the one after the previous
    /// access costs a seek plus half a revolution; the seek grows with the
    /// square root of the distance, scaled so that a random seek over the
    /// whole device averages `seek_ms` (a full stroke costs about
    /// `1.9 * seek_ms`). Every access then costs `bytes / transfer_mb_s`.
    /// With `cache`, a plain write is acknowledged after the bus transfer
    /// only and the medium cost is paid at the next flush (the cached writes
    /// are written back in block order, as a disk's elevator would); a FUA
    /// write is a medium access. Without `cache`, every write is a medium
    /// access and a flush is free.
    ///
    /// With `rotation`, the platter turns while the host is not using the
    /// disk: a write to the block after the previous access waits for
    /// that block to come round again (the time since the previous access
    /// ended, modulo a revolution), and every command starts
    /// [`HDD_TURNAROUND_NS`] after the previous one ended. A read of that
    /// block does not wait: the disk reads ahead into its buffer after a
    /// read, as disks do, so sequential reads stream. A run of
    /// back-to-back sequential transfers inside one command (a flush
    /// writing its cache back) waits for nothing; a log write issued after
    /// a flush completes waits most of a revolution, as on a real disk.
    /// Without it (the default, and every table made before the switch),
    /// the next block is always under the head at no cost.
    Hdd {
        /// Average seek time, milliseconds (8.5 for a 7200-rpm desktop disk).
        seek_ms: f64,
        /// Spindle speed, revolutions per minute.
        rpm: u32,
        /// Sustained media transfer rate, MB/s (10^6 bytes per second).
        transfer_mb_s: f64,
        /// The disk has a volatile write cache (write-back, `wce=on`).
        /// `false` is `wce=off`, write-through, the 1994 disk: a write
        /// completes when it is on the medium, so completion is durability
        /// ([`TimedDevice`] then reports every write it acknowledged as
        /// durable).
        cache: bool,
        /// Rotational position and command turnaround (see above).
        rotation: bool,
    },
    /// A flash disk with a volatile (DRAM) write cache.
    ///
    /// A read costs `read_us + bytes / bandwidth_mb_s`; a plain write costs
    /// `write_us + bytes / bandwidth_mb_s` and sits in the cache; a flush
    /// costs `flush_us` if any write is cached since the previous flush (and
    /// nothing otherwise); a FUA write costs a write plus `flush_us`.
    Ssd {
        /// Read latency, microseconds.
        read_us: f64,
        /// Write latency into the cache, microseconds.
        write_us: f64,
        /// Cost of a cache flush with data to write back, microseconds.
        flush_us: f64,
        /// Transfer rate, MB/s (10^6 bytes per second).
        bandwidth_mb_s: f64,
    },
    /// A provisioned network volume (the shape of AWS gp3 or GCP pd-ssd).
    ///
    /// Every request (read, write, flush) costs
    /// `max(1 / iops, bytes / mb_s)`: the volume is limited by operations
    /// or by throughput, whichever binds. Writes are durable when
    /// acknowledged (replicated), so FUA costs nothing extra.
    Cloud {
        /// Provisioned operations per second.
        iops: u32,
        /// Provisioned throughput, MB/s (10^6 bytes per second).
        mb_s: f64,
    },
}

impl DiskModel {
    /// A 7200-rpm desktop disk with its write cache on.
    pub fn hdd_7200() -> Self {
        DiskModel::Hdd {
            seek_ms: 8.5,
            rpm: 7200,
            transfer_mb_s: 150.0,
            cache: true,
            rotation: false,
        }
    }

    /// A disk of the class Ganger & Patt measured (OSDI '94): the HP C2447,
    /// a 3.5-inch, 1 GB SCSI-2 disk of the HP C2244/45/46/47 family
    /// (1992), with its write cache off, as their driver used it
    /// (completion = durable).
    ///
    /// The paper names the disk and its manual ([HP92], "HP C2244/45/46/47
    /// 3.5-inch SCSI-2 Disk Drive Technical Reference Manual") but quotes
    /// none of its figures; the values are the family's published ones:
    /// 5400 rpm (11.1 ms per revolution, 5.56 ms average rotational
    /// latency), 10 ms average seek, and a media rate of 3.5 MB/s, the
    /// middle of the zoned surface's range (about 2.6 MB/s on the inner
    /// zones to 4.4 MB/s on the outer ones; the model has one rate for the
    /// whole surface).
    pub fn hp_c2447() -> Self {
        DiskModel::Hdd {
            seek_ms: 10.0,
            rpm: 5400,
            transfer_mb_s: 3.5,
            cache: false,
            rotation: false,
        }
    }

    /// This model with its write cache on or off (`wce=on|off`); `None`
    /// for models that have no such switch (flash, cloud).
    pub fn with_write_cache(self, on: bool) -> Option<Self> {
        match self {
            DiskModel::Hdd {
                seek_ms,
                rpm,
                transfer_mb_s,
                rotation,
                ..
            } => Some(DiskModel::Hdd {
                seek_ms,
                rpm,
                transfer_mb_s,
                cache: on,
                rotation,
            }),
            _ => None,
        }
    }

    /// This model with its rotational position and command turnaround
    /// modeled or not (`rot=on|off`); `None` for models without a platter.
    pub fn with_rotation(self, on: bool) -> Option<Self> {
        match self {
            DiskModel::Hdd {
                seek_ms,
                rpm,
                transfer_mb_s,
                cache,
                ..
            } => Some(DiskModel::Hdd {
                seek_ms,
                rpm,
                transfer_mb_s,
                cache,
                rotation: on,
            }),
            _ => None,
        }
    }

    /// A SATA flash disk.
    pub fn ssd_sata() -> Self {
        DiskModel::Ssd {
            read_us: 90.0,
            write_us: 30.0,
            flush_us: 1000.0,
            bandwidth_mb_s: 500.0,
        }
    }

    /// A provisioned cloud volume at gp3's baseline.
    pub fn cloud_gp3() -> Self {
        DiskModel::Cloud {
            iops: 3000,
            mb_s: 125.0,
        }
    }

    /// Checks that every parameter is positive and finite.
    pub fn validate(&self) -> Result<(), DevError> {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        let good = match *self {
            DiskModel::Hdd {
                seek_ms,
                rpm,
                transfer_mb_s,
                ..
            } => seek_ms.is_finite() && seek_ms >= 0.0 && rpm > 0 && ok(transfer_mb_s),
            DiskModel::Ssd {
                read_us,
                write_us,
                flush_us,
                bandwidth_mb_s,
            } => {
                [read_us, write_us, flush_us]
                    .iter()
                    .all(|x| x.is_finite() && *x >= 0.0)
                    && ok(bandwidth_mb_s)
            }
            DiskModel::Cloud { iops, mb_s } => iops > 0 && ok(mb_s),
        };
        if good {
            Ok(())
        } else {
            Err(DevError::Geometry(format!(
                "disk model parameters must be positive and finite: {self:?}"
            )))
        }
    }
}

fn ms_to_ns(ms: f64) -> f64 {
    ms * 1e6
}

fn us_to_ns(us: f64) -> f64 {
    us * 1e3
}

/// Nanoseconds to move `bytes` at `mb_s` (10^6 bytes per second).
fn transfer_ns(bytes: u64, mb_s: f64) -> f64 {
    bytes as f64 / mb_s * 1e3
}

struct TimeState {
    /// The virtual clock, in nanoseconds (fractions kept so that many small
    /// requests add up exactly, independent of rounding).
    now_ns: f64,
    /// HDD: the block after the previous medium access.
    head_block: u64,
    /// HDD: when that access ended (the block was then under the head).
    head_ns: f64,
    /// HDD with cache: cached write requests (block, blocks, ticket),
    /// oldest first.
    hdd_cached: Vec<(u64, u64, Ticket)>,
    /// HDD with cache: every write at or below this ticket was destaged
    /// by the disk on its own (the cache filled), without a flush.
    destaged: Ticket,
    /// SSD: a write is cached since the last flush.
    ssd_dirty: bool,
    /// HDD without cache: the highest ticket acknowledged (durable, since a
    /// write-through disk completes a write when it is on the medium).
    written_through: Ticket,
}

/// What the I/O scheduler ([`crate::sched`]) asks of a timing model.
pub trait Timing: Send + Sync {
    /// The virtual clock, nanoseconds.
    fn now_ns(&self) -> u64;
    /// Seek plus rotation to reach `block` from where the head is now, in
    /// nanoseconds; `None` for a model without positioning (flash, cloud).
    fn positioning_ns(&self, block: u64) -> Option<f64>;
    /// The block after the last medium access (an HDD's head), if the
    /// model has one.
    fn head_block(&self) -> Option<u64>;
}

/// A device wrapper that charges virtual time per request.
pub struct TimedDevice<D: BlockDevice> {
    inner: D,
    model: DiskModel,
    state: Mutex<TimeState>,
}

impl<D: BlockDevice> TimedDevice<D> {
    /// Wraps `inner`; the clock starts at 0 with the head at block 0.
    pub fn new(inner: D, model: DiskModel) -> Result<Self, DevError> {
        model.validate()?;
        Ok(TimedDevice {
            inner,
            model,
            state: Mutex::new(TimeState {
                now_ns: 0.0,
                head_block: 0,
                head_ns: 0.0,
                hdd_cached: Vec::new(),
                destaged: 0,
                ssd_dirty: false,
                written_through: 0,
            }),
        })
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The model in use.
    pub fn model(&self) -> DiskModel {
        self.model
    }

    /// Virtual time spent so far, nanoseconds.
    pub fn virtual_time_ns(&self) -> u64 {
        self.lock().now_ns.round() as u64
    }

    fn lock(&self) -> MutexGuard<'_, TimeState> {
        // The state is a few numbers updated together after the inner call;
        // a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Seek plus rotation to `block`, for an access starting at `at_ns`,
    /// on an HDD model (`None` on another model): for the block after the
    /// previous access nothing, or with `rotation` the wait for it to come
    /// round again; otherwise the square-root seek curve and half a
    /// revolution.
    fn hdd_positioning_ns(&self, s: &TimeState, block: u64, at_ns: f64, read: bool) -> Option<f64> {
        let DiskModel::Hdd {
            seek_ms,
            rpm,
            rotation,
            ..
        } = self.model
        else {
            return None;
        };
        if block == s.head_block {
            if !rotation || read {
                return Some(0.0);
            }
            let rev = ms_to_ns(60_000.0 / rpm as f64);
            // Back to back (within a nanosecond: the clock adds up
            // fractions, so "the same instant" may differ in its last bits)
            // the block is still under the head.
            let since = (at_ns - s.head_ns).max(0.0) % rev;
            return Some(if since < 1.0 || rev - since < 1.0 {
                0.0
            } else {
                rev - since
            });
        }
        let head = s.head_block;
        let distance = block.abs_diff(head) as f64 / self.inner.block_count().max(1) as f64;
        Some(
            ms_to_ns(seek_ms) * distance.min(1.0).sqrt() / MEAN_SQRT_DISTANCE
                + ms_to_ns(30_000.0 / rpm as f64), // half a revolution
        )
    }

    /// Cost of one HDD medium access starting at `at_ns`, moving the head.
    fn hdd_access_ns(
        &self,
        s: &mut TimeState,
        block: u64,
        blocks: u64,
        at_ns: f64,
        read: bool,
    ) -> f64 {
        let DiskModel::Hdd { transfer_mb_s, .. } = self.model else {
            unreachable!("HDD cost asked of another model")
        };
        let mut ns = self
            .hdd_positioning_ns(s, block, at_ns, read)
            .expect("an HDD model");
        ns += transfer_ns(blocks * self.inner.block_size() as u64, transfer_mb_s);
        s.head_block = block + blocks;
        s.head_ns = at_ns + ns;
        ns
    }

    /// Writes back `requests` from an HDD cache, in block order, back to
    /// back from `at_ns`. A request rewritten by a later one of the same
    /// blocks is not written: the disk's cache holds a block's newest data
    /// once, and the later write replaced it there.
    fn hdd_write_back_ns(
        &self,
        s: &mut TimeState,
        mut requests: Vec<(u64, u64, Ticket)>,
        at_ns: f64,
    ) -> f64 {
        requests.sort_unstable();
        requests.dedup_by(|later, earlier| {
            // Sorted by (block, blocks, ticket): keep the last of a run of
            // equal ranges, the newest.
            let same = (later.0, later.1) == (earlier.0, earlier.1);
            if same {
                *earlier = *later;
            }
            same
        });
        let mut ns = 0.0;
        for (b, n, _) in requests {
            ns += self.hdd_access_ns(s, b, n, at_ns + ns, false);
        }
        ns
    }

    /// With `rotation`, the command's turnaround before it reaches the
    /// disk, added to the clock; nothing otherwise.
    fn turnaround(&self, s: &mut TimeState) {
        if matches!(self.model, DiskModel::Hdd { rotation: true, .. }) {
            s.now_ns += HDD_TURNAROUND_NS;
        }
    }

    fn charge_read(&self, s: &mut TimeState, block: u64, blocks: u64) {
        let bytes = blocks * self.inner.block_size() as u64;
        self.turnaround(s);
        let at = s.now_ns;
        s.now_ns += match self.model {
            DiskModel::Hdd { .. } => self.hdd_access_ns(s, block, blocks, at, true),
            DiskModel::Ssd {
                read_us,
                bandwidth_mb_s,
                ..
            } => us_to_ns(read_us) + transfer_ns(bytes, bandwidth_mb_s),
            DiskModel::Cloud { iops, mb_s } => (1e9 / iops as f64).max(transfer_ns(bytes, mb_s)),
        };
    }

    fn charge_write(&self, s: &mut TimeState, block: u64, blocks: u64, fua: bool, ticket: Ticket) {
        let bytes = blocks * self.inner.block_size() as u64;
        self.turnaround(s);
        let at = s.now_ns;
        s.now_ns += match self.model {
            DiskModel::Hdd {
                cache,
                transfer_mb_s,
                ..
            } => {
                if cache && !fua {
                    s.hdd_cached.push((block, blocks, ticket));
                    let mut ns = transfer_ns(bytes, transfer_mb_s);
                    if s.hdd_cached.len() > HDD_CACHE_REQUESTS_MAX {
                        let oldest: Vec<_> =
                            s.hdd_cached.drain(..HDD_CACHE_REQUESTS_MAX / 2).collect();
                        ns += self.hdd_write_back_ns(s, oldest, at + ns);
                        // A durability notification without a flush: every
                        // write older than the oldest still cached is on
                        // the medium (FUA writes went there directly).
                        s.destaged = s.hdd_cached[0].2 - 1;
                    }
                    ns
                } else {
                    self.hdd_access_ns(s, block, blocks, at, false)
                }
            }
            DiskModel::Ssd {
                write_us,
                flush_us,
                bandwidth_mb_s,
                ..
            } => {
                let mut ns = us_to_ns(write_us) + transfer_ns(bytes, bandwidth_mb_s);
                if fua {
                    ns += us_to_ns(flush_us);
                } else {
                    s.ssd_dirty = true;
                }
                ns
            }
            DiskModel::Cloud { iops, mb_s } => (1e9 / iops as f64).max(transfer_ns(bytes, mb_s)),
        };
    }

    fn charge_flush(&self, s: &mut TimeState) {
        self.turnaround(s);
        let at = s.now_ns;
        s.now_ns += match self.model {
            DiskModel::Hdd { .. } => {
                let cached = std::mem::take(&mut s.hdd_cached);
                self.hdd_write_back_ns(s, cached, at)
            }
            DiskModel::Ssd { flush_us, .. } => {
                if std::mem::take(&mut s.ssd_dirty) {
                    us_to_ns(flush_us)
                } else {
                    0.0
                }
            }
            DiskModel::Cloud { iops, .. } => 1e9 / iops as f64,
        };
    }
}

impl<D: BlockDevice> BlockDevice for TimedDevice<D> {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }

    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()> {
        let mut s = self.lock();
        self.inner.read(block, buf, class)?;
        let blocks = (buf.len() / self.inner.block_size() as usize) as u64;
        self.charge_read(&mut s, block, blocks);
        Ok(())
    }

    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket> {
        let mut s = self.lock();
        let ticket = self.inner.write(block, data, flags)?;
        let blocks = (data.len() / self.inner.block_size() as usize) as u64;
        self.charge_write(&mut s, block, blocks, flags.fua, ticket);
        if matches!(self.model, DiskModel::Hdd { cache: false, .. }) {
            s.written_through = s.written_through.max(ticket);
        }
        Ok(ticket)
    }

    fn flush(&self) -> io::Result<()> {
        let mut s = self.lock();
        self.inner.flush()?;
        self.charge_flush(&mut s);
        Ok(())
    }

    fn durable(&self) -> Ticket {
        // Write-through (`wce=off`): a completed write is on the medium;
        // with a cache, what the disk destaged on its own is too.
        let s = self.lock();
        self.inner.durable().max(s.written_through).max(s.destaged)
    }

    fn counters(&self) -> Counters {
        self.inner.counters()
    }

    fn timing(&self) -> Option<&dyn Timing> {
        Some(self)
    }
}

impl<D: BlockDevice> Timing for TimedDevice<D> {
    fn now_ns(&self) -> u64 {
        self.virtual_time_ns()
    }

    fn positioning_ns(&self, block: u64) -> Option<f64> {
        let s = self.lock();
        // The scheduler orders writes and reads alike; a write's cost is
        // the one that depends on the platter.
        self.hdd_positioning_ns(&s, block, s.now_ns, false)
    }

    fn head_block(&self) -> Option<u64> {
        match self.model {
            DiskModel::Hdd { .. } => Some(self.lock().head_block),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    const BLOCKS: u64 = 1 << 18; // 1 GiB of 4 KiB blocks

    fn timed(model: DiskModel) -> TimedDevice<MemDevice> {
        TimedDevice::new(MemDevice::new(4096, BLOCKS).unwrap(), model).unwrap()
    }

    fn w(d: &TimedDevice<MemDevice>, block: u64, fua: bool) {
        let flags = if fua {
            WriteFlags::fua(BlockClass::Data)
        } else {
            WriteFlags::new(BlockClass::Data)
        };
        d.write(block, &[1u8; 4096], flags).unwrap();
    }

    fn scattered(i: u64) -> u64 {
        (i * 7919 * 104_729) % BLOCKS
    }

    #[test]
    fn hdd_sequential_is_cheaper_than_scattered() {
        let nocache = DiskModel::Hdd {
            seek_ms: 8.5,
            rpm: 7200,
            transfer_mb_s: 150.0,
            cache: false,
            rotation: false,
        };
        let seq = timed(nocache);
        let rnd = timed(nocache);
        for i in 0..100 {
            w(&seq, i, false);
            w(&rnd, scattered(i), false);
        }
        let (s, r) = (seq.virtual_time_ns(), rnd.virtual_time_ns());
        // 100 scattered writes: about 100 * (8.5 + 4.17) ms.
        assert!(r > 900_000_000 && r < 1_600_000_000, "{r}");
        assert!(s * 50 < r, "sequential {s} vs scattered {r}");
    }

    #[test]
    fn hdd_cache_defers_cost_to_flush() {
        let d = timed(DiskModel::hdd_7200());
        for i in 0..50 {
            w(&d, scattered(i), false);
        }
        let before = d.virtual_time_ns();
        assert!(
            before < 10_000_000,
            "cached writes cost only the transfer: {before}"
        );
        d.flush().unwrap();
        let after = d.virtual_time_ns();
        assert!(
            after - before > 50 * 4_000_000,
            "flush writes back: {}",
            after - before
        );
        d.flush().unwrap();
        assert_eq!(d.virtual_time_ns(), after, "an empty flush is free");
        w(&d, scattered(999), true);
        assert!(
            d.virtual_time_ns() - after > 4_000_000,
            "FUA is a medium access"
        );
    }

    #[test]
    fn a_block_rewritten_in_the_cache_is_written_back_once() {
        let once = timed(DiskModel::hdd_7200());
        let thrice = timed(DiskModel::hdd_7200());
        for i in 0..20 {
            w(&once, scattered(i), false);
            for _ in 0..3 {
                w(&thrice, scattered(i), false);
            }
        }
        let (o, t) = (once.virtual_time_ns(), thrice.virtual_time_ns());
        once.flush().unwrap();
        thrice.flush().unwrap();
        let (fo, ft) = (once.virtual_time_ns() - o, thrice.virtual_time_ns() - t);
        assert!(
            fo > 20 * 4_000_000,
            "20 scattered blocks written back: {fo}"
        );
        assert_eq!(fo, ft, "three writes of a block in the cache cost one");
    }

    #[test]
    fn ssd_flush_only_costs_with_cached_writes() {
        let d = timed(DiskModel::ssd_sata());
        d.flush().unwrap();
        assert_eq!(d.virtual_time_ns(), 0);
        w(&d, 5, false);
        let t = d.virtual_time_ns();
        // 30 us + 4096 B at 500 MB/s (8.192 us).
        assert_eq!(t, 38_192);
        d.flush().unwrap();
        assert_eq!(d.virtual_time_ns(), t + 1_000_000);
        w(&d, 6, true);
        assert_eq!(d.virtual_time_ns(), 2 * t + 1_000_000 + 1_000_000);
        let mut buf = vec![0u8; 8192];
        d.read(5, &mut buf, BlockClass::Data).unwrap();
        assert_eq!(d.virtual_time_ns(), 2 * t + 2_000_000 + 90_000 + 16_384);
    }

    #[test]
    fn cloud_is_bound_by_iops_or_throughput() {
        let d = timed(DiskModel::Cloud {
            iops: 1000,
            mb_s: 100.0,
        });
        for i in 0..1000 {
            w(&d, i, false);
        }
        assert_eq!(
            d.virtual_time_ns(),
            1_000_000_000,
            "1000 small writes at 1000 IOPS"
        );
        let big = vec![0u8; 1 << 20];
        d.write(0, &big, WriteFlags::new(BlockClass::Data)).unwrap();
        // 1 MiB at 100 MB/s = 10.48576 ms, more than one IOPS slot.
        assert_eq!(d.virtual_time_ns(), 1_000_000_000 + 10_485_760);
    }

    #[test]
    fn same_requests_same_time() {
        let run = || {
            let d = timed(DiskModel::hdd_7200());
            for i in 0..200 {
                w(&d, scattered(i), i % 17 == 0);
                if i % 10 == 0 {
                    d.flush().unwrap();
                }
            }
            d.virtual_time_ns()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn hp_c2447_parameters_validate() {
        let m = DiskModel::hp_c2447();
        m.validate().unwrap();
        assert_eq!(
            m,
            DiskModel::Hdd {
                seek_ms: 10.0,
                rpm: 5400,
                transfer_mb_s: 3.5,
                cache: false,
                rotation: false,
            }
        );
        assert_eq!(m.with_write_cache(false), Some(m));
        assert!(matches!(
            m.with_write_cache(true),
            Some(DiskModel::Hdd { cache: true, .. })
        ));
        assert_eq!(DiskModel::ssd_sata().with_write_cache(false), None);
        // A random 4 KiB write: 10 ms seek on average, 5.56 ms of rotation,
        // 1.17 ms of transfer.
        let d = timed(m);
        for i in 0..200 {
            w(&d, scattered(i), false);
        }
        let per = d.virtual_time_ns() / 200;
        assert!((14_000_000..19_000_000).contains(&per), "{per}");
        // Write-through: every acknowledged write is durable.
        let t = d
            .write(3, &[0u8; 4096], WriteFlags::new(BlockClass::Data))
            .unwrap();
        assert!(d.durable() >= t);
        let cached = TimedDevice::new(
            crate::WriteCacheDevice::new(MemDevice::new(4096, BLOCKS).unwrap()),
            DiskModel::hdd_7200(),
        )
        .unwrap();
        let t = cached
            .write(3, &[0u8; 4096], WriteFlags::new(BlockClass::Data))
            .unwrap();
        assert!(
            cached.durable() < t,
            "write-back: durable only after a flush"
        );
        cached.flush().unwrap();
        assert!(cached.durable() >= t);
    }

    #[test]
    fn a_full_hdd_cache_destages_and_reports_it() {
        let d =
            TimedDevice::new(MemDevice::new(4096, 16384).unwrap(), DiskModel::hdd_7200()).unwrap();
        let mut tickets = Vec::new();
        for i in 0..=HDD_CACHE_REQUESTS_MAX as u64 {
            let t = d
                .write(i * 2, &[0u8; 4096], WriteFlags::new(BlockClass::Data))
                .unwrap();
            tickets.push(t);
            if i < HDD_CACHE_REQUESTS_MAX as u64 {
                assert_eq!(d.durable(), 0, "nothing destaged while the cache has room");
            }
        }
        // The oldest half went to the medium: durable without a flush.
        let half = HDD_CACHE_REQUESTS_MAX / 2;
        assert_eq!(d.durable(), tickets[half - 1]);
        assert!(d.durable() < tickets[half]);
        assert_eq!(d.counters().flushes, 0);
    }

    #[test]
    fn with_rotation_the_next_block_waits_for_the_platter() {
        let rot = DiskModel::hdd_7200().with_rotation(true).unwrap();
        assert!(DiskModel::ssd_sata().with_rotation(true).is_none());
        let rev = 60_000_000_000.0 / 7200.0; // 8.33 ms
                                             // A log write after a flush: cached, then written back by the
                                             // flush, then the commit block with FUA at the next block.
        let fsync = |d: &TimedDevice<MemDevice>, log: u64| {
            w(d, log, false);
            d.flush().unwrap();
            w(d, log + 1, true);
        };
        let plain = timed(DiskModel::hdd_7200());
        let turning = timed(rot);
        // The first commit seeks to the log; the next 20 find the head
        // there.
        fsync(&plain, 998);
        fsync(&turning, 998);
        let (p0, t0) = (plain.virtual_time_ns(), turning.virtual_time_ns());
        for i in 0..20 {
            fsync(&plain, 1000 + 2 * i);
            fsync(&turning, 1000 + 2 * i);
        }
        // Without rotation the log costs its transfer once the head is
        // there; with it each of the two writes after a command's
        // turnaround misses its sector and waits nearly a revolution.
        let per_plain = (plain.virtual_time_ns() - p0) as f64 / 20.0;
        let per_turning = (turning.virtual_time_ns() - t0) as f64 / 20.0;
        assert!(per_plain < 0.2e6, "{per_plain}");
        assert!(
            per_turning > 1.9 * rev && per_turning < 2.1 * rev,
            "{per_turning} against {rev} per revolution"
        );
        // A run written back by one flush streams: no wait between the
        // requests of one command.
        let d = timed(rot);
        for b in 0..64 {
            w(&d, 5000 + b, false);
        }
        let before = d.virtual_time_ns();
        d.flush().unwrap();
        let flush = (d.virtual_time_ns() - before) as f64;
        // One positioning (seek and half a revolution) and 256 KiB of
        // transfer (1.75 ms), no revolution per block.
        assert!(flush < 12.0e6, "{flush}");
        // Sequential reads stream from the disk's read-ahead: 64 reads of
        // one block each cost their turnarounds and transfers, not a
        // revolution each.
        let r = timed(rot);
        let mut buf = vec![0u8; 4096];
        r.read(7000, &mut buf, BlockClass::Data).unwrap();
        let t = r.virtual_time_ns();
        for b in 1..65 {
            r.read(7000 + b, &mut buf, BlockClass::Data).unwrap();
        }
        let reads = (r.virtual_time_ns() - t) as f64;
        assert!(reads < 64.0 * 0.1e6, "{reads}");
        // Deterministic, and reading the clock does not move it.
        let again = timed(rot);
        fsync(&again, 998);
        for i in 0..20 {
            fsync(&again, 1000 + 2 * i);
        }
        assert_eq!(again.virtual_time_ns(), turning.virtual_time_ns());
    }

    #[test]
    fn bad_models_are_refused() {
        let m = MemDevice::new(4096, 16).unwrap();
        assert!(TimedDevice::new(m, DiskModel::Cloud { iops: 0, mb_s: 1.0 }).is_err());
        assert!(DiskModel::Ssd {
            read_us: 1.0,
            write_us: f64::NAN,
            flush_us: 1.0,
            bandwidth_mb_s: 1.0
        }
        .validate()
        .is_err());
    }
}
