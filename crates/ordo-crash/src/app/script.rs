//! The applications' workload drivers and checkers: `apps/ordo_app.py`,
//! embedded in the binary and run with the host's Python.
//!
//! [`run_workload`] runs an application's workload in a directory of the
//! file system under test and relays its control lines (an update begins,
//! an update is durable) to the caller while the workload is blocked, so
//! the caller can tag its device log in the same sequence as the writes.
//! [`check`] runs the application's checker on a private, writable copy of
//! a recovered directory and returns its [`Verdict`].
//!
//! The control protocol on the script's stdout / stdin: `op K DESCRIPTION`
//! before update `K`'s first file-system call, `mark K` once update `K` was
//! promised durable (each acknowledged with `ok`), `done` at the end.
//! Update 0 is the setup, updates `1..=steps` the workload.

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::OnceLock;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::CrashError;

/// The script, as shipped in the crate.
const SCRIPT: &str = include_str!("../../apps/ordo_app.py");

/// How long one checker run may take before it is killed (the script
/// bounds each of its own subprocesses; this is the backstop).
const CHECK_TIMEOUT: Duration = Duration::from_secs(600);

/// How many bytes of the script's stderr an error message quotes.
const STDERR_TAIL: usize = 2000;

/// A real application whose crash consistency is checked.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum App {
    /// SQLite with a rollback journal (`journal_mode=DELETE`,
    /// `synchronous=FULL`): one transaction of three inserts and a counter
    /// update per step.
    SqliteRollback,
    /// SQLite in WAL mode (`wal_autocheckpoint=4`, so checkpoints happen
    /// during the run), same transactions.
    SqliteWal,
    /// git with its default durability settings: `git add -A` and
    /// `git commit` of a few added, modified and deleted files per step.
    Git,
    /// LevelDB (through plyvel): eight puts per step, only the last one
    /// synced.
    Leveldb,
    /// An editor's atomic save: write and fsync `doc.txt.tmp`, rename it
    /// over `doc.txt`, fsync the directory.
    Editor,
}

impl App {
    /// Every application, in a fixed order.
    pub const ALL: [App; 5] = [
        App::SqliteRollback,
        App::SqliteWal,
        App::Git,
        App::Leveldb,
        App::Editor,
    ];

    /// Whether the application's durable points are backed by a sync it
    /// issues. git (2.47, default `core.fsync`) calls no fsync for loose
    /// objects, refs or the index, so a returned `git commit` promises
    /// nothing on disk: its marks are kept in the log for the report, but
    /// the checker is not told that any update was durable, and a crash
    /// may take the repository back to any earlier commit (or before
    /// `git init`) as long as what it finds is a valid repository.
    pub fn syncs_its_durable_points(self) -> bool {
        !matches!(self, App::Git)
    }

    /// The application's name on the command line and in the script
    /// (`sqlite-rollback`, `sqlite-wal`, `git`, `leveldb`, `editor`).
    pub fn name(self) -> &'static str {
        match self {
            App::SqliteRollback => "sqlite-rollback",
            App::SqliteWal => "sqlite-wal",
            App::Git => "git",
            App::Leveldb => "leveldb",
            App::Editor => "editor",
        }
    }
}

impl FromStr for App {
    type Err = String;

    /// Parse an application name as [`App::name`] spells it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        App::ALL.into_iter().find(|a| a.name() == s).ok_or_else(|| {
            let valid: Vec<&str> = App::ALL.iter().map(|a| a.name()).collect();
            format!("unknown application '{s}' (valid: {})", valid.join(", "))
        })
    }
}

impl fmt::Display for App {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A control line of a running workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Update `k` is about to make its first file-system call (0 = setup).
    Op {
        /// The update.
        k: i64,
        /// What the update does.
        label: String,
    },
    /// The application has promised that update `k` is durable.
    Mark(i64),
    /// The workload is over.
    Done,
}

impl Control {
    /// Parse one line of the script's stdout.
    fn parse(line: &str) -> Option<Control> {
        let line = line.trim_end_matches(['\n', '\r']);
        if line == "done" {
            return Some(Control::Done);
        }
        if let Some(rest) = line.strip_prefix("mark ") {
            return rest.trim().parse().ok().map(Control::Mark);
        }
        let rest = line.strip_prefix("op ")?;
        let (k, label) = rest.split_once(' ').unwrap_or((rest, ""));
        let k = k.parse().ok()?;
        Some(Control::Op {
            k,
            label: label.to_string(),
        })
    }
}

/// A checker's verdict on one recovered directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The state is the application's state after update `j` (`-1`:
    /// nothing yet), with `durable <= j <= started`.
    Consistent {
        /// The update the state corresponds to.
        j: i64,
    },
    /// The state is not one the application was allowed to be in; the
    /// checker's reason.
    Inconsistent(String),
}

fn app_err(app: App, detail: impl Into<String>) -> CrashError {
    CrashError::App {
        app: app.name().to_string(),
        detail: detail.into(),
    }
}

/// The script written to a temporary file, once per process (kept until
/// the process exits).
fn script_path() -> Result<&'static Path, String> {
    static PATH: OnceLock<Result<tempfile::TempPath, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let mut f = tempfile::Builder::new()
            .prefix("ordo_app-")
            .suffix(".py")
            .tempfile()
            .map_err(|e| format!("creating the script file: {e}"))?;
        f.write_all(SCRIPT.as_bytes())
            .and_then(|()| f.flush())
            .map_err(|e| format!("writing the script file: {e}"))?;
        Ok(f.into_temp_path())
    })
    .as_ref()
    .map(AsRef::as_ref)
    .map_err(Clone::clone)
}

/// The Python interpreter: the system one (which has the distribution's
/// `python3-plyvel`) if present, else whatever `python3` is on `PATH`.
fn python() -> PathBuf {
    let system = Path::new("/usr/bin/python3");
    if system.exists() {
        system.to_path_buf()
    } else {
        PathBuf::from("python3")
    }
}

/// `python3 ordo_app.py SUBCOMMAND APP DIR --steps N`.
fn command(app: App, sub: &str, dir: &Path, steps: u32) -> Result<Command, CrashError> {
    let script = script_path().map_err(|e| app_err(app, e))?;
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .arg(sub)
        .arg(app.name())
        .arg(dir)
        .arg("--steps")
        .arg(steps.to_string());
    Ok(cmd)
}

/// Read a pipe to its end on a thread of its own.
fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

fn join(h: Option<JoinHandle<Vec<u8>>>) -> String {
    let bytes = h.and_then(|h| h.join().ok()).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The end of a captured stream, for an error message.
fn tail(s: &str) -> String {
    let s = s.trim();
    if s.len() <= STDERR_TAIL {
        return s.to_string();
    }
    let mut start = s.len() - STDERR_TAIL;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &s[start..])
}

fn with_stderr(msg: String, stderr: &str) -> String {
    let t = tail(stderr);
    if t.is_empty() {
        msg
    } else {
        format!("{msg}; stderr: {t}")
    }
}

/// Run `app`'s workload in the (empty) directory `dir` with `steps`
/// updates after the setup, calling `on_control` for each control line
/// before acknowledging it (the workload is blocked meanwhile).
///
/// # Errors
///
/// [`CrashError::App`] if the script cannot be started, prints a line that
/// is not a control line, exits nonzero or ends without `done`; the error
/// quotes the end of the script's stderr.
pub fn run_workload(
    app: App,
    dir: &Path,
    steps: u32,
    on_control: &mut dyn FnMut(&Control),
) -> Result<(), CrashError> {
    let mut cmd = command(app, "run", dir, steps)?;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| app_err(app, format!("starting {}: {e}", python().display())))?;
    let stderr = child.stderr.take().map(drain);
    let result = converse(&mut child, on_control);
    if result.is_err() {
        let _ = child.kill();
    }
    // Close our end of stdin so a script waiting for an answer sees EOF.
    drop(child.stdin.take());
    let status = child.wait();
    let stderr = join(stderr);
    let saw_done = result.map_err(|e| app_err(app, with_stderr(e, &stderr)))?;
    let status = status.map_err(|e| app_err(app, format!("waiting for the workload: {e}")))?;
    if !status.success() {
        return Err(app_err(
            app,
            with_stderr(format!("workload failed ({status})"), &stderr),
        ));
    }
    if !saw_done {
        return Err(app_err(
            app,
            with_stderr("workload ended without 'done'".into(), &stderr),
        ));
    }
    Ok(())
}

/// Relay control lines until the script's stdout ends; whether `done` was
/// seen.
fn converse(child: &mut Child, on_control: &mut dyn FnMut(&Control)) -> Result<bool, String> {
    let stdout: ChildStdout = child.stdout.take().ok_or("no stdout pipe")?;
    let mut stdin = child.stdin.take().ok_or("no stdin pipe")?;
    let mut reader = BufReader::new(stdout);
    let mut done = false;
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| format!("reading the control channel: {e}"))?;
        if n == 0 {
            return Ok(done);
        }
        if done {
            return Err(format!("output after 'done': {:?}", line.trim_end()));
        }
        let c = Control::parse(&line)
            .ok_or_else(|| format!("not a control line: {:?}", line.trim_end()))?;
        on_control(&c);
        match c {
            Control::Done => done = true,
            Control::Op { .. } | Control::Mark(_) => {
                stdin
                    .write_all(b"ok\n")
                    .and_then(|()| stdin.flush())
                    .map_err(|e| format!("acknowledging {:?}: {e}", line.trim_end()))?;
            }
        }
    }
}

/// Run `app`'s checker on `dir`, a private writable copy of a recovered
/// application directory (the checker may modify it: roll back a journal,
/// replay a log, make a probe commit).
///
/// `durable` is the last update marked durable before the crash (`-1`:
/// not even the setup), `started` the update in flight (the last whose
/// `op` line was printed; `-1`: none).
///
/// # Errors
///
/// [`CrashError::App`] if the checker could not run (a missing program or
/// module, a timeout, unexpected output); a bad state is a
/// [`Verdict::Inconsistent`], not an error.
pub fn check(
    app: App,
    dir: &Path,
    durable: i64,
    started: i64,
    steps: u32,
) -> Result<Verdict, CrashError> {
    let mut cmd = command(app, "check", dir, steps)?;
    cmd.arg("--durable")
        .arg(durable.to_string())
        .arg("--started")
        .arg(started.to_string());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| app_err(app, format!("starting {}: {e}", python().display())))?;
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let status = wait_timeout(&mut child, CHECK_TIMEOUT);
    let stdout = join(stdout);
    let stderr = join(stderr);
    let status = match status {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(app_err(
                app,
                with_stderr(
                    format!("checker timed out after {} s", CHECK_TIMEOUT.as_secs()),
                    &stderr,
                ),
            ))
        }
        Err(e) => return Err(app_err(app, format!("waiting for the checker: {e}"))),
    };
    let first_line = stdout
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    match status.code() {
        Some(0) => {
            let j = stdout
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .and_then(|l| l.strip_prefix("ok j="))
                .and_then(|j| j.parse().ok())
                .ok_or_else(|| {
                    app_err(
                        app,
                        with_stderr(
                            format!("checker said {:?}, not 'ok j=J'", stdout.trim()),
                            &stderr,
                        ),
                    )
                })?;
            Ok(Verdict::Consistent { j })
        }
        // A verdict always comes with its reason on stdout; exit 1 without
        // one is Python failing before the checker ran (a traceback).
        Some(1) if !first_line.is_empty() => Ok(Verdict::Inconsistent(first_line.to_string())),
        _ => Err(app_err(
            app,
            with_stderr(
                format!("checker could not run ({status}): {}", stdout.trim()),
                &stderr,
            ),
        )),
    }
}

/// Wait for `child` at most `limit`; kill it and return `None` on timeout.
fn wait_timeout(child: &mut Child, limit: Duration) -> std::io::Result<Option<ExitStatus>> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(5));
    }
}
