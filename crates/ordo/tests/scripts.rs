//! The scripts under `scripts/` parse, and the C programs that
//! `scripts/floor_compare.sh` builds compile cleanly and do their job: the
//! load creates its files whole, and the libfuse floor serves a mount that
//! the load runs on, in both of its loops; `scripts/fuse_instructions.sh`
//! counts the instructions of ordo's server and of the floor.
//!
//! Needs root and /dev/fuse (the floor is mounted), gcc, pkg-config,
//! libfuse3-dev and valgrind (scripts/deps.sh installs them).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{is_mounted, require_mount_privileges, run, which, OrdoMount, Scratch};

/// The workspace's `scripts/` directory.
fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

/// Compile `scripts/floor/NAME.c` into `out` with warnings as errors,
/// adding `extra` (libraries, flags) after the source.
fn compile(name: &str, out: &Path, extra: &[String]) {
    assert!(which("cc"), "cc is missing: scripts/deps.sh installs gcc");
    let src = scripts_dir().join("floor").join(format!("{name}.c"));
    let o = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
        .arg(out)
        .arg(&src)
        .args(extra)
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// pkg-config's compiler and linker flags for libfuse 3.
fn fuse3_flags() -> Vec<String> {
    assert!(
        which("pkg-config"),
        "pkg-config is missing: scripts/deps.sh installs it"
    );
    let o = run("pkg-config", &["--cflags", "--libs", "fuse3"]);
    assert!(
        o.status.success(),
        "pkg-config finds no fuse3 (libfuse3-dev; scripts/deps.sh installs it): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Run `createload DIR N THREADS [BYTES]`; the rate it printed.
fn createload(bin: &Path, dir: &Path, n: u32, threads: u32, bytes: Option<u32>) -> f64 {
    let mut cmd = Command::new(bin);
    cmd.arg(dir).arg(n.to_string()).arg(threads.to_string());
    if let Some(b) = bytes {
        cmd.arg(b.to_string());
    }
    let o = cmd.output().expect("run createload");
    assert!(
        o.status.success(),
        "createload {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("createload printed {text:?}, not a rate"))
}

#[test]
fn every_script_parses() {
    let (mut shell, mut python) = (0, 0);
    for entry in fs::read_dir(scripts_dir()).unwrap() {
        let path = entry.unwrap().path();
        let p = path.to_str().unwrap();
        let o = match path.extension().and_then(|e| e.to_str()) {
            Some("sh") => {
                shell += 1;
                run("bash", &["-n", p])
            }
            Some("py") => {
                python += 1;
                run(
                    "python3",
                    &[
                        "-c",
                        "import ast, sys; ast.parse(open(sys.argv[1]).read())",
                        p,
                    ],
                )
            }
            _ => continue,
        };
        assert!(
            o.status.success(),
            "{} does not parse: {}",
            path.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert!(
        shell >= 9 && python >= 3,
        "found only {shell} shell and {python} Python scripts under scripts/"
    );
}

#[test]
fn the_load_creates_every_file_whole() {
    let s = Scratch::new();
    let bin = s.path("createload");
    compile("createload", &bin, &[]);
    let dir = s.path("files");
    let rate = createload(&bin, &dir, 37, 4, Some(5000));
    assert!(rate > 0.0, "rate {rate}");
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            assert_eq!(e.metadata().unwrap().len(), 5000, "{:?}", e.path());
            e.file_name().into_string().unwrap()
        })
        .collect();
    names.sort();
    let mut want: Vec<String> = (0..37).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names, want);
    // The directory exists now: a second run into it must fail, not
    // overwrite (O_EXCL and mkdir both refuse).
    let o = Command::new(&bin)
        .arg(&dir)
        .args(["1", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "a second run into {dir:?} succeeded");
}

#[test]
fn the_libfuse_floor_serves_the_load() {
    require_mount_privileges();
    let s = Scratch::new();
    let load = s.path("createload");
    compile("createload", &load, &[]);
    let floor = s.path("libfuse_floor");
    compile("libfuse_floor", &floor, &fuse3_flags());
    for multi_threaded in [false, true] {
        let mp = s.mkdir(if multi_threaded { "mt" } else { "st" });
        let mut cmd = Command::new(&floor);
        cmd.args(["-o", "default_permissions"]).arg(&mp);
        if multi_threaded {
            cmd.env("MT", "1");
        } else {
            cmd.env_remove("MT");
        }
        let m = OrdoMount::spawn(cmd, &mp);
        let rate = createload(&load, &mp.join("c"), 300, 3, None);
        assert!(rate > 0.0, "rate {rate}");
        // The directory the load made is remembered as one; a name
        // nobody made is missing (a negative entry).
        assert!(
            mp.join("c").is_dir(),
            "{:?} is not a directory",
            mp.join("c")
        );
        assert!(!mp.join("c/never").exists(), "a name nobody made exists");
        m.stop_ok();
        assert!(!is_mounted(&mp), "{mp:?} is still mounted");
    }
}

/// `scripts/fuse_instructions.sh` counts each server's own instructions
/// under cachegrind: a row per target, a positive count per file, and
/// ordo's server, which stores what it is sent, above the floor's, which
/// stores nothing.
#[test]
fn fuse_instructions_counts_each_server() {
    require_mount_privileges();
    assert!(
        which("valgrind"),
        "valgrind is missing: scripts/deps.sh installs it"
    );
    let o = Command::new("bash")
        .arg(scripts_dir().join("fuse_instructions.sh"))
        .args(["200", "2", "floor", "mode=async"])
        .env("ORDO_BIN", env!("CARGO_BIN_EXE_ordo"))
        .output()
        .expect("run fuse_instructions.sh");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "fuse_instructions.sh failed:\n{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let per_file = |target: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(target))
            .unwrap_or_else(|| panic!("no row for {target} in:\n{text}"));
        line.split_whitespace()
            .nth(3)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no count per file in {line:?}"))
    };
    let (floor, ordo) = (per_file("floor"), per_file("mode=async"));
    assert!(floor > 0, "the floor's count per file is {floor}:\n{text}");
    assert!(
        ordo > floor,
        "ordo's server counts {ordo} per file, the floor's {floor}:\n{text}"
    );
}
