//! A full file system through FUSE, in every protocol: several worker
//! processes create, write, link, rename, symlink, truncate and delete on
//! a small image until and past full. Only the errors a racing, full file system
//! gives are accepted (ENOSPC above all); afterwards deleting a file makes
//! room for a new write at once, and after unmount `e2fsck -fn` is clean.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;

const WORKERS: usize = 4;
const OPS_PER_WORKER: usize = 500;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    enospc: AtomicU64,
    other_expected: AtomicU64,
}

/// Errors a worker may see: out of space, or a name another step of the
/// same worker (random names) removed, took or filled.
fn check(r: std::io::Result<()>, what: &str, counts: &Counts) {
    counts.ops.fetch_add(1, Ordering::Relaxed);
    let Err(e) = r else { return };
    match e.raw_os_error() {
        Some(libc::ENOSPC) => {
            counts.enospc.fetch_add(1, Ordering::Relaxed);
        }
        Some(libc::ENOENT) | Some(libc::EEXIST) | Some(libc::ENOTEMPTY) => {
            counts.other_expected.fetch_add(1, Ordering::Relaxed);
        }
        _ => panic!("{what}: unexpected error {e}"),
    }
}

fn write_file(path: &Path, len: usize, byte: u8, append: bool) -> std::io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)?;
    let buf = vec![byte; len];
    f.write_all(&buf)
}

fn worker(root: &Path, shared: &Path, id: usize, counts: &Counts) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((id as u64 + 1) * 0x1234_5678_9abc));
    let dir = root.join(format!("w{id}"));
    fs::create_dir(&dir).unwrap();
    let file = |i: u64| dir.join(format!("f{i}"));
    let long = |i: u64| dir.join(format!("{}{i}", "n".repeat(240)));
    for step in 0..OPS_PER_WORKER {
        let op = rng.below(100);
        let a = rng.below(32);
        let b = rng.below(16);
        let what = format!("worker {id} step {step} op {op}");
        let r = match op {
            0..=29 => {
                let len = rng.below(2 << 20) as usize + 1;
                write_file(&file(a), len, id as u8 + 1, false)
            }
            30..=39 => write_file(&file(a), 256 * 1024, 0x55, true),
            40..=47 => fs::hard_link(file(a), long(b)),
            48..=55 => fs::rename(file(a), file(b)),
            56..=59 => fs::rename(
                file(a),
                shared.join(format!("{}{id}-{step}", "r".repeat(200))),
            ),
            60..=65 => symlink("t".repeat(300), long(b + 100)),
            66..=69 => symlink("short", long(b + 200)),
            70..=74 => fs::create_dir(dir.join(format!("d{a}"))),
            75..=77 => fs::remove_dir(dir.join(format!("d{a}"))),
            78..=84 => fs::OpenOptions::new()
                .write(true)
                .open(file(a))
                .and_then(|f| f.set_len(rng.below(1 << 20))),
            85..=94 => fs::remove_file(file(a)),
            _ => fs::remove_file(long(b)),
        };
        check(r, &what, counts);
    }
}

/// Write `path` in 1 MiB pieces until the file system is full. `dd`
/// writes it, not this process: while this process held it open, a child
/// another test spawns could inherit it for a moment, and a deletion right
/// after would then leave it allocated until that child let go.
fn fill(path: &Path) {
    let out = run(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", path.display()),
            "bs=1M",
            "status=none",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("No space left on device"),
        "filling {}: {} {err}",
        path.display(),
        out.status
    );
}

/// Run the workers on a fresh 32 MiB image made with `-O features`
/// (none when empty), mounted `-o options`.
fn stress(mode: &str, features: &str) {
    require_mount_privileges();
    let s = Scratch::new();
    let img = s.path("stress.img");
    let mut args = vec!["mkfs", img.to_str().unwrap(), "--size", "32M"];
    if !features.is_empty() {
        args.extend(["-O", features]);
    }
    let out = ordo(&args);
    assert!(
        out.status.success(),
        "ordo mkfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mp = s.mkdir("m");
    let m = OrdoMount::start(&img, &mp, &format!("mode={mode}"));
    let shared = mp.join("shared");
    fs::create_dir(&shared).unwrap();
    let counts = Counts::default();
    // Each worker is a process of its own: this test binary, run for the
    // ignored test `stress_worker` with the worker's number and paths.
    let children: Vec<_> = (0..WORKERS)
        .map(|id| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--ignored", "--exact", "stress_worker", "--nocapture"])
                .env(WORKER_ENV, format!("{id}"))
                .env(ROOT_ENV, &mp)
                .env(SHARED_ENV, &shared)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a worker process")
        })
        .collect();
    for (id, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: worker {id} failed:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("worker counts: "))
            .unwrap_or_else(|| panic!("{mode}: worker {id} printed no counts:\n{text}"));
        let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        counts.ops.fetch_add(v[0], Ordering::Relaxed);
        counts.enospc.fetch_add(v[1], Ordering::Relaxed);
        counts.other_expected.fetch_add(v[2], Ordering::Relaxed);
    }
    let (ops, enospc) = (
        counts.ops.load(Ordering::Relaxed),
        counts.enospc.load(Ordering::Relaxed),
    );
    eprintln!(
        "stress {mode}: {ops} operations, {enospc} ENOSPC, {} ENOENT/EEXIST/ENOTEMPTY",
        counts.other_expected.load(Ordering::Relaxed)
    );
    assert!(
        enospc > 0,
        "{mode}: the workers never filled the file system"
    );
    // Deleting makes room at once: remove what the workers made, fill
    // the file system again, then delete the filler and write.
    for id in 0..WORKERS {
        fs::remove_dir_all(mp.join(format!("w{id}"))).unwrap();
    }
    fs::remove_dir_all(&shared).unwrap();
    let filler: PathBuf = mp.join("filler");
    fill(&filler);
    let fresh = mp.join("fresh");
    let r = write_file(&fresh, 4096, 1, false);
    assert!(
        matches!(&r, Err(e) if e.raw_os_error() == Some(libc::ENOSPC)),
        "{mode}: the fill left room: {r:?}"
    );
    let _ = fs::remove_file(&fresh);
    assert!(fs::metadata(&filler).unwrap().len() > 16 << 20);
    fs::remove_file(&filler).unwrap();
    write_file(&fresh, 1 << 20, 2, false)
        .unwrap_or_else(|e| panic!("{mode}: writing after a deletion: {e}"));
    assert_eq!(fs::metadata(&fresh).unwrap().len(), 1 << 20);
    m.stop_ok();
    assert_e2fsck_clean(&img);
}

const WORKER_ENV: &str = "ORDO_STRESS_WORKER";
const ROOT_ENV: &str = "ORDO_STRESS_ROOT";
const SHARED_ENV: &str = "ORDO_STRESS_SHARED";

/// One worker process of the stress tests (they start it; on its own it
/// has nothing to do and fails).
#[test]
#[ignore = "a worker process the stress tests start"]
fn stress_worker() {
    let id: usize = std::env::var(WORKER_ENV)
        .expect("started by a stress test")
        .parse()
        .unwrap();
    let root = PathBuf::from(std::env::var_os(ROOT_ENV).unwrap());
    let shared = PathBuf::from(std::env::var_os(SHARED_ENV).unwrap());
    let counts = Counts::default();
    worker(&root, &shared, id, &counts);
    println!(
        "worker counts: {} {} {}",
        counts.ops.load(Ordering::Relaxed),
        counts.enospc.load(Ordering::Relaxed),
        counts.other_expected.load(Ordering::Relaxed)
    );
}

#[test]
fn stress_past_full_journal() {
    stress("journal", "");
}

#[test]
fn stress_past_full_journal_data() {
    stress("journal,data=journal", "");
}

#[test]
fn stress_past_full_sync() {
    stress("sync", "^has_journal");
}

#[test]
fn stress_past_full_async() {
    stress("async", "^has_journal");
}

#[test]
fn stress_past_full_fast_commit() {
    stress("fast_commit", "fast_commit");
}

/// `ordo mkfs -m 10`: through FUSE, a user other than root runs out of
/// space while a tenth of the blocks is still free, and root can still
/// write.
#[test]
fn reserved_blocks_through_fuse() {
    require_mount_privileges();
    assert!(
        which("setpriv"),
        "setpriv (util-linux) is needed to write as a user"
    );
    let s = Scratch::new();
    let img = s.path("reserved.img");
    let out = ordo(&["mkfs", img.to_str().unwrap(), "--size", "32M", "-m", "10"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sh(s.dir.path(), "chmod 0755 .");
    let mp = s.mkdir("m");
    let m = OrdoMount::start(&img, &mp, "mode=journal");
    sh(&mp, "mkdir u && chmod 0777 u");
    let user = run(
        "setpriv",
        &[
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "dd",
            "if=/dev/zero",
            &format!("of={}", mp.join("u/f").display()),
            "bs=1M",
        ],
    );
    let err = String::from_utf8_lossy(&user.stderr);
    assert!(
        !user.status.success() && err.contains("No space left on device"),
        "the user's dd: {} {err}",
        user.status
    );
    // What is left is the reserve: statfs says nothing is available to
    // users, and about a tenth of the blocks is free.
    let df = sh(&mp, "stat -f -c '%b %f %a' .");
    let v: Vec<u64> = df.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (blocks, free, avail) = (v[0], v[1], v[2]);
    assert_eq!(avail, 0, "statfs after the user's fill: {df}");
    assert!(
        free * 100 >= blocks * 9,
        "the user wrote into the reserve: {free} of {blocks} blocks free"
    );
    // Root is not held back.
    sh(&mp, "dd if=/dev/zero of=rootfile bs=1M count=1 status=none");
    m.stop_ok();
    assert_e2fsck_clean(&img);
}
