//! `ordo fsck IMAGE [-n|-p|-y]`, with e2fsck's exit codes.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use ordo_dev::{BlockDevice, FileDevice, OpenOptions};
use ordo_fs::fsck::{check, FsckOptions, Severity};

use crate::superblock::SuperblockView;

/// No errors.
pub const EXIT_CLEAN: u8 = 0;
/// Errors were found and corrected.
pub const EXIT_CORRECTED: u8 = 1;
/// Errors were found and left uncorrected.
pub const EXIT_UNCORRECTED: u8 = 4;
/// The check itself failed (image unreadable, not ext4, ...).
pub const EXIT_OPERATIONAL: u8 = 8;
/// Usage or syntax error.
pub const EXIT_USAGE: u8 = 16;

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// The image file or block device.
    pub image: PathBuf,
    /// Open read-only and answer "no" to every repair (the default).
    #[arg(short = 'n', conflicts_with_all = ["preen", "yes"])]
    pub no: bool,
    /// Repair what is safe to repair without asking.
    #[arg(short = 'p', conflicts_with = "yes")]
    pub preen: bool,
    /// Repair everything.
    #[arg(short = 'y')]
    pub yes: bool,
    /// Accepted for e2fsck compatibility: ordo always checks fully.
    #[arg(short = 'f')]
    pub force: bool,
}

/// Run `ordo fsck`; returns the exit code.
pub fn run(a: &FsckArgs) -> u8 {
    let repair = a.preen || a.yes;
    let name = a.image.display();
    // The block size comes from the primary superblock; when that is
    // unreadable the checker still looks for a backup, reading in 1 KiB
    // blocks.
    let block_size = SuperblockView::read(&a.image)
        .map(|sb| sb.block_size)
        .unwrap_or(1024);
    let opts = if repair {
        OpenOptions::read_write()
    } else {
        OpenOptions::read_only()
    };
    let dev = match FileDevice::open(&a.image, block_size, opts) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ordo fsck: {e}");
            return EXIT_OPERATIONAL;
        }
    };
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    // A journal that needs recovery is replayed first, as e2fsck does: for
    // real when repairing, in memory (the image untouched) with -n, so that
    // the check sees the file system the next mount will see rather than
    // the metadata the log is about to replace.
    let mut recovered = false;
    let dev = if repair {
        match ordo_fs::recover_image(dev.as_ref()) {
            Ok(Some(r)) => {
                print_recovery(&name.to_string(), "", &r);
                recovered = true;
                dev
            }
            Ok(None) => dev,
            Err(e) => {
                eprintln!("ordo fsck: {name}: journal recovery failed: {e}");
                return EXIT_UNCORRECTED;
            }
        }
    } else {
        match ordo_fs::recovered_view(dev.clone()) {
            Ok((view, Some(r))) => {
                print_recovery(
                    &name.to_string(),
                    " in memory (the image is not changed)",
                    &r,
                );
                view
            }
            Ok((view, None)) => view,
            Err(e) => {
                println!(
                    "{name}: [info] the journal cannot be replayed ({e}); checking the image as it is"
                );
                dev
            }
        }
    };
    let fsck_opts = FsckOptions {
        repair_benign: repair,
        ..FsckOptions::default()
    };
    let report = match check(dev.as_ref(), &fsck_opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ordo fsck: {name}: {e}");
            return EXIT_OPERATIONAL;
        }
    };
    for p in &report.problems {
        println!("{name}: {p}");
    }
    if report.truncated {
        println!("{name}: (more problems not shown)");
    }
    for r in &report.repairs {
        println!("{name}: repaired: {r}");
    }
    if let Some(rem) = &report.remaining {
        for p in rem.iter().filter(|p| p.severity > Severity::Info) {
            println!("{name}: still wrong after repair: {p}");
        }
    }
    if repair && report.has_unsafe() {
        println!("{name}: not repaired: the image has problems that are not safe to repair automatically");
    }
    let st = &report.stats;
    println!(
        "{name}: {} problem(s); {}/{} inodes, {}/{} blocks, {} directories, {} files, {} symlinks",
        report
            .problems
            .iter()
            .filter(|p| p.severity > Severity::Info)
            .count(),
        st.inodes_used,
        st.inodes_count,
        st.blocks_used,
        st.blocks_count,
        st.directories,
        st.regular_files,
        st.symlinks
    );
    match report.exit_code() {
        0 if recovered => EXIT_CORRECTED,
        0 => EXIT_CLEAN,
        1 => EXIT_CORRECTED,
        _ => EXIT_UNCORRECTED,
    }
}

fn print_recovery(name: &str, how: &str, r: &ordo_fs::protocol::RecoveryReport) {
    println!(
        "{name}: journal needs recovery: replayed{how}: {} record(s), {} block(s) written",
        r.replayed, r.blocks_written
    );
    for l in &r.lines {
        println!("{name}:   {l}");
    }
}
