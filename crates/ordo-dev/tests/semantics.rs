//! The device contract, checked the same way on every backend and on the
//! stacks the crash explorer builds (recorder over memory, overlay over a
//! shared base, write cache over a recorder).

use std::sync::Arc;

use ordo_dev::{
    BlockClass, BlockDevice, CrashPolicy, DiskModel, EventKind, FileDevice, MemDevice,
    OverlayDevice, RecordingDevice, TimedDevice, WriteCacheDevice, WriteFlags,
};

const BS: u32 = 4096;
const BLOCKS: u64 = 256;

fn backends(dir: &std::path::Path) -> Vec<(&'static str, Box<dyn BlockDevice>)> {
    let base = Arc::new(MemDevice::new(BS, BLOCKS).unwrap());
    vec![
        ("mem", Box::new(MemDevice::new(BS, BLOCKS).unwrap())),
        (
            "file",
            Box::new(FileDevice::create(dir.join("img"), BLOCKS * BS as u64, BS).unwrap()),
        ),
        ("overlay", Box::new(OverlayDevice::over_mem(base.clone()))),
        ("record", Box::new(RecordingDevice::from_base(base))),
        (
            "cache",
            Box::new(WriteCacheDevice::new(MemDevice::new(BS, BLOCKS).unwrap())),
        ),
        (
            "timed",
            Box::new(
                TimedDevice::new(MemDevice::new(BS, BLOCKS).unwrap(), DiskModel::ssd_sata())
                    .unwrap(),
            ),
        ),
    ]
}

#[test]
fn every_backend_counts_and_reports_durability_alike() {
    let dir = tempfile::tempdir().unwrap();
    for (name, d) in backends(dir.path()) {
        assert_eq!(d.block_size(), BS, "{name}");
        assert_eq!(d.block_count(), BLOCKS, "{name}");
        let data: Vec<u8> = (0..4 * BS).map(|i| (i % 249) as u8 + 1).collect();
        // A multi-block write counts once.
        let t1 = d
            .write(8, &data, WriteFlags::new(BlockClass::Directory))
            .unwrap();
        assert_eq!(d.durable(), 0, "{name}: a plain write is not durable");
        let mut buf = vec![0u8; data.len()];
        d.read(8, &mut buf, BlockClass::Directory).unwrap();
        assert_eq!(buf, data, "{name}: read your writes");
        d.flush().unwrap();
        assert_eq!(d.durable(), t1, "{name}: flush makes it durable");
        let t2 = d
            .write(100, &data[..BS as usize], WriteFlags::new(BlockClass::Data))
            .unwrap();
        assert!(t2 > t1, "{name}: tickets increase");
        assert_eq!(d.durable(), t1, "{name}: only flush or FUA moves durable()");
        let t3 = d
            .write(
                101,
                &data[..BS as usize],
                WriteFlags::fua(BlockClass::Journal),
            )
            .unwrap();
        assert_eq!(
            d.durable(),
            t1,
            "{name}: FUA does not make an earlier plain write durable"
        );
        d.flush().unwrap();
        assert_eq!(d.durable(), t3, "{name}");
        let c = d.counters();
        let dir_c = c.class(BlockClass::Directory);
        assert_eq!(
            (
                dir_c.writes,
                dir_c.write_bytes,
                dir_c.reads,
                dir_c.read_bytes
            ),
            (1, 4 * BS as u64, 1, 4 * BS as u64),
            "{name}"
        );
        assert_eq!(c.class(BlockClass::Journal).fua_writes, 1, "{name}");
        assert_eq!(c.class(BlockClass::Data).fua_writes, 0, "{name}");
        assert_eq!(c.total().writes, 3, "{name}");
        assert_eq!(c.flushes, 2, "{name}");
        // Out-of-range and misaligned requests are errors, not panics.
        assert!(
            d.read(BLOCKS, &mut buf[..BS as usize], BlockClass::Data)
                .is_err(),
            "{name}"
        );
        assert!(
            d.write(0, &[1u8; 10], WriteFlags::new(BlockClass::Data))
                .is_err(),
            "{name}"
        );
    }
}

#[test]
fn replaying_a_recording_onto_its_base_rebuilds_the_device() {
    let mut base_img = vec![0u8; (BLOCKS * BS as u64) as usize];
    base_img[..BS as usize].fill(0x55);
    let base = Arc::new(MemDevice::from_image(BS, &base_img).unwrap());
    let rec = RecordingDevice::from_base(base.clone());
    for i in 0..40u64 {
        let block = (i * 37) % BLOCKS;
        let fill = [i as u8 + 1; BS as usize * 2];
        let n = if block + 2 <= BLOCKS { 2 } else { 1 };
        let flags = if i % 7 == 0 {
            WriteFlags::fua(BlockClass::Journal)
        } else {
            WriteFlags::new(BlockClass::Data)
        };
        rec.write(block, &fill[..n * BS as usize], flags).unwrap();
        if i % 5 == 4 {
            rec.flush().unwrap();
            rec.mark(format!("promise {i}"));
        }
    }
    let log = rec.log();
    let state = OverlayDevice::over_mem(rec.base().unwrap().clone());
    let mut writes = 0;
    let mut marks = 0;
    for e in &log {
        match &e.kind {
            EventKind::Write { .. } => {
                writes += 1;
                for (b, img) in e.blocks(BS) {
                    state.put(b, img).unwrap();
                }
            }
            EventKind::Mark(_) => marks += 1,
            EventKind::Flush => {}
        }
    }
    assert_eq!((writes, marks), (40, 8));
    assert_eq!(state.to_mem().unwrap().to_image(), rec.inner().to_image());
    assert_eq!(base.to_image(), base_img, "recording never writes the base");
}

#[test]
fn write_cache_over_a_recorder_logs_write_back_at_flush() {
    let rec = RecordingDevice::new(MemDevice::new(BS, BLOCKS).unwrap());
    let cache = WriteCacheDevice::new(rec);
    cache
        .write(3, &[3u8; BS as usize], WriteFlags::new(BlockClass::Data))
        .unwrap();
    cache
        .write(4, &[4u8; BS as usize], WriteFlags::fua(BlockClass::Journal))
        .unwrap();
    let log = cache.inner().log();
    assert_eq!(log.len(), 1, "only the FUA write reached the medium");
    assert!(matches!(
        log[0].kind,
        EventKind::Write {
            block: 4,
            fua: true,
            ..
        }
    ));
    // A crash now that drops pending writes keeps the FUA write only.
    let img = cache.crash(7, CrashPolicy::lose_all()).unwrap();
    assert_eq!(img.block(4).unwrap()[0], 4);
    assert!(img.block(3).is_none());
    cache.flush().unwrap();
    let log = cache.inner().log();
    assert_eq!(log.len(), 3);
    assert!(matches!(
        log[1].kind,
        EventKind::Write {
            block: 3,
            fua: false,
            ..
        }
    ));
    assert_eq!(log[2].kind, EventKind::Flush);
    let img = cache.crash(7, CrashPolicy::lose_all()).unwrap();
    assert_eq!(
        img.block(3).unwrap()[0],
        3,
        "flushed writes survive any crash"
    );
}

#[test]
fn overlay_states_share_one_base_across_threads() {
    let base = Arc::new(MemDevice::new(BS, BLOCKS).unwrap());
    base.put_block(0, Arc::from(vec![9u8; BS as usize]));
    let before = base.to_image();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let base = base.clone();
            s.spawn(move || {
                let o = OverlayDevice::over_mem(base);
                for b in 0..BLOCKS {
                    o.write(b, &[t + 1; BS as usize], WriteFlags::new(BlockClass::Data))
                        .unwrap();
                }
                let mut buf = vec![0u8; BS as usize];
                o.read(0, &mut buf, BlockClass::Data).unwrap();
                assert_eq!(buf[0], t + 1);
            });
        }
    });
    assert_eq!(base.to_image(), before);
}
