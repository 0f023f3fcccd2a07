//! Workloads that are real programs: SQLite (inserts and an OLTP mix), git,
//! PostMark and fs_mark.
//! Nobody here wrote them, so they exercise the file system the way
//! applications do (rename-based journals, directory fsyncs, small
//! synchronous writes) rather than the way ordo's authors expect. They need
//! a mounted target; on the in-process library target they are refused.
//!
//! Their fsync latencies are not visible from outside the program, so these
//! rows report throughput and device figures only.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rand::Rng;
use serde_json::json;

use super::{pattern, Case, RunCtx, RunOutput, Scale};
use crate::error::{BenchError, Result};
use crate::stats::{filebench_size, thread_rng};
use crate::sys::{ensure_program, run, run_with_stdin};
use crate::vfs::{mkdir_all, Vfs};

/// Bytes of each SQLite row's payload.
const SQLITE_ROW_BYTES: usize = 120;
/// Point SELECTs per OLTP transaction (sysbench's `--point-selects`).
const OLTP_POINT_SELECTS: u32 = 10;
/// Rows of the OLTP range SELECT (sysbench's `--range-size`).
const OLTP_RANGE_ROWS: u64 = 100;
/// Groups of 11 digits in an OLTP row's `c` (119 characters, as sysbench).
const OLTP_C_GROUPS: usize = 10;
/// Groups of 11 digits in an OLTP row's `pad` (59 characters, as sysbench).
const OLTP_PAD_GROUPS: usize = 5;
/// Files per directory in the git tree.
const GIT_FILES_PER_DIR: u64 = 20;
/// Mean size of a file in the git tree.
const GIT_MEAN_FILE_BYTES: u64 = 4096;
/// fs_mark's file size.
const FSMARK_FILE_BYTES: u64 = 4096;

fn host_root<'a>(vfs: &'a dyn Vfs, workload: &str) -> Result<&'a Path> {
    vfs.host_path().ok_or_else(|| BenchError::Unsupported {
        workload: workload.into(),
        target: "in-process".into(),
        reason: "it runs an external program, which needs a mounted file system (use ordo:MODE)"
            .into(),
    })
}

/// A scratch file on the host (outside the file system under test) for a
/// program's script or configuration.
fn host_scratch(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("ordo-bench-{}-{n}-{name}", std::process::id()))
}

fn check(workload: &str, ok: bool, detail: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(BenchError::Workload {
            workload: workload.into(),
            detail: detail(),
        })
    }
}

/// SQLite: rows inserted one per transaction with the `sqlite3` shell.
pub struct Sqlite {
    rows: u64,
}

/// sqlite at `scale` (ops: rows inserted).
pub fn sqlite(scale: Scale) -> Box<dyn Case> {
    Box::new(Sqlite {
        rows: scale.pick(20, 500, 2000, 2000),
    })
}

impl Case for Sqlite {
    fn workload(&self) -> &'static str {
        "sqlite"
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "rows": self.rows,
            "row_bytes": SQLITE_ROW_BYTES,
            "journal_mode": "delete",
            "synchronous": "full",
            "transaction": "one per insert",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.rows
    }
    fn needs_host_path(&self) -> bool {
        true
    }
    fn setup(&self, vfs: &dyn Vfs, _seed: u64) -> Result<()> {
        let root = host_root(vfs, "sqlite")?;
        let sqlite3 = ensure_program("sqlite3", "sqlite3")?;
        run(Command::new(sqlite3).arg(root.join("bench.db")).arg(
            "PRAGMA journal_mode=DELETE; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);",
        ))?;
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let root = host_root(vfs, "sqlite")?;
        let sqlite3 = ensure_program("sqlite3", "sqlite3")?;
        let db = root.join("bench.db");
        let mut script = String::from("PRAGMA journal_mode=DELETE;\nPRAGMA synchronous=FULL;\n");
        let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
        for i in 0..self.rows {
            let row: String = pattern(SQLITE_ROW_BYTES, ctx.seed ^ i)
                .iter()
                .map(|b| alphabet[*b as usize % alphabet.len()] as char)
                .collect();
            script.push_str(&format!("INSERT INTO t(v) VALUES('{row}');\n"));
        }
        let script_path = host_scratch("inserts.sql");
        std::fs::write(&script_path, script)
            .map_err(|e| BenchError::io("write", &script_path, e))?;
        let file = std::fs::File::open(&script_path)
            .map_err(|e| BenchError::io("open", &script_path, e))?;
        let r = run_with_stdin(Command::new(&sqlite3).arg(&db), Stdio::from(file));
        let _ = std::fs::remove_file(&script_path);
        r?;
        ctx.tick(self.rows);
        let out = run(Command::new(&sqlite3)
            .arg(&db)
            .arg("SELECT count(*) FROM t;"))?;
        let count = String::from_utf8_lossy(&out.stdout).trim().to_string();
        check("sqlite", count == self.rows.to_string(), || {
            format!("table holds {count} rows, expected {}", self.rows)
        })?;
        Ok(RunOutput {
            ops: self.rows,
            ..RunOutput::default()
        })
    }
}

/// OLTP: a sysbench `oltp_read_write`-style transaction mix on a SQLite
/// table, standing in for MariaDB + sysbench (OptFS's Figure 8).
pub struct Oltp {
    rows: u64,
    transactions: u64,
}

/// oltp at `scale` (ops: transactions).
pub fn oltp(scale: Scale) -> Box<dyn Case> {
    Box::new(Oltp {
        rows: scale.pick(1000, 10_000, 100_000, 100_000),
        transactions: scale.pick(50, 500, 2000, 10_000),
    })
}

/// sysbench's string columns: `groups` runs of 11 random digits joined by
/// dashes.
fn sysbench_string(rng: &mut impl Rng, groups: usize) -> String {
    let mut s = String::with_capacity(groups * 12);
    for g in 0..groups {
        if g > 0 {
            s.push('-');
        }
        for _ in 0..11 {
            s.push(char::from(b'0' + rng.gen_range(0..10u8)));
        }
    }
    s
}

impl Oltp {
    /// The table's initial `k` column, in id order (ids 1..=rows), and the
    /// SQL that loads it: the same for setup and for the run's check.
    fn initial(&self, seed: u64, sql: Option<&mut String>) -> Vec<u64> {
        let mut rng = thread_rng(seed ^ 0x0171, 0);
        let mut ks = Vec::with_capacity(self.rows as usize);
        let mut sql = sql;
        for id in 1..=self.rows {
            let k = rng.gen_range(1..=self.rows);
            let c = sysbench_string(&mut rng, OLTP_C_GROUPS);
            let pad = sysbench_string(&mut rng, OLTP_PAD_GROUPS);
            if let Some(sql) = sql.as_deref_mut() {
                sql.push_str(&format!(
                    "INSERT INTO sbtest(id,k,c,pad) VALUES({id},{k},'{c}','{pad}');\n"
                ));
            }
            ks.push(k);
        }
        ks
    }
}

impl Case for Oltp {
    fn workload(&self) -> &'static str {
        "oltp"
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "rows": self.rows,
            "transactions": self.transactions,
            "point_selects": OLTP_POINT_SELECTS,
            "range_rows": OLTP_RANGE_ROWS,
            "transaction": "10 point SELECTs, 1 range SELECT, UPDATE k (indexed), UPDATE c, DELETE, INSERT",
            "journal_mode": "delete",
            "synchronous": "full",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.transactions
    }
    fn needs_host_path(&self) -> bool {
        true
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        let root = host_root(vfs, "oltp")?;
        let sqlite3 = ensure_program("sqlite3", "sqlite3")?;
        let mut script = String::from(
            ".bail on\nPRAGMA journal_mode=DELETE;\nPRAGMA synchronous=FULL;\n\
             CREATE TABLE sbtest(id INTEGER PRIMARY KEY, k INTEGER NOT NULL DEFAULT 0, \
             c CHAR(120) NOT NULL DEFAULT '', pad CHAR(60) NOT NULL DEFAULT '');\n\
             BEGIN;\n",
        );
        self.initial(seed, Some(&mut script));
        // The index is built after the load, as sysbench's `prepare` does.
        script.push_str("COMMIT;\nCREATE INDEX k_1 ON sbtest(k);\n");
        let script_path = host_scratch("oltp-load.sql");
        std::fs::write(&script_path, script)
            .map_err(|e| BenchError::io("write", &script_path, e))?;
        let file = std::fs::File::open(&script_path)
            .map_err(|e| BenchError::io("open", &script_path, e))?;
        let r = run_with_stdin(
            Command::new(&sqlite3).arg(root.join("oltp.db")),
            Stdio::from(file),
        );
        let _ = std::fs::remove_file(&script_path);
        r?;
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let root = host_root(vfs, "oltp")?;
        let sqlite3 = ensure_program("sqlite3", "sqlite3")?;
        let db = root.join("oltp.db");
        // The k column every committed transaction leaves (one row's k + 1,
        // another row reinserted with a fresh k): its sum is checked below.
        let mut ks = self.initial(ctx.seed, None);
        let mut rng = thread_rng(ctx.seed ^ 0x0172, 0);
        // The SELECTs' rows go to /dev/null: the shell still steps through
        // every one of them.
        let mut script = String::from(
            ".bail on\n.output /dev/null\nPRAGMA journal_mode=DELETE;\nPRAGMA synchronous=FULL;\n",
        );
        for _ in 0..self.transactions {
            script.push_str("BEGIN;\n");
            for _ in 0..OLTP_POINT_SELECTS {
                let id = rng.gen_range(1..=self.rows);
                script.push_str(&format!("SELECT c FROM sbtest WHERE id={id};\n"));
            }
            let lo = rng.gen_range(1..=self.rows);
            script.push_str(&format!(
                "SELECT c FROM sbtest WHERE id BETWEEN {lo} AND {};\n",
                lo + OLTP_RANGE_ROWS - 1
            ));
            let id = rng.gen_range(1..=self.rows);
            script.push_str(&format!("UPDATE sbtest SET k=k+1 WHERE id={id};\n"));
            ks[(id - 1) as usize] += 1;
            let id = rng.gen_range(1..=self.rows);
            let c = sysbench_string(&mut rng, OLTP_C_GROUPS);
            script.push_str(&format!("UPDATE sbtest SET c='{c}' WHERE id={id};\n"));
            let id = rng.gen_range(1..=self.rows);
            let k = rng.gen_range(1..=self.rows);
            let c = sysbench_string(&mut rng, OLTP_C_GROUPS);
            let pad = sysbench_string(&mut rng, OLTP_PAD_GROUPS);
            script.push_str(&format!(
                "DELETE FROM sbtest WHERE id={id};\n\
                 INSERT INTO sbtest(id,k,c,pad) VALUES({id},{k},'{c}','{pad}');\n\
                 COMMIT;\n"
            ));
            ks[(id - 1) as usize] = k;
        }
        let script_path = host_scratch("oltp.sql");
        std::fs::write(&script_path, script)
            .map_err(|e| BenchError::io("write", &script_path, e))?;
        let file = std::fs::File::open(&script_path)
            .map_err(|e| BenchError::io("open", &script_path, e))?;
        let r = run_with_stdin(Command::new(&sqlite3).arg(&db), Stdio::from(file));
        let _ = std::fs::remove_file(&script_path);
        r?;
        ctx.tick(self.transactions);
        let out = run(Command::new(&sqlite3).arg(&db).arg(
            "SELECT count(*) FROM sbtest; SELECT sum(k) FROM sbtest; PRAGMA integrity_check;",
        ))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().map(str::trim).collect();
        let count = lines.first().copied().unwrap_or("");
        check("oltp", count == self.rows.to_string(), || {
            format!("table holds {count} rows, expected {}", self.rows)
        })?;
        let integrity = lines.get(2..).unwrap_or(&[]).join("; ");
        check("oltp", integrity == "ok", || {
            format!("PRAGMA integrity_check: {integrity}")
        })?;
        let sum_k = lines.get(1).and_then(|s| s.parse::<u64>().ok());
        let want: u64 = ks.iter().sum();
        check("oltp", sum_k == Some(want), || {
            format!(
                "sum(k) is {}, expected {want}: a transaction is missing",
                lines.get(1).copied().unwrap_or("")
            )
        })?;
        Ok(RunOutput {
            ops: self.transactions,
            ..RunOutput::default()
        })
    }
}

/// git: `git add -A` and `git commit` of a generated tree.
pub struct Git {
    files: u64,
}

/// git at `scale` (ops: files committed).
pub fn git(scale: Scale) -> Box<dyn Case> {
    Box::new(Git {
        files: scale.pick(20, 500, 2000, 5000),
    })
}

fn git_cmd(git: &Path, repo: &Path) -> Command {
    let mut c = Command::new(git);
    git_args(&mut c, repo);
    c
}

/// git's configuration for every command run in `repo`: fsync each object
/// and ref (`core.fsync=committed`), no automatic gc, no user's config.
pub(crate) fn git_args(c: &mut Command, repo: &Path) {
    c.arg("-C")
        .arg(repo)
        .args([
            "-c",
            "user.name=ordo bench",
            "-c",
            "user.email=bench@ordo.invalid",
            "-c",
            "core.fsync=committed",
            "-c",
            "core.fsyncMethod=fsync",
            "-c",
            "gc.auto=0",
        ])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null");
}

impl Case for Git {
    fn workload(&self) -> &'static str {
        "git"
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "files": self.files,
            "files_per_dir": GIT_FILES_PER_DIR,
            "mean_file_bytes": GIT_MEAN_FILE_BYTES,
            "config": "core.fsync=committed core.fsyncMethod=fsync gc.auto=0",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.files
    }
    fn needs_host_path(&self) -> bool {
        true
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        let root = host_root(vfs, "git")?.to_path_buf();
        let git = ensure_program("git", "git")?;
        let mut rng = thread_rng(seed ^ 0x617, 0);
        for i in 0..self.files {
            let dir = format!("repo/src/d{}", i / GIT_FILES_PER_DIR);
            if i % GIT_FILES_PER_DIR == 0 {
                mkdir_all(vfs, &dir)?;
            }
            let size = filebench_size(&mut rng, GIT_MEAN_FILE_BYTES) as usize;
            let f = vfs.create(&format!("{dir}/f{i}.txt"))?;
            f.write_at(0, &pattern(size, seed ^ i))?;
        }
        run(git_cmd(&git, &root.join("repo")).args(["init", "-q"]))?;
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let repo = host_root(vfs, "git")?.join("repo");
        let git = ensure_program("git", "git")?;
        run(git_cmd(&git, &repo).args(["add", "-A"]))?;
        run(git_cmd(&git, &repo).args(["commit", "-q", "-m", "ordo bench"]))?;
        ctx.tick(self.files);
        let out = run(git_cmd(&git, &repo).args(["ls-files"]))?;
        let listed = out.stdout.iter().filter(|&&b| b == b'\n').count() as u64;
        check("git", listed == self.files, || {
            format!("commit holds {listed} files, expected {}", self.files)
        })?;
        Ok(RunOutput {
            ops: self.files,
            ..RunOutput::default()
        })
    }
}

/// PostMark: NetApp's small-file mail/news benchmark.
pub struct Postmark {
    files: u64,
    transactions: u64,
}

/// postmark at `scale` (ops: files created, read, appended and deleted).
pub fn postmark(scale: Scale) -> Box<dyn Case> {
    Box::new(Postmark {
        files: scale.pick(50, 500, 1000, 5000),
        transactions: scale.pick(100, 2000, 10_000, 20_000),
    })
}

/// Sum of PostMark's "N created", "N read", "N appended", "N deleted".
fn postmark_ops(stdout: &str) -> Option<u64> {
    let mut total = 0;
    let mut seen = 0;
    for line in stdout.lines() {
        let mut w = line.split_whitespace();
        if let (Some(n), Some(what)) = (w.next(), w.next()) {
            if matches!(what, "created" | "read" | "appended" | "deleted") {
                total += n.parse::<u64>().ok()?;
                seen += 1;
            }
        }
    }
    (seen == 4).then_some(total)
}

impl Case for Postmark {
    fn workload(&self) -> &'static str {
        "postmark"
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "files": self.files,
            "transactions": self.transactions,
            "size_bytes": "500..10000",
            "op": "file created, read, appended or deleted",
        })
    }
    fn expected_ops(&self) -> u64 {
        2 * self.files + self.transactions
    }
    fn needs_host_path(&self) -> bool {
        true
    }
    fn setup(&self, vfs: &dyn Vfs, _seed: u64) -> Result<()> {
        host_root(vfs, "postmark")?;
        ensure_program("postmark", "postmark")?;
        vfs.mkdir("pm")
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let dir = host_root(vfs, "postmark")?.join("pm");
        let postmark = ensure_program("postmark", "postmark")?;
        let cfg = format!(
            "set location {}\nset number {}\nset transactions {}\nset size 500 10000\nset seed {}\nset buffering false\nrun\nquit\n",
            dir.display(),
            self.files,
            self.transactions,
            ctx.seed % (i32::MAX as u64)
        );
        let cfg_path = host_scratch("postmark.cfg");
        std::fs::write(&cfg_path, cfg).map_err(|e| BenchError::io("write", &cfg_path, e))?;
        let r = run(Command::new(postmark).arg(&cfg_path));
        let _ = std::fs::remove_file(&cfg_path);
        let out = r?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let ops = postmark_ops(&stdout).ok_or_else(|| BenchError::Workload {
            workload: "postmark".into(),
            detail: format!("cannot read its report: {}", stdout.trim()),
        })?;
        ctx.tick(ops);
        Ok(RunOutput {
            ops,
            ..RunOutput::default()
        })
    }
}

/// fs_mark: files written and fsynced before close.
pub struct Fsmark {
    files_per_thread: u64,
    threads: u32,
}

/// fsmark at `scale` (ops: files).
pub fn fsmark(scale: Scale) -> Box<dyn Case> {
    Box::new(Fsmark {
        files_per_thread: scale.pick(20, 500, 2000, 10_000),
        threads: scale.pick(1, 2, 4, 4),
    })
}

impl Case for Fsmark {
    fn workload(&self) -> &'static str {
        "fsmark"
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "files_per_thread": self.files_per_thread,
            "threads": self.threads,
            "file_bytes": FSMARK_FILE_BYTES,
            "sync_method": "1 (fsync before close)",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.files_per_thread * self.threads as u64
    }
    fn needs_host_path(&self) -> bool {
        true
    }
    fn setup(&self, vfs: &dyn Vfs, _seed: u64) -> Result<()> {
        host_root(vfs, "fsmark")?;
        ensure_program("fs_mark", "fsmark")?;
        vfs.mkdir("fsm")
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let dir = host_root(vfs, "fsmark")?.join("fsm");
        let fs_mark = ensure_program("fs_mark", "fsmark")?;
        // fs_mark refuses directory names of 40 bytes or more: name it
        // relative to the mount point.
        let root = dir.parent().unwrap_or(&dir).to_path_buf();
        run(Command::new(fs_mark)
            .args(["-d", "fsm"])
            .args(["-n", &self.files_per_thread.to_string()])
            .args(["-s", &FSMARK_FILE_BYTES.to_string()])
            .args(["-t", &self.threads.to_string()])
            .args(["-S", "1", "-k", "-L", "1"])
            .current_dir(&root))?;
        let made = vfs.list("fsm")?.len() as u64;
        check("fsmark", made == self.expected_ops(), || {
            format!("{made} files made, expected {}", self.expected_ops())
        })?;
        ctx.tick(made);
        Ok(RunOutput {
            ops: made,
            ..RunOutput::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_postmarks_report() {
        let out = "Files:\n\t102 created (102 per second)\n\t\tCreation alone: 50 files (50 per second)\n\t52 read (52 per second)\n\t48 appended (48 per second)\n\t102 deleted (102 per second)\n";
        assert_eq!(postmark_ops(out), Some(304));
        assert_eq!(postmark_ops("nothing"), None);
    }

    #[test]
    fn oltp_rows_are_sysbench_shaped_and_seeded() {
        let mut rng = thread_rng(1, 0);
        let c = sysbench_string(&mut rng, OLTP_C_GROUPS);
        let pad = sysbench_string(&mut rng, OLTP_PAD_GROUPS);
        assert_eq!((c.len(), pad.len()), (119, 59));
        assert!(c
            .split('-')
            .all(|g| g.len() == 11 && g.bytes().all(|b| b.is_ascii_digit())));
        let o = Oltp {
            rows: 50,
            transactions: 1,
        };
        let mut sql = String::new();
        let ks = o.initial(7, Some(&mut sql));
        assert_eq!(ks, o.initial(7, None), "the run's check sees setup's rows");
        assert_ne!(ks, o.initial(8, None));
        assert_eq!(sql.lines().count(), 50);
        assert!(ks.iter().all(|&k| (1..=50).contains(&k)));
    }
}
