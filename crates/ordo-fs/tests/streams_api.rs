//! The durability calls beyond fsync/sync and the streams they name, on
//! every protocol:
//!
//! - a thread's stream is its own, the default one until it sets another,
//!   and every operation handle records its caller's stream (counted per
//!   stream by [`Fs::stream_handles`] from what the protocol is told);
//! - stream names are bounded and checked (ENAMETOOLONG, EINVAL), an
//!   unknown stream to streamsync is EINVAL;
//! - osync, dsync and streamsync give the guarantee documented for each
//!   protocol: no protocol implements them natively today, so osync and
//!   dsync are fsyncs and streamsync is a sync, and what they covered
//!   survives a power cut that loses every write not flushed;
//! - on a read-only mount they succeed and write nothing, as fsync.

mod core_common;

use std::sync::Arc;

use core_common::create_file as create;
use ordo_dev::{BlockDevice, CrashPolicy, MemDevice, WriteCacheDevice};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::stream::STREAM_NAME_MAX_BYTES;
use ordo_fs::{Creds, DurabilityCalls, Fs, MountOptions, ProtocolKind, StreamId, ROOT_INO};

/// A fresh image with a journal and a fast-commit area, so that every
/// protocol can mount it.
fn image() -> MemDevice {
    let mem = MemDevice::new(4096, 16384).unwrap();
    let opts = MkfsOptions {
        block_size: 4096,
        features: parse_features("has_journal,fast_commit", DEFAULT_FEATURES).unwrap(),
        journal_blocks: Some(1024),
        ..MkfsOptions::default()
    };
    mkfs(&mem, &opts).unwrap();
    mem
}

fn opts(mode: ProtocolKind) -> MountOptions {
    MountOptions {
        mode,
        ..MountOptions::default()
    }
}

/// The contents of `/name` on the image a power cut that loses every
/// unflushed write leaves, after recovery (a read-only mount recovers in
/// memory; by `mode`'s own recovery when it keeps a log, else JBD2's);
/// `None` when the file is not there.
fn after_crash(
    dev: &WriteCacheDevice<MemDevice>,
    mode: ProtocolKind,
    name: &str,
) -> Option<Vec<u8>> {
    let crashed: Arc<dyn BlockDevice> = Arc::new(dev.crash(7, CrashPolicy::lose_all()).unwrap());
    let fs = Fs::mount(
        crashed,
        MountOptions {
            mode: if mode.caps().log_replay {
                mode
            } else {
                ProtocolKind::named("journal")
            },
            read_only: true,
            ..MountOptions::default()
        },
    )
    .unwrap();
    let a = fs.lookup(ROOT_INO, name.as_bytes()).ok()?;
    Some(fs.read(a.ino, 0, a.size as u32).unwrap())
}

fn mount(mode: ProtocolKind) -> (Arc<WriteCacheDevice<MemDevice>>, Fs) {
    let dev = Arc::new(WriteCacheDevice::new(image()));
    let fs = Fs::mount(dev.clone(), opts(mode)).unwrap();
    (dev, fs)
}

#[test]
fn handles_record_the_stream_of_their_thread() {
    for mode in ProtocolKind::all() {
        let (_dev, fs) = mount(mode);
        assert_eq!(fs.getstream(), StreamId::DEFAULT, "{mode:?}");
        assert_eq!(fs.stream_name(StreamId::DEFAULT).unwrap(), b"default");
        let a = fs.setstream(b"a").unwrap();
        assert_ne!(a, StreamId::DEFAULT);
        assert_eq!(fs.getstream(), a);
        assert_eq!(fs.stream_name(a).unwrap(), b"a");
        assert_eq!(fs.find_stream(b"a"), Some(a));
        let default_before = fs.stream_handles(StreamId::DEFAULT).unwrap();
        assert_eq!(fs.stream_handles(a), Some(0));
        // create + one short write: two handles, both in `a`.
        create(&fs, "in-a", b"written in stream a");
        assert_eq!(fs.stream_handles(a), Some(2), "{mode:?}");
        assert_eq!(
            fs.stream_handles(StreamId::DEFAULT),
            Some(default_before),
            "{mode:?}: nothing ran in the default stream"
        );
        // Another thread starts in the default stream and keeps its own.
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(fs.getstream(), StreamId::DEFAULT);
                let b = fs.setstream(b"b").unwrap();
                create(&fs, "in-b", b"written in stream b");
                assert_eq!(fs.stream_handles(b), Some(2), "{mode:?}");
            });
        });
        assert_eq!(fs.getstream(), a, "the other thread did not move this one");
        assert_eq!(fs.stream_handles(a), Some(2), "{mode:?}");
        // Setting a stream again reuses its id; back to the default.
        assert_eq!(fs.setstream(b"a").unwrap(), a);
        assert_eq!(fs.setstream(b"default").unwrap(), StreamId::DEFAULT);
        fs.mkdir(ROOT_INO, b"d", 0o755, &Creds::root()).unwrap();
        assert_eq!(
            fs.stream_handles(StreamId::DEFAULT),
            Some(default_before + 1),
            "{mode:?}"
        );
        // A server thread acting for a requester.
        fs.set_thread_stream(a).unwrap();
        fs.unlink(ROOT_INO, b"in-b").unwrap();
        assert_eq!(fs.stream_handles(a), Some(3), "{mode:?}");
        assert_eq!(
            fs.set_thread_stream(StreamId(1000)).unwrap_err().errno(),
            libc::EINVAL
        );
        // streamsync is native where streams are kept apart (the explorer
        // checks each stream's prefix); osync and dsync are native only
        // where the prefix property checks osync.
        let native = fs.native_durability_calls();
        assert_eq!(
            native.contains(DurabilityCalls::STREAMSYNC),
            mode.caps().stream_prefix_after_crash,
            "{mode:?}"
        );
        assert_eq!(
            native.contains(DurabilityCalls::OSYNC),
            mode.caps().prefix_after_crash,
            "{mode:?}"
        );
        fs.unmount().unwrap();
    }
}

#[test]
fn stream_names_are_checked() {
    let (_dev, fs) = mount(ProtocolKind::named("async"));
    let long = vec![b'n'; STREAM_NAME_MAX_BYTES + 1];
    assert_eq!(fs.setstream(&long).unwrap_err().errno(), libc::ENAMETOOLONG);
    let max = fs.setstream(&long[..STREAM_NAME_MAX_BYTES]).unwrap();
    assert_eq!(fs.stream_name(max).unwrap(), &long[..STREAM_NAME_MAX_BYTES]);
    assert_eq!(fs.setstream(b"a\0b").unwrap_err().errno(), libc::EINVAL);
    assert_eq!(fs.setstream(b"").unwrap_err().errno(), libc::EINVAL);
    // Any other bytes are a name.
    let odd = fs.setstream(b"\xff \n/").unwrap();
    assert_eq!(fs.getstream(), odd);
    assert_eq!(
        fs.streamsync(StreamId(999)).unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(fs.stream_handles(StreamId(999)), None);
    assert_eq!(fs.stream_name(StreamId(999)), None);
    fs.unmount().unwrap();
}

#[test]
fn dsync_makes_the_file_durable() {
    for mode in ProtocolKind::all() {
        let (dev, fs) = mount(mode);
        let ino = create(&fs, "d", b"dsynced data");
        fs.dsync(ino).unwrap();
        assert_eq!(
            after_crash(&dev, mode, "d").as_deref(),
            Some(&b"dsynced data"[..]),
            "{mode:?}"
        );
        fs.unmount().unwrap();
    }
}

#[test]
fn osync_falls_back_to_fsync_and_makes_the_file_durable() {
    for mode in ProtocolKind::all() {
        let (dev, fs) = mount(mode);
        if fs
            .native_durability_calls()
            .contains(DurabilityCalls::OSYNC)
        {
            // Its own osync: no durability (tests/optimistic.rs).
            fs.unmount().unwrap();
            continue;
        }
        let ino = create(&fs, "o", b"osynced data");
        let flushes = dev.counters().flushes;
        fs.osync(ino).unwrap();
        if mode != ProtocolKind::named("sync") {
            assert!(dev.counters().flushes > flushes, "{mode:?}: no flush");
        }
        assert_eq!(
            after_crash(&dev, mode, "o").as_deref(),
            Some(&b"osynced data"[..]),
            "{mode:?}"
        );
        fs.unmount().unwrap();
    }
}

#[test]
fn streamsync_makes_the_stream_durable() {
    for mode in ProtocolKind::all() {
        let (dev, fs) = mount(mode);
        let s1 = fs.setstream(b"s1").unwrap();
        create(&fs, "one", b"stream one");
        let s2 = std::thread::scope(|s| {
            s.spawn(|| {
                let s2 = fs.setstream(b"s2").unwrap();
                create(&fs, "two", b"stream two");
                s2
            })
            .join()
            .unwrap()
        });
        assert_ne!(s1, s2);
        // Before: a power cut may lose both (nothing asked for durability).
        fs.streamsync(s1).unwrap();
        assert_eq!(
            after_crash(&dev, mode, "one").as_deref(),
            Some(&b"stream one"[..]),
            "{mode:?}"
        );
        let two = after_crash(&dev, mode, "two");
        if mode == ProtocolKind::named("streams") {
            // Its own transaction: the other stream's create is not in it
            // (the two entries went to separate room of the directory).
            assert_eq!(two, None, "streams: streamsync committed another stream");
        } else {
            // The fallback is a full sync: the other stream is durable too.
            assert_eq!(
                two.as_deref(),
                Some(&b"stream two"[..]),
                "{mode:?}: streamsync falls back to sync"
            );
        }
        // The default stream is a stream like the others.
        fs.setstream(b"default").unwrap();
        create(&fs, "three", b"default stream");
        fs.streamsync(StreamId::DEFAULT).unwrap();
        assert_eq!(
            after_crash(&dev, mode, "three").as_deref(),
            Some(&b"default stream"[..]),
            "{mode:?}"
        );
        fs.unmount().unwrap();
    }
}

#[test]
fn without_the_call_the_crash_loses_the_file() {
    // The checks above can fail: with no durability call, the file is
    // lost by a power cut on the protocols that delay their writes.
    for mode in [
        ProtocolKind::named("async"),
        ProtocolKind::named("journal"),
        ProtocolKind::named("fast_commit"),
    ] {
        let (dev, fs) = mount(mode);
        create(&fs, "lost", b"never synced");
        assert_eq!(after_crash(&dev, mode, "lost"), None, "{mode:?}");
        fs.unmount().unwrap();
    }
}

#[test]
fn read_only_mounts_take_the_calls_as_no_ops() {
    let (dev, fs) = mount(ProtocolKind::named("journal"));
    let ino = create(&fs, "f", b"data");
    fs.unmount().unwrap();
    let image: Arc<dyn BlockDevice> = Arc::new(dev.inner().snapshot());
    let ro = Fs::mount(
        image.clone(),
        MountOptions {
            mode: ProtocolKind::named("journal"),
            read_only: true,
            ..MountOptions::default()
        },
    )
    .unwrap();
    let before = image.counters();
    ro.osync(ino).unwrap();
    ro.dsync(ino).unwrap();
    let s = ro.setstream(b"ro").unwrap();
    ro.streamsync(s).unwrap();
    ro.streamsync(StreamId::DEFAULT).unwrap();
    assert_eq!(
        ro.streamsync(StreamId(77)).unwrap_err().errno(),
        libc::EINVAL
    );
    let after = image.counters();
    assert_eq!(
        after.total().writes,
        before.total().writes,
        "nothing written"
    );
    assert_eq!(after.flushes, before.flushes, "nothing flushed");
    ro.unmount().unwrap();
}
