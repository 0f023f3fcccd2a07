//! The directory indexes (every touched directory's names, in memory) stay
//! within their bound, derived from the cache bound: walking more names
//! than that drops the least recently used indexes, which are rebuilt from
//! the directory's blocks when needed, and every name still resolves.

use std::sync::Arc;

use ordo_dev::MemDevice;
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
use ordo_fs::{Creds, FileType, Fs, MountOptions, ProtocolKind, ROOT_INO};

const DIRS: u32 = 24;
const FILES: u32 = 400;

fn image(mode: &str) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(4096, 65536).unwrap());
    let features = parse_features(
        ProtocolKind::named(mode).spec().mkfs_features,
        DEFAULT_FEATURES,
    )
    .unwrap();
    let opts = MkfsOptions {
        block_size: 4096,
        features,
        uuid: Some(*b"ordo-dir-bound!!"),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.as_ref(), &opts).unwrap();
    dev
}

fn opts(mode: &str) -> MountOptions {
    MountOptions {
        mode: ProtocolKind::named(mode),
        // The smallest cache: the index bound is its floor, 4,096 names.
        cache_bytes: 1 << 20,
        ..MountOptions::default()
    }
}

fn walk_and_check(fs: &Fs) {
    let (_, bound, _) = fs.dir_index_stats();
    for d in 0..DIRS {
        let dir = fs.lookup(ROOT_INO, format!("d{d}").as_bytes()).unwrap().ino;
        for f in 0..FILES {
            let a = fs.lookup(dir, format!("f{f}").as_bytes()).unwrap();
            assert_eq!(a.size, u64::from(f), "d{d}/f{f}");
        }
        assert!(fs.lookup(dir, b"missing").is_err());
        let (names, _, _) = fs.dir_index_stats();
        assert!(
            names <= bound + FILES as usize + 2,
            "{names} names indexed, bound {bound}"
        );
    }
}

#[test]
fn walking_more_names_than_the_bound_keeps_the_indexes_bounded() {
    for mode in ["async", "journal"] {
        let dev = image(mode);
        let c = Creds::root();
        let fs = Fs::mount(dev.clone(), opts(mode)).unwrap();
        let (_, bound, _) = fs.dir_index_stats();
        assert_eq!(bound, 4096);
        assert!(
            (DIRS * FILES) as usize > 2 * bound,
            "the test must exceed the bound"
        );
        for d in 0..DIRS {
            let dir = fs
                .mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, &c)
                .unwrap();
            for f in 0..FILES {
                let a = fs
                    .create(
                        dir.ino,
                        format!("f{f}").as_bytes(),
                        FileType::Regular,
                        0o644,
                        0,
                        &c,
                    )
                    .unwrap();
                fs.write(a.ino, 0, &vec![7u8; f as usize]).unwrap();
            }
            // Renames and removals keep the count exact (checked in debug
            // builds every time the bound is enforced).
            fs.rename(dir.ino, b"f0", dir.ino, b"g0", Default::default())
                .unwrap();
            fs.rename(dir.ino, b"g0", dir.ino, b"f0", Default::default())
                .unwrap();
        }
        walk_and_check(&fs);
        let (names, _, evictions) = fs.dir_index_stats();
        assert!(evictions > 0, "{mode}: nothing was dropped ({names} names)");
        fs.unmount().unwrap();
        // The tree on disk is whole.
        let fs = Fs::mount(dev, opts(mode)).unwrap();
        walk_and_check(&fs);
        fs.unmount().unwrap();
    }
}
