//! What the harness reads from and does to the host: running commands,
//! the kernel's per-device I/O counters, and a process's CPU time and peak
//! memory.
//!
//! The kernel's counters are what make the comparison fair: ordo on
//! `/dev/loopN` and the kernel's ext4 on `/dev/loopM` are counted by the
//! same code in the block layer (`/sys/block/loopN/stat`), whatever either
//! file system believes it wrote.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde::Serialize;

use crate::error::{BenchError, Result};

/// Bytes in a sector as `/sys/block/*/stat` counts them (always 512).
pub const SECTOR_BYTES: u64 = 512;

/// One line of `/sys/block/DEV/stat` (Documentation/block/stat.rst): 17
/// fields on kernels since 5.5, 15 since 4.18, 11 before; missing fields
/// read as zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockStat {
    /// Read requests completed (field 1).
    pub reads: u64,
    /// Read requests merged into others (field 2).
    pub read_merges: u64,
    /// Sectors read (field 3).
    pub read_sectors: u64,
    /// Write requests completed (field 5).
    pub writes: u64,
    /// Write requests merged into others (field 6).
    pub write_merges: u64,
    /// Sectors written (field 7).
    pub write_sectors: u64,
    /// Flush requests completed (field 16).
    pub flushes: u64,
}

impl BlockStat {
    /// Parses the whitespace-separated fields of a stat line.
    pub fn parse(line: &str) -> Result<BlockStat> {
        let fields: Vec<u64> = line
            .split_whitespace()
            .map(|f| f.parse::<u64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| BenchError::Usage(format!("bad block stat line '{line}': {e}")))?;
        if fields.len() < 11 {
            return Err(BenchError::Usage(format!(
                "bad block stat line '{line}': {} fields, expected at least 11",
                fields.len()
            )));
        }
        let at = |i: usize| fields.get(i).copied().unwrap_or(0);
        Ok(BlockStat {
            reads: at(0),
            read_merges: at(1),
            read_sectors: at(2),
            writes: at(4),
            write_merges: at(5),
            write_sectors: at(6),
            flushes: at(15),
        })
    }

    /// Reads the counters of a block device such as `/dev/loop3`.
    pub fn read(dev: &Path) -> Result<BlockStat> {
        let name = dev
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| BenchError::Usage(format!("{}: not a device path", dev.display())))?;
        let p = Path::new("/sys/block").join(name).join("stat");
        let s = std::fs::read_to_string(&p).map_err(|e| BenchError::io("read", &p, e))?;
        BlockStat::parse(s.trim())
    }

    /// `self - earlier`, field by field (saturating).
    pub fn since(&self, earlier: &BlockStat) -> BlockStat {
        BlockStat {
            reads: self.reads.saturating_sub(earlier.reads),
            read_merges: self.read_merges.saturating_sub(earlier.read_merges),
            read_sectors: self.read_sectors.saturating_sub(earlier.read_sectors),
            writes: self.writes.saturating_sub(earlier.writes),
            write_merges: self.write_merges.saturating_sub(earlier.write_merges),
            write_sectors: self.write_sectors.saturating_sub(earlier.write_sectors),
            flushes: self.flushes.saturating_sub(earlier.flushes),
        }
    }

    /// Bytes written.
    pub fn write_bytes(&self) -> u64 {
        self.write_sectors * SECTOR_BYTES
    }
}

/// The command line of `cmd`, for messages.
pub fn command_line(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The last `max_chars` characters of a command's stderr, trimmed.
fn tail(bytes: &[u8], max_chars: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    let skip = s.chars().count().saturating_sub(max_chars);
    s.chars().skip(skip).collect()
}

/// Runs `cmd` to completion with stdin closed; an error unless it exits 0.
pub fn run(cmd: &mut Command) -> Result<Output> {
    run_with_stdin(cmd, Stdio::null())
}

/// Runs `cmd` to completion reading `stdin`; an error unless it exits 0.
pub fn run_with_stdin(cmd: &mut Command, stdin: Stdio) -> Result<Output> {
    let line = command_line(cmd);
    let out = cmd
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| BenchError::Command {
            command: line.clone(),
            status: "not started".into(),
            stderr: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(BenchError::Command {
            command: line,
            status: out.status.to_string(),
            stderr: tail(&out.stderr, 2000),
        });
    }
    Ok(out)
}

/// Runs a program given as words.
pub fn run_words(words: &[&str]) -> Result<Output> {
    let (prog, args) = words
        .split_first()
        .ok_or_else(|| BenchError::Usage("empty command".into()))?;
    run(Command::new(prog).args(args))
}

/// Finds `program` on `$PATH`.
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Serialises `ensure_program` within the process: the smoke test and
/// `ordo bench` run several workloads at once, and two of them missing a
/// program must not start two `apt-get`s.
static INSTALL_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How long `apt-get` waits for the dpkg lock held by another process
/// (apt's own `DPkg::Lock::Timeout`), in seconds.
const DPKG_LOCK_TIMEOUT_S: u32 = 600;

/// Makes sure `program` is installed, installing the Debian package
/// `package` with apt-get when it is missing and we are root.
///
/// `scripts/deps.sh` installs every program up front; this is the fallback
/// for interactive `ordo bench` on a machine where it never ran. It never
/// races: calls are serialised within the process, and apt-get waits for
/// the dpkg lock another process holds instead of failing.
pub fn ensure_program(program: &str, package: &str) -> Result<std::path::PathBuf> {
    if let Some(p) = which(program) {
        return Ok(p);
    }
    // A poisoned lock only means another install panicked; the lock
    // protects no data, so go on.
    let _guard = INSTALL_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Another thread may have installed it while we waited.
    if let Some(p) = which(program) {
        return Ok(p);
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && which("apt-get").is_some() {
        eprintln!("ordo bench: {program} not found; installing Debian package {package}");
        let lock = format!("DPkg::Lock::Timeout={DPKG_LOCK_TIMEOUT_S}");
        let install = || {
            run(Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args([
                    "-o",
                    &lock,
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    package,
                ]))
        };
        if install().is_err() {
            // A machine that never ran `apt-get update` has no package
            // lists; fetch them once and try again.
            run(Command::new("apt-get").args(["-o", &lock, "update", "-q"]))?;
            install()?;
        }
        if let Some(p) = which(program) {
            return Ok(p);
        }
    }
    Err(BenchError::Missing {
        program: program.into(),
        hint: format!("install the Debian package `{package}` (scripts/deps.sh installs every program ordo drives)"),
    })
}

/// CPU time (user + system) of this process and of its waited-for
/// children, in microseconds.
pub fn self_and_children_cpu_us() -> u64 {
    fn of(who: libc::c_int) -> u64 {
        // SAFETY: getrusage fills the zeroed struct we own.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(who, &mut ru) } != 0 {
            return 0;
        }
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
    of(libc::RUSAGE_SELF) + of(libc::RUSAGE_CHILDREN)
}

/// CPU time (user + system) of process `pid` from `/proc/PID/stat`, in
/// microseconds; `None` if the process is gone.
pub fn process_cpu_us(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it are
    // counted from its closing parenthesis.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Some((utime + stime) * 1_000_000 / hz)
}

/// Peak resident memory (VmHWM) of process `pid`, KiB.
pub fn process_peak_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Resets this process's peak resident memory to its current size, so
/// that [`process_peak_kib`] measures from now on (`clear_refs` value 5,
/// Linux 4.0 and later). Best effort.
pub fn reset_own_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Resets the peak resident memory of process `pid` (a child serving a
/// file system), as [`reset_own_peak`] does for this one. Best effort.
pub fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// True if `dir` is a mount point (listed in `/proc/self/mountinfo`).
pub fn is_mount_point(dir: &Path) -> bool {
    let Ok(canon) = dir.canonicalize() else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = canon.to_string_lossy();
    info.lines().any(|l| {
        l.split_whitespace()
            .nth(4)
            .map(unescape_mountinfo)
            .is_some_and(|m| m == want)
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|t| u8::from_str_radix(t, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The CPU model name from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Online CPUs.
pub fn cpu_count() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Total memory, MiB.
pub fn mem_total_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kib| kib / 1024)
        .unwrap_or(0)
}

/// The kernel's FUSE over io_uring turned on for a run whose targets ask
/// for it (`ordo:MODE,io_uring`, `fuse-floor,io_uring`), and set back to
/// what it was when the returned switch is dropped; `None` (and a message)
/// when this kernel has no such switch or it cannot be written (it needs
/// root): such targets then run over `/dev/fuse`, and `ordo mount` says so
/// too. Only a server that asks for the ring in INIT gets it, so the other
/// targets of the run are served as before.
pub fn fuse_uring_on() -> Option<ordo_fuse::uring_switch::RingSwitch> {
    use ordo_fuse::uring_switch::{RingSwitch, ENABLE_URING};
    match RingSwitch::set(true) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!(
                "ordo bench: cannot turn on {ENABLE_URING} ({e}; the kernel needs FUSE over \
io_uring, and root): io_uring targets are served over /dev/fuse"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_seventeen_field_stat_line() {
        let s = BlockStat::parse(
            "     150       10     2192       15       69       19      838       28        0       36       69        0        0        0        0       39       25",
        )
        .unwrap();
        assert_eq!(s.reads, 150);
        assert_eq!(s.read_merges, 10);
        assert_eq!(s.read_sectors, 2192);
        assert_eq!(s.writes, 69);
        assert_eq!(s.write_merges, 19);
        assert_eq!(s.write_sectors, 838);
        assert_eq!(s.flushes, 39);
        assert_eq!(s.write_bytes(), 838 * 512);
    }

    #[test]
    fn old_kernels_have_no_flush_field() {
        let s = BlockStat::parse("1 2 3 4 5 6 7 8 9 10 11").unwrap();
        assert_eq!(s.writes, 5);
        assert_eq!(s.flushes, 0);
        assert!(BlockStat::parse("1 2 3").is_err());
        assert!(BlockStat::parse("1 2 x 4 5 6 7 8 9 10 11").is_err());
    }

    #[test]
    fn since_subtracts_and_saturates() {
        let a = BlockStat {
            writes: 10,
            flushes: 3,
            ..Default::default()
        };
        let b = BlockStat {
            writes: 4,
            flushes: 5,
            ..Default::default()
        };
        let d = a.since(&b);
        assert_eq!(d.writes, 6);
        assert_eq!(d.flushes, 0);
    }

    #[test]
    fn own_process_figures_are_readable() {
        let pid = std::process::id();
        assert!(process_peak_kib(pid).unwrap() > 0);
        assert!(process_cpu_us(pid).is_some());
        assert!(is_mount_point(Path::new("/")));
        assert!(!is_mount_point(Path::new("/definitely/not/here")));
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
    }

    #[test]
    fn failing_command_reports_its_stderr() {
        let e = run_words(&["sh", "-c", "echo oops >&2; exit 3"]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("oops") && msg.contains("sh -c"), "{msg}");
    }
}
