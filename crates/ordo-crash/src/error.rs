//! Errors of the explorer itself (not verdicts about crash states, which are
//! [`crate::oracle::Failure`]s).

use std::io;

/// Why an exploration could not run.
#[derive(Debug, thiserror::Error)]
pub enum CrashError {
    /// A workload name, scenario file or operation is invalid.
    #[error("workload: {0}")]
    Workload(String),
    /// A command-line argument is invalid.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Making the base image failed.
    #[error("mkfs of the base image failed: {0}")]
    Mkfs(String),
    /// The workload failed while being recorded (ordo refused an operation
    /// the model accepts, or the other way round).
    #[error("recording '{sequence}' failed at operation {op} '{text}': {detail}")]
    Record {
        /// Sequence name.
        sequence: String,
        /// 1-based operation index (0 = setup or mount).
        op: usize,
        /// The operation in scenario form.
        text: String,
        /// What went wrong.
        detail: String,
    },
    /// A JSON report could not be read, written or merged.
    #[error("report {path}: {detail}")]
    Report {
        /// File.
        path: String,
        /// What went wrong.
        detail: String,
    },
    /// An application workload or checker could not run (a missing
    /// program, a broken control channel), as opposed to a verdict.
    #[error("application {app}: {detail}")]
    App {
        /// The application (`sqlite-wal`, `git`, `kernel-ext4`, ...).
        app: String,
        /// What went wrong.
        detail: String,
    },
    /// SIGINT or SIGTERM ([`crate::stop`]): the workers stopped between
    /// crash states and released what they held; nothing half-checked is
    /// reported.
    #[error("interrupted: stopped between crash states (a soak resumes from its last finished seed when run again)")]
    Interrupted,
    /// Host I/O (temporary files, e2fsck, --keep directory).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl CrashError {
    /// Wrap an I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        CrashError::Io {
            what: what.into(),
            source,
        }
    }
}
