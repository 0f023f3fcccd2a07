//! Ganger & Patt's tables and figures ("Metadata Update Performance in
//! File Systems", OSDI '94), reproduced in virtual time: `ordo bench
//! ganger`.
//!
//! Every run is a simulated machine of the paper's kind ([`sim`]): one
//! CPU whose per-call costs are fitted to the paper's No Order CPU times,
//! the HP C2447 disk model with its write cache off, a syncer that runs
//! the protocol's write-back every virtual second, and N user processes
//! taking turns by virtual time. The same seed gives the same figures on
//! any machine. Each run starts from a fresh image, sets up its files
//! untimed, remounts cold, runs, and checks the image with ordo's fsck
//! after unmounting.
//!
//! The schemes are the paper's five plus ordo's journal: No Order
//! (`async`), Conventional (`sync`), Scheduler Flag (`sched-flag`,
//! Part-NR/CB), Scheduler Chains (`sched-chain`, new owner depends on the
//! old), Soft Updates (`softdep`), and `journal`. Every ordo protocol
//! initialises allocated blocks before pointing at them, so ordo's rows
//! compare with the paper's allocation-initialisation rows where the
//! paper has both.

pub mod machine;
pub mod paper;
pub mod sim;

use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use ordo_dev::DiskModel;
use ordo_fs::ProtocolKind;
use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::report::Row;
use crate::vfs::{mkdir_all, read_whole, remove_all, Vfs};
use crate::workload::ganger::{
    copy_file, copy_tree, Tree, SMALL_FILE_BYTES, TREE_BYTES, TREE_FILES,
};
use crate::workload::{pattern, RunCtx, Scale};
use machine::Machine;
use sim::CpuModel;

/// One of the compared schemes: the paper's name and ordo's mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheme {
    /// The paper's name for it.
    pub name: &'static str,
    /// ordo's `-o mode=` value.
    pub mode: &'static str,
}

/// The paper's five schemes and ordo's journal, No Order first (the base
/// of every ratio).
pub const SCHEMES: [Scheme; 6] = [
    Scheme {
        name: "No Order",
        mode: "async",
    },
    Scheme {
        name: "Conventional",
        mode: "sync",
    },
    Scheme {
        name: "Scheduler Flag",
        mode: "sched-flag",
    },
    Scheme {
        name: "Scheduler Chains",
        mode: "sched-chain",
    },
    Scheme {
        name: "Soft Updates",
        mode: "softdep",
    },
    Scheme {
        name: "ordo journal",
        mode: "journal",
    },
];

/// The flag variants of Figures 1 and 2, and the block-copy comparison of
/// Figures 3 and 4.
const FLAG_VARIANTS: [&str; 4] = [
    "sched-flag:full-cb",
    "sched-flag:back-cb",
    "sched-flag:part-cb",
    "sched-flag:ignore-cb",
];
const COPY_VARIANTS: [&str; 4] = [
    "sched-flag:part",
    "sched-flag:part-cb",
    "sched-chain:dep",
    "sched-chain:dep-cb",
];

/// User counts of Figure 5.
const FIG5_USERS: [u32; 4] = [1, 2, 4, 8];

/// Andrew's source tree: about 70 files, 200 KB (Howard et al. 1988).
const ANDREW_FILES: u64 = 70;
const ANDREW_BYTES: u64 = 200_000;
/// Phase 5 compiles every fourth file.
const ANDREW_COMPILE_EVERY: usize = 4;
/// Compiler CPU per source byte, fitted so that phase 5 of the paper-size
/// tree costs about the paper's 276 s (a 1994 optimising compiler on a
/// 33 MHz 486); the compiler's own file I/O is the object file it writes.
const COMPILE_NS_PER_BYTE: u64 = 5_500_000;
/// Object bytes per source byte.
const OBJECT_RATIO: u64 = 2;

/// What a run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Copy,
    Remove,
    Create,
    Unlink,
    CreateRemove,
    Andrew,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Copy => "copy",
            Work::Remove => "remove",
            Work::Create => "create",
            Work::Unlink => "remove",
            Work::CreateRemove => "create-remove",
            Work::Andrew => "andrew",
        }
    }
}

/// One run's figures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Run {
    /// Which table or figure: table1, table2, table3, fig1 ... fig5.
    pub table: String,
    /// The case within it (workload and users).
    pub case: String,
    /// The paper's scheme name, or the variant.
    pub scheme: String,
    /// ordo's mode.
    pub mode: String,
    /// Simulated processes.
    pub users: u32,
    /// Files handled.
    pub files: u64,
    /// Elapsed time, averaged over the processes (as the paper's tables),
    /// virtual seconds.
    pub elapsed_s: f64,
    /// When the last process finished, virtual seconds.
    pub last_s: f64,
    /// CPU time summed over the processes, seconds.
    pub cpu_s: f64,
    /// Disk reads and writes during the run.
    pub disk_requests: u64,
    /// Disk reads.
    pub reads: u64,
    /// Disk writes.
    pub writes: u64,
    /// Average response time (queue + service), ms.
    pub avg_response_ms: f64,
    /// Time the disk was busy, seconds.
    pub disk_busy_s: f64,
    /// Files per second (Figure 5's throughput): files / last_s.
    pub files_per_s: f64,
    /// Andrew: the five phases' elapsed times, seconds.
    pub phases_s: Vec<f64>,
    /// The protocol's own counters at the end of the run (rounds, rolled
    /// back images, queued writes...).
    pub protocol: Vec<(String, u64)>,
}

/// Sizes of a suite run.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    tree_files: u64,
    tree_bytes: u64,
    andrew_files: u64,
    andrew_bytes: u64,
    small_files: u64,
}

impl Sizes {
    fn of(scale: Scale) -> Sizes {
        let div = scale.pick(20, 5, 2, 1);
        let adiv = scale.pick(4, 1, 1, 1);
        Sizes {
            tree_files: TREE_FILES / div,
            tree_bytes: TREE_BYTES / div,
            andrew_files: ANDREW_FILES / adiv,
            andrew_bytes: ANDREW_BYTES / adiv,
            small_files: scale.pick(240, 2000, 5000, 10_000),
        }
    }
}

/// One run to make.
#[derive(Clone, Debug)]
struct Experiment {
    table: &'static str,
    work: Work,
    users: u32,
    scheme: String,
    mode: String,
}

/// The suite's knobs.
#[derive(Clone, Debug)]
pub struct Suite {
    /// Size.
    pub scale: Scale,
    /// Seed of the trees and of the file systems.
    pub seed: u64,
    /// Only these tables (table1, table2, table3, fig1 ... fig5); empty:
    /// all.
    pub only: Vec<String>,
    /// Only these modes; empty: all.
    pub modes: Vec<String>,
}

/// The disk every run uses.
pub fn disk_model() -> DiskModel {
    DiskModel::hp_c2447()
}

impl Suite {
    fn experiments(&self) -> Vec<Experiment> {
        let mut out = Vec::new();
        let mut add = |table: &'static str, work: Work, users: u32, scheme: &str, mode: &str| {
            out.push(Experiment {
                table,
                work,
                users,
                scheme: scheme.into(),
                mode: mode.into(),
            })
        };
        for s in SCHEMES {
            add("table1", Work::Copy, 4, s.name, s.mode);
        }
        for s in SCHEMES {
            add("table2", Work::Remove, 4, s.name, s.mode);
        }
        for s in SCHEMES {
            add("table3", Work::Andrew, 1, s.name, s.mode);
        }
        for work in [Work::Create, Work::Unlink, Work::CreateRemove] {
            for users in FIG5_USERS {
                for s in SCHEMES {
                    add("fig5", work, users, s.name, s.mode);
                }
            }
        }
        for v in FLAG_VARIANTS {
            add("fig1", Work::Copy, 4, v, v);
        }
        for v in FLAG_VARIANTS {
            add("fig2", Work::Remove, 1, v, v);
        }
        for v in COPY_VARIANTS {
            add("fig3", Work::Copy, 4, v, v);
        }
        for v in COPY_VARIANTS {
            add("fig4", Work::Remove, 4, v, v);
        }
        out.retain(|e| {
            (self.only.is_empty() || self.only.iter().any(|t| t == e.table))
                && (self.modes.is_empty() || self.modes.contains(&e.mode))
        });
        out
    }

    /// Runs the suite; `on_run` sees each run as it finishes.
    pub fn run(&self, mut on_run: impl FnMut(&Run)) -> Result<Vec<Run>> {
        let sizes = Sizes::of(self.scale);
        let mut runs = Vec::new();
        for e in self.experiments() {
            let r = run_one(&e, sizes, self.seed)?;
            on_run(&r);
            runs.push(r);
        }
        Ok(runs)
    }
}

fn bench_err(detail: impl Into<String>) -> BenchError {
    BenchError::Workload {
        workload: "ganger".into(),
        detail: detail.into(),
    }
}

fn ctx(seed: u64) -> RunCtx {
    RunCtx {
        seed,
        progress: Arc::new(AtomicU64::new(0)),
    }
}

/// Runs one experiment on a fresh simulated machine.
fn run_one(e: &Experiment, sizes: Sizes, seed: u64) -> Result<Run> {
    let mode: ProtocolKind = e
        .mode
        .parse()
        .map_err(|m: String| bench_err(format!("mode {}: {m}", e.mode)))?;
    let users = e.users as usize;
    let tree = Tree::generate(sizes.tree_files, sizes.tree_bytes, seed);
    let andrew = Tree::generate(sizes.andrew_files, sizes.andrew_bytes, seed ^ 0xA5);
    let per_user = sizes.small_files / e.users as u64;
    let mem = machine::fresh_image(mode, seed)?;
    machine::setup(&mem, mode, seed, |vfs| {
        match e.work {
            Work::Copy | Work::Remove => {
                for u in 0..users {
                    tree.write(vfs, &format!("user{u}/src"), seed ^ u as u64)?;
                }
            }
            Work::Create | Work::Unlink | Work::CreateRemove => {
                let data = pattern(SMALL_FILE_BYTES, seed);
                for u in 0..users {
                    vfs.mkdir(&format!("small{u}"))?;
                    if e.work == Work::Unlink {
                        for i in 0..per_user {
                            let f = vfs.create(&format!("small{u}/f{i}"))?;
                            f.write_at(0, &data)?;
                        }
                    }
                }
            }
            Work::Andrew => andrew.write(vfs, "andrew/src", seed)?,
        }
        Ok(())
    })
    .map_err(|err| bench_err(format!("{} setup on {}: {err}", e.work.name(), e.mode)))?;

    let m = Machine::mount(&mem, disk_model(), mode, CpuModel::PAPER, seed)?;
    let vfs = m.vfs();
    let rc = ctx(seed);
    let mut phases = Vec::new();
    let results: Vec<(u64, u64, u64)> = match e.work {
        Work::Copy => m.sim.run_users(&m.fs, users, 0, |u| {
            copy_tree(&vfs, &format!("user{u}/src"), &format!("user{u}/dst"), &rc)
        })?,
        Work::Remove => m.sim.run_users(&m.fs, users, 0, |u| {
            remove_all(&vfs, &format!("user{u}/src"))
        })?,
        Work::Create | Work::Unlink | Work::CreateRemove => {
            let data = pattern(SMALL_FILE_BYTES, seed);
            m.sim.run_users(&m.fs, users, 0, |u| {
                for i in 0..per_user {
                    let p = format!("small{u}/f{i}");
                    if e.work != Work::Unlink {
                        let f = vfs.create(&p)?;
                        f.write_at(0, &data)?;
                    }
                    if e.work != Work::Create {
                        vfs.unlink(&p)?;
                    }
                }
                Ok(per_user)
            })?
        }
        Work::Andrew => {
            let mut start = 0;
            let mut cpu = 0;
            let mut files = 0;
            for phase in 1..=5 {
                let r = m.sim.run_users(&m.fs, 1, start, |_| {
                    andrew_phase(&vfs, &m, &andrew, phase, seed)
                })?;
                let (n, end, c) = r[0];
                phases.push((end - start) as f64 / 1e9);
                start = end;
                cpu += c;
                files = files.max(n);
            }
            vec![(files, start, cpu)]
        }
    };
    drop(vfs);
    let disk = m.sim.disk();
    let protocol = m.fs.protocol_stats().1;
    m.unmount()
        .map_err(|err| bench_err(format!("{} on {}: {err}", e.work.name(), e.mode)))?;

    let files: u64 = results.iter().map(|r| r.0).sum();
    let last = results.iter().map(|r| r.1).max().unwrap_or(0);
    let avg = results.iter().map(|r| r.1 as f64).sum::<f64>() / results.len().max(1) as f64;
    let cpu: u64 = results.iter().map(|r| r.2).sum();
    Ok(Run {
        table: e.table.into(),
        case: format!("{} users={}", e.work.name(), e.users),
        scheme: e.scheme.clone(),
        mode: e.mode.clone(),
        users: e.users,
        files,
        elapsed_s: avg / 1e9,
        last_s: last as f64 / 1e9,
        cpu_s: cpu as f64 / 1e9,
        disk_requests: disk.requests(),
        reads: disk.reads,
        writes: disk.writes,
        avg_response_ms: disk.avg_response_ms(),
        disk_busy_s: disk.busy_ns as f64 / 1e9,
        files_per_s: files as f64 / (last.max(1) as f64 / 1e9),
        phases_s: phases,
        protocol,
    })
}

/// One phase of the Andrew benchmark; returns the files it handled.
fn andrew_phase(vfs: &dyn Vfs, m: &Machine, tree: &Tree, phase: u32, seed: u64) -> Result<u64> {
    let dst = "andrew/dst";
    match phase {
        // (1) Create the directory tree.
        1 => {
            mkdir_all(vfs, dst)?;
            for d in &tree.dirs {
                vfs.mkdir(&format!("{dst}/{d}"))?;
            }
            Ok(tree.dirs.len() as u64)
        }
        // (2) Copy every file.
        2 => {
            let mut buf = vec![0u8; 64 << 10];
            for (path, _) in &tree.files {
                copy_file(
                    vfs,
                    &format!("andrew/src/{path}"),
                    &format!("{dst}/{path}"),
                    &mut buf,
                )?;
            }
            Ok(tree.files.len() as u64)
        }
        // (3) Examine the status of every file.
        3 => {
            let mut n = 0;
            for d in &tree.dirs {
                for (name, is_dir) in vfs.list(&format!("{dst}/{d}"))? {
                    if !is_dir {
                        vfs.size(&format!("{dst}/{d}/{name}"))?;
                        n += 1;
                    }
                }
            }
            Ok(n)
        }
        // (4) Read every byte of every file.
        4 => {
            for (path, _) in &tree.files {
                read_whole(&*vfs.open(&format!("{dst}/{path}"))?, 64 << 10)?;
            }
            Ok(tree.files.len() as u64)
        }
        // (5) Compile some of the files: read the source, run the
        // compiler (CPU), write the object.
        _ => {
            let mut n = 0;
            for (path, size) in tree.files.iter().step_by(ANDREW_COMPILE_EVERY) {
                read_whole(&*vfs.open(&format!("{dst}/{path}"))?, 64 << 10)?;
                drop(m.sim.call(size * COMPILE_NS_PER_BYTE));
                let obj = pattern((size / OBJECT_RATIO) as usize, seed ^ n);
                vfs.create(&format!("{dst}/{path}.o"))?.write_at(0, &obj)?;
                n += 1;
            }
            Ok(n)
        }
    }
}

/// Runs of one table, looked up by scheme.
fn find<'a>(runs: &'a [Run], table: &str, case: &str, scheme: &str) -> Option<&'a Run> {
    runs.iter()
        .find(|r| r.table == table && r.case == case && r.scheme == scheme)
}

fn pct(x: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:.1}", 100.0 * x / base)
    } else {
        "-".into()
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.prec$}"))
}

/// Tables 1 and 2: elapsed, CPU, disk requests, response, next to the
/// paper's.
fn tree_table(out: &mut String, runs: &[Run], table: &str, case: &str, paper: &[paper::TreeRow]) {
    let Some(base) = find(runs, table, case, "No Order") else {
        return;
    };
    let pbase = paper.iter().find(|p| p.scheme == "No Order");
    let _ = writeln!(
        out,
        "{:18} {:>9} {:>7} {:>7} {:>7} {:>9} {:>7} {:>7} {:>9} {:>9}",
        "scheme",
        "elapsed s",
        "% NoOrd",
        "paper %",
        "CPU s",
        "requests",
        "% NoOrd",
        "paper %",
        "resp ms",
        "paper ms"
    );
    let _ = writeln!(out, "{}", "-".repeat(104));
    for s in SCHEMES {
        let Some(r) = find(runs, table, case, s.name) else {
            continue;
        };
        let p = paper.iter().find(|p| p.scheme == s.name);
        let ppct = p.zip(pbase).map(|(p, b)| 100.0 * p.elapsed_s / b.elapsed_s);
        let preq = p
            .zip(pbase)
            .map(|(p, b)| 100.0 * p.requests as f64 / b.requests as f64);
        let _ = writeln!(
            out,
            "{:18} {:>9.2} {:>7} {:>7} {:>7.2} {:>9} {:>7} {:>7} {:>9.1} {:>9}",
            s.name,
            r.elapsed_s,
            pct(r.elapsed_s, base.elapsed_s),
            opt(ppct, 1),
            r.cpu_s,
            r.disk_requests,
            pct(r.disk_requests as f64, base.disk_requests as f64),
            opt(preq, 1),
            r.avg_response_ms,
            opt(p.map(|p| p.response_ms), 1),
        );
    }
}

/// Prints the whole report.
pub fn report(runs: &[Run], suite: &Suite) -> String {
    let mut out = String::new();
    let s = Sizes::of(suite.scale);
    let _ = writeln!(
        out,
        "Ganger & Patt (OSDI '94) in virtual time: HP C2447 model (5400 rpm, 10 ms seek, 3.5 MB/s, \
         write cache off), 1 GB disk, {} MiB cache, 1-s syncer, one CPU with per-call costs fitted \
         to the paper's No Order CPU times; scale {} (tree of {} files, {} bytes per user; {} small \
         files), seed {}.",
        machine::CACHE_BYTES >> 20,
        suite.scale.name(),
        s.tree_files,
        s.tree_bytes,
        s.small_files,
        suite.seed
    );
    let _ = writeln!(
        out,
        "ordo's rows always initialise allocated blocks; the paper's figures quoted are its \
         allocation-initialisation rows where it has both (No Order has only N)."
    );
    let sections = [
        (
            "table1",
            "copy users=4",
            "Table 1: 4-user copy",
            paper::TABLE1,
        ),
        (
            "table2",
            "remove users=4",
            "Table 2: 4-user remove",
            paper::TABLE2,
        ),
    ];
    for (table, case, title, p) in sections {
        if runs.iter().any(|r| r.table == table) {
            let _ = writeln!(out, "\n{title}");
            tree_table(&mut out, runs, table, case, p);
        }
    }
    if let Some(base) = find(runs, "table3", "andrew users=1", "No Order") {
        let _ = writeln!(out, "\nTable 3: Andrew benchmark (seconds per phase)");
        let _ = writeln!(
            out,
            "{:18} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7} {:>7}",
            "scheme",
            "(1) mkdir",
            "(2) copy",
            "(3) stat",
            "(4) read",
            "(5) cc",
            "total",
            "% NoOrd",
            "paper %"
        );
        let _ = writeln!(out, "{}", "-".repeat(92));
        let pbase = paper::TABLE3.iter().find(|p| p.scheme == "No Order");
        for sc in SCHEMES {
            let Some(r) = find(runs, "table3", "andrew users=1", sc.name) else {
                continue;
            };
            let p = paper::TABLE3.iter().find(|p| p.scheme == sc.name);
            let ph = |i: usize| r.phases_s.get(i).copied().unwrap_or(0.0);
            let _ = writeln!(
                out,
                "{:18} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.1} {:>9.1} {:>7} {:>7}",
                sc.name,
                ph(0),
                ph(1),
                ph(2),
                ph(3),
                ph(4),
                r.elapsed_s,
                pct(r.elapsed_s, base.elapsed_s),
                opt(
                    p.zip(pbase).map(|(p, b)| 100.0 * p.phases[5] / b.phases[5]),
                    1
                ),
            );
        }
        let _ = writeln!(out, "phases as % of No Order (ordo / paper):");
        for sc in SCHEMES {
            let (Some(r), Some(p), Some(pb)) = (
                find(runs, "table3", "andrew users=1", sc.name),
                paper::TABLE3.iter().find(|p| p.scheme == sc.name),
                pbase,
            ) else {
                continue;
            };
            let cells: Vec<String> = (0..5)
                .map(|i| {
                    format!(
                        "{}/{:.0}",
                        pct(r.phases_s[i], base.phases_s[i]),
                        100.0 * p.phases[i] / pb.phases[i]
                    )
                })
                .collect();
            let _ = writeln!(out, "  {:18} {}", sc.name, cells.join("  "));
        }
    }
    if runs.iter().any(|r| r.table == "fig5") {
        let _ = writeln!(
            out,
            "\nFigure 5: 1 KiB files per second (virtual), {} files split among the users",
            s.small_files
        );
        for work in [Work::Create, Work::Unlink, Work::CreateRemove] {
            let _ = writeln!(out, "  {}:", work.name());
            let _ = writeln!(
                out,
                "  {:18} {:>9} {:>9} {:>9} {:>9}   % of No Order at 1/2/4/8",
                "scheme", "1 user", "2 users", "4 users", "8 users"
            );
            for sc in SCHEMES {
                let mut cells = Vec::new();
                let mut ratios = Vec::new();
                for u in FIG5_USERS {
                    let case = format!("{} users={u}", work.name());
                    let r = runs.iter().find(|r| {
                        r.table == "fig5"
                            && r.case == case
                            && r.scheme == sc.name
                            && fig5_work(r) == work
                    });
                    let b = runs.iter().find(|r| {
                        r.table == "fig5"
                            && r.case == case
                            && r.scheme == "No Order"
                            && fig5_work(r) == work
                    });
                    cells.push(r.map_or("-".into(), |r| format!("{:.0}", r.files_per_s)));
                    ratios.push(match (r, b) {
                        (Some(r), Some(b)) => pct(r.files_per_s, b.files_per_s),
                        _ => "-".into(),
                    });
                }
                if cells.iter().all(|c| c == "-") {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "  {:18} {:>9} {:>9} {:>9} {:>9}   {}",
                    sc.name,
                    cells[0],
                    cells[1],
                    cells[2],
                    cells[3],
                    ratios.join(" / ")
                );
            }
        }
    }
    let figs = [
        (
            "fig1",
            "Figure 1: flag semantics, 4-user copy",
            "sched-flag:part-cb",
        ),
        (
            "fig2",
            "Figure 2: flag semantics, 1-user remove",
            "sched-flag:part-cb",
        ),
        (
            "fig3",
            "Figure 3: block copying, 4-user copy",
            "sched-flag:part-cb",
        ),
        (
            "fig4",
            "Figure 4: block copying, 4-user remove",
            "sched-flag:part-cb",
        ),
    ];
    for (table, title, base_mode) in figs {
        let rows: Vec<&Run> = runs.iter().filter(|r| r.table == table).collect();
        let Some(base) = rows.iter().find(|r| r.mode == base_mode) else {
            continue;
        };
        let _ = writeln!(out, "\n{title}");
        let _ = writeln!(
            out,
            "  {:22} {:>9} {:>9} {:>7} {:>9} {:>9}",
            "variant", "elapsed s", "% Part-CB", "CPU s", "requests", "resp ms"
        );
        for r in rows.iter() {
            let _ = writeln!(
                out,
                "  {:22} {:>9.2} {:>9} {:>7.2} {:>9} {:>9.1}",
                r.mode,
                r.elapsed_s,
                pct(r.elapsed_s, base.elapsed_s),
                r.cpu_s,
                r.disk_requests,
                r.avg_response_ms
            );
        }
    }
    let _ = writeln!(out, "\n{}", shape(runs));
    out
}

/// Which Figure 5 phase a run is (its case names it).
fn fig5_work(r: &Run) -> Work {
    if r.case.starts_with("create-remove") {
        Work::CreateRemove
    } else if r.case.starts_with("create") {
        Work::Create
    } else {
        Work::Unlink
    }
}

/// The paper's claims, checked against this run's figures.
fn shape(runs: &[Run]) -> String {
    let mut out = String::from("The paper's shape in this run:");
    let ratio = |table: &str, case: &str, scheme: &str, f: &dyn Fn(&Run) -> f64| {
        let r = find(runs, table, case, scheme)?;
        let b = find(runs, table, case, "No Order")?;
        Some(f(r) / f(b))
    };
    let mut claim = |text: String, holds: Option<bool>| {
        let verdict = match holds {
            Some(true) => "holds",
            Some(false) => "DOES NOT HOLD",
            None => "not run",
        };
        let _ = write!(out, "\n  [{verdict}] {text}");
    };
    let el = |r: &Run| r.elapsed_s;
    for (table, case, name) in [
        ("table1", "copy users=4", "4-user copy"),
        ("table2", "remove users=4", "4-user remove"),
        ("table3", "andrew users=1", "Andrew"),
    ] {
        let r = ratio(table, case, "Soft Updates", &el);
        claim(
            format!(
                "Soft Updates within 5% of No Order on {name}: {}",
                opt(r.map(|r| 100.0 * r), 1) + "%"
            ),
            r.map(|r| r <= 1.05),
        );
    }
    let r = ratio("table2", "remove users=4", "Soft Updates", &el);
    claim(
        format!(
            "Soft Updates below No Order on 4-user remove (deferred frees): {}%",
            opt(r.map(|r| 100.0 * r), 1)
        ),
        r.map(|r| r < 1.0),
    );
    let r = ratio("table1", "copy users=4", "Conventional", &el);
    claim(
        format!(
            "Conventional (with allocation initialisation) about 1.9x No Order on copy (paper: 2.32x): {}x",
            opt(r, 2)
        ),
        r.map(|r| r >= 1.5),
    );
    let r = ratio("table1", "copy users=4", "Soft Updates", &|r: &Run| {
        r.disk_requests as f64
    });
    claim(
        format!(
            "Soft Updates' disk requests within a few percent of No Order's on copy: {}%",
            opt(r.map(|r| 100.0 * r), 1)
        ),
        r.map(|r| r <= 1.05),
    );
    let fig5: Vec<&Run> = runs.iter().filter(|r| r.table == "fig5").collect();
    let mut worst: Option<f64> = None;
    let mut cr_min: Option<f64> = None;
    for r in fig5.iter().filter(|r| r.scheme == "Soft Updates") {
        let Some(b) = fig5
            .iter()
            .find(|b| b.case == r.case && b.scheme == "No Order")
        else {
            continue;
        };
        let q = r.files_per_s / b.files_per_s;
        worst = Some(worst.map_or(q, |w: f64| w.min(q)));
        if fig5_work(r) == Work::CreateRemove {
            for o in ["Conventional", "Scheduler Flag", "Scheduler Chains"] {
                if let Some(x) = fig5.iter().find(|x| x.case == r.case && x.scheme == o) {
                    let q = r.files_per_s / x.files_per_s;
                    cr_min = Some(cr_min.map_or(q, |w: f64| w.min(q)));
                }
            }
        }
    }
    claim(
        format!(
            "Soft Updates within 5% of No Order on every Figure 5 point: lowest {}% of No Order",
            opt(worst.map(|w| 100.0 * w), 1)
        ),
        worst.map(|w| w >= 0.95),
    );
    claim(
        format!(
            "Soft Updates about 5x the ordered schemes on create-and-remove: at least {}x",
            opt(cr_min, 1)
        ),
        cr_min.map(|q| q >= 4.0),
    );
    out
}

/// Rows for the SVG chart: one panel line per table or figure.
pub fn rows(runs: &[Run], suite: &Suite) -> Vec<Row> {
    runs.iter()
        .map(|r| Row {
            target: r.scheme.clone(),
            workload: format!("ganger-{}", r.table),
            case: r.case.clone(),
            params: serde_json::json!({ "mode": r.mode, "users": r.users }),
            scale: suite.scale.name().into(),
            seed: suite.seed,
            ops: r.files,
            elapsed_s: r.last_s,
            virtual_time: true,
            disk: Some("hp-c2447,wce=off".into()),
            ops_per_sec: r.files_per_s,
            writes_per_op: Some(r.writes as f64 / r.files.max(1) as f64),
            counters_source: "ordo".into(),
            ..Row::default()
        })
        .collect()
}

#[cfg(test)]
mod tests;
