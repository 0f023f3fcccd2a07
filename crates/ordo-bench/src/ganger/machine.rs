//! One simulated machine per run: a fresh image on a memory device, set up
//! untimed, remounted cold on the paper's disk model under [`Sim`], and the
//! workload's calls made through [`SimVfs`], which charges each its CPU.

use std::path::Path;
use std::sync::Arc;

use ordo_dev::{DiskModel, MemDevice, TimedDevice};
use ordo_fs::clock::{SimClock, Timespec};
use ordo_fs::fsck::FsckOptions;
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Fs, MountOptions, ProtocolKind};

use super::sim::{CallGuard, CpuModel, Disk, Sim, SimDevice};
use crate::error::{BenchError, Result};
use crate::vfs::{LibVfs, VFile, Vfs};

/// Size of the simulated disk: the HP C2447's 1 GB, so that seek distances
/// are fractions of the paper's disk.
pub const DISK_BYTES: u64 = 1 << 30;
/// ordo's buffer cache: the paper's machine had 44 MB for the system, and
/// SVR4's file cache shared it with virtual memory.
pub const CACHE_BYTES: u64 = 32 << 20;
/// Most bytes of background writes in flight (buffers the disk has not
/// written yet) before a process waits for memory: a quarter of the cache.
pub const IN_FLIGHT_BYTES_MAX: u64 = CACHE_BYTES / 4;
/// The syncer's period.
pub const SYNCER_NS: u64 = 1_000_000_000;
/// Block size of the image.
const BLOCK_SIZE: u32 = 4096;
/// Every timestamp the file system writes (deterministic images).
const EPOCH_SEC: i64 = 1_700_000_000;

fn err(detail: impl Into<String>) -> BenchError {
    BenchError::Workload {
        workload: "ganger".into(),
        detail: detail.into(),
    }
}

/// A fresh, deterministic ext4 image with the features `mode` asks of
/// mkfs (a journal for the journaling protocols).
pub fn fresh_image(mode: ProtocolKind, seed: u64) -> Result<Arc<MemDevice>> {
    let mem = Arc::new(
        MemDevice::new(BLOCK_SIZE, DISK_BYTES / BLOCK_SIZE as u64)
            .map_err(|e| err(e.to_string()))?,
    );
    let features = parse_features(mode.spec().mkfs_features, DEFAULT_FEATURES)
        .map_err(|e| err(format!("mkfs features of {mode}: {e}")))?;
    let opts = MkfsOptions {
        features,
        uuid: Some([0x6a; 16]),
        hash_seed: Some([0x5e; 16]),
        seed: Some(seed),
        time_sec: Some(EPOCH_SEC as u64),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(&*mem, &opts).map_err(|e| err(format!("mkfs: {e}")))?;
    Ok(mem)
}

fn options(mode: ProtocolKind, seed: u64) -> MountOptions {
    MountOptions {
        mode,
        cache_bytes: CACHE_BYTES,
        // The syncer is the simulation's; no timer thread.
        background: false,
        clock: Some(Arc::new(SimClock::fixed(Timespec {
            sec: EPOCH_SEC,
            nsec: 0,
        }))),
        seed: Some(seed),
        ..MountOptions::default()
    }
}

/// Mounts `mem` untimed, runs `setup` on it, unmounts.
pub fn setup(
    mem: &Arc<MemDevice>,
    mode: ProtocolKind,
    seed: u64,
    setup: impl FnOnce(&dyn Vfs) -> Result<()>,
) -> Result<()> {
    let fs = Arc::new(
        Fs::mount(mem.clone(), options(mode, seed)).map_err(|e| err(format!("mount: {e}")))?,
    );
    {
        let vfs = LibVfs::new(fs.clone(), None);
        setup(&vfs)?;
    }
    let fs = Arc::try_unwrap(fs).map_err(|_| err("setup still holds the file system"))?;
    fs.unmount().map_err(|e| err(format!("unmount: {e}")))
}

/// A mounted, simulated machine.
pub struct Machine {
    /// The simulation.
    pub sim: Arc<Sim>,
    /// The file system.
    pub fs: Arc<Fs>,
    /// The disk model under it.
    pub disk: Arc<Disk>,
}

impl Machine {
    /// Mounts `mem` cold on `model` with `mode`, under a fresh simulation.
    pub fn mount(
        mem: &Arc<MemDevice>,
        model: DiskModel,
        mode: ProtocolKind,
        cpu: CpuModel,
        seed: u64,
    ) -> Result<Machine> {
        let sim = Sim::new(cpu, SYNCER_NS, IN_FLIGHT_BYTES_MAX);
        let disk = Arc::new(TimedDevice::new(mem.clone(), model).map_err(|e| err(e.to_string()))?);
        let dev = Arc::new(SimDevice::new(disk.clone(), sim.clone()));
        let fs = Fs::mount(dev, options(mode, seed)).map_err(|e| err(format!("mount: {e}")))?;
        Ok(Machine {
            sim,
            fs: Arc::new(fs),
            disk,
        })
    }

    /// The file-system interface of the simulated processes.
    pub fn vfs(&self) -> SimVfs {
        SimVfs {
            inner: LibVfs::new(self.fs.clone(), None),
            sim: self.sim.clone(),
        }
    }

    /// Unmounts (untimed) and checks the image with ordo's fsck.
    pub fn unmount(self) -> Result<()> {
        let Machine { sim, fs, disk } = self;
        drop(sim);
        let fs = Arc::try_unwrap(fs).map_err(|_| err("the run still holds the file system"))?;
        fs.unmount().map_err(|e| err(format!("unmount: {e}")))?;
        let report = ordo_fs::fsck::check(disk.inner().as_ref(), &FsckOptions::default())
            .map_err(|e| err(format!("fsck after the run: {e}")))?;
        if let Some(p) = report.problems.first() {
            return Err(err(format!(
                "the image is not clean after the run ({} problems; first: {p})",
                report.problems.len()
            )));
        }
        Ok(())
    }
}

/// [`LibVfs`] with each call charged on the simulated machine.
pub struct SimVfs {
    inner: LibVfs,
    sim: Arc<Sim>,
}

impl SimVfs {
    fn call(&self, cpu_ns: u64) -> CallGuard<'_> {
        self.sim.call(cpu_ns)
    }
    fn cpu(&self) -> CpuModel {
        self.sim.cpu()
    }
    fn file(&self, f: Box<dyn VFile>) -> Box<dyn VFile> {
        Box::new(SimFile {
            inner: Some(f),
            sim: self.sim.clone(),
        })
    }
}

struct SimFile {
    /// Taken at drop, to close it inside a simulated call.
    inner: Option<Box<dyn VFile>>,
    sim: Arc<Sim>,
}

impl SimFile {
    fn f(&self) -> &dyn VFile {
        self.inner.as_deref().expect("an open file")
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        let _g = self.sim.call(self.sim.cpu().close_ns);
        self.inner.take();
    }
}

impl VFile for SimFile {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let _g = self.sim.call(self.sim.cpu().rw(data.len()));
        self.f().write_at(offset, data)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let g = self.sim.call(self.sim.cpu().rw_ns);
        let n = self.f().read_at(offset, buf)?;
        g.charge(self.sim.cpu().rw(n) - self.sim.cpu().rw_ns);
        Ok(n)
    }
    fn fsync(&self) -> Result<()> {
        let _g = self.sim.call(self.sim.cpu().rw_ns);
        self.f().fsync()
    }
    fn size_bytes(&self) -> Result<u64> {
        let _g = self.sim.call(self.sim.cpu().stat_ns);
        self.f().size_bytes()
    }
}

impl Vfs for SimVfs {
    fn create(&self, path: &str) -> Result<Box<dyn VFile>> {
        let f = {
            let _g = self.call(self.cpu().create_ns);
            self.inner.create(path)?
        };
        Ok(self.file(f))
    }
    fn open(&self, path: &str) -> Result<Box<dyn VFile>> {
        let f = {
            let _g = self.call(self.cpu().open_ns);
            self.inner.open(path)?
        };
        Ok(self.file(f))
    }
    fn mkdir(&self, path: &str) -> Result<()> {
        let _g = self.call(self.cpu().mkdir_ns);
        self.inner.mkdir(path)
    }
    fn unlink(&self, path: &str) -> Result<()> {
        let _g = self.call(self.cpu().unlink_ns);
        self.inner.unlink(path)
    }
    fn rmdir(&self, path: &str) -> Result<()> {
        let _g = self.call(self.cpu().rmdir_ns);
        self.inner.rmdir(path)
    }
    fn size(&self, path: &str) -> Result<u64> {
        let _g = self.call(self.cpu().stat_ns);
        self.inner.size(path)
    }
    fn list(&self, dir: &str) -> Result<Vec<(String, bool)>> {
        let g = self.call(self.cpu().list_ns);
        let names = self.inner.list(dir)?;
        g.charge(self.cpu().list_entry_ns * names.len() as u64);
        Ok(names)
    }
    fn host_path(&self) -> Option<&Path> {
        None
    }
    fn now_ns(&self) -> u64 {
        self.sim.now_ns()
    }
    fn virtual_time(&self) -> bool {
        true
    }
}
