//! A deterministic simulation of Ganger & Patt's machine: one CPU, one
//! disk, N user processes and a syncer daemon, in virtual time.
//!
//! The timing model ([`TimedDevice`]) says how long each disk request
//! takes. What it cannot say is what the paper measured: how long a
//! *process* takes when its CPU work overlaps other processes' disk waits,
//! when its synchronous writes block it and its delayed writes do not, and
//! when the syncer's background writes occupy the disk it needs for a read.
//! This module adds exactly that, and nothing more:
//!
//! - **Processes** are real threads running the workload against ordo's
//!   library, but only one runs at a time: each file-system call waits for
//!   its turn, and the turn goes to the process whose virtual clock is
//!   earliest (ties to the lowest number). A run is therefore one fixed
//!   interleaving, the same on every machine and every run.
//! - **CPU**: each call first charges its CPU cost ([`CpuModel`]) on the
//!   single CPU, starting when both the process and the CPU are free.
//! - **Disk**: every request the call makes reaches [`SimDevice`], which
//!   asks the timing model for its service time and puts it on the disk's
//!   timeline (first come, first served, after whatever the disk is still
//!   doing). The calling process waits for it: inside a call, ordo's I/O
//!   is synchronous (a read miss, `sync`'s ordered writes, a write-back
//!   forced by memory pressure, `sched-flag` draining its queue for a
//!   write lock).
//! - **Syncer**: once per virtual second (before the first call that
//!   starts at or after the tick) the syncer runs the protocol's periodic
//!   write-back (`Fs::write_back`, what ordo's timer thread does). Its
//!   requests occupy the disk but block no process: they are the
//!   asynchronous writes of delayed-write schemes, of soft updates' syncer
//!   and of the scheduler-ordered protocols' queue.
//!
//! A request's response time is its completion minus the moment it reached
//! the device layer (the syncer's tick, or the calling process's clock):
//! queue plus service, the paper's "driver response time".

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ordo_dev::{
    BlockClass, BlockDevice, Counters, MemDevice, Ticket, TimedDevice, Timing, WriteFlags,
};
use ordo_fs::Fs;

use crate::error::{BenchError, Result};

thread_local! {
    /// The simulated process this thread runs, set by [`Sim::run_users`].
    static USER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The device under the simulation: memory, with the disk model on top.
pub type Disk = TimedDevice<Arc<MemDevice>>;

/// CPU cost of each file-system call, nanoseconds, on the paper's machine
/// (an NCR 3433, a 33 MHz 80486).
///
/// The paper reports CPU time per benchmark, not per call; the costs are
/// fitted to its No Order rows: 4-user remove charges 7.44 s of CPU for
/// 2,140 files (3.5 ms a file: the unlink with its linear directory scan,
/// plus the directory reads), and 4-user copy 68.4 s for 2,140 files of
/// 57.2 MB (32 ms a file, most of it the two copies of every byte through
/// the buffer cache). The same costs serve every scheme: a scheme's own
/// CPU (soft updates' dependency bookkeeping, block copies) is not
/// modeled, and the paper's figures show it is within ten percent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuModel {
    /// Path lookup and open of an existing file.
    pub open_ns: u64,
    /// Create of a file (lookup, directory scan for the name, inode).
    pub create_ns: u64,
    /// mkdir.
    pub mkdir_ns: u64,
    /// unlink (lookup, directory scan, inode release).
    pub unlink_ns: u64,
    /// rmdir.
    pub rmdir_ns: u64,
    /// stat of a path.
    pub stat_ns: u64,
    /// A readdir: fixed part.
    pub list_ns: u64,
    /// A readdir: per entry returned.
    pub list_entry_ns: u64,
    /// A read or write call: fixed part.
    pub rw_ns: u64,
    /// A read or write call: per byte copied.
    pub byte_ns: f64,
    /// close.
    pub close_ns: u64,
}

impl CpuModel {
    /// The costs fitted to the paper's machine (see the type's comment).
    pub const PAPER: CpuModel = CpuModel {
        open_ns: 1_000_000,
        create_ns: 2_000_000,
        mkdir_ns: 3_000_000,
        unlink_ns: 3_000_000,
        rmdir_ns: 3_000_000,
        stat_ns: 500_000,
        list_ns: 500_000,
        list_entry_ns: 20_000,
        rw_ns: 200_000,
        byte_ns: 550.0,
        close_ns: 100_000,
    };

    /// A read or write of `bytes`.
    pub fn rw(&self, bytes: usize) -> u64 {
        self.rw_ns + (bytes as f64 * self.byte_ns).round() as u64
    }
}

/// Who is using the simulated machine right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Actor {
    User(usize),
    Syncer,
}

/// Where a simulated process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Running workload code between two file-system calls (or not
    /// started): the scheduler waits for it.
    Between,
    /// Waiting for its turn to make a call.
    Waiting,
    /// Making a call.
    Running,
    /// Finished.
    Done,
}

#[derive(Clone, Copy, Debug)]
struct Proc {
    status: Status,
    /// When it can next run, ns.
    ready_ns: u64,
    /// CPU charged to it, ns.
    cpu_ns: u64,
}

/// Disk figures of a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskFigures {
    /// Read requests.
    pub reads: u64,
    /// Write requests (a concatenated multi-block write is one).
    pub writes: u64,
    /// Cache flushes (free on a write-through disk, still counted).
    pub flushes: u64,
    /// Sum of response times (queue + service), ns.
    pub response_ns: u64,
    /// Time the disk was busy, ns.
    pub busy_ns: u64,
}

impl DiskFigures {
    /// Read and write requests.
    pub fn requests(&self) -> u64 {
        self.reads + self.writes
    }
    /// Average response time, ms.
    pub fn avg_response_ms(&self) -> f64 {
        match self.requests() {
            0 => 0.0,
            n => self.response_ns as f64 / n as f64 / 1e6,
        }
    }
}

struct State {
    procs: Vec<Proc>,
    running: Option<Actor>,
    /// The running actor's clock, ns.
    now_ns: u64,
    cpu_free_ns: u64,
    disk_free_ns: u64,
    next_tick_ns: u64,
    disk: DiskFigures,
    /// The syncer's writes not yet complete: (completion, bytes), in
    /// completion order (the disk is first come, first served).
    in_flight: VecDeque<(u64, u64)>,
    /// Their bytes.
    in_flight_bytes: u64,
    /// A failure of the syncer (reported by the run).
    syncer_error: Option<String>,
}

/// The simulated machine. See the module comment.
pub struct Sim {
    state: Mutex<State>,
    turn: Condvar,
    cpu: CpuModel,
    syncer_ns: u64,
    /// Most bytes of background writes in flight before a call waits.
    in_flight_max: u64,
    /// The file system the syncer writes back (set while a run is on).
    fs: Mutex<Option<Arc<Fs>>>,
}

impl Sim {
    /// A machine with `cpu` costs, a syncer every `syncer_ns`, and at
    /// most `in_flight_max` bytes of background writes in flight before a
    /// process waits for memory.
    pub fn new(cpu: CpuModel, syncer_ns: u64, in_flight_max: u64) -> Arc<Sim> {
        assert!(syncer_ns > 0, "the syncer needs an interval");
        Arc::new(Sim {
            state: Mutex::new(State {
                procs: Vec::new(),
                running: None,
                now_ns: 0,
                cpu_free_ns: 0,
                disk_free_ns: 0,
                next_tick_ns: syncer_ns,
                disk: DiskFigures::default(),
                in_flight: VecDeque::new(),
                in_flight_bytes: 0,
                syncer_error: None,
            }),
            turn: Condvar::new(),
            cpu,
            syncer_ns,
            in_flight_max,
            fs: Mutex::new(None),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a few numbers updated together; a panic elsewhere
        // (a failed workload thread) leaves them consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The CPU costs.
    pub fn cpu(&self) -> CpuModel {
        self.cpu
    }

    /// The latest point any process or the disk has reached, ns.
    pub fn horizon_ns(&self) -> u64 {
        let s = self.lock();
        s.procs
            .iter()
            .map(|p| p.ready_ns)
            .chain([s.cpu_free_ns, s.disk_free_ns])
            .max()
            .unwrap_or(0)
    }

    /// Disk figures so far.
    pub fn disk(&self) -> DiskFigures {
        self.lock().disk
    }

    /// Runs `users` processes, each `f(user)`, on the simulated machine
    /// over `fs`, starting at virtual time `start_ns`. Returns, per
    /// process, (its result, when it finished, CPU charged to it).
    pub fn run_users<T, F>(
        self: &Arc<Self>,
        fs: &Arc<Fs>,
        users: usize,
        start_ns: u64,
        f: F,
    ) -> Result<Vec<(T, u64, u64)>>
    where
        T: Send,
        F: Fn(usize) -> Result<T> + Sync,
    {
        assert!(users > 0, "a run needs a process");
        {
            let mut s = self.lock();
            assert!(s.running.is_none(), "a run is already on");
            s.procs = vec![
                Proc {
                    status: Status::Between,
                    ready_ns: start_ns,
                    cpu_ns: 0,
                };
                users
            ];
            s.cpu_free_ns = s.cpu_free_ns.max(start_ns);
            s.next_tick_ns = s.next_tick_ns.max(start_ns + self.syncer_ns);
        }
        *self.fs.lock().unwrap_or_else(|p| p.into_inner()) = Some(fs.clone());
        let results: Vec<std::thread::Result<Result<T>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..users)
                .map(|u| {
                    let f = &f;
                    let sim = self.clone();
                    scope.spawn(move || {
                        USER.with(|c| c.set(Some(u)));
                        let r = f(u);
                        sim.finish(u);
                        USER.with(|c| c.set(None));
                        r
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect()
        });
        *self.fs.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let s = self.lock();
        if let Some(e) = &s.syncer_error {
            return Err(BenchError::Workload {
                workload: "ganger".into(),
                detail: format!("the syncer failed: {e}"),
            });
        }
        let procs = s.procs.clone();
        drop(s);
        let mut out = Vec::with_capacity(users);
        for (r, p) in results.into_iter().zip(procs) {
            match r {
                Ok(Ok(v)) => out.push((v, p.ready_ns, p.cpu_ns)),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(BenchError::Workload {
                        workload: "ganger".into(),
                        detail: "a simulated process panicked".into(),
                    })
                }
            }
        }
        Ok(out)
    }

    /// Marks `u` finished and passes the turn on.
    fn finish(&self, u: usize) {
        let mut s = self.lock();
        if s.running == Some(Actor::User(u)) {
            // A call failed half way (its guard dropped): it is over.
            s.running = None;
        }
        s.procs[u].status = Status::Done;
        drop(s);
        self.turn.notify_all();
    }

    /// The process whose turn it is, if every process is waiting or done
    /// and nothing runs.
    fn chosen(s: &State) -> Option<usize> {
        if s.running.is_some() || s.procs.iter().any(|p| p.status == Status::Between) {
            return None;
        }
        s.procs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.status == Status::Waiting)
            .min_by_key(|(i, p)| (p.ready_ns, *i))
            .map(|(i, _)| i)
    }

    /// Starts a file-system call costing `cpu_ns` of CPU on this thread's
    /// process; the call runs while the returned guard lives. Outside a
    /// run (setup), a no-op.
    pub fn call(&self, cpu_ns: u64) -> CallGuard<'_> {
        let Some(u) = USER.with(|c| c.get()) else {
            return CallGuard {
                sim: self,
                user: None,
            };
        };
        let mut s = self.lock();
        assert_eq!(s.procs[u].status, Status::Between, "nested simulated call");
        s.procs[u].status = Status::Waiting;
        self.turn.notify_all();
        loop {
            if Self::chosen(&s) == Some(u) {
                break;
            }
            s = self.turn.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        let start = s.procs[u].ready_ns.max(s.cpu_free_ns);
        // The syncer's ticks due before this call starts.
        while s.next_tick_ns <= start {
            let tick = s.next_tick_ns;
            s.next_tick_ns += self.syncer_ns;
            s.running = Some(Actor::Syncer);
            s.now_ns = tick;
            drop(s);
            let fs = self.fs.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let r = fs.map(|fs| fs.write_back());
            s = self.lock();
            if let Some(Err(e)) = r {
                s.syncer_error.get_or_insert(e.to_string());
            }
        }
        let mut start = s.procs[u].ready_ns.max(s.cpu_free_ns);
        // Memory: buffers under background write stay pinned until the
        // disk completes them; past the bound, the call waits for enough
        // of them (the paper's processes blocking on buffers when the
        // driver's queue outgrows memory).
        while let Some(&(end, bytes)) = s.in_flight.front() {
            if end > start && s.in_flight_bytes <= self.in_flight_max {
                break;
            }
            start = start.max(end);
            s.in_flight_bytes -= bytes;
            s.in_flight.pop_front();
        }
        s.cpu_free_ns = start + cpu_ns;
        s.procs[u].cpu_ns += cpu_ns;
        s.procs[u].status = Status::Running;
        s.running = Some(Actor::User(u));
        s.now_ns = start + cpu_ns;
        CallGuard {
            sim: self,
            user: Some(u),
        }
    }

    /// A disk request served in `service_ns` by the model.
    fn request(&self, kind: ReqKind, bytes: u64, service_ns: u64) {
        let mut s = self.lock();
        let Some(actor) = s.running else {
            return; // setup: not measured
        };
        let arrival = s.now_ns;
        let end = arrival.max(s.disk_free_ns) + service_ns;
        s.disk_free_ns = end;
        s.disk.busy_ns += service_ns;
        match kind {
            ReqKind::Read => s.disk.reads += 1,
            ReqKind::Write => s.disk.writes += 1,
            ReqKind::Flush => s.disk.flushes += 1,
        }
        if kind != ReqKind::Flush {
            s.disk.response_ns += end - arrival;
        }
        match actor {
            Actor::User(_) => s.now_ns = end,
            Actor::Syncer if kind == ReqKind::Write => {
                s.in_flight.push_back((end, bytes));
                s.in_flight_bytes += bytes;
            }
            Actor::Syncer => {}
        }
    }

    /// The clock of the running actor (or the horizon outside a call).
    pub fn now_ns(&self) -> u64 {
        let s = self.lock();
        if s.running.is_some() {
            s.now_ns
        } else {
            drop(s);
            self.horizon_ns()
        }
    }
}

/// A file-system call in progress; ends the call when dropped.
pub struct CallGuard<'a> {
    sim: &'a Sim,
    user: Option<usize>,
}

impl CallGuard<'_> {
    /// Charges `cpu_ns` more CPU to the call, after what it did so far
    /// (a cost known only once the call has run: bytes read, entries
    /// listed).
    pub fn charge(&self, cpu_ns: u64) {
        let Some(u) = self.user else { return };
        let mut s = self.sim.lock();
        let start = s.now_ns.max(s.cpu_free_ns);
        s.now_ns = start + cpu_ns;
        s.cpu_free_ns = s.now_ns;
        s.procs[u].cpu_ns += cpu_ns;
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        let Some(u) = self.user else { return };
        let mut s = self.sim.lock();
        assert_eq!(s.running, Some(Actor::User(u)), "call ended by another");
        s.procs[u].ready_ns = s.now_ns;
        s.procs[u].status = Status::Between;
        s.running = None;
        drop(s);
        self.sim.turn.notify_all();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReqKind {
    Read,
    Write,
    Flush,
}

/// The device the simulated file system sees: the timing model, with each
/// request put on the simulated disk's timeline.
pub struct SimDevice {
    disk: Arc<Disk>,
    sim: Arc<Sim>,
}

impl SimDevice {
    /// `disk` under `sim`.
    pub fn new(disk: Arc<Disk>, sim: Arc<Sim>) -> SimDevice {
        SimDevice { disk, sim }
    }

    fn timed<T>(
        &self,
        kind: ReqKind,
        bytes: usize,
        f: impl FnOnce(&Disk) -> io::Result<T>,
    ) -> io::Result<T> {
        let t0 = self.disk.virtual_time_ns();
        let r = f(&self.disk);
        let service = self.disk.virtual_time_ns().saturating_sub(t0);
        self.sim.request(kind, bytes as u64, service);
        r
    }
}

impl BlockDevice for SimDevice {
    fn block_size(&self) -> u32 {
        self.disk.block_size()
    }
    fn block_count(&self) -> u64 {
        self.disk.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> io::Result<()> {
        self.timed(ReqKind::Read, buf.len(), |d| d.read(block, buf, class))
    }
    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> io::Result<Ticket> {
        self.timed(ReqKind::Write, data.len(), |d| d.write(block, data, flags))
    }
    fn flush(&self) -> io::Result<()> {
        self.timed(ReqKind::Flush, 0, |d| d.flush())
    }
    fn durable(&self) -> Ticket {
        self.disk.durable()
    }
    fn counters(&self) -> Counters {
        self.disk.counters()
    }
    fn timing(&self) -> Option<&dyn Timing> {
        self.disk.timing()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem_disk() -> Arc<Disk> {
        let mem = Arc::new(MemDevice::new(4096, 1 << 14).unwrap());
        Arc::new(TimedDevice::new(mem, ordo_dev::DiskModel::hp_c2447()).unwrap())
    }

    #[test]
    fn cpu_overlaps_another_process_disk_wait() {
        let sim = Sim::new(CpuModel::PAPER, 1_000_000_000_000, 1 << 20);
        let dev = SimDevice::new(mem_disk(), sim.clone());
        let st = || {
            let s = sim.lock();
            (s.cpu_free_ns, s.disk_free_ns)
        };
        // Two processes: 0 makes a call with a disk read, 1 a CPU-only call.
        sim.lock().procs = vec![
            Proc {
                status: Status::Between,
                ready_ns: 0,
                cpu_ns: 0,
            };
            2
        ];
        // One process at a time makes calls here; the other is parked
        // (marked done) so the turn needs no thread for it.
        sim.lock().procs[1].status = Status::Done;
        USER.with(|c| c.set(Some(0)));
        {
            let _g = sim.call(1_000);
            let mut buf = vec![0u8; 4096];
            dev.read(5000, &mut buf, BlockClass::Data).unwrap();
        }
        let (cpu, disk) = st();
        assert_eq!(cpu, 1_000);
        assert!(disk > 1_000_000, "a random read costs milliseconds: {disk}");
        let p0 = sim.lock().procs[0].ready_ns;
        assert_eq!(p0, disk, "the reader waited for its read");
        // Process 0 goes back to its workload; process 1 gets the CPU at
        // once, while 0's read is still on the disk.
        {
            let mut s = sim.lock();
            s.procs[0].status = Status::Done;
            s.procs[1].status = Status::Between;
        }
        USER.with(|c| c.set(Some(1)));
        {
            let _g = sim.call(2_000);
        }
        assert_eq!(sim.lock().procs[1].ready_ns, 3_000);
        assert_eq!(sim.disk().reads, 1);
        USER.with(|c| c.set(None));
    }
}
