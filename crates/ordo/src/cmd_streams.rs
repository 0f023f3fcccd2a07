//! `ordo run`, `ordo osync`, `ordo dsync`, `ordo streamsync`: the
//! durability calls and streams of a live `ordo mount`, through its
//! ioctls (`ordo_fuse::ioctl`, documented in docs/API.md).
//!
//! `ordo run --stream NAME -- CMD` puts its own process in the stream and
//! then execs CMD, so CMD keeps the pid the mount recorded, and every
//! process CMD starts inherits the stream. It sets the stream's flags
//! too (SETSTREAMFLAGS): `--ignore-fsync` is ccfs's `IGNORE_FSYNC`, under
//! which the fsyncs of every process in the stream return at once (the
//! stream's order still holds; `ordo streamsync` makes it durable), and
//! without it fsync in the stream is a real one again.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use clap::Args;
use ordo_fuse::ioctl;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The stream to run CMD in (made on first use; `default` is the
    /// stream of every process that set none).
    #[arg(long, value_name = "NAME")]
    stream: OsString,
    /// Set the stream's IGNORE_FSYNC flag (ccfs+): fsync and fdatasync in
    /// the stream return at once, ordering kept; `ordo streamsync` makes
    /// the stream durable. The flag is the stream's, so it applies to
    /// every process in it; without this option `ordo run` clears it.
    #[arg(long)]
    ignore_fsync: bool,
    /// A directory on the ordo mount (default: the current directory).
    #[arg(long, value_name = "DIR")]
    mount: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    cmd: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct SyncFileArgs {
    /// A file or directory on an ordo mount.
    file: PathBuf,
}

#[derive(Args, Debug)]
pub struct StreamSyncArgs {
    /// The stream to make durable (default: this process's stream, which
    /// `ordo run` sets).
    #[arg(long, value_name = "NAME")]
    stream: Option<OsString>,
    /// A file or directory on the ordo mount.
    path: PathBuf,
}

/// Why a call failed, said for a person.
fn explain(what: &str, path: &Path, e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOTTY) | Some(libc::ENOSYS) => format!(
            "{}: not on an ordo mount (the file system does not know ordo's ioctls: {e})",
            path.display()
        ),
        _ => format!("{what} {}: {e}", path.display()),
    }
}

/// Call `cmd` with `name` in its buffer.
fn ioctl_name(file: &File, cmd: u32, name: &[u8]) -> io::Result<()> {
    let mut buf = ioctl::name_buffer(name).map_err(io::Error::from_raw_os_error)?;
    ioctl::call(file, cmd, Some(&mut buf))
}

fn open(path: &Path) -> Result<File, String> {
    File::open(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// SETSTREAMFLAGS: the caller in stream `name` (non-empty) with `flags`.
fn set_stream_flags(file: &File, name: &[u8], flags: u32) -> io::Result<()> {
    if name.is_empty() {
        // The ioctl reads an empty name as "the caller's stream".
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut buf = ioctl::stream_flags_buffer(name, flags).map_err(io::Error::from_raw_os_error)?;
    ioctl::call(file, ioctl::ORDO_IOC_SETSTREAMFLAGS, Some(&mut buf))
}

/// `ordo run --stream NAME [--ignore-fsync] [--mount DIR] -- CMD ARGS...`.
pub fn run(a: &RunArgs) -> u8 {
    let dir = a.mount.clone().unwrap_or_else(|| PathBuf::from("."));
    let flags = if a.ignore_fsync {
        ioctl::IGNORE_FSYNC
    } else {
        0
    };
    let set = open(&dir).and_then(|f| {
        set_stream_flags(&f, a.stream.as_bytes(), flags).map_err(|e| {
            let mut m = explain("setstream on", &dir, &e);
            if matches!(e.raw_os_error(), Some(libc::ENOTTY) | Some(libc::ENOSYS))
                && a.mount.is_none()
            {
                m.push_str("; run from a directory of the mount or give --mount DIR");
            }
            m
        })
    });
    if let Err(m) = set {
        eprintln!("ordo run: {m}");
        return 1;
    }
    // exec returns only on failure; the pid, and so the stream, is kept.
    let e = std::process::Command::new(&a.cmd[0])
        .args(&a.cmd[1..])
        .exec();
    eprintln!("ordo run: {}: {e}", a.cmd[0].to_string_lossy());
    // As shells: 127 for a program not found, 126 for one not runnable.
    if e.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// `ordo osync FILE` / `ordo dsync FILE`.
pub fn sync_file(a: &SyncFileArgs, dsync: bool) -> u8 {
    let (name, cmd) = if dsync {
        ("dsync", ioctl::ORDO_IOC_DSYNC)
    } else {
        ("osync", ioctl::ORDO_IOC_OSYNC)
    };
    let r = open(&a.file)
        .and_then(|f| ioctl::call(&f, cmd, None).map_err(|e| explain(name, &a.file, &e)));
    match r {
        Ok(()) => 0,
        Err(m) => {
            eprintln!("ordo {name}: {m}");
            1
        }
    }
}

/// `ordo sync PATH`: the file system PATH is on, made durable.
pub fn sync_all(a: &SyncFileArgs) -> u8 {
    let r = open(&a.file).and_then(|f| {
        ioctl::call(&f, ioctl::ORDO_IOC_SYNC, None).map_err(|e| explain("sync", &a.file, &e))
    });
    match r {
        Ok(()) => 0,
        Err(m) => {
            eprintln!("ordo sync: {m}");
            1
        }
    }
}

/// `ordo streamsync [--stream NAME] PATH`.
pub fn streamsync(a: &StreamSyncArgs) -> u8 {
    let name = a.stream.as_ref().map_or(&[][..], |s| s.as_bytes());
    let r = open(&a.path).and_then(|f| {
        ioctl_name(&f, ioctl::ORDO_IOC_STREAMSYNC, name).map_err(|e| {
            if e.raw_os_error() == Some(libc::EINVAL) && !name.is_empty() {
                format!(
                    "no stream named '{}' on the mount of {}",
                    String::from_utf8_lossy(name),
                    a.path.display()
                )
            } else {
                explain("streamsync on", &a.path, &e)
            }
        })
    });
    match r {
        Ok(()) => 0,
        Err(m) => {
            eprintln!("ordo streamsync: {m}");
            1
        }
    }
}
