//! Deterministic runs: the same workload, mkfs options, clock and seed write
//! the same bytes.
//!
//! For every protocol (and every JBD2 data mode), a library workload runs
//! twice from mkfs to unmount with a simulated clock and a fixed seed, on
//! (a) a memory device and (b) the timing model over the write-cache
//! model, and the two final images must be byte-identical. On the model
//! device the virtual time, a power-cut image taken before the unmount
//! (seeded), and that image after recovery (log replay, or the benign
//! repair for `async`/`sync`) must match too.
//!
//! The last tests show the comparison can fail: another seed, another
//! start time, or the system clock each give a different image.

use std::sync::Arc;

use ordo_dev::{BlockDevice, CrashPolicy, DiskModel, MemDevice, TimedDevice, WriteCacheDevice};
use ordo_fs::clock::{Clock, SimClock};
use ordo_fs::fsck::{check, FsckOptions};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{
    Creds, DataMode, FileType, Fs, MountOptions, ProtocolKind, RenameFlags, SetAttr, TimeSet,
    Timespec, ROOT_INO,
};

const BLOCK_SIZE: u32 = 4096;
/// 16 MiB: room for a 4 MiB journal and the workload.
const BLOCKS: u64 = 4096;
/// The simulated clock's start (2023-11-14) and step per reading.
const START_SEC: i64 = 1_700_000_000;
const STEP_NS: u64 = 1_000_017;
/// Seed of the power cut taken on the write-cache model.
const CRASH_SEED: u64 = 7;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Device {
    /// `MemDevice`: every write is durable at once.
    Mem,
    /// `TimedDevice<WriteCacheDevice<MemDevice>>`: virtual time charged per
    /// request, writes volatile until flushed.
    Model,
}

#[derive(Clone, Debug)]
enum ClockChoice {
    /// A `SimClock` starting at this second.
    Sim(i64),
    /// The default: the system clock.
    System,
}

#[derive(Clone, Debug)]
struct Config {
    mode: ProtocolKind,
    data: DataMode,
    device: Device,
    seed: u64,
    clock: ClockChoice,
}

impl Config {
    fn clock(&self) -> Option<Arc<dyn Clock>> {
        match self.clock {
            ClockChoice::Sim(sec) => {
                Some(Arc::new(SimClock::new(Timespec { sec, nsec: 0 }, STEP_NS)))
            }
            ClockChoice::System => None,
        }
    }
}

/// What one run leaves behind.
#[derive(Debug)]
struct Outcome {
    /// The device after the unmount (the medium, on the model device).
    image: Vec<u8>,
    /// Model device only: virtual time at the end.
    virtual_ns: Option<u64>,
    /// Model device only: the medium after a power cut just before the
    /// unmount, then that image after recovery, and what recovery said.
    crash: Option<Vec<u8>>,
    recovered: Option<Vec<u8>>,
    recovery: Option<String>,
}

/// Every protocol, with every data mode where the protocol has one.
fn configs() -> Vec<(ProtocolKind, DataMode)> {
    let mut out = Vec::new();
    for mode in ProtocolKind::all() {
        if mode.caps().data_modes {
            for data in [DataMode::Ordered, DataMode::Writeback, DataMode::Journal] {
                out.push((mode, data));
            }
        } else {
            out.push((mode, DataMode::Ordered));
        }
    }
    out
}

fn mkfs_options(mode: ProtocolKind) -> MkfsOptions {
    let features = parse_features(mode.spec().mkfs_features, DEFAULT_FEATURES).unwrap();
    let journaled = mode.caps().log_replay;
    MkfsOptions {
        block_size: BLOCK_SIZE,
        features,
        // UUID and hash seed drawn from the seed, not given.
        seed: Some(0x0bd0_5eed),
        time_sec: Some(START_SEC as u64 - 3600),
        journal_blocks: journaled.then_some(1024),
        assume_zeroed: true,
        ..MkfsOptions::default()
    }
}

fn mount_options(cfg: &Config) -> MountOptions {
    MountOptions {
        mode: cfg.mode,
        data: cfg.data,
        background: false,
        cache_bytes: 8 << 20,
        clock: cfg.clock(),
        seed: Some(cfg.seed),
        ..MountOptions::default()
    }
}

/// Bytes that differ from file to file and offset to offset.
fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ tag.wrapping_mul(0x9E37)) as u8)
        .collect()
}

/// Creates, writes, renames, unlinks, mkdir/rmdir, hard links, truncates,
/// timestamps, fsyncs and a sync.
fn workload(fs: &Fs) {
    let root = Creds::root();
    let file = |parent, name: &str| {
        fs.create(parent, name.as_bytes(), FileType::Regular, 0o644, 0, &root)
            .unwrap_or_else(|e| panic!("create {name}: {e}"))
            .ino
    };
    let d1 = fs.mkdir(ROOT_INO, b"d1", 0o755, &root).unwrap().ino;
    let d2 = fs.mkdir(ROOT_INO, b"d2", 0o755, &root).unwrap().ino;
    let mut files = Vec::new();
    for i in 0..24u64 {
        let parent = if i % 3 == 0 { d2 } else { d1 };
        let ino = file(parent, &format!("f{i}"));
        let len = 700 + (i as usize * 1931) % 20_000;
        fs.write(ino, (i % 4) * 4096, &pattern(i, len)).unwrap();
        files.push((parent, ino));
    }
    let big = file(ROOT_INO, "big");
    fs.write(big, 0, &pattern(99, 300 << 10)).unwrap();
    fs.fsync(big, false).unwrap();
    fs.fsync(files[7].1, false).unwrap();

    fs.link(files[3].1, d1, b"h3").unwrap();
    fs.link(files[4].1, ROOT_INO, b"h4").unwrap();
    fs.rename(d1, b"f4", d2, b"r4", RenameFlags::default())
        .unwrap();
    // Rename over an existing name.
    fs.rename(d1, b"f5", d1, b"f8", RenameFlags::default())
        .unwrap();
    fs.unlink(d1, b"f10").unwrap();
    fs.unlink(ROOT_INO, b"h4").unwrap();
    let trunc = |ino, size| {
        fs.setattr(
            ino,
            &SetAttr {
                size: Some(size),
                ..SetAttr::default()
            },
        )
        .unwrap();
    };
    trunc(files[11].1, 100);
    trunc(big, 50_000);
    trunc(files[13].1, 0);
    fs.setattr(
        files[14].1,
        &SetAttr {
            atime: Some(TimeSet::Now),
            mtime: Some(TimeSet::Now),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let sub = fs.mkdir(d2, b"sub", 0o700, &root).unwrap().ino;
    let s1 = file(sub, "s1");
    fs.write(s1, 0, &pattern(7, 5000)).unwrap();
    fs.rename(sub, b"s1", d1, b"moved", RenameFlags::default())
        .unwrap();
    fs.rmdir(d2, b"sub").unwrap();
    fs.fsync(s1, false).unwrap();
    fs.sync().unwrap();

    // After the sync: more, some of it fsynced, some left pending for the
    // power cut.
    for i in 24..40u64 {
        let ino = file(d2, &format!("g{i}"));
        fs.write(ino, 0, &pattern(i, 3000 + i as usize * 17))
            .unwrap();
        if i % 5 == 0 {
            fs.fsync(ino, i % 10 == 0).unwrap();
        }
    }
    fs.unlink(d2, b"f0").unwrap();
    fs.link(files[1].1, d2, b"h1").unwrap();
    fs.write(files[2].1, 1 << 16, &pattern(2, 9000)).unwrap();
    trunc(files[2].1, 70_000);
    fs.fsync(files[2].1, false).unwrap();
    fs.unlink(d1, b"f16").unwrap();
    fs.rename(d2, b"g25", d1, b"g25", RenameFlags::default())
        .unwrap();
}

/// Recover a power-cut image as the protocol's users would (log replay by
/// a mount, or the benign repair), with the run's clock; the recovered
/// image and a line saying what happened.
fn recover(cfg: &Config, crashed: MemDevice) -> (Vec<u8>, String) {
    let dev = Arc::new(crashed);
    let said = match cfg.mode.caps().log_replay {
        true => {
            let d: Arc<dyn BlockDevice> = dev.clone();
            match Fs::mount(d, mount_options(cfg)) {
                Ok(fs) => match fs.unmount() {
                    Ok(()) => "replayed".to_string(),
                    Err(e) => format!("unmount: {e}"),
                },
                Err(e) => format!("mount: {e}"),
            }
        }
        false => {
            let opts = FsckOptions {
                repair_benign: true,
                clock: cfg.clock(),
                ..FsckOptions::default()
            };
            match check(dev.as_ref(), &opts) {
                Ok(r) => format!("{} problems, repairs: {:?}", r.problems.len(), r.repairs),
                Err(e) => format!("fsck: {e}"),
            }
        }
    };
    (dev.to_image(), said)
}

fn run(cfg: &Config) -> Outcome {
    match cfg.device {
        Device::Mem => {
            let mem = Arc::new(MemDevice::new(BLOCK_SIZE, BLOCKS).unwrap());
            must(mkfs(mem.as_ref(), &mkfs_options(cfg.mode)), "mkfs", cfg);
            let dev: Arc<dyn BlockDevice> = mem.clone();
            let fs = must(Fs::mount(dev, mount_options(cfg)), "mount", cfg);
            workload(&fs);
            must(fs.unmount(), "unmount", cfg);
            Outcome {
                image: mem.to_image(),
                virtual_ns: None,
                crash: None,
                recovered: None,
                recovery: None,
            }
        }
        Device::Model => {
            let cache = WriteCacheDevice::new(MemDevice::new(BLOCK_SIZE, BLOCKS).unwrap());
            let model = Arc::new(TimedDevice::new(cache, DiskModel::hdd_7200()).unwrap());
            must(mkfs(model.as_ref(), &mkfs_options(cfg.mode)), "mkfs", cfg);
            let dev: Arc<dyn BlockDevice> = model.clone();
            let fs = must(Fs::mount(dev, mount_options(cfg)), "mount", cfg);
            workload(&fs);
            let crashed = must(
                model.inner().crash(CRASH_SEED, CrashPolicy::default()),
                "power cut",
                cfg,
            );
            let crash = crashed.to_image();
            must(fs.unmount(), "unmount", cfg);
            let (recovered, said) = recover(cfg, crashed);
            Outcome {
                image: model.inner().inner().to_image(),
                virtual_ns: Some(model.virtual_time_ns()),
                crash: Some(crash),
                recovered: Some(recovered),
                recovery: Some(said),
            }
        }
    }
}

/// `r`'s value, or a panic naming the step and the run.
fn must<T, E: std::fmt::Display>(r: Result<T, E>, what: &str, cfg: &Config) -> T {
    r.unwrap_or_else(|e| panic!("{what} ({cfg:?}): {e}"))
}

/// The first block where two images differ, or `None` when identical.
fn first_difference(a: &[u8], b: &[u8]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("lengths {} and {}", a.len(), b.len()));
    }
    let bs = BLOCK_SIZE as usize;
    let block = a.chunks(bs).zip(b.chunks(bs)).position(|(x, y)| x != y)?;
    let off = a[block * bs..]
        .iter()
        .zip(&b[block * bs..])
        .position(|(x, y)| x != y)
        .unwrap_or(0);
    let blocks = a
        .chunks(bs)
        .zip(b.chunks(bs))
        .filter(|(x, y)| x != y)
        .count();
    Some(format!(
        "{blocks} blocks differ, the first is block {block} at byte {off}"
    ))
}

/// Where two outcomes differ, or `None` when they are the same run.
fn outcome_difference(a: &Outcome, b: &Outcome) -> Option<String> {
    if let Some(d) = first_difference(&a.image, &b.image) {
        return Some(format!("final image: {d}"));
    }
    if a.virtual_ns != b.virtual_ns {
        return Some(format!(
            "virtual time: {:?} and {:?} ns",
            a.virtual_ns, b.virtual_ns
        ));
    }
    for (what, x, y) in [
        ("power-cut image", &a.crash, &b.crash),
        ("recovered image", &a.recovered, &b.recovered),
    ] {
        if let (Some(x), Some(y)) = (x, y) {
            if let Some(d) = first_difference(x, y) {
                return Some(format!("{what}: {d}"));
            }
        }
    }
    if a.recovery != b.recovery {
        return Some(format!("recovery: {:?} and {:?}", a.recovery, b.recovery));
    }
    None
}

fn config(mode: ProtocolKind, data: DataMode, device: Device) -> Config {
    Config {
        mode,
        data,
        device,
        seed: 42,
        clock: ClockChoice::Sim(START_SEC),
    }
}

fn same_runs_write_the_same_bytes(device: Device) {
    for (mode, data) in configs() {
        let cfg = config(mode, data, device);
        let a = run(&cfg);
        let b = run(&cfg);
        if let Some(d) = outcome_difference(&a, &b) {
            panic!("two runs of {cfg:?} differ: {d}");
        }
        eprintln!(
            "{} data={:?} on {:?}: identical{}",
            mode.name(),
            data,
            device,
            a.recovery
                .as_deref()
                .map(|r| format!(" (after the power cut: {r})"))
                .unwrap_or_default()
        );
    }
}

#[test]
fn same_seed_and_clock_give_identical_images_on_a_memory_device() {
    same_runs_write_the_same_bytes(Device::Mem);
}

#[test]
fn same_seed_and_clock_give_identical_images_on_the_model_device() {
    same_runs_write_the_same_bytes(Device::Model);
}

/// The generations differ with the seed, so the comparison above is not
/// blind to them.
#[test]
fn another_seed_gives_another_image() {
    for device in [Device::Mem, Device::Model] {
        let cfg = config(ProtocolKind::named("journal"), DataMode::Ordered, device);
        let other = Config {
            seed: 43,
            ..cfg.clone()
        };
        let d = outcome_difference(&run(&cfg), &run(&other));
        eprintln!("seed 42 vs 43 on {device:?}: {d:?}");
        assert!(d.is_some(), "another seed wrote the same image");
    }
}

/// The times differ with the clock: a simulated clock started elsewhere,
/// or the system clock (the default) in two runs.
#[test]
fn another_clock_gives_another_image() {
    for mode in [
        ProtocolKind::named("async"),
        ProtocolKind::named("fast_commit"),
    ] {
        let cfg = config(mode, DataMode::Ordered, Device::Mem);
        let later = Config {
            clock: ClockChoice::Sim(START_SEC + 1),
            ..cfg.clone()
        };
        let d = outcome_difference(&run(&cfg), &run(&later));
        eprintln!("{}: clock start +1 s: {d:?}", mode.name());
        assert!(d.is_some(), "another start time wrote the same image");

        let system = Config {
            clock: ClockChoice::System,
            ..cfg.clone()
        };
        let first = run(&system);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let d = outcome_difference(&first, &run(&system));
        eprintln!("{}: system clock twice: {d:?}", mode.name());
        assert!(
            d.is_some(),
            "two runs on the system clock wrote the same image"
        );
    }
}
