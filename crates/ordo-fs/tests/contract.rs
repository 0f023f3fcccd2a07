//! The protocol contract, tested with a protocol that lives only here: the
//! core passes every block image it sends to the device through the
//! protocol's `prepare_block_write`; plans carry ordering the executor
//! honours; and after each plan the protocol learns every write's ticket
//! and the device's durable horizon.
//!
//! The test protocol ("stamp") writes like `async` (every dirty block;
//! a flush on fsync and sync, none on the timer) and stamps every image
//! it prepares: it records the image's checksum under its block. A device
//! wrapper checks every image that reaches it against those stamps.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use ordo_dev::{BlockClass, BlockDevice, MemDevice, Ticket, WriteCacheDevice, WriteFlags};
use ordo_fs::cache::BufferCache;
use ordo_fs::mkfs::{mkfs, MkfsOptions};
use ordo_fs::protocol::{
    self, Capabilities, Io, IoPlan, IoStep, PlanDone, Protocol, ProtocolEnv, ProtocolSpec,
    Recovered, WriteBackReason, WriteId,
};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, Result, ROOT_INO};

/// What one mount of the test protocol saw, shared with its test (by the
/// file system's UUID: a spec's `build` is a plain function).
#[derive(Default)]
struct Seen {
    /// Whether `prepare_block_write` is asked for (false: a protocol that
    /// does not stamp, to show the device check fails).
    stamping: bool,
    /// (block, crc32c) of every image prepared.
    stamped: HashSet<(u64, u32)>,
    /// Every plan outcome.
    done: Vec<PlanDone>,
}

/// Each mount's [`Seen`], by UUID.
type Registry = Mutex<HashMap<[u8; 16], Arc<Mutex<Seen>>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Default::default)
}

fn seen_for(uuid: [u8; 16]) -> Arc<Mutex<Seen>> {
    registry().lock().unwrap().entry(uuid).or_default().clone()
}

struct Stamp {
    seen: Arc<Mutex<Seen>>,
}

impl Stamp {
    fn write_all(&mut self, io: &mut Io, flush: bool) {
        let dirty = io.dirty_blocks();
        io.write_home_runs(&dirty, false, 16);
        if flush {
            io.flush();
        }
    }
}

impl Protocol for Stamp {
    fn name(&self) -> &'static str {
        "stamp"
    }
    fn fsync(&mut self, _ino: ordo_fs::Ino, _datasync: bool, io: &mut Io) -> Result<()> {
        self.write_all(io, true);
        Ok(())
    }
    fn sync(&mut self, io: &mut Io) -> Result<()> {
        self.write_all(io, true);
        Ok(())
    }
    fn write_back(&mut self, reason: WriteBackReason, io: &mut Io) -> Result<()> {
        self.write_all(io, reason == WriteBackReason::Unmount);
        Ok(())
    }
    fn prepares_block_writes(&self) -> bool {
        self.seen.lock().unwrap().stamping
    }
    fn prepare_block_write(&mut self, block: u64, image: &mut [u8]) {
        self.seen
            .lock()
            .unwrap()
            .stamped
            .insert((block, crc32c::crc32c(image)));
    }
    fn plan_done(&mut self, done: &PlanDone) {
        self.seen.lock().unwrap().done.push(done.clone());
    }
}

fn build_stamp(_r: Recovered, env: &ProtocolEnv) -> Result<Box<dyn Protocol>> {
    Ok(Box::new(Stamp {
        seen: seen_for(env.uuid),
    }))
}

static STAMP: ProtocolSpec = ProtocolSpec {
    name: "stamp",
    summary: "test protocol: async writes, every image stamped",
    variants: &[],
    mkfs_features: "",
    caps: Capabilities {
        ..Capabilities::NONE
    },
    recover: protocol::recover_nothing,
    build: build_stamp,
};

/// A device that checks every image written to it outside the log
/// against the stamps of one mount.
struct CheckStamps<D: BlockDevice> {
    inner: D,
    seen: Arc<Mutex<Seen>>,
    unstamped: Mutex<Vec<u64>>,
    images: Mutex<u64>,
}

impl<D: BlockDevice> BlockDevice for CheckStamps<D> {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8], class: BlockClass) -> std::io::Result<()> {
        self.inner.read(block, buf, class)
    }
    fn write(&self, block: u64, data: &[u8], flags: WriteFlags) -> std::io::Result<Ticket> {
        let bs = self.block_size() as usize;
        {
            let seen = self.seen.lock().unwrap();
            for (i, img) in data.chunks(bs).enumerate() {
                *self.images.lock().unwrap() += 1;
                if !seen
                    .stamped
                    .contains(&(block + i as u64, crc32c::crc32c(img)))
                {
                    self.unstamped.lock().unwrap().push(block + i as u64);
                }
            }
        }
        self.inner.write(block, data, flags)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn durable(&self) -> Ticket {
        self.inner.durable()
    }
    fn counters(&self) -> ordo_dev::Counters {
        self.inner.counters()
    }
}

fn image(uuid: [u8; 16]) -> MemDevice {
    let dev = MemDevice::new(4096, 4096).unwrap();
    let opts = MkfsOptions {
        block_size: 4096,
        uuid: Some(uuid),
        hash_seed: Some(*b"ordo-contract-h!"),
        time_sec: Some(1_700_000_000),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(&dev, &opts).unwrap();
    dev
}

fn workload(fs: &Fs) {
    let c = Creds::root();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, &c).unwrap();
    for i in 0..20u32 {
        let f = fs
            .create(
                d.ino,
                format!("f{i}").as_bytes(),
                FileType::Regular,
                0o644,
                0,
                &c,
            )
            .unwrap();
        fs.write(f.ino, 0, &vec![i as u8; 3000 + 700 * i as usize])
            .unwrap();
        if i % 5 == 0 {
            fs.fsync(f.ino, false).unwrap();
        }
    }
    fs.rename(d.ino, b"f3", ROOT_INO, b"moved", Default::default())
        .unwrap();
    fs.unlink(d.ino, b"f4").unwrap();
    fs.write_back().unwrap();
    fs.sync().unwrap();
}

fn mount_stamp(dev: Arc<dyn BlockDevice>) -> Fs {
    Fs::mount(
        dev,
        MountOptions {
            mode: ProtocolKind::from_spec(&STAMP),
            ..MountOptions::default()
        },
    )
    .unwrap()
}

/// Every image that reached the device went through the protocol's
/// `prepare_block_write`.
#[test]
fn every_image_passes_prepare_block_write() {
    let uuid = *b"contract-stamp-1";
    let seen = seen_for(uuid);
    seen.lock().unwrap().stamping = true;
    let dev = Arc::new(CheckStamps {
        inner: image(uuid),
        seen: seen.clone(),
        unstamped: Mutex::new(Vec::new()),
        images: Mutex::new(0),
    });
    let fs = mount_stamp(dev.clone());
    workload(&fs);
    fs.unmount().unwrap();
    let images = *dev.images.lock().unwrap();
    assert!(images > 40, "the workload wrote {images} images");
    let bad = dev.unstamped.lock().unwrap().clone();
    assert!(bad.is_empty(), "unstamped images reached blocks {bad:?}");
}

/// The device check fails when images skip the hook: a protocol that
/// says it does not prepare images gets none prepared, and every image
/// reaches the device unstamped.
#[test]
fn the_stamp_check_catches_images_that_skip_the_hook() {
    let uuid = *b"contract-stamp-2";
    let seen = seen_for(uuid);
    seen.lock().unwrap().stamping = false;
    let dev = Arc::new(CheckStamps {
        inner: image(uuid),
        seen,
        unstamped: Mutex::new(Vec::new()),
        images: Mutex::new(0),
    });
    let fs = mount_stamp(dev.clone());
    workload(&fs);
    fs.unmount().unwrap();
    let bad = dev.unstamped.lock().unwrap().len() as u64;
    assert!(bad > 0);
    assert_eq!(bad, *dev.images.lock().unwrap());
}

/// After each plan the protocol learns every write's ticket and the
/// durable horizon: on a volatile write cache, write-back without a flush
/// leaves its writes above the horizon; an fsync's flush brings the
/// horizon over every write before it.
#[test]
fn plans_report_tickets_and_the_durable_horizon() {
    let uuid = *b"contract-stamp-3";
    let seen = seen_for(uuid);
    let dev = Arc::new(WriteCacheDevice::new(image(uuid)));
    let fs = mount_stamp(dev.clone());
    let c = Creds::root();
    let f = fs
        .create(ROOT_INO, b"f", FileType::Regular, 0o644, 0, &c)
        .unwrap();
    fs.write(f.ino, 0, &[7u8; 10_000]).unwrap();
    seen.lock().unwrap().done.clear();
    fs.write_back().unwrap();
    let wb = seen.lock().unwrap().done.clone();
    assert_eq!(wb.len(), 1, "one write-back plan");
    let wb = &wb[0];
    assert!(wb.ok && !wb.writes.is_empty());
    let ids: Vec<WriteId> = wb.writes.iter().map(|w| w.0).collect();
    assert!(ids.windows(2).all(|p| p[0] < p[1]), "ids in issue order");
    assert!(
        wb.writes.windows(2).all(|p| p[0].2 < p[1].2),
        "tickets grow in issue order"
    );
    for &(id, _, t) in &wb.writes {
        assert!(
            t > wb.durable,
            "write {id:?} (ticket {t}) is not durable without a flush"
        );
        assert!(!wb.is_durable(id));
    }
    fs.write(f.ino, 0, &[8u8; 100]).unwrap();
    seen.lock().unwrap().done.clear();
    fs.fsync(f.ino, false).unwrap();
    let fsync = seen.lock().unwrap().done.clone();
    assert_eq!(fsync.len(), 1);
    let last = fsync[0].writes.last().expect("fsync wrote").2;
    assert!(
        fsync[0].durable >= last,
        "the fsync's flush made its writes durable"
    );
    assert!(wb.writes.iter().all(|w| w.2 <= fsync[0].durable));
    assert!(fsync[0].serial > wb.serial, "plans are numbered in order");
    fs.unmount().unwrap();
}

/// A write may be ordered after earlier writes of its plan or of earlier
/// plans, and a barrier orders without flushing; the default executor
/// issues in order, which honours both.
#[test]
fn ordering_after_earlier_writes_and_barriers() {
    let mem = MemDevice::new(4096, 64).unwrap();
    let mut cache = BufferCache::new(4096, 1 << 20);
    let mut plan = IoPlan::numbered(5);
    {
        let mut io = Io::new(&mut cache, &mut plan);
        io.write_raw(
            3,
            Arc::new(vec![1; 4096]),
            WriteFlags::new(BlockClass::Other),
        );
        let a = io.last_write().unwrap();
        io.barrier();
        io.write_raw(
            9,
            Arc::new(vec![2; 4096]),
            WriteFlags::new(BlockClass::Other),
        );
        let b = io.last_write().unwrap();
        io.order_after(b, a);
        io.order_after(b, WriteId { plan: 4, index: 17 });
        assert_eq!(a, WriteId { plan: 5, index: 0 });
        assert_eq!(b, WriteId { plan: 5, index: 1 });
    }
    assert!(plan.steps.iter().any(|s| matches!(s, IoStep::Barrier)));
    let (done, r) = protocol::execute_plan(&plan, &mem);
    r.unwrap();
    assert!(done.ok);
    assert_eq!(
        done.writes.iter().map(|w| w.1).collect::<Vec<_>>(),
        vec![3, 9],
        "issued in order"
    );
    let mut buf = vec![0u8; 4096];
    mem.read(9, &mut buf, BlockClass::Other).unwrap();
    assert_eq!(buf, vec![2; 4096]);
}

/// A write's index counts every write before it in the plan: those the
/// `Io` appended, flushes and barriers between them not counted, and steps
/// a caller put in the plan by hand.
#[test]
fn write_ids_count_every_earlier_write_of_the_plan() {
    let mut cache = BufferCache::new(4096, 1 << 20);
    let mut plan = IoPlan::numbered(7);
    let w = |b: u64| IoStep::Write {
        block: b,
        data: Arc::new(vec![0; 4096]).into(),
        flags: WriteFlags::new(BlockClass::Other),
        after: Vec::new(),
    };
    plan.steps = vec![w(1), IoStep::Flush, w(2)];
    let flags = WriteFlags::new(BlockClass::Other);
    let ids: Vec<WriteId> = {
        let mut io = Io::new(&mut cache, &mut plan);
        let mut ids = Vec::new();
        for b in 10..1010u64 {
            ids.push(io.write_raw_after(b, Arc::new(vec![1; 4096]), flags, Vec::new()));
            if b % 100 == 0 {
                io.flush();
                io.barrier();
            }
        }
        ids
    };
    plan.steps.push(w(5000));
    let next = {
        let mut io = Io::new(&mut cache, &mut plan);
        io.write_raw_after(5001, Arc::new(vec![1; 4096]), flags, Vec::new())
    };
    let want: Vec<u32> = (2..1002).collect();
    assert_eq!(ids.iter().map(|i| i.index).collect::<Vec<_>>(), want);
    assert!(ids.iter().all(|i| i.plan == 7));
    assert_eq!(next.index, 1003, "the write pushed by hand counts too");
    let by_walk: Vec<WriteId> = plan.writes().map(|(id, _)| id).collect();
    assert_eq!(by_walk.len(), 1004);
    assert_eq!(by_walk[2..1002], ids[..]);
    assert_eq!(by_walk[1003], next);
}

/// A run written home is the cache's own images, gathered by the device
/// in one request: the plan holds no copy of them. A block changed after
/// the plan was made keeps the planned image (copy-on-write), and the
/// device receives the bytes as they were planned.
#[test]
fn runs_written_home_share_the_cached_images() {
    let mem = MemDevice::new(4096, 64).unwrap();
    let mut cache = BufferCache::new(4096, 1 << 20);
    for b in 10..14u64 {
        cache.insert_new(b, BlockClass::Data, vec![b as u8; 4096]);
    }
    cache.insert_new(20, BlockClass::Data, vec![20; 4096]);
    let mut plan = IoPlan::numbered(1);
    {
        let mut io = Io::new(&mut cache, &mut plan);
        io.write_home_runs(&[10, 11, 12, 13, 20], false, 256);
    }
    let writes: Vec<(u64, &ordo_fs::protocol::BlockImages)> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            IoStep::Write { block, data, .. } => Some((*block, data)),
            _ => None,
        })
        .collect();
    assert_eq!(writes.len(), 2, "one write per run");
    assert_eq!(writes[0].0, 10);
    assert_eq!(writes[0].1.parts().len(), 4);
    assert_eq!(writes[0].1.len(), 4 * 4096);
    for (k, part) in writes[0].1.parts().iter().enumerate() {
        let cached = cache.snapshot(10 + k as u64).unwrap();
        assert!(Arc::ptr_eq(part, &cached), "block {}: copied", 10 + k);
    }
    cache.modify(11, 0, &[0xee; 8]);
    assert_eq!(writes[1].1.parts().len(), 1);
    let (done, r) = protocol::execute_plan(&plan, &mem);
    r.unwrap();
    assert_eq!(done.writes.len(), 2);
    let mut buf = vec![0u8; 4 * 4096];
    mem.read(10, &mut buf, BlockClass::Data).unwrap();
    for k in 0..4usize {
        assert!(buf[k * 4096..(k + 1) * 4096]
            .iter()
            .all(|&x| x == 10 + k as u8));
    }
    assert_eq!(mem.counters().class(BlockClass::Data).writes, 2);

    // Raw images (a checkpoint's committed copies, a commit's log blocks)
    // are gathered the same way: consecutive blocks of one class in one
    // write, each image as it was handed over.
    let imgs: Vec<Arc<Vec<u8>>> = (0..3u8).map(|k| Arc::new(vec![k; 4096])).collect();
    let mut plan = IoPlan::numbered(2);
    let n = {
        let mut io = Io::new(&mut cache, &mut plan);
        io.write_raw_runs(
            [
                (30, BlockClass::Journal, imgs[0].clone()),
                (31, BlockClass::Journal, imgs[1].clone()),
                (33, BlockClass::Journal, imgs[2].clone()),
            ],
            false,
        )
    };
    assert_eq!(n, 2, "a gap ends a run");
    let IoStep::Write { block, data, .. } = &plan.steps[0] else {
        panic!("a write first")
    };
    assert_eq!(*block, 30);
    assert_eq!(data.parts().len(), 2);
    assert!(Arc::ptr_eq(&data.parts()[0], &imgs[0]) && Arc::ptr_eq(&data.parts()[1], &imgs[1]));
}

/// Naming a write that is not earlier is a protocol bug, caught when the
/// plan is made.
#[test]
#[should_panic(expected = "cannot be ordered after")]
fn ordering_after_a_later_write_is_refused() {
    let mut cache = BufferCache::new(4096, 1 << 20);
    let mut plan = IoPlan::numbered(1);
    let mut io = Io::new(&mut cache, &mut plan);
    io.write_raw(
        3,
        Arc::new(vec![1; 4096]),
        WriteFlags::new(BlockClass::Other),
    );
    let a = io.last_write().unwrap();
    io.order_after(a, WriteId { plan: 2, index: 0 });
}

/// The executor checks the same of a plan built by hand.
#[test]
#[should_panic(expected = "which is not earlier")]
fn the_executor_refuses_a_dependency_on_a_later_write() {
    let mem = MemDevice::new(4096, 64).unwrap();
    let mut plan = IoPlan::numbered(1);
    plan.steps.push(IoStep::Write {
        block: 1,
        data: Arc::new(vec![0; 4096]).into(),
        flags: WriteFlags::new(BlockClass::Other),
        after: vec![WriteId { plan: 1, index: 1 }],
    });
    plan.steps.push(IoStep::Write {
        block: 2,
        data: Arc::new(vec![0; 4096]).into(),
        flags: WriteFlags::new(BlockClass::Other),
        after: Vec::new(),
    });
    let _ = protocol::execute_plan(&plan, &mem);
}

/// The registry: names unique, features valid, and every question the
/// crash explorer and the harness ask answered by capabilities.
#[test]
fn the_registry_describes_every_protocol() {
    let names: Vec<&str> = ProtocolKind::all().map(|k| k.name()).collect();
    let unique: HashSet<&&str> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    for k in ProtocolKind::all() {
        let _ = k.required_features();
        assert_eq!(k.name().parse::<ProtocolKind>().unwrap(), k);
        assert!(!k.spec().summary.is_empty());
        if k.caps().kernel_replays {
            assert!(k.caps().log_replay, "{k}: the kernel replays only logs");
        }
    }
    assert!("nope".parse::<ProtocolKind>().is_err());
    assert_eq!(ProtocolKind::from_spec(&STAMP).name(), "stamp");
}
