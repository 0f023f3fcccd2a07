//! The `ordo` command: make, mount, check and describe ordo images, and run
//! the crash explorer.
//!
//! Exit codes follow the tools each subcommand stands in for: `mount` like
//! mount(8) (1 for a usage error, 32 when mounting fails), `fsck` like
//! e2fsck (0 clean, 1 corrected, 4 left uncorrected, 8 operational error,
//! 16 usage), the others 0 on success and 1 on failure.

mod cmd_floor;
mod cmd_fsck;
mod cmd_mkfs;
mod cmd_mount;
mod cmd_streams;
mod daemon;
mod image_pool;
mod options;
mod stats;
mod superblock;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::superblock::SuperblockView;

/// Block images from memory faulted in ahead of need, by a thread of their
/// own, once a mount starts it (`image_pool`); everything else, and every
/// other subcommand, allocates from the system allocator.
#[global_allocator]
static ALLOCATOR: image_pool::ImagePool = image_pool::ImagePool::new();

/// Start the block-image pool's refiller (after any fork) for a block
/// cache of `cache_bytes`: the mount's cache grows without its serving
/// threads taking the page faults.
pub(crate) fn start_image_pool(cache_bytes: u64) -> bool {
    ALLOCATOR.start(image_pool::Levels::for_cache(cache_bytes))
}

/// The block-image pool's counts, once started.
pub(crate) fn image_pool_stats() -> Option<image_pool::PoolStats> {
    ALLOCATOR.started().then(|| ALLOCATOR.stats())
}

/// ordo: a user-space file system with ext4's on-disk format and a choice
/// of crash-consistency protocols.
#[derive(Parser, Debug)]
#[command(name = "ordo", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Debug)]
struct CrashArgs {
    /// The crash explorer's arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Make an ext4 image (a sparse file is created when IMAGE is missing).
    Mkfs(cmd_mkfs::MkfsArgs),
    /// Mount an image through FUSE; detach once the mount is live (-f:
    /// stay in the foreground) and serve it until it is unmounted (umount
    /// MOUNTPOINT, fusermount3 -u MOUNTPOINT, or SIGTERM / Ctrl-C; a
    /// mount still in use then is detached after 5 s, and served until
    /// its last open file is closed).
    Mount(cmd_mount::MountArgs),
    /// Check an image (read-only unless -p or -y). Exit codes as e2fsck:
    /// 0 clean, 1 errors corrected, 4 errors left uncorrected, 8
    /// operational error, 16 usage error.
    Fsck(cmd_fsck::FsckArgs),
    /// Show an image's superblock, like `dumpe2fs -h`, and the protocol
    /// statistics of its live or last `ordo mount`.
    Info(InfoArgs),
    /// Explore the disk states a crash can leave, recover and check each
    /// one (`ordo crash --help` for its options). Exit codes: 0 every state
    /// passed, 1 some failed, 2 the exploration could not run, 130 stopped
    /// by SIGINT or SIGTERM (between states, nothing left behind).
    #[command(disable_help_flag = true)]
    Crash(CrashArgs),
    /// Run the papers' workloads on ordo and on the kernel's ext4 and print
    /// one table (needs root; see docs/BENCH.md). Exit codes: 0 every row
    /// ran, 1 some target failed, 2 the benchmark could not run.
    Bench(ordo_bench::cli::BenchArgs),
    /// Run a program in a stream of an ordo mount: its changes, and those
    /// of every process it starts, are ordered within the stream (see
    /// docs/API.md). Exit codes: the program's, 1 when the stream cannot
    /// be set, 126/127 when the program cannot be run.
    Run(cmd_streams::RunArgs),
    /// An ordering point on a file of an ordo mount (OptFS's osync): what
    /// was written before reaches the disk before what is written after.
    Osync(cmd_streams::SyncFileArgs),
    /// Make a file of an ordo mount durable (OptFS's dsync).
    Dsync(cmd_streams::SyncFileArgs),
    /// Make a stream of an ordo mount durable (the caller's stream unless
    /// --stream names one).
    Streamsync(cmd_streams::StreamSyncArgs),
    /// Make the whole file system of an ordo mount durable. sync(1) does
    /// not reach a FUSE file system: the kernel does not pass syncfs on.
    Sync(cmd_streams::SyncFileArgs),
    /// Serve a FUSE file system that stores nothing, with ordo's session
    /// (threads, mount options, capabilities, TTLs), in the foreground
    /// until unmounted: the FUSE floor of `ordo bench` (target
    /// `fuse-floor`).
    #[command(name = "fuse-floor", hide = true)]
    FuseFloor(cmd_floor::FloorArgs),
}

#[derive(Args, Debug)]
struct InfoArgs {
    /// The image file or block device, or the mountpoint of an `ordo
    /// mount`.
    image: PathBuf,
}

/// Exit code of a usage error, per subcommand (e2fsck uses 16).
fn usage_exit_code(argv: &[String]) -> u8 {
    match argv.get(1).map(String::as_str) {
        Some("fsck") => cmd_fsck::EXIT_USAGE,
        Some("crash") => 2,
        _ => 1,
    }
}

/// The options mount(8), fstab and `mount.fuse3` pass that are not ordo's:
/// fstab's own (`defaults`, `noauto`, `user`, `nofail`, `_netdev`, `x-*`,
/// `comment=*`), the VFS flags FUSE mounts always carry, and the names
/// mount.fuse3 adds. Dropped before ordo's options are parsed.
fn generic_mount_option(o: &str) -> bool {
    matches!(
        o,
        "" | "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "_netdev"
            | "nofail"
            | "dev"
            | "nodev"
            | "suid"
            | "nosuid"
            | "exec"
            | "noexec"
            | "atime"
            | "noatime"
            | "relatime"
            | "norelatime"
            | "strictatime"
            | "lazytime"
            | "nolazytime"
            | "loop"
    ) || o.starts_with("x-")
        || o.starts_with("comment=")
        || o.starts_with("subtype=")
        || o.starts_with("fsname=")
}

/// `ordo IMAGE DIR [-o OPTIONS]...`, as `mount -t fuse.ordo` runs it
/// through mount.fuse3 (or mount(8) runs `mount.fuse.ordo`, a link to
/// this binary): the mount, detached once live, with mount(8)'s options
/// that are not ordo's dropped.
fn mount_helper(argv: &[String]) -> Option<cmd_mount::MountArgs> {
    let prog = std::path::Path::new(argv.first()?).file_name()?.to_str()?;
    let helper_name = prog.starts_with("mount.fuse");
    let first = argv.get(1)?;
    let known = Cli::command()
        .get_subcommands()
        .any(|c| c.get_name() == first)
        || first == "help";
    let source_exists = std::path::Path::new(first).exists();
    if !helper_name && (known || first.starts_with('-') || argv.len() < 3 || !source_exists) {
        return None;
    }
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = argv[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => {
                let list = it.next()?;
                let kept: Vec<&str> = list
                    .split(',')
                    .filter(|o| !generic_mount_option(o))
                    .collect();
                if !kept.is_empty() {
                    options.push(kept.join(","));
                }
            }
            // mount(8)'s: type, no mtab, sloppy, verbose.
            "-t" => {
                it.next()?;
            }
            "-n" | "-s" | "-v" => {}
            _ => positional.push(a.clone()),
        }
    }
    if positional.len() != 2 {
        return None;
    }
    Some(cmd_mount::MountArgs {
        image: PathBuf::from(&positional[0]),
        mountpoint: PathBuf::from(&positional[1]),
        options,
        foreground: false,
    })
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if let Some(a) = mount_helper(&argv) {
        return ExitCode::from(cmd_mount::run(&a));
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                usage_exit_code(&argv)
            } else {
                0
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let code = match cli.cmd {
        Cmd::Mkfs(a) => cmd_mkfs::run(&a),
        Cmd::Mount(a) => cmd_mount::run(&a),
        Cmd::Fsck(a) => cmd_fsck::run(&a),
        Cmd::Info(a) => info(&a),
        Cmd::Crash(a) => crash(&a.args),
        Cmd::Bench(a) => bench(&a),
        Cmd::Run(a) => cmd_streams::run(&a),
        Cmd::Osync(a) => cmd_streams::sync_file(&a, false),
        Cmd::Dsync(a) => cmd_streams::sync_file(&a, true),
        Cmd::Streamsync(a) => cmd_streams::streamsync(&a),
        Cmd::Sync(a) => cmd_streams::sync_all(&a),
        Cmd::FuseFloor(a) => cmd_floor::run(&a),
    };
    ExitCode::from(code)
}

/// `ordo info IMAGE|MOUNTPOINT`: the image, then its mount's statistics.
fn info(a: &InfoArgs) -> u8 {
    let dir = stats::run_dir();
    let canon = std::fs::canonicalize(&a.image).unwrap_or_else(|_| a.image.clone());
    let (image, lookup) = if a.image.is_dir() {
        match stats::find_by_mountpoint(&dir, &canon) {
            stats::Lookup::Found(s) => (s.image.clone(), stats::Lookup::Found(s)),
            _ => {
                eprintln!(
                    "ordo info: {}: a directory, and no ordo mount on it is recorded in {}",
                    a.image.display(),
                    dir.display()
                );
                return 1;
            }
        }
    } else {
        (a.image.clone(), stats::find_by_image(&dir, &canon))
    };
    let Some(code) = image_info(&image) else {
        return 1;
    };
    match lookup {
        stats::Lookup::Missing => println!(
            "\nProtocol statistics: none (no ordo mount of this image is recorded in {})",
            dir.display()
        ),
        stats::Lookup::Unreadable { path, why } => println!(
            "\nProtocol statistics: unavailable ({}: {why})",
            path.display()
        ),
        stats::Lookup::Found(s) => print!(
            "\n{}",
            stats::format_stats(&s, s.state(), stats::now_unix())
        ),
    }
    code
}

/// What `ordo info` prints about the image itself; the exit code, `None`
/// when it has no superblock to show.
fn image_info(image: &std::path::Path) -> Option<u8> {
    let sb = match SuperblockView::read(image) {
        Ok(sb) => sb,
        Err(e) => {
            eprintln!("ordo info: {}: {e}", image.display());
            return None;
        }
    };
    print!("{}", format_info(&sb));
    if sb.feature_compat & ordo_format::features::compat::HAS_JOURNAL != 0 {
        // The journal superblock and what a recovery would replay.
        // Without the lock, as dumpe2fs reads a mounted file system.
        let unlocked = ordo_dev::OpenOptions {
            exclusive: false,
            ..ordo_dev::OpenOptions::read_only()
        };
        let opened = ordo_dev::FileDevice::open(image, sb.block_size, unlocked);
        match opened
            .map_err(|e| e.to_string())
            .and_then(|dev| ordo_fs::recovery::journal_state(&dev).map_err(|e| e.to_string()))
        {
            Ok(Some(st)) => print!("{st}"),
            Ok(None) => {}
            Err(e) => {
                eprintln!("ordo info: {}: journal: {e}", image.display());
                return Some(1);
            }
        }
        // The fast-commit log a recovery would replay after the journal.
        let fc = ordo_dev::FileDevice::open(image, sb.block_size, unlocked)
            .map_err(|e| e.to_string())
            .and_then(|dev| ordo_fs::fc_replay::fc_state(&dev).map_err(|e| e.to_string()));
        if let Ok(Some(st)) = fc {
            print!("{st}");
        }
    }
    Some(0)
}

/// A superblock time as "YYYY-MM-DD HH:MM:SS UTC" ("n/a" for 0).
fn time_string(secs: u32) -> String {
    if secs == 0 {
        return "n/a".to_string();
    }
    let days = i64::from(secs / 86_400);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The `dumpe2fs -h`-like report of a superblock.
fn format_info(sb: &SuperblockView) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let label = if sb.volume_name.is_empty() {
        "<none>"
    } else {
        &sb.volume_name
    };
    let size_bytes = sb.blocks_count * u64::from(sb.block_size);
    let has_journal = sb.feature_compat & ordo_format::features::compat::HAS_JOURNAL != 0;
    let needs_recovery = sb.feature_incompat & ordo_format::features::incompat::RECOVER != 0;
    let lines: Vec<(&str, String)> = vec![
        ("Filesystem volume name", label.to_string()),
        (
            "Last mounted on",
            if sb.last_mounted.is_empty() {
                "<not available>".into()
            } else {
                sb.last_mounted.clone()
            },
        ),
        ("Filesystem UUID", sb.uuid_string()),
        (
            "Filesystem magic number",
            format!("{:#06X}", ordo_format::superblock::EXT4_MAGIC),
        ),
        ("Filesystem revision #", sb.rev_level.to_string()),
        ("Filesystem features", sb.feature_names().join(" ")),
        ("Filesystem state", sb.state_name()),
        (
            "Errors behavior",
            match sb.errors {
                1 => "Continue",
                2 => "Remount read-only",
                3 => "Panic",
                _ => "Unknown",
            }
            .into(),
        ),
        (
            "Filesystem size",
            format!("{size_bytes} bytes ({} MiB)", size_bytes >> 20),
        ),
        ("Inode count", sb.inodes_count.to_string()),
        ("Block count", sb.blocks_count.to_string()),
        ("Reserved block count", sb.reserved_blocks_count.to_string()),
        ("Free blocks", sb.free_blocks_count.to_string()),
        ("Free inodes", sb.free_inodes_count.to_string()),
        ("First block", sb.first_data_block.to_string()),
        ("Block size", sb.block_size.to_string()),
        ("Blocks per group", sb.blocks_per_group.to_string()),
        ("Inodes per group", sb.inodes_per_group.to_string()),
        ("Inode size", sb.inode_size.to_string()),
        ("First inode", sb.first_ino.to_string()),
        ("Group descriptor size", sb.desc_size.max(32).to_string()),
        ("Filesystem created", time_string(sb.mkfs_time)),
        ("Last mount time", time_string(sb.mount_time)),
        ("Last write time", time_string(sb.write_time)),
        ("Mount count", sb.mount_count.to_string()),
        ("Maximum mount count", sb.max_mount_count.to_string()),
        ("Lifetime writes", format!("{} KiB", sb.kbytes_written)),
        (
            "Checksum type",
            if sb.checksum_type == 1 {
                "crc32c".into()
            } else {
                "none".into()
            },
        ),
        ("Checksum", format!("{:#010x}", sb.checksum)),
        (
            "Journal",
            if has_journal {
                format!(
                    "inode {}{}",
                    sb.journal_inum,
                    if needs_recovery {
                        ", needs recovery"
                    } else {
                        ", clean"
                    }
                )
            } else {
                "none".into()
            },
        ),
        (
            "First orphan inode",
            if sb.last_orphan == 0 {
                "none".into()
            } else {
                sb.last_orphan.to_string()
            },
        ),
        ("FS error count", sb.error_count.to_string()),
    ];
    for (k, v) in lines {
        let _ = writeln!(o, "{:<26}{v}", format!("{k}:"));
    }
    o
}

/// `ordo bench ...`: the benchmark harness.
fn bench(a: &ordo_bench::cli::BenchArgs) -> u8 {
    match ordo_bench::cli::run(a) {
        Ok(code) => u8::try_from(code).unwrap_or(1),
        Err(e) => {
            eprintln!("ordo bench: {e}");
            2
        }
    }
}

/// `ordo crash ...`: the crash explorer parses its own arguments.
fn crash(args: &[String]) -> u8 {
    // SIGINT/SIGTERM: the workers finish the states they are checking and
    // release their loop devices, mounts and images; a second one exits at
    // once.
    if let Err(e) = ctrlc::set_handler(|| {
        if ordo_crash::stop::request() {
            eprintln!("ordo crash: interrupted again, exiting now");
            std::process::exit(130);
        }
        eprintln!(
            "ordo crash: stopping after the states being checked (interrupt again to exit at once)"
        );
    }) {
        eprintln!("ordo crash: cannot handle Ctrl-C/SIGTERM: {e}");
    }
    // The explorer runs the core, and its FUSE recordings, on the
    // allocator `ordo mount` runs them on: every state it checks is also a
    // check that no block image was handed out twice.
    if !start_image_pool(ordo_fs::MountOptions::default().cache_bytes) {
        eprintln!("ordo crash: the block-image pool did not start (no address space or no thread for it); block images come from the system allocator");
    }
    match ordo_crash::cli::run(args) {
        Ok(code) => u8::try_from(code).unwrap_or(1),
        Err(message) => {
            eprint!("{message}");
            if !message.ends_with('\n') {
                eprintln!();
            }
            if ordo_crash::stop::requested() {
                130
            } else {
                2
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_times_print_as_utc_dates() {
        assert_eq!(time_string(0), "n/a");
        assert_eq!(time_string(1), "1970-01-01 00:00:01 UTC");
        assert_eq!(time_string(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(time_string(1_795_361_721), "2026-11-22 15:35:21 UTC");
        assert_eq!(time_string(u32::MAX), "2106-02-07 06:28:15 UTC");
    }
}
