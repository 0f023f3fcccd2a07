//! The scheduled executor (`sched=`): plans run through the I/O scheduler
//! leave the image the in-order executor leaves, for every protocol and
//! every policy, on the HP C2447 model (virtual time, one request at a
//! time) and on a memory device (requests in flight together); and a hand
//! made plan with dependencies, barriers, a flush and rewrites of one block
//! ends the same under both executors.

use std::sync::Arc;

use ordo_dev::sched::{Policy, SchedConfig, Scheduler};
use ordo_dev::{BlockClass, BlockDevice, DiskModel, MemDevice, TimedDevice, WriteFlags};
use ordo_fs::clock::SimClock;
use ordo_fs::fsck::{check, FsckOptions};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::protocol::{execute_plan, IoPlan, IoStep, WriteId};
use ordo_fs::sched::execute_plan_scheduled;
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, RenameFlags, Timespec, ROOT_INO};

const BS: u32 = 4096;
const BLOCKS: u64 = 4096;

fn mkfs_options(mode: ProtocolKind) -> MkfsOptions {
    MkfsOptions {
        block_size: BS,
        features: parse_features(mode.spec().mkfs_features, DEFAULT_FEATURES).unwrap(),
        seed: Some(0x5c4e_d00d),
        time_sec: Some(1_700_000_000),
        journal_blocks: mode.caps().log_replay.then_some(1024),
        assume_zeroed: true,
        ..MkfsOptions::default()
    }
}

fn workload(fs: &Fs) {
    let root = Creds::root();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, &root).unwrap().ino;
    let mut inos = Vec::new();
    for i in 0..16u64 {
        let parent = if i % 2 == 0 { d } else { ROOT_INO };
        let name = format!("f{i}");
        let ino = fs
            .create(parent, name.as_bytes(), FileType::Regular, 0o644, 0, &root)
            .unwrap()
            .ino;
        let data: Vec<u8> = (0..(900 + i as usize * 3001) % 40_000)
            .map(|k| (k as u64 * 7 + i) as u8)
            .collect();
        fs.write(ino, (i % 3) * 4096, &data).unwrap();
        if i % 4 == 0 {
            fs.fsync(ino, false).unwrap();
        }
        inos.push((parent, name, ino));
    }
    fs.rename(d, b"f2", ROOT_INO, b"r2", RenameFlags::default())
        .unwrap();
    fs.unlink(ROOT_INO, b"f3").unwrap();
    fs.link(inos[5].2, d, b"h5").unwrap();
    fs.sync().unwrap();
    for i in (0..8u64).filter(|&i| i != 3) {
        fs.write(inos[i as usize].2, 1 << 15, &[i as u8 + 1; 5000])
            .unwrap();
    }
    fs.unlink(d, b"f6").unwrap();
    fs.fsync(inos[7].2, false).unwrap();
}

/// mkfs, mount with `sched`, the workload, unmount: the image, and the
/// scheduler's statistics and the virtual time on the model.
fn run(
    mode: ProtocolKind,
    sched: Option<Policy>,
    timed: bool,
) -> (Vec<u8>, Option<ordo_dev::SchedStats>, u64) {
    let mem = Arc::new(MemDevice::new(BS, BLOCKS).unwrap());
    mkfs(mem.as_ref(), &mkfs_options(mode)).unwrap();
    let model = Arc::new(TimedDevice::new(mem.clone(), DiskModel::hp_c2447()).unwrap());
    let dev: Arc<dyn BlockDevice> = if timed { model.clone() } else { mem.clone() };
    let opts = MountOptions {
        mode,
        background: false,
        cache_bytes: 8 << 20,
        clock: Some(Arc::new(SimClock::new(
            Timespec {
                sec: 1_700_000_000,
                nsec: 0,
            },
            1_000_003,
        ))),
        seed: Some(11),
        sched,
        ..MountOptions::default()
    };
    let fs = Fs::mount(dev, opts).unwrap_or_else(|e| panic!("{mode} {sched:?}: mount: {e}"));
    workload(&fs);
    let stats = fs.sched_stats();
    fs.unmount().unwrap();
    (mem.to_image(), stats, model.virtual_time_ns())
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.chunks(BS as usize)
        .zip(b.chunks(BS as usize))
        .position(|(x, y)| x != y)
}

#[test]
fn scheduled_mounts_leave_the_in_order_image() {
    for mode in ProtocolKind::all() {
        let (want, none, _) = run(mode, None, true);
        // Protocols ordered by the scheduler run through one without
        // `sched=` too.
        assert_eq!(none.is_some(), mode.caps().scheduler, "{mode}");
        let r = check(
            &MemDevice::from_image(BS, &want).unwrap(),
            &FsckOptions::default(),
        )
        .unwrap();
        assert!(r.problems.is_empty(), "{mode}: {:?}", r.problems);
        for policy in Policy::ALL {
            for timed in [true, false] {
                let (got, stats, _) = run(mode, Some(policy), timed);
                assert_eq!(
                    first_difference(&want, &got),
                    None,
                    "{mode} sched={policy} timed={timed}: the images differ at this block"
                );
                let stats = stats.expect("a scheduled mount has statistics");
                assert!(stats.all_writes().requests > 0, "{mode} {policy}");
                assert!(stats.disk_requests > 0);
                assert_eq!(stats.virtual_time, timed);
            }
        }
    }
}

#[test]
fn scheduled_virtual_time_is_deterministic() {
    let mode = ProtocolKind::named("sync");
    let a = run(mode, Some(Policy::Sptf), true);
    let b = run(mode, Some(Policy::Sptf), true);
    assert_eq!(a.1, b.1, "same statistics");
    assert_eq!(a.2, b.2, "same virtual time");
    let s = a.1.unwrap();
    assert!(s.all().avg_response_ns() > 0);
}

/// A plan with dependencies, a barrier, a flush and one block written
/// three times, in an order C-LOOK would change.
fn plan() -> IoPlan {
    let mut p = IoPlan::numbered(3);
    let w = |block: u64, byte: u8, blocks: usize, after: Vec<u32>| IoStep::Write {
        block,
        data: Arc::new(vec![byte; blocks * BS as usize]).into(),
        flags: WriteFlags::new(BlockClass::Data),
        after: after
            .into_iter()
            .map(|index| WriteId { plan: 3, index })
            .collect(),
    };
    p.steps = vec![
        w(40, 2, 1, vec![]),
        // Waits for 40; the rewrite of 900 below names nothing, and must
        // still land after it.
        w(900, 1, 2, vec![0]),
        w(41, 3, 1, vec![1]),
        w(900, 4, 1, vec![]),
        w(12, 5, 3, vec![0, 2]),
        IoStep::Barrier,
        w(5, 6, 1, vec![]),
        w(901, 7, 1, vec![]),
        IoStep::Flush,
        w(900, 8, 1, vec![]),
        w(3, 9, 4, vec![]),
    ];
    // A write of an earlier plan (completed before this one starts).
    if let IoStep::Write { after, .. } = &mut p.steps[8] {
        after.push(WriteId { plan: 2, index: 9 });
    }
    p
}

#[test]
fn a_scheduled_plan_ends_as_the_in_order_one() {
    let p = plan();
    let a = MemDevice::new(BS, BLOCKS).unwrap();
    let (done_a, r) = execute_plan(&p, &a);
    r.unwrap();
    for policy in Policy::ALL {
        for timed in [false, true] {
            let b = TimedDevice::new(MemDevice::new(BS, BLOCKS).unwrap(), DiskModel::hp_c2447())
                .unwrap();
            let dev: &dyn BlockDevice = if timed { &b } else { b.inner() };
            let mut s = Scheduler::new(SchedConfig::new(policy), BS);
            let (done_b, r) = execute_plan_scheduled(&p, dev, &mut s);
            r.unwrap();
            assert!(done_b.ok);
            assert_eq!(s.queued(), 0);
            assert_eq!(
                first_difference(&a.to_image(), &b.inner().to_image()),
                None,
                "{policy} timed={timed}"
            );
            let mut ids_a: Vec<_> = done_a.writes.iter().map(|w| (w.0, w.1)).collect();
            let mut ids_b: Vec<_> = done_b.writes.iter().map(|w| (w.0, w.1)).collect();
            ids_a.sort();
            ids_b.sort();
            assert_eq!(ids_a, ids_b, "every write reported once");
            let pos = |i: u32| done_b.writes.iter().position(|w| w.0.index == i).unwrap();
            assert!(pos(0) < pos(1) && pos(1) < pos(2) && pos(2) < pos(4) && pos(1) < pos(3));
            for before in 0..5 {
                for after in 5..9 {
                    assert!(pos(before) < pos(after), "{policy}: barrier");
                }
            }
            if policy != Policy::Fifo && timed {
                assert_ne!(
                    done_b.writes.iter().map(|w| w.0).collect::<Vec<_>>(),
                    done_a.writes.iter().map(|w| w.0).collect::<Vec<_>>(),
                    "{policy} reorders"
                );
            }
        }
    }
}
