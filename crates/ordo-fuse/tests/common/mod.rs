//! What the adapter's integration tests share.

use ordo_dev::MemDevice;
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};

/// A fresh ext4 image of `blocks` 4 KiB blocks in memory, with a journal
/// of 1024 blocks.
pub fn journaled_image(blocks: u64) -> MemDevice {
    let mem = MemDevice::new(4096, blocks).unwrap();
    let features = parse_features("has_journal", DEFAULT_FEATURES).unwrap();
    mkfs(
        &mem,
        &MkfsOptions {
            block_size: 4096,
            features,
            journal_blocks: Some(1024),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    mem
}
