//! Typed errors of the harness. Every error names what was being done
//! (the command run, the target set up, the file touched) so that a failed
//! run of a long benchmark says where it stopped.

use std::io;
use std::path::PathBuf;

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A bad command line: unknown workload, target, scale or option.
    #[error("{0}")]
    Usage(String),
    /// An external command (mkfs.ext4, losetup, mount, sqlite3, ...) failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line, as it would be typed.
        command: String,
        /// Exit status, or how it died.
        status: String,
        /// The end of its standard error.
        stderr: String,
    },
    /// A program the workload needs is not installed and could not be.
    #[error("{program} is not installed: {hint}")]
    Missing {
        /// The program looked for.
        program: String,
        /// What to do about it.
        hint: String,
    },
    /// Setting up or tearing down a target failed.
    #[error("target {target}: {detail}")]
    Target {
        /// The target, as named on the command line.
        target: String,
        /// What went wrong.
        detail: String,
    },
    /// The workload cannot run on this target (an external program on an
    /// in-process target, for instance).
    #[error("workload {workload} cannot run on target {target}: {reason}")]
    Unsupported {
        /// The workload.
        workload: String,
        /// The target.
        target: String,
        /// Why.
        reason: String,
    },
    /// A file-system operation of the workload failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation ("create", "fsync", ...).
        op: &'static str,
        /// The path inside the file system under test (or on the host).
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: io::Error,
    },
    /// An ordo library call failed.
    #[error("ordo: {op} {path}: {source}")]
    Fs {
        /// The operation.
        op: &'static str,
        /// The path inside the file system.
        path: String,
        /// The core's error.
        #[source]
        source: ordo_fs::FsError,
    },
    /// A workload stopped: a thread panicked or a check of its result
    /// (rows in the database, files in the tree) failed.
    #[error("workload {workload}: {detail}")]
    Workload {
        /// The workload.
        workload: String,
        /// What went wrong.
        detail: String,
    },
    /// Writing the JSON report or the chart failed.
    #[error("writing {path}: {source}")]
    Output {
        /// The output file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: io::Error,
    },
}

impl BenchError {
    /// Shorthand for an I/O error on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        BenchError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Shorthand for a target error.
    pub fn target(target: impl Into<String>, detail: impl Into<String>) -> Self {
        BenchError::Target {
            target: target.into(),
            detail: detail.into(),
        }
    }
}

/// The harness's result type.
pub type Result<T> = std::result::Result<T, BenchError>;
