//! `ordo mkfs IMAGE --size SIZE [-b BS] [-g BLOCKS] [--mode MODE] [-O FEATURES] [-L LABEL] [-N INODES]`.

use std::path::PathBuf;

use std::os::unix::fs::FileTypeExt;

use clap::Args;
use ordo_dev::{BlockDevice, FileDevice, OpenOptions};
use ordo_fs::mkfs::{mkfs, parse_features, MkfsOptions, DEFAULT_FEATURES};

use crate::options::parse_size;

#[derive(Args, Debug)]
pub struct MkfsArgs {
    /// The image file (created sparse when missing) or block device.
    pub image: PathBuf,
    /// Size of the file system, e.g. 64M or 2G (default: the size of an
    /// existing image or device).
    #[arg(short = 's', long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Block size in bytes: 1024, 2048 or 4096.
    #[arg(short = 'b', long = "block-size", default_value_t = 4096)]
    pub block_size: u32,
    /// Features, as mke2fs -O: a comma-separated list, "^name" turns one off.
    /// `has_journal` is on by default (`-O ^has_journal` for async / sync).
    #[arg(short = 'O', long = "features")]
    pub features: Option<String>,
    /// Journal size in blocks (default: mke2fs's size for the file system).
    #[arg(short = 'J', long = "journal-blocks")]
    pub journal_blocks: Option<u32>,
    /// Volume label (at most 16 bytes).
    #[arg(short = 'L', long)]
    pub label: Option<String>,
    /// Format for this protocol (`-o mode=`): add the features it needs on
    /// disk (a journal, a fast-commit area), before `-O`.
    #[arg(long = "mode")]
    pub mode: Option<ordo_fs::ProtocolKind>,
    /// Number of inodes (default: one per 16 KiB).
    #[arg(short = 'N', long = "inodes")]
    pub inodes: Option<u32>,
    /// Percentage of the blocks reserved for root (`s_r_blocks_count`), as
    /// mke2fs -m: other users get ENOSPC when only these are left.
    #[arg(short = 'm', long = "reserved-percent", default_value_t = 5)]
    pub reserved_percent: u32,
    /// Blocks per group, as mke2fs -g: a multiple of 8 from 256 to 8 x the
    /// block size (the default).
    #[arg(short = 'g', long = "blocks-per-group")]
    pub blocks_per_group: Option<u32>,
}

fn make(a: &MkfsArgs) -> Result<String, String> {
    let name = a.image.display();
    // Like mke2fs: an internal journal unless turned off.
    let mut base = parse_features("has_journal", DEFAULT_FEATURES).map_err(|e| e.to_string())?;
    if let Some(mode) = a.mode {
        base = parse_features(mode.spec().mkfs_features, base).map_err(|e| e.to_string())?;
    }
    let features = match &a.features {
        Some(spec) => parse_features(spec, base).map_err(|e| e.to_string())?,
        None => base,
    };
    if let Some(label) = &a.label {
        if label.len() > 16 {
            return Err(format!("label '{label}' is longer than 16 bytes"));
        }
    }
    let existing = std::fs::metadata(&a.image).ok();
    let is_block_device = existing
        .as_ref()
        .is_some_and(|m| m.file_type().is_block_device());
    let (dev, fresh) = match (&existing, a.size) {
        (None, None) => {
            return Err(format!(
                "{name} does not exist: give --size to create it (e.g. --size 1G)"
            ))
        }
        (None, Some(size)) => (
            FileDevice::create(&a.image, size, a.block_size).map_err(|e| e.to_string())?,
            true,
        ),
        (Some(m), Some(size)) if !is_block_device && m.len() < size => (
            FileDevice::create(&a.image, size, a.block_size).map_err(|e| e.to_string())?,
            false,
        ),
        (Some(_), _) => (
            FileDevice::open(&a.image, a.block_size, OpenOptions::read_write())
                .map_err(|e| e.to_string())?,
            false,
        ),
    };
    let opts = MkfsOptions {
        size_bytes: a.size.unwrap_or(0),
        block_size: a.block_size,
        inodes_count: a.inodes,
        features,
        label: a.label.clone().unwrap_or_default(),
        assume_zeroed: fresh,
        journal_blocks: a.journal_blocks,
        reserved_percent: a.reserved_percent,
        blocks_per_group: a.blocks_per_group,
        ..MkfsOptions::default()
    };
    let report = mkfs(&dev, &opts).map_err(|e| format!("{name}: {e}"))?;
    dev.flush().map_err(|e| format!("{name}: flush: {e}"))?;
    let uuid: String = report.uuid.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "{name}: ext4 file system of {} blocks of {} bytes ({} MiB), {} groups, \
         {} inodes ({} per group), {} blocks free\n\
         UUID {}-{}-{}-{}-{}\nfeatures: {}\njournal: {}\n",
        report.blocks_count,
        report.block_size,
        (report.blocks_count * u64::from(report.block_size)) >> 20,
        report.groups_count,
        report.inodes_count,
        report.inodes_per_group,
        report.free_blocks,
        &uuid[0..8],
        &uuid[8..12],
        &uuid[12..16],
        &uuid[16..20],
        &uuid[20..32],
        report.features.names().join(" "),
        if report.journal_blocks == 0 {
            "none".to_string()
        } else {
            format!("{} blocks", report.journal_blocks)
        }
    ))
}

/// Run `ordo mkfs`; returns the exit code.
pub fn run(a: &MkfsArgs) -> u8 {
    let existed = a.image.exists();
    match make(a) {
        Ok(summary) => {
            print!("{summary}");
            0
        }
        Err(e) => {
            eprintln!("ordo mkfs: {e}");
            // Leave no half-made image behind when the file was ours.
            if !existed {
                let _ = std::fs::remove_file(&a.image);
            }
            1
        }
    }
}
