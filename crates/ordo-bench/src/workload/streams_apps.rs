//! ccfs's Table 5 (Pillai et al., FAST '17 / ACM TOS '17, §4.4): real
//! applications with their fsyncs, and with ccfs+'s `IGNORE_FSYNC` and a
//! `streamsync` at their commit points.
//!
//! Each workload has a case per durability scheme ([`Durability`]):
//!
//! - `fsync`: the program as it is, its fsyncs honoured. On ordo it runs in
//!   a stream of its own (`ordo run --stream APP`, the paper's "the
//!   application runs in a single stream"), which on `journal` changes
//!   nothing (one transaction for every stream) and on `streams` keeps its
//!   commits to its own changes;
//! - `streamsync-each` (SQLite): its stream has `IGNORE_FSYNC` (`ordo run
//!   --ignore-fsync`), so its fsyncs only order, and the driver calls
//!   STREAMSYNC (the mount's ioctl) after every COMMIT: each transaction
//!   is durable when the next starts, as with fsync;
//! - `streamsync-end`: `IGNORE_FSYNC` and one streamsync when the program
//!   is done (the bench calls the ioctl). For an unmodified program
//!   (git, LevelDB) that is the only commit point reachable from outside:
//!   nothing is durable before the end. SQLite's row for it is the
//!   paper's ccfs+ row (0 fsyncs, 0 flushes during the run).
//!
//! The programs: SQLite through Python's `sqlite3` module (the system's
//! libsqlite3, rollback journal, `synchronous=FULL`, one INSERT of a
//! 120-byte row per transaction: the paper's 2,000 rows); git (`add -A`
//! then `commit` of a generated kernel-like tree: nested directories,
//! C-like text files of a gamma-distributed size; `core.fsync=committed`,
//! `core.fsyncMethod=fsync`, today's spelling of the paper's
//! `core.fsyncobjectfiles`); LevelDB's `fillrandom` through plyvel
//! (Debian's `python3-plyvel` over libleveldb: random 16-byte keys,
//! 1,000-byte values half compressible as db_bench's, `sync=false` writes:
//! LevelDB's own fsyncs are those of its table files and manifest). The
//! paper's ext4 rows ran LevelDB with fsyncs added for consistency; this
//! runs it unmodified.
//!
//! They need a mount: `ordo:MODE`, or `ordo-lib:MODE,fuse` for the HDD
//! model in virtual time (where only the disk's time counts: the
//! programs' CPU time is not modeled; the rows also give the wall-clock
//! seconds). The measured interval ends after the last streamsync.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rand::Rng;
use serde_json::json;

use super::apps::git_args;
use super::{Case, RunCtx, RunOutput, Scale};
use crate::error::{BenchError, Result};
use crate::stats::{filebench_size, thread_rng};
use crate::sys::{ensure_program, run};
use crate::vfs::{mkdir_all, read_whole, Vfs};

/// Bytes of each SQLite row's payload (the paper's 120).
const SQLITE_ROW_BYTES: usize = 120;
/// LevelDB's value size (the paper's 1,000 bytes).
const LEVELDB_VALUE_BYTES: usize = 1000;
/// LevelDB's key size (db_bench's 16).
const LEVELDB_KEY_BYTES: usize = 16;
/// Files per directory of the generated git tree.
const GIT_FILES_PER_DIR: u64 = 16;
/// Subdirectories per directory of the generated git tree.
const GIT_DIR_FANOUT: u64 = 8;
/// Mean file size of the generated tree (the Linux tree's is about 12 KiB).
const GIT_MEAN_FILE_BYTES: u64 = 12 << 10;
/// The system Python, which has Debian's python3-plyvel.
const PYTHON: &str = "/usr/bin/python3";

/// When the application's work is made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Its own fsyncs.
    Fsync,
    /// `IGNORE_FSYNC`; a streamsync after every transaction (the driver's).
    StreamsyncEach,
    /// `IGNORE_FSYNC`; one streamsync at the end.
    StreamsyncEnd,
}

impl Durability {
    /// The case label.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Fsync => "fsync",
            Durability::StreamsyncEach => "streamsync-each",
            Durability::StreamsyncEnd => "streamsync-end",
        }
    }

    fn ignores_fsync(self) -> bool {
        self != Durability::Fsync
    }
}

fn host_root<'a>(vfs: &'a dyn Vfs, workload: &str) -> Result<&'a Path> {
    vfs.host_path().ok_or_else(|| BenchError::Unsupported {
        workload: workload.into(),
        target: "in-process".into(),
        reason: "it runs an external program, which needs a mounted file system \
                 (use ordo:MODE, or ordo-lib:MODE,fuse for a timing model)"
            .into(),
    })
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

/// The system Python, if it can import `module` (`scripts/deps.sh`
/// installs the Debian package `package` that brings it).
fn python_with(module: &str, package: &str) -> Result<PathBuf> {
    let py = PathBuf::from(PYTHON);
    let ok = Command::new(&py)
        .args(["-c", &format!("import {module}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        return Ok(py);
    }
    Err(BenchError::Missing {
        program: format!("{PYTHON} with the module {module}"),
        hint: format!("install the Debian package `{package}` (scripts/deps.sh does)"),
    })
}

/// How one program of a case is started: in stream `stream` through `ordo
/// run` (with `--ignore-fsync` unless its fsyncs count) on a file system
/// with streams; directly, for `fsync` only, on one without.
fn app_command(
    vfs: &dyn Vfs,
    workload: &str,
    stream: &str,
    d: Durability,
    program: &Path,
) -> Result<Command> {
    let root = host_root(vfs, workload)?;
    if vfs.has_streams() {
        let ordo = crate::target::find_ordo_bin(None)?;
        let mut c = Command::new(ordo);
        c.args(["run", "--stream", stream]);
        if d.ignores_fsync() {
            c.arg("--ignore-fsync");
        }
        c.arg("--mount").arg(root).arg("--").arg(program);
        Ok(c)
    } else if d == Durability::Fsync {
        Ok(Command::new(program))
    } else {
        Err(BenchError::Unsupported {
            workload: workload.into(),
            target: "without streams".into(),
            reason: "IGNORE_FSYNC and streamsync are ordo's (streams through the mount's ioctls)"
                .into(),
        })
    }
}

/// What every case reports besides its operations: wall-clock seconds
/// (the interval itself is virtual on a timing model).
fn output(ops: u64, t0: u64, vfs: &dyn Vfs, wall: Instant, d: Durability) -> RunOutput {
    let mut out = RunOutput {
        ops,
        elapsed_ns: Some(vfs.now_ns().saturating_sub(t0)),
        ..RunOutput::default()
    };
    out.extra
        .insert("wall_s".into(), json!(wall.elapsed().as_secs_f64()));
    out.extra.insert("durability".into(), json!(d.name()));
    out
}

// ---------------------------------------------------------------- SQLite

/// The SQLite driver: one INSERT per transaction, and the STREAMSYNC
/// ioctl after every COMMIT when asked.
const SQLITE_DRIVER: &str = r#"
import fcntl, os, random, sqlite3, sys
db, rows, seed, each, root, ioc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5], int(sys.argv[6])
row_bytes = int(sys.argv[7])
rnd = random.Random(seed)
alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
con = sqlite3.connect(db, isolation_level=None)
con.execute("PRAGMA journal_mode=DELETE")
con.execute("PRAGMA synchronous=FULL")
fd = os.open(root, os.O_RDONLY) if each else -1
for i in range(rows):
    v = "".join(rnd.choice(alphabet) for _ in range(row_bytes))
    con.execute("BEGIN")
    con.execute("INSERT INTO t(v) VALUES(?)", (v,))
    con.execute("COMMIT")
    if each:
        fcntl.ioctl(fd, ioc, bytes(256))
con.close()
"#;

/// SQLite inserts, one transaction each.
pub struct StreamsSqlite {
    rows: u64,
    durability: Durability,
}

/// streams-sqlite at `scale`: fsync, streamsync-each, streamsync-end.
pub fn sqlite_cases(scale: Scale) -> Vec<Box<dyn Case>> {
    [
        Durability::Fsync,
        Durability::StreamsyncEach,
        Durability::StreamsyncEnd,
    ]
    .into_iter()
    .map(|durability| {
        Box::new(StreamsSqlite {
            rows: scale.pick(20, 500, 2000, 2000),
            durability,
        }) as Box<dyn Case>
    })
    .collect()
}

impl Case for StreamsSqlite {
    fn workload(&self) -> &'static str {
        "streams-sqlite"
    }
    fn label(&self) -> String {
        self.durability.name().into()
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "rows": self.rows,
            "row_bytes": SQLITE_ROW_BYTES,
            "journal_mode": "delete",
            "synchronous": "full",
            "transaction": "one INSERT",
            "durability": self.durability.name(),
            "stream": "sqlite",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.rows
    }
    fn needs_host_path(&self) -> bool {
        true
    }
    fn setup(&self, vfs: &dyn Vfs, _seed: u64) -> Result<()> {
        let root = host_root(vfs, "streams-sqlite")?;
        let py = python_with("sqlite3", "python3")?;
        run(Command::new(py).args(["-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA journal_mode=DELETE'); c.execute('CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL)'); c.commit(); c.close()"]).arg(root.join("bench.db")))?;
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let w = self.workload();
        let root = host_root(vfs, w)?.to_path_buf();
        let py = python_with("sqlite3", "python3")?;
        let db = root.join("bench.db");
        let mut cmd = app_command(vfs, w, "sqlite", self.durability, &py)?;
        cmd.args(["-c", SQLITE_DRIVER])
            .arg(&db)
            .arg(self.rows.to_string())
            .arg(ctx.seed.to_string())
            .arg(if self.durability == Durability::StreamsyncEach {
                "1"
            } else {
                "0"
            })
            .arg(&root)
            .arg(ordo_fuse::ioctl::ORDO_IOC_STREAMSYNC.to_string())
            .arg(SQLITE_ROW_BYTES.to_string());
        let (t0, wall) = (vfs.now_ns(), Instant::now());
        run(&mut cmd)?;
        if self.durability == Durability::StreamsyncEnd {
            vfs.streamsync("sqlite")?;
        }
        let out = output(self.rows, t0, vfs, wall, self.durability);
        ctx.tick(self.rows);
        let counted = run(Command::new(&py)
            .args([
                "-c",
                "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT count(*) FROM t').fetchone()[0])",
            ])
            .arg(&db))?;
        let count = String::from_utf8_lossy(&counted.stdout).trim().to_string();
        check(w, count == self.rows.to_string(), || {
            format!("table holds {count} rows, expected {}", self.rows)
        })?;
        Ok(out)
    }
}

// ------------------------------------------------------------------- git

/// Words of the generated tree's C-like text.
const WORDS: &[&str] = &[
    "static",
    "int",
    "struct",
    "return",
    "if",
    "else",
    "for",
    "while",
    "unsigned",
    "long",
    "const",
    "void",
    "char",
    "sizeof",
    "goto",
    "out",
    "err",
    "ret",
    "dev",
    "buf",
    "len",
    "flags",
    "lock",
    "unlock",
    "spin_lock",
    "mutex",
    "page",
    "inode",
    "skb",
    "irq",
    "pci",
    "0",
    "1",
    "NULL",
    "->",
    "=",
    "==",
    "!=",
    "&&",
    "||",
    "(",
    ")",
    "{",
    "}",
    ";",
    "*",
    "u32",
    "u64",
    "size_t",
    "EINVAL",
    "ENOMEM",
    "kfree",
    "kmalloc",
    "GFP_KERNEL",
    "pr_err",
    "list_head",
];

/// `bytes` of C-like text, seeded.
fn c_like_text(rng: &mut impl Rng, bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes + 16);
    let mut col = 0;
    while out.len() < bytes {
        let w = WORDS[rng.gen_range(0..WORDS.len())];
        out.extend_from_slice(w.as_bytes());
        col += w.len() + 1;
        if col > 60 || w == ";" || w == "{" {
            out.push(b'\n');
            let indent = rng.gen_range(0..3);
            out.resize(out.len() + indent, b'\t');
            col = 8 * indent;
        } else {
            out.push(b' ');
        }
    }
    out.truncate(bytes);
    out
}

/// The directory of file `i` in the generated tree: `GIT_FILES_PER_DIR`
/// files per directory, directories `GIT_DIR_FANOUT` wide, three levels
/// (as `drivers/net/ethernet`).
fn git_dir_of(i: u64) -> String {
    let leaf = i / GIT_FILES_PER_DIR;
    format!(
        "repo/d{}/d{}/d{}",
        leaf / (GIT_DIR_FANOUT * GIT_DIR_FANOUT),
        (leaf / GIT_DIR_FANOUT) % GIT_DIR_FANOUT,
        leaf % GIT_DIR_FANOUT
    )
}

/// Reads every file under `dir` (not `.git`); returns the bytes read.
fn read_tree(vfs: &dyn Vfs, dir: &str) -> Result<u64> {
    /// Request size of the warming reads.
    const WARM_IO_BYTES: usize = 1 << 20;
    let mut bytes = 0;
    for (name, is_dir) in vfs.list(dir)? {
        let path = format!("{dir}/{name}");
        if is_dir {
            if name != ".git" {
                bytes += read_tree(vfs, &path)?;
            }
        } else {
            bytes += read_whole(&*vfs.open(&path)?, WARM_IO_BYTES)?;
        }
    }
    Ok(bytes)
}

/// git add + commit of a generated tree.
pub struct StreamsGit {
    files: u64,
    durability: Durability,
}

/// streams-git at `scale`: fsync, streamsync-end.
pub fn git_cases(scale: Scale) -> Vec<Box<dyn Case>> {
    [Durability::Fsync, Durability::StreamsyncEnd]
        .into_iter()
        .map(|durability| {
            Box::new(StreamsGit {
                files: scale.pick(50, 2000, 10_000, 48_000),
                durability,
            }) as Box<dyn Case>
        })
        .collect()
}

impl Case for StreamsGit {
    fn workload(&self) -> &'static str {
        "streams-git"
    }
    fn label(&self) -> String {
        self.durability.name().into()
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "files": self.files,
            "files_per_dir": GIT_FILES_PER_DIR,
            "dir_fanout": GIT_DIR_FANOUT,
            "mean_file_bytes": GIT_MEAN_FILE_BYTES,
            "content": "C-like text",
            "config": "core.fsync=committed core.fsyncMethod=fsync gc.auto=0",
            "durability": self.durability.name(),
            "stream": "git",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.files
    }
    fn needs_host_path(&self) -> bool {
        true
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        let root = host_root(vfs, "streams-git")?.to_path_buf();
        let git = ensure_program("git", "git")?;
        let mut rng = thread_rng(seed ^ 0x61_7e, 0);
        for i in 0..self.files {
            let dir = git_dir_of(i);
            if i % GIT_FILES_PER_DIR == 0 {
                mkdir_all(vfs, &dir)?;
            }
            let size = filebench_size(&mut rng, GIT_MEAN_FILE_BYTES) as usize;
            let f = vfs.create(&format!("{dir}/f{i}.c"))?;
            f.write_at(0, &c_like_text(&mut rng, size))?;
        }
        let mut init = Command::new(git);
        git_args(&mut init, &root.join("repo"));
        run(init.args(["init", "-q"]))?;
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let w = self.workload();
        let repo = host_root(vfs, w)?.join("repo");
        let git = ensure_program("git", "git")?;
        // The tree is read once before the measurement, as after it was
        // unpacked: the paper's run committed a tree in the page cache, and
        // reading 10,000 cold files (a seek each on the HDD model) would
        // otherwise be most of the streamsync case's time.
        let warmed = read_tree(vfs, "repo")?;
        let (t0, wall) = (vfs.now_ns(), Instant::now());
        for args in [
            &["add", "-A"][..],
            &["commit", "-q", "-m", "ordo bench"][..],
        ] {
            let mut c = app_command(vfs, w, "git", self.durability, &git)?;
            git_args(&mut c, &repo);
            run(c.args(args))?;
        }
        if self.durability == Durability::StreamsyncEnd {
            vfs.streamsync("git")?;
        }
        let mut out = output(self.files, t0, vfs, wall, self.durability);
        out.extra.insert("prewarmed_bytes".into(), json!(warmed));
        ctx.tick(self.files);
        let mut ls = Command::new(&git);
        git_args(&mut ls, &repo);
        let listed = run(ls.arg("ls-files"))?
            .stdout
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        check(w, listed == self.files, || {
            format!("commit holds {listed} files, expected {}", self.files)
        })?;
        Ok(out)
    }
}

// --------------------------------------------------------------- LevelDB

/// LevelDB's fillrandom through plyvel: db_bench's keys and values,
/// `sync=false` writes. Prints the number of puts.
const LEVELDB_DRIVER: &str = r#"
import random, sys, plyvel
path, n, seed, vbytes, kbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rnd = random.Random(seed)
raw = rnd.randbytes(1 << 20)
half = vbytes // 2
db = plyvel.DB(path, create_if_missing=True)
for i in range(n):
    o = (i * 7919) % ((1 << 20) - half)
    # db_bench's values compress to half their size.
    value = raw[o:o + half] + bytes([raw[o] | 1]) * (vbytes - half)
    key = b"%0*d" % (kbytes, rnd.randrange(n))
    db.put(key, value)
db.close()
print(n)
"#;

/// LevelDB fillrandom.
pub struct StreamsLeveldb {
    puts: u64,
    durability: Durability,
}

/// streams-leveldb at `scale`: fsync, streamsync-end.
pub fn leveldb_cases(scale: Scale) -> Vec<Box<dyn Case>> {
    [Durability::Fsync, Durability::StreamsyncEnd]
        .into_iter()
        .map(|durability| {
            Box::new(StreamsLeveldb {
                puts: scale.pick(2000, 20_000, 100_000, 250_000),
                durability,
            }) as Box<dyn Case>
        })
        .collect()
}

impl Case for StreamsLeveldb {
    fn workload(&self) -> &'static str {
        "streams-leveldb"
    }
    fn label(&self) -> String {
        self.durability.name().into()
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "puts": self.puts,
            "key_bytes": LEVELDB_KEY_BYTES,
            "value_bytes": LEVELDB_VALUE_BYTES,
            "benchmark": "fillrandom (plyvel, sync=false, default options)",
            "durability": self.durability.name(),
            "stream": "leveldb",
        })
    }
    fn expected_ops(&self) -> u64 {
        self.puts
    }
    fn needs_host_path(&self) -> bool {
        true
    }
    fn setup(&self, vfs: &dyn Vfs, _seed: u64) -> Result<()> {
        host_root(vfs, "streams-leveldb")?;
        python_with("plyvel", "python3-plyvel")?;
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let w = self.workload();
        let root = host_root(vfs, w)?.to_path_buf();
        let py = python_with("plyvel", "python3-plyvel")?;
        let mut cmd = app_command(vfs, w, "leveldb", self.durability, &py)?;
        cmd.args(["-c", LEVELDB_DRIVER])
            .arg(root.join("ldb"))
            .arg(self.puts.to_string())
            .arg(ctx.seed.to_string())
            .arg(LEVELDB_VALUE_BYTES.to_string())
            .arg(LEVELDB_KEY_BYTES.to_string());
        let (t0, wall) = (vfs.now_ns(), Instant::now());
        let done = run(&mut cmd)?;
        if self.durability == Durability::StreamsyncEnd {
            vfs.streamsync("leveldb")?;
        }
        let mut out = output(self.puts, t0, vfs, wall, self.durability);
        ctx.tick(self.puts);
        let printed = String::from_utf8_lossy(&done.stdout).trim().to_string();
        check(w, printed == self.puts.to_string(), || {
            format!("the driver reports {printed} puts, expected {}", self.puts)
        })?;
        let secs = out.elapsed_ns.unwrap_or(1).max(1) as f64 / 1e9;
        out.extra.insert(
            "mb_per_s".into(),
            json!(self.puts as f64 * (LEVELDB_KEY_BYTES + LEVELDB_VALUE_BYTES) as f64 / 1e6 / secs),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tree_is_nested_and_text() {
        assert_eq!(git_dir_of(0), "repo/d0/d0/d0");
        assert_eq!(git_dir_of(GIT_FILES_PER_DIR), "repo/d0/d0/d1");
        assert_eq!(
            git_dir_of(GIT_FILES_PER_DIR * GIT_DIR_FANOUT * GIT_DIR_FANOUT),
            "repo/d1/d0/d0"
        );
        let mut rng = thread_rng(1, 0);
        let t = c_like_text(&mut rng, 5000);
        assert_eq!(t.len(), 5000);
        assert!(t.iter().all(|b| b.is_ascii()));
        assert!(t.contains(&b'\n'));
        let mut rng = thread_rng(1, 0);
        assert_eq!(t, c_like_text(&mut rng, 5000), "seeded");
    }

    #[test]
    fn case_labels_name_the_durability_scheme() {
        let labels: Vec<String> = sqlite_cases(Scale::Smoke)
            .iter()
            .map(|c| c.label())
            .collect();
        assert_eq!(labels, ["fsync", "streamsync-each", "streamsync-end"]);
        assert_eq!(git_cases(Scale::Smoke).len(), 2);
        assert_eq!(leveldb_cases(Scale::Smoke).len(), 2);
    }
}
