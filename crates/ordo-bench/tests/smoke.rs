//! A tiny run of every workload on every kind of target: the harness
//! works and the counters agree. Nothing here looks at speed.
//!
//! Needs root (loop devices, mounts), e2fsprogs, fuse3, sqlite3, git, and
//! the Debian packages postmark and fsmark (installed on demand). The ordo
//! targets need the `ordo` binary: `cargo build -p ordo` first, or set
//! `ORDO_BIN`.

use std::path::PathBuf;

use ordo_bench::report::Row;
use ordo_bench::runner::{run_plan, Plan};
use ordo_bench::target::{DeviceKind, DiskName, DiskSpec, ImageKind, TargetConfig, TargetSpec};
use ordo_bench::workload::{self, Overrides, Scale, WorkloadName};

/// Workloads that run a program and so need a mounted target.
const EXTERNAL: [WorkloadName; 8] = [
    WorkloadName::StreamsSqlite,
    WorkloadName::StreamsGit,
    WorkloadName::StreamsLeveldb,
    WorkloadName::Sqlite,
    WorkloadName::Oltp,
    WorkloadName::Git,
    WorkloadName::Postmark,
    WorkloadName::Fsmark,
];

/// Workloads that time fsyncs.
const FSYNCING: [&str; 7] = [
    "fcmicro",
    "varmail",
    "randwrite",
    "seqwrite",
    "overwrite",
    "twofile",
    "twofile-repeat",
];

/// True for the rows of a case that needs ordo's streams (IGNORE_FSYNC
/// and streamsync), which a file system without them refuses.
fn needs_streams(r: &Row) -> bool {
    r.workload.starts_with("streams-") && r.case != "fsync"
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "the smoke tests mount file systems on loop devices: run them as root"
    );
}

fn plan(targets: &[&str], workloads: &[WorkloadName], disk: Option<DiskSpec>) -> Plan {
    Plan {
        workloads: workloads.to_vec(),
        targets: targets
            .iter()
            .map(|t| t.parse::<TargetSpec>().unwrap())
            .collect(),
        config: TargetConfig {
            workdir: PathBuf::from("/var/tmp/ordo-bench-test"),
            size_bytes: 256 << 20,
            device: DeviceKind::Loop,
            image: ImageKind::Sparse,
            disk,
            ordo_bin: None,
        },
        scale: Scale::Smoke,
        seed: 42,
        overrides: Overrides::default(),
        progress: false,
        repeat: 1,
    }
}

fn run(p: &Plan) -> Vec<Row> {
    require_root();
    let rows = run_plan(p, |_| {}).unwrap();
    let cases: usize = p
        .workloads
        .iter()
        .map(|&w| workload::cases(w, p.scale, &p.overrides).unwrap().len())
        .sum();
    assert_eq!(
        rows.len(),
        cases * p.targets.len(),
        "one row per case and target"
    );
    rows
}

/// Checks that a row ran without error and counted operations.
fn check_ran(r: &Row) {
    assert!(
        r.error.is_none(),
        "{} on {} failed: {}",
        r.title(),
        r.target,
        r.error.as_deref().unwrap_or("")
    );
    assert!(r.ops > 0, "{} on {}: no operations", r.title(), r.target);
}

/// Checks a row that must have run, with device counters when `device`.
fn check_ok(r: &Row, device: bool) {
    check_ran(r);
    assert!(r.ops_per_sec > 0.0 && r.elapsed_s > 0.0);
    if FSYNCING.contains(&r.workload.as_str()) {
        assert!(r.fsyncs > 0, "{} on {} timed no fsync", r.title(), r.target);
        let (p50, p99) = (r.fsync_us_p50.unwrap(), r.fsync_us_p99.unwrap());
        assert!(p50 <= p99 && p99 <= r.fsync_us_max.unwrap());
    }
    if device {
        assert_eq!(r.counters_source, "kernel", "{} on {}", r.title(), r.target);
        let k = r.device_counters.expect("kernel counters");
        assert!(
            k.writes > 0 && r.kib_per_op.unwrap() > 0.0,
            "{} on {}: the kernel saw no writes",
            r.title(),
            r.target
        );
    } else {
        assert_eq!(r.counters_source, "none");
        assert!(r.writes_per_op.is_none());
    }
}

#[test]
fn every_workload_on_tmpfs_and_kernel_ext4() {
    let rows = run(&plan(&["tmpfs", "ext4:ordered"], &WorkloadName::ALL, None));
    for r in &rows {
        if needs_streams(r) {
            let e = r.error.as_deref().unwrap_or("");
            assert!(
                e.contains("IGNORE_FSYNC"),
                "{} on {}: {e}",
                r.title(),
                r.target
            );
            continue;
        }
        check_ok(r, r.target != "tmpfs");
        assert!(r.ordo.is_none() && r.counters_agree.is_none());
    }
    // With an fsync per file the kernel's ext4 flushes at least once per
    // operation; tmpfs has no device at all.
    let fc = rows
        .iter()
        .find(|r| r.workload == "fcmicro" && r.target == "ext4:ordered")
        .unwrap();
    assert!(fc.flushes_per_op.unwrap() >= 1.0, "{fc:?}");
}

#[test]
fn every_kernel_ext4_mode_runs_fcmicro() {
    let rows = run(&plan(
        &["ext4:fast_commit", "ext4:journal", "ext4:nobarrier"],
        &[WorkloadName::Fcmicro],
        None,
    ));
    for r in &rows {
        check_ok(r, true);
    }
    let nobarrier = rows.iter().find(|r| r.target == "ext4:nobarrier").unwrap();
    assert_eq!(
        nobarrier.device_counters.unwrap().flushes,
        0,
        "nobarrier issues no cache flush"
    );
    let fc = rows
        .iter()
        .find(|r| r.target == "ext4:fast_commit")
        .unwrap();
    let jn = rows.iter().find(|r| r.target == "ext4:journal").unwrap();
    assert!(
        fc.kib_per_op.unwrap() < jn.kib_per_op.unwrap(),
        "a fast commit writes less than a data=journal commit"
    );
    // From /proc/fs/ext4/loopN/fc_info and /proc/fs/jbd2/loopN-8/info:
    // the first fsync of the mount is a full commit, every later one fast.
    let c = &fc
        .commits
        .as_ref()
        .expect("kernel fast-commit counts")
        .counts;
    assert_eq!(c.source, "kernel");
    assert_eq!(
        (c.fast_commits, c.full_commits),
        (fc.fsyncs - 1, 1),
        "{c:?}"
    );
    assert!(c.fc_blocks.unwrap() >= c.fast_commits);
    let j = &jn.commits.as_ref().expect("kernel jbd2 counts").counts;
    assert_eq!(j.fast_commits, 0);
    assert!(j.full_commits >= 1, "{j:?}");
}

#[test]
fn every_workload_on_ordo_through_fuse() {
    let rows = run(&plan(&["ordo:async"], &WorkloadName::ALL, None));
    for r in &rows {
        check_ok(r, true);
        let o = r.ordo.as_ref().unwrap_or_else(|| {
            panic!(
                "{} on {}: no ordo counters: {}",
                r.title(),
                r.target,
                r.counters_note.as_deref().unwrap_or("")
            )
        });
        assert!(o.writes_per_op > 0.0);
        assert_eq!(
            r.counters_agree,
            Some(true),
            "{} on {}: {}",
            r.title(),
            r.target,
            r.counters_note.as_deref().unwrap_or("")
        );
        assert!(
            r.fs_peak_mib.unwrap() > 0.0,
            "peak memory of the ordo process"
        );
        assert!(r.fs_cpu_ms.is_some(), "CPU of the ordo process");
    }
}

/// The journaled targets of the FUSE fcmicro test, with a commit interval
/// longer than the run: on a loaded machine the default 5 s timer can fall
/// inside it and add a full commit the counts below do not expect.
const JOURNAL: &str = "ordo:journal,commit=600";
const FAST_COMMIT: &str = "ordo:fast_commit,commit=600";

#[test]
fn every_ordo_mode_runs_fcmicro_through_fuse() {
    let rows = run(&plan(
        // No timer commit during the run (see below).
        &["ordo:sync", JOURNAL, FAST_COMMIT],
        &[WorkloadName::Fcmicro],
        None,
    ));
    assert_eq!(rows.len(), 3);
    for r in &rows {
        check_ok(r, true);
        assert_eq!(
            r.counters_agree,
            Some(true),
            "{} on {}: {}",
            r.title(),
            r.target,
            r.counters_note.as_deref().unwrap_or("")
        );
    }
    let kib = |t: &str| {
        rows.iter()
            .find(|r| r.target == t)
            .and_then(|r| r.kib_per_op)
            .unwrap()
    };
    assert!(
        kib(FAST_COMMIT) < kib(JOURNAL),
        "a fast commit writes less than a full JBD2 commit"
    );
    // The protocol's statistics, from the counters line of `ordo mount`.
    let row = |t: &str| rows.iter().find(|r| r.target == t).unwrap();
    assert!(
        row("ordo:sync").commits.is_none(),
        "sync mode does not commit"
    );
    let fc = row(FAST_COMMIT);
    let c = fc.commits.as_ref().expect("ordo fast-commit counts");
    assert_eq!(
        (c.counts.fast_commits, c.counts.full_commits),
        (fc.fsyncs - 1, 1),
        "{c:?}"
    );
    assert_eq!(c.counts.ineligible["no_live_log"], 1);
    assert_eq!(c.single_block_share_pct, Some(100.0), "{c:?}");
    let jn = row(JOURNAL);
    let j = &jn.commits.as_ref().expect("ordo journal counts").counts;
    assert_eq!((j.fast_commits, j.full_commits), (0, jn.fsyncs), "{j:?}");
}

#[test]
fn in_process_fast_commit_counts_come_from_the_library() {
    let rows = run(&plan(
        // No timer commit during the run: on a loaded machine the default
        // 5 s interval can fall inside it and add a full commit.
        &["ordo-lib:fast_commit,commit=600"],
        &[WorkloadName::Fcmicro],
        None,
    ));
    let r = &rows[0];
    check_ok(r, true);
    let c = &r.commits.as_ref().expect("protocol_stats").counts;
    assert_eq!(c.source, "ordo");
    assert_eq!((c.fast_commits, c.full_commits), (r.fsyncs - 1, 1), "{c:?}");
}

#[test]
fn in_process_ordo_counters_agree_with_the_kernel() {
    let rows = run(&plan(&["ordo-lib:async"], &WorkloadName::ALL, None));
    for r in &rows {
        let external = EXTERNAL.iter().any(|w| w.name() == r.workload);
        if external {
            let e = r.error.as_deref().unwrap_or("");
            assert!(
                e.contains("needs a mounted file system"),
                "{}: {e}",
                r.workload
            );
            continue;
        }
        check_ok(r, true);
        assert_eq!(
            r.counters_agree,
            Some(true),
            "{}: {}",
            r.title(),
            r.counters_note.as_deref().unwrap_or("")
        );
    }
}

#[test]
fn timing_models_charge_virtual_time() {
    let mut p = plan(
        &["ordo-lib:sync"],
        &[WorkloadName::Fcmicro],
        Some(DiskName::Hdd.into()),
    );
    let hdd = run(&p).remove(0);
    p.config.disk = Some(DiskName::Ssd.into());
    let ssd = run(&p).remove(0);
    for r in [&hdd, &ssd] {
        check_ok(r, true);
        assert!(r.virtual_time);
    }
    assert_eq!(hdd.disk.as_deref(), Some("hdd"));
    // Virtual time is the model's: an HDD's seeks cost more than an SSD's
    // writes for the same requests.
    assert!(
        hdd.elapsed_s > ssd.elapsed_s,
        "hdd {} s, ssd {} s",
        hdd.elapsed_s,
        ssd.elapsed_s
    );
}

/// NoFS's benchmarks on the HDD model, as `WORKLOADS=nofs` runs them: every
/// case runs on backpointers and journal, and a backpointers fsync is one
/// flush with nothing ordered (no FUA), journal's a flush and a FUA commit.
#[test]
fn nofs_benchmarks_run_on_the_hdd_model() {
    let p = plan(
        &["ordo-lib:backpointers", "ordo-lib:journal"],
        &[WorkloadName::NofsMicro, WorkloadName::Sort],
        Some(DiskName::Hdd.into()),
    );
    let rows = run(&p);
    for r in &rows {
        check_ok(r, true);
        assert!(r.virtual_time, "{} on {}", r.title(), r.target);
    }
    let create = |target: &str| {
        rows.iter()
            .find(|r| r.target == target && r.case == "create")
            .unwrap()
    };
    let (bp, jn) = (create("ordo-lib:backpointers"), create("ordo-lib:journal"));
    assert_eq!(bp.fsyncs, 200);
    let c = &bp.ordo.as_ref().unwrap().counters;
    let fua: u64 = c.by_class.iter().map(|k| k.fua_writes).sum();
    assert_eq!(fua, 0, "backpointers orders nothing");
    // One flush per fsync, and the mount's and the unmount's (the owner
    // table's stamp, the write-back): a few.
    assert!(
        (bp.fsyncs..=bp.fsyncs + 4).contains(&c.flushes),
        "{} flushes for {} fsyncs",
        c.flushes,
        bp.fsyncs
    );
    let c = &jn.ordo.as_ref().unwrap().counters;
    let fua: u64 = c.by_class.iter().map(|k| k.fua_writes).sum();
    assert!(fua >= jn.fsyncs, "journal commits with FUA: {fua}");
}

#[test]
fn a_repeated_plan_gives_the_median_run_of_each_case_and_target() {
    let mut p = plan(&["tmpfs", "ordo-lib:async"], &[WorkloadName::Fcmicro], None);
    p.repeat = 3;
    require_root();
    let mut ran: Vec<String> = Vec::new();
    let rows = run_plan(&p, |r| ran.push(r.target.clone())).unwrap();
    let cases = workload::cases(WorkloadName::Fcmicro, p.scale, &p.overrides)
        .unwrap()
        .len();
    assert_eq!(rows.len(), cases * 2, "one row per case and target");
    assert_eq!(ran.len(), cases * 2 * 3, "every run reported as it ends");
    // The targets take turns going first.
    assert_eq!(
        &ran[..6],
        [
            "tmpfs",
            "ordo-lib:async",
            "ordo-lib:async",
            "tmpfs",
            "tmpfs",
            "ordo-lib:async"
        ]
    );
    for r in &rows {
        check_ok(r, r.target != "tmpfs");
        let rep = r.repeat.as_ref().expect("a repeated row says so");
        assert_eq!((rep.runs, rep.ops_per_sec.len()), (3, 3));
        assert_eq!(r.ops_per_sec, rep.ops_per_sec[rep.median_run]);
        let below = rep
            .ops_per_sec
            .iter()
            .filter(|&&x| x < r.ops_per_sec)
            .count();
        let above = rep
            .ops_per_sec
            .iter()
            .filter(|&&x| x > r.ops_per_sec)
            .count();
        assert!(below <= 1 && above <= 1, "{rep:?}");
        assert!(rep.min <= r.ops_per_sec && r.ops_per_sec <= rep.max);
    }
    let table = ordo_bench::report::table(&rows);
    assert!(table.contains("every run, ops/s"), "{table}");
}

#[test]
fn command_line_writes_json_and_chart() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ordo_bench::cli::BenchArgs,
    }
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let chart = dir.path().join("r.svg");
    let cli = Cli::try_parse_from([
        "bench",
        "fcmicro",
        "--targets",
        "tmpfs",
        "--scale",
        "smoke",
        "--fsync-every",
        "1,4",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--chart",
        chart.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(ordo_bench::cli::run(&cli.args).unwrap(), 0);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "one row per fsync interval");
    for key in [
        "target",
        "workload",
        "ops_per_sec",
        "fsync_us_mean",
        "fsync_us_p50",
        "fsync_us_p99",
        "writes_per_op",
        "kib_per_op",
        "flushes_per_op",
        "params",
    ] {
        assert!(results[0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(results[1]["params"]["fsync_every"], 4);
    assert!(v["command"].as_str().unwrap().contains("--fsync-every 1,4"));
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.contains("<polyline"), "a sweep is drawn as lines");
}

#[test]
fn twofile_streams_keep_a_out_of_bs_fsync() {
    // Virtual time and byte counts: deterministic. With a stream each, B's
    // fsync writes none of A's 4 MiB; with one stream it writes all of it.
    let mut p = plan(
        &["ordo-lib:streams"],
        &[WorkloadName::Twofile],
        Some(DiskName::Hdd.into()),
    );
    let fsync_bytes = |rows: &[Row]| -> Vec<u64> {
        rows.iter()
            .map(|r| {
                check_ok(r, true);
                r.extra["fsync_write_bytes"].as_u64().unwrap()
            })
            .collect()
    };
    p.overrides.streams = Some(2);
    let two = run(&p);
    assert!(two.iter().all(|r| r.extra["a_own_stream"] == true));
    for b in fsync_bytes(&two) {
        assert!(b < 1 << 20, "ccfs-2: B's fsync wrote {b} bytes");
    }
    p.overrides.streams = Some(1);
    for b in fsync_bytes(&run(&p)) {
        assert!(b >= 4 << 20, "ccfs-1: B's fsync wrote only {b} bytes");
    }
}

#[test]
fn programs_run_on_an_in_process_mount() {
    // ordo-lib:MODE,fuse: the harness serves the library through FUSE, so
    // a program runs on the timing model, in its virtual time.
    let p = plan(
        &["ordo-lib:streams,fuse"],
        &[WorkloadName::StreamsSqlite],
        Some(DiskName::Hdd.into()),
    );
    for r in run(&p) {
        check_ok(&r, true);
        assert!(r.virtual_time, "{}", r.title());
        assert!(r.extra["wall_s"].as_f64().unwrap() > 0.0);
    }
}

/// The read and stat workloads run on the FUSE floor, which keeps sizes
/// and not bytes: its read rows check lengths (and say so), ordo's check
/// every byte. A floor row is what the kernel's FUSE transport costs for
/// the requests ordo's row makes.
#[test]
fn read_and_stat_run_on_the_fuse_floor() {
    let rows = run(&plan(
        &["fuse-floor", "ordo:async"],
        &[WorkloadName::Read, WorkloadName::Stat],
        None,
    ));
    let mut floor_reads = 0;
    for r in &rows {
        check_ran(r);
        assert!(r.ops_per_sec > 0.0, "{} on {}", r.title(), r.target);
        if r.workload == "read" {
            let checked = r.extra.get("bytes_checked").and_then(|v| v.as_bool());
            let floor = r.target == "fuse-floor";
            assert_eq!(checked, Some(!floor), "{} on {}", r.title(), r.target);
            floor_reads += usize::from(floor);
        }
    }
    assert_eq!(floor_reads, 4, "the floor ran every read case");
}
