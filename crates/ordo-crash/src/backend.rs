//! The parts of ordo the explorer drives: mkfs, fsck and mount, behind a few
//! functions so that the rest of the explorer reads the same whatever their
//! exact signatures.

use std::sync::Arc;

use ordo_dev::{BlockDevice, MemDevice};
use ordo_fs::{DataMode, Fs, MountOptions, ProtocolKind};

use crate::error::CrashError;

/// Geometry of the base image.
#[derive(Clone, Copy, Debug)]
pub struct ImageParams {
    /// Image size in MiB.
    pub size_mib: u64,
    /// File-system block size in bytes.
    pub block_size: u32,
}

impl Default for ImageParams {
    fn default() -> Self {
        ImageParams {
            size_mib: 16,
            block_size: 4096,
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
        time_sec: Some(1_700_000_000),
        journal_blocks: journaled.then_some(1024),
        assume_zeroed: true,
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
/// driven by the workload.
pub fn mount_options(mode: ProtocolKind, data: DataMode, read_only: bool) -> MountOptions {
    MountOptions {
        mode,
        data,
        read_only,
        background: false,
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
