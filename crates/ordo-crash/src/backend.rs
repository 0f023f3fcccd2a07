//! The parts of ordo the explorer drives: mkfs, fsck and mount, behind a few
//! functions so that the rest of the explorer reads the same whatever their
//! exact signatures.

use std::sync::Arc;

use ordo_dev::{BlockDevice, MemDevice};
use ordo_fs::{DataMode, Fs, MountOptions, ProtocolKind};

use crate::error::CrashError;

/// The base image's creation time (2023-11-14), seconds since the epoch.
const MKFS_TIME_SEC: u64 = 1_700_000_000;
/// Where every mount's and every repair's simulated clock starts: an hour
/// after mkfs. Each mount gets a fresh clock, so a state replays with the
/// times it was recorded with (the clock restarts, and may read earlier
/// than times already on the image: nothing ordo, e2fsck or the judges
/// check depends on times increasing across mounts).
const CLOCK_START_SEC: i64 = MKFS_TIME_SEC as i64 + 3600;
/// The simulated clock's advance per reading (1 ms: distinct times per
/// operation, as on a real machine).
const CLOCK_STEP_NS: u64 = 1_000_000;
/// Seed of every mount's random source (inode generations).
const MOUNT_SEED: u64 = 0x0c7a_5eed;

/// A fresh simulated clock for one mount or one repair: with the fixed
/// seed, a run writes the same bytes every time.
fn sim_clock() -> Arc<dyn ordo_fs::clock::Clock> {
    Arc::new(ordo_fs::clock::SimClock::new(
        ordo_fs::Timespec {
            sec: CLOCK_START_SEC,
            nsec: 0,
        },
        CLOCK_STEP_NS,
    ))
}

/// Geometry of the base image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageParams {
    /// Image size in MiB.
    pub size_mib: u64,
    /// File-system block size in bytes.
    pub block_size: u32,
    /// Blocks per group (`None`: 8 x the block size, one group for the
    /// default image). Smaller groups make the image several groups.
    pub blocks_per_group: Option<u32>,
}

impl Default for ImageParams {
    fn default() -> Self {
        ImageParams {
            size_mib: 16,
            block_size: 4096,
            blocks_per_group: None,
        }
    }
}

/// An empty ordo file system in memory, formatted for `mode` (with a
/// journal for the journaling protocols). Deterministic: fixed UUID, hash
/// seed and times, so the same run writes the same blocks.
pub fn make_image(params: &ImageParams, mode: ProtocolKind) -> Result<Arc<MemDevice>, CrashError> {
    use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};
    let blocks = params.size_mib * (1 << 20) / u64::from(params.block_size);
    let dev = Arc::new(
        MemDevice::new(params.block_size, blocks).map_err(|e| CrashError::Mkfs(e.to_string()))?,
    );
    let journaled = mode
        .required_features()
        .has_compat(ordo_format::features::compat::HAS_JOURNAL);
    let features = parse_features(mode.spec().mkfs_features, DEFAULT_FEATURES)
        .map_err(|e| CrashError::Mkfs(e.to_string()))?;
    let opts = MkfsOptions {
        block_size: params.block_size,
        features,
        uuid: Some(*b"ordo-crash-uuid!"),
        hash_seed: Some(*b"ordo-crash-hash!"),
        time_sec: Some(MKFS_TIME_SEC),
        journal_blocks: journaled.then_some(1024),
        assume_zeroed: true,
        blocks_per_group: params.blocks_per_group,
        ..MkfsOptions::default()
    };
    mkfs(dev.as_ref(), &opts).map_err(|e| CrashError::Mkfs(e.to_string()))?;
    Ok(dev)
}

/// What ordo's fsck said about an image.
#[derive(Clone, Debug, Default)]
pub struct FsckVerdict {
    /// Unsafe problems (the state is inconsistent); when repairing, none
    /// were repaired and the image was not written.
    pub unsafe_problems: Vec<String>,
    /// Errors that are not unsafe: those found when not repairing, those
    /// still there after the repair when repairing.
    pub benign_problems: Vec<String>,
    /// What the benign repair changed.
    pub repairs: Vec<String>,
}

impl FsckVerdict {
    /// No error left.
    pub fn is_clean(&self) -> bool {
        self.unsafe_problems.is_empty() && self.benign_problems.is_empty()
    }
}

/// Run ordo's fsck on `dev`, repairing benign problems when
/// `repair_benign`. An error means fsck could not even read the image
/// (which makes the state inconsistent too).
pub fn fsck(dev: &dyn BlockDevice, repair_benign: bool) -> Result<FsckVerdict, String> {
    use ordo_fs::fsck::{check, FsckOptions, Severity};
    let opts = FsckOptions {
        repair_benign,
        clock: Some(sim_clock()),
        ..FsckOptions::default()
    };
    let r = check(dev, &opts).map_err(|e| format!("fsck: {e}"))?;
    if r.truncated {
        return Err(format!(
            "fsck: more than {} problems (first: {})",
            opts.max_problems,
            r.problems
                .first()
                .map(|p| p.to_string())
                .unwrap_or_default()
        ));
    }
    let unsafe_problems = r
        .of_severity(Severity::Unsafe)
        .map(|p| p.to_string())
        .collect();
    let left = r.remaining.as_ref().unwrap_or(&r.problems);
    let benign_problems = left
        .iter()
        .filter(|p| matches!(p.severity, Severity::Benign | Severity::Hazard))
        .map(|p| p.to_string())
        .collect();
    Ok(FsckVerdict {
        unsafe_problems,
        benign_problems,
        repairs: r.repairs.clone(),
    })
}

/// Mount options the explorer uses: no background thread, everything
/// driven by the workload, and a simulated clock with a fixed seed so that
/// a run is reproducible byte for byte.
pub fn mount_options(mode: ProtocolKind, data: DataMode, read_only: bool) -> MountOptions {
    MountOptions {
        mode,
        data,
        read_only,
        background: false,
        clock: Some(sim_clock()),
        seed: Some(MOUNT_SEED),
        // A protocol ordered by the I/O scheduler records with a seeded
        // random choice among the eligible requests, one at a time: the
        // recording is reproducible, and over many plans it takes orders
        // no fixed policy would.
        sched: mode
            .caps()
            .scheduler
            .then_some(ordo_fs::sched::Policy::Random(MOUNT_SEED)),
        ..MountOptions::default()
    }
}

/// Mount `dev`.
pub fn mount(
    dev: Arc<dyn BlockDevice>,
    mode: ProtocolKind,
    data: DataMode,
    read_only: bool,
) -> ordo_fs::Result<Fs> {
    Fs::mount(dev, mount_options(mode, data, read_only))
}

/// A base image made by the kernel: `mkfs.ext4` with the features `mode`
/// needs (and fixed UUID and hash seed), then a loop mount in which the
/// kernel makes `dir` and its names, so that the directory is the
/// kernel's own: indexed (htree) once it outgrew a block. Needs root,
/// `mkfs.ext4`, `losetup` and `mount`.
pub fn make_kernel_image(
    params: &ImageParams,
    mode: ProtocolKind,
    dir: &crate::workload::KernelDir,
) -> Result<Arc<MemDevice>, CrashError> {
    use std::process::Command;
    let err = |what: &str, e: String| CrashError::Mkfs(format!("kernel base image: {what}: {e}"));
    let run = |cmd: &mut Command, what: &str| -> Result<(), CrashError> {
        let out = cmd.output().map_err(|e| err(what, e.to_string()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(err(
                what,
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stderr).trim(),
                    String::from_utf8_lossy(&out.stdout).trim()
                ),
            ))
        }
    };
    let tmp = tempfile::Builder::new()
        .prefix("ordo-kernel-base-")
        .tempdir()
        .map_err(|e| err("temporary directory", e.to_string()))?;
    let img = tmp.path().join("base.img");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).map_err(|e| err("mount point", e.to_string()))?;
    let journaled = mode
        .required_features()
        .has_compat(ordo_format::features::compat::HAS_JOURNAL);
    let mut features = String::from(if journaled {
        "has_journal"
    } else {
        "^has_journal"
    });
    for f in mode
        .spec()
        .mkfs_features
        .split(',')
        .filter(|f| !f.is_empty())
    {
        if f != "has_journal" {
            features.push(',');
            features.push_str(f);
        }
    }
    let mut mkfs = Command::new("mkfs.ext4");
    mkfs.args([
        "-F",
        "-q",
        "-b",
        &params.block_size.to_string(),
        "-O",
        &features,
    ])
    .args(["-U", "6f72646f-2d6b-6572-6e65-6c2d62617365"])
    .args([
        "-E",
        "hash_seed=6f72646f-2d68-7472-6565-2d6861736821,lazy_itable_init=0,nodiscard",
    ])
    .args(["-T", "default"]);
    if journaled {
        mkfs.args(["-J", "size=4"]);
    }
    if let Some(g) = params.blocks_per_group {
        mkfs.args(["-g", &g.to_string()]);
    }
    mkfs.arg(&img).arg(format!("{}M", params.size_mib));
    run(&mut mkfs, "mkfs.ext4")?;
    let kernel = ordo_dev::KernelMount::mount(&img, &mnt, "")
        .map_err(|e| err("loop mount", e.to_string()))?;
    let fill = (|| -> std::io::Result<()> {
        let d = mnt.join(dir.path.trim_start_matches('/'));
        std::fs::create_dir(&d)?;
        for n in &dir.names {
            std::fs::File::create(d.join(n))?;
        }
        Ok(())
    })();
    let umount = kernel.unmount().map_err(|e| err("umount", e.to_string()));
    fill.map_err(|e| err("filling the directory", e.to_string()))?;
    umount?;
    let bytes = std::fs::read(&img).map_err(|e| err("reading back", e.to_string()))?;
    let dev = Arc::new(
        MemDevice::from_image(params.block_size, &bytes)
            .map_err(|e| err("loading", e.to_string()))?,
    );
    // The point of the base: the directory is indexed. (EXT4_INDEX_FL)
    const INDEX_FL: u32 = 0x1000;
    let fs = mount(Arc::new(dev.snapshot()), mode, DataMode::Ordered, true)
        .map_err(|e| err("mounting read-only", e.to_string()))?;
    let flags = fs
        .lookup_path(&dir.path)
        .map_err(|e| err(&dir.path, e.to_string()))?
        .flags;
    if flags & INDEX_FL == 0 {
        return Err(err(
            &dir.path,
            format!("the kernel did not index it (i_flags {flags:#x})"),
        ));
    }
    Ok(dev)
}

/// Write a memory image to a (sparse) file.
pub fn write_image(image: &MemDevice, path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path)?;
    let bs = u64::from(image.block_size());
    f.set_len(image.block_count() * bs)?;
    for b in image.populated_blocks() {
        if let Some(data) = image.block(b) {
            f.write_all_at(&data, b * bs)?;
        }
    }
    Ok(())
}

/// Block `b` of `dev`, as group metadata, with the block named on error.
pub fn read_raw_block(dev: &dyn BlockDevice, b: u64) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; dev.block_size() as usize];
    dev.read(b, &mut buf, ordo_dev::BlockClass::GroupMeta)
        .map_err(|e| format!("block {b}: {e}"))?;
    Ok(buf)
}

/// The superblock and every group descriptor of an image, read straight
/// from the device without mounting it (a crash image's, say); checksums
/// are not verified.
pub fn raw_groups(
    dev: &dyn BlockDevice,
) -> Result<(ordo_format::Superblock, Vec<ordo_format::GroupDesc>), String> {
    use ordo_format::superblock::{super_block_nr, super_offset, SUPERBLOCK_SIZE};
    let bs = dev.block_size();
    let sb_block = read_raw_block(dev, super_block_nr(bs))?;
    let off = super_offset(bs);
    let sb = ordo_format::Superblock::decode_unverified(&sb_block[off..off + SUPERBLOCK_SIZE])
        .map_err(|e| format!("superblock: {e}"))?;
    let table = u64::from(sb.first_data_block) + 1;
    let mut descs = Vec::new();
    for g in 0..sb.groups_count() {
        let (blk, at) = ordo_format::group::desc_location(&sb, table, g);
        let desc = ordo_format::GroupDesc::decode(&read_raw_block(dev, blk)?[at..], sb.desc_size())
            .map_err(|e| format!("group {g} descriptor: {e}"))?;
        descs.push(desc);
    }
    Ok((sb, descs))
}
