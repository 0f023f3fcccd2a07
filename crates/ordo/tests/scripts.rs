//! The scripts under `scripts/` parse, and the C programs that
//! `scripts/floor_compare.sh` builds compile cleanly and do their job: the
//! load creates its files whole, and the libfuse floor serves a mount that
//! the load runs on, in both of its loops; `scripts/fuse_instructions.sh`
//! counts the instructions of ordo's server and of the floor,
//! `scripts/floor_compare.sh` sums up its rounds with ratios taken within
//! each, and `scripts/request_times.sh` times every request of the load
//! from the kernel's tracepoints.
//!
//! Needs root and /dev/fuse (the floor is mounted), gcc, pkg-config,
//! libfuse3-dev, valgrind and perf (scripts/deps.sh installs them).

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

/// Run `scripts/NAME ARGS` with this build's ordo (`ORDO_BIN`) and `env`;
/// what it printed, once it succeeded.
fn run_script(name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let o = Command::new("bash")
        .arg(scripts_dir().join(name))
        .args(args)
        .env("ORDO_BIN", env!("CARGO_BIN_EXE_ordo"))
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{name} failed:\n{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    text
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
    let text = run_script(
        "fuse_instructions.sh",
        &["200", "2", "floor", "mode=async"],
        &[],
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

/// `floor_compare.sh` runs its targets in a turning order and sums up
/// each target with the medians of its ratios to the floor taken within
/// each round: with two rounds of a few hundred files, every run's row
/// and the summary's ratios must be there, and the ratio must be the
/// median of the rounds' own (recomputed here from the rows printed), and
/// the CPU columns parse.
#[test]
fn floor_compare_sums_up_ratios_within_rounds() {
    require_mount_privileges();
    let text = run_script(
        "floor_compare.sh",
        &["3", "2", "floor", "mode=async"],
        &[("FILES", "300")],
    );
    // The runs, round by round, in the order they ran.
    let mut rounds: Vec<Vec<(String, f64)>> = Vec::new();
    let mut summary = false;
    let mut rows: Vec<Vec<String>> = Vec::new();
    for line in text.lines() {
        if line.starts_with("round ") {
            rounds.push(Vec::new());
        } else if line.starts_with("medians over") {
            summary = true;
        } else if summary && !line.starts_with("target") && !line.starts_with("reproduce") {
            rows.push(line.split_whitespace().map(str::to_owned).collect());
        } else if let (false, Some(r)) = (summary, rounds.last_mut()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let rate = f[1]
                .parse()
                .unwrap_or_else(|_| panic!("no rate in {line:?}"));
            r.push((f[0].to_owned(), rate));
        }
    }
    assert_eq!(rounds.len(), 3, "three rounds in:\n{text}");
    // The order turns: each round starts with a different target.
    assert_eq!(rounds[0][0].0, "floor", "{text}");
    assert_eq!(rounds[1][0].0, "mode=async", "{text}");
    let mut ratios: Vec<f64> = rounds
        .iter()
        .map(|r| {
            let rate = |t: &str| r.iter().find(|(n, _)| n == t).expect("both ran").1;
            assert!(rate("floor") > 0.0 && rate("mode=async") > 0.0, "{text}");
            rate("mode=async") / rate("floor")
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let ordo = rows
        .iter()
        .find(|r| r[0] == "mode=async")
        .unwrap_or_else(|| panic!("no summary row for mode=async in:\n{text}"));
    let floor = rows.iter().find(|r| r[0] == "floor").expect("floor row");
    assert_eq!(floor[3], "-", "the floor against itself: {floor:?}");
    assert_eq!(ordo[2], "-", "no kernel among the targets: {ordo:?}");
    let x: f64 = ordo[3]
        .parse()
        .unwrap_or_else(|_| panic!("no ratio in {ordo:?}"));
    assert!(
        (x - ratios[1]).abs() < 0.0015,
        "summary says {x}x the floor, the rounds' median is {}:\n{text}",
        ratios[1]
    );
    // A few hundred files may take under one clock tick of the server's.
    let cpu: u32 = ordo[4]
        .parse()
        .unwrap_or_else(|_| panic!("ordo's server CPU per file: {ordo:?}"));
    // Of it, the time in user space, in parentheses, never more.
    let user: u32 = ordo[5]
        .trim_matches(|c| c == '(' || c == ')')
        .parse()
        .unwrap_or_else(|_| panic!("ordo's server user CPU per file: {ordo:?}"));
    assert!(user <= cpu, "user {user} of {cpu} µs per file: {ordo:?}");
    // The whole machine's CPU per file, which holds the server's user time.
    let machine: u32 = ordo[6]
        .parse()
        .unwrap_or_else(|_| panic!("the machine's CPU per file: {ordo:?}"));
    assert!(
        machine >= user,
        "machine {machine} µs per file, the server's user time alone {user}: {ordo:?}"
    );
}

/// `scripts/request_times.sh` pairs every request's send with its end: on
/// the floor and on ordo, a create + write + close is one LOOKUP, CREATE,
/// WRITE and RELEASE per file, each with a positive time, ordo's rows carry
/// their ratio to the floor's, and each target's sum is its rows' means
/// weighted by requests per file.
#[test]
fn request_times_pairs_every_request() {
    require_mount_privileges();
    assert!(
        which("perf"),
        "perf is missing: scripts/deps.sh installs it"
    );
    let text = run_script(
        "request_times.sh",
        &["300", "1", "floor", "mode=async"],
        &[],
    );
    for target in ["floor", "mode=async"] {
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.first() == Some(&target))
            .collect();
        let mut sum = 0.0;
        for op in ["LOOKUP", "CREATE", "WRITE", "RELEASE"] {
            let row = rows
                .iter()
                .find(|f| f.get(1) == Some(&op))
                .unwrap_or_else(|| panic!("no {op} row for {target} in:\n{text}"));
            let per_file: f64 = row[2].parse().expect("requests per file");
            assert!(
                (0.95..=1.1).contains(&per_file),
                "{target}: {per_file} {op} per file:\n{text}"
            );
            let mean: f64 = row[3].parse().expect("mean");
            assert!(mean > 0.0, "{target} {op}: mean {mean}:\n{text}");
            assert_eq!(
                row[5] == "-",
                target == "floor",
                "{target} {op}: the ratio column {:?}",
                row[5]
            );
        }
        for row in rows.iter().filter(|f| f.len() == 6) {
            sum += row[2].parse::<f64>().unwrap() * row[3].parse::<f64>().unwrap();
        }
        let total: f64 = rows
            .iter()
            .find(|f| f.get(1) == Some(&"per") && f.get(2) == Some(&"file"))
            .unwrap_or_else(|| panic!("no sum for {target} in:\n{text}"))[3]
            .parse()
            .expect("the sum");
        assert!(
            (total - sum).abs() <= 0.05 * sum + 0.5,
            "{target}: sum {total}, rows give {sum}:\n{text}"
        );
    }
}
