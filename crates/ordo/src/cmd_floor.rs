//! `ordo fuse-floor MOUNTPOINT [--threads N] [--open-requests on|off] [--io-uring]` (hidden): the FUSE floor of
//! the benchmarks, a FUSE file system that stores nothing, served with the
//! session of `ordo mount` (`ordo_fuse::floor`). It stays in the
//! foreground until unmounted (umount MOUNTPOINT, fusermount3 -u
//! MOUNTPOINT, or SIGTERM / Ctrl-C), as `ordo mount -f` does.

use std::path::PathBuf;

use clap::Args;

use crate::cmd_mount::{EXIT_MOUNT_FAILED, EXIT_USAGE};

#[derive(Args, Debug)]
pub struct FloorArgs {
    /// An existing directory.
    pub mountpoint: PathBuf,
    /// Worker threads serving requests (ordo's default unless given).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: Option<u16>,
    /// Serve OPEN and RELEASE (`on`, ordo's default) or answer OPEN with
    /// ENOSYS so that the kernel opens files itself (`off`), as `ordo mount
    /// -o open_requests=off` does.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub open_requests: String,
    /// Serve requests through FUSE over io_uring when the kernel offers
    /// it, as `ordo mount -o io_uring` does.
    #[arg(long)]
    pub io_uring: bool,
    /// One worker reads requests while it runs, another only while it
    /// waits (`demand`, ordo's default), or every worker reads (`all`), as
    /// `ordo mount -o readers=` has it.
    #[arg(long, value_name = "demand|all", default_value = "demand", value_parser = ["demand", "all"])]
    pub readers: String,
}

/// Run `ordo fuse-floor`; returns the exit code.
pub fn run(a: &FloorArgs) -> u8 {
    match std::fs::metadata(&a.mountpoint) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            eprintln!(
                "ordo fuse-floor: mountpoint {}: not a directory",
                a.mountpoint.display()
            );
            return EXIT_USAGE;
        }
        Err(e) => {
            eprintln!(
                "ordo fuse-floor: mountpoint {}: {e}",
                a.mountpoint.display()
            );
            return EXIT_USAGE;
        }
    }
    let threads = a
        .threads
        .map_or(ordo_fuse::MountConfig::default().threads, usize::from);
    let mut session = match ordo_fuse::floor::mount_floor(
        &a.mountpoint,
        threads,
        a.open_requests == "on",
        a.io_uring,
        a.readers == "demand",
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "ordo fuse-floor: {}: FUSE mount failed: {e}",
                a.mountpoint.display()
            );
            return EXIT_MOUNT_FAILED;
        }
    };
    crate::cmd_mount::unmount_on_signals(&mut session, &a.mountpoint, "ordo fuse-floor");
    if a.io_uring && !session.io_uring() {
        eprintln!("ordo fuse-floor: {}", ordo_fuse::IO_URING_NOT_OFFERED);
    }
    eprintln!(
        "ordo: FUSE floor (stores nothing) mounted on {} ({threads} threads{}); unmount with: umount {}",
        a.mountpoint.display(),
        if session.io_uring() { ", io_uring" } else { "" },
        a.mountpoint.display()
    );
    match session.run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ordo fuse-floor: FUSE session ended with an error: {e}");
            1
        }
    }
}
