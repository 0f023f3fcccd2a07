//! `ordo bench WORKLOAD --targets T1,T2,...`: the command line of the
//! harness, wired into the `ordo` binary as a subcommand.

use std::path::PathBuf;

use clap::Args;

use crate::error::{BenchError, Result};
use crate::runner::{run_plan, Plan};
use crate::target::{DeviceKind, DiskSpec, ImageKind, TargetConfig, TargetSpec};
use crate::workload::{fcmicro::SWEEP, Overrides, Scale, WorkloadName};

/// Default seed: any fixed number; printed with every result.
pub const DEFAULT_SEED: u64 = 42;

/// Arguments of `ordo bench`.
#[derive(Args, Debug, Clone)]
#[command(after_help = format!("Targets: {}.\n\
Workloads: {}, or all; also ganger (Ganger & Patt's tables) and nofs-scan (NoFS's scanners after a crash).\n\
Needs root (loop devices, mounts). See docs/BENCH.md.", crate::target::target_names(), workload_names()))]
pub struct BenchArgs {
    /// Workloads, comma-separated (or `all`).
    #[arg(value_name = "WORKLOAD")]
    pub workloads: String,
    /// Targets, comma-separated, e.g. ext4:ordered,ext4:fast_commit,tmpfs,ordo:journal
    /// (`ordo:all`: every protocol).
    #[arg(long, value_name = "T1,T2,...", default_value = "ext4:ordered,tmpfs")]
    pub targets: String,
    /// Where ordo's image lives: a loop device (counted by the kernel) or a
    /// plain file. The kernel's ext4 always runs on a loop device.
    #[arg(long, value_enum, default_value_t = DeviceKind::Loop)]
    pub device: DeviceKind,
    /// Image files written whole before `mkfs` (the default: the host has
    /// allocated every block, as a disk has all of its blocks) or sparse
    /// (quicker to make; the first write to each host block then costs a
    /// host journal commit at the next flush).
    #[arg(long, value_enum, default_value_t = ImageKind::Written)]
    pub image: ImageKind,
    /// Size of each workload (smoke, small, medium, paper).
    #[arg(long, value_enum, default_value_t = Scale::Small)]
    pub scale: Scale,
    /// Seed of every random choice (file sizes, offsets, the file picked).
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Write the results as JSON ({"results": [...]}).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw the main figure as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<PathBuf>,
    /// Size of every device image (default: 2G, 4G at --scale paper).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,
    /// fcmicro / randwrite: fsync every N operations; a list (1,4,16) or
    /// `sweep` (1, 2, 4, ..., 1024) gives one case per value.
    #[arg(long, value_name = "N[,N...]|sweep")]
    pub fsync_every: Option<String>,
    /// fcmicro: bytes appended to each file (default 4096, the paper's);
    /// 0 makes every fsync a metadata-only commit (create + fsync).
    #[arg(long, value_name = "BYTES")]
    pub append_bytes: Option<usize>,
    /// copy / remove / smallfiles: concurrent users.
    #[arg(long)]
    pub users: Option<u32>,
    /// twofile / twofile-repeat: 1 puts A's and B's writers in one stream
    /// (ccfs-1), 2 (the default) gives each its own (ccfs-2); no effect on
    /// a file system without streams.
    #[arg(long, value_name = "1|2", value_parser = clap::value_parser!(u32).range(1..=2))]
    pub streams: Option<u32>,
    /// Filebench personalities: worker threads.
    #[arg(long)]
    pub threads: Option<u32>,
    /// In-process ordo targets (ordo-lib:MODE) on a disk timing model,
    /// reporting virtual time: hdd, hp-c2447, ssd or cloud, and for the
    /// rotating disks `,wce=on|off` (write cache on or off) and
    /// `,rot=on|off` (the platter's position and each command's turnaround
    /// modeled; off by default).
    #[arg(long, value_name = "DISK[,wce=on|off][,rot=on|off]")]
    pub disk: Option<DiskSpec>,
    /// `ganger` only: the tables and figures to run (table1, table2,
    /// table3, fig1 ... fig5), comma-separated; default all.
    #[arg(long, value_name = "T1,T2,...")]
    pub tables: Option<String>,
    /// `ganger` only: run only these of its schemes' modes (e.g.
    /// async,softdep); default all.
    #[arg(long, value_name = "MODE,...")]
    pub modes: Option<String>,
    /// Directory for images and mount points.
    #[arg(long, default_value = "/var/tmp/ordo-bench")]
    pub workdir: PathBuf,
    /// The ordo binary for ordo:MODE targets (default: next to this one,
    /// or $ORDO_BIN).
    #[arg(long)]
    pub ordo_bin: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
    /// Run each case on each target N times, the targets taking turns going
    /// first; each row is the median run, and every run's figure is printed
    /// below the table (for comparisons on a shared, noisy machine).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=99))]
    pub repeat: u32,
}

fn workload_names() -> String {
    WorkloadName::ALL.map(|w| w.name()).join(", ")
}

/// Parses "4096", "64M", "2G" (powers of 1024), as every ordo tool does.
pub use ordo_dev::parse_size_bytes as parse_size;

/// Parses the workload list.
pub fn parse_workloads(s: &str) -> Result<Vec<WorkloadName>> {
    if s == "all" {
        return Ok(WorkloadName::ALL.to_vec());
    }
    s.split(',')
        .filter(|w| !w.is_empty())
        .map(|w| {
            WorkloadName::ALL
                .into_iter()
                .find(|k| k.name() == w)
                .ok_or_else(|| {
                    BenchError::Usage(format!(
                        "unknown workload '{w}' (known: {}, all)",
                        workload_names()
                    ))
                })
        })
        .collect()
}

fn parse_fsync_every(s: &str) -> Result<Vec<u64>> {
    if s == "sweep" {
        return Ok(SWEEP.to_vec());
    }
    s.split(',')
        .map(|n| match n.trim().parse::<u64>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(BenchError::Usage(format!(
                "--fsync-every: '{n}' is not a positive number (or use `sweep`)"
            ))),
        })
        .collect()
}

/// Split a `--targets` list on commas, keeping a target's own options
/// with it: `ordo:journal,data=writeback,ext4:ordered` is two targets, since
/// an `OPT=V` item (an `=` and no `:`) belongs to the target before it, as
/// does a bare option such as `fuse` (no `:`, and not `tmpfs` or
/// `fuse-floor`, the targets without one). `ordo:all` and `ordo-lib:all`
/// (with any options after them) stand for one target per protocol of the
/// registry, in its order, each with those options.
fn split_targets(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in list.split(',').filter(|t| !t.is_empty()) {
        match out.last_mut() {
            Some(prev) if !item.contains(':') && !matches!(item, "tmpfs" | "fuse-floor") => {
                prev.push(',');
                prev.push_str(item);
            }
            _ => out.push(item.to_string()),
        }
    }
    out.into_iter()
        .flat_map(|t| {
            let (head, opts) = match t.split_once(',') {
                Some((h, o)) => (h.to_string(), format!(",{o}")),
                None => (t.clone(), String::new()),
            };
            match head.as_str() {
                "ordo:all" | "ordo-lib:all" => {
                    let kind = head.trim_end_matches(":all").to_string();
                    ordo_fs::ProtocolKind::all()
                        .map(|k| format!("{kind}:{}{opts}", k.name()))
                        .collect()
                }
                _ => vec![t],
            }
        })
        .collect()
}

impl BenchArgs {
    /// The plan these arguments describe.
    pub fn plan(&self) -> Result<Plan> {
        let workloads = parse_workloads(&self.workloads)?;
        if workloads.is_empty() {
            return Err(BenchError::Usage("no workload given".into()));
        }
        let targets: Vec<TargetSpec> = split_targets(&self.targets)
            .iter()
            .map(|t| t.parse())
            .collect::<Result<_>>()?;
        if targets.is_empty() {
            return Err(BenchError::Usage("no target given".into()));
        }
        let default_size = self.scale.pick(256 << 20, 2 << 30, 2 << 30, 4 << 30);
        Ok(Plan {
            workloads,
            targets,
            config: TargetConfig {
                workdir: self.workdir.clone(),
                size_bytes: self.size.unwrap_or(default_size),
                device: self.device,
                image: self.image,
                disk: self.disk,
                ordo_bin: self.ordo_bin.clone(),
            },
            scale: self.scale,
            seed: self.seed,
            overrides: Overrides {
                fsync_every: match &self.fsync_every {
                    Some(s) => parse_fsync_every(s)?,
                    None => Vec::new(),
                },
                users: self.users,
                threads: self.threads,
                append_bytes: self.append_bytes,
                streams: self.streams,
            },
            progress: !self.quiet,
            repeat: self.repeat as usize,
        })
    }

    /// The command line that reproduces this run (every default spelled
    /// out that changes results).
    pub fn command_line(&self) -> String {
        let mut s = format!(
            "ordo bench {} --targets {} --scale {} --seed {}",
            self.workloads,
            self.targets,
            self.scale.name(),
            self.seed
        );
        if self.device != DeviceKind::Loop {
            s.push_str(" --device file");
        }
        if self.image != ImageKind::Written {
            s.push_str(" --image sparse");
        }
        if let Some(size) = self.size {
            s.push_str(&format!(" --size {}M", size >> 20));
        }
        if let Some(f) = &self.fsync_every {
            s.push_str(&format!(" --fsync-every {f}"));
        }
        if let Some(b) = self.append_bytes {
            s.push_str(&format!(" --append-bytes {b}"));
        }
        if let Some(u) = self.users {
            s.push_str(&format!(" --users {u}"));
        }
        if let Some(t) = self.threads {
            s.push_str(&format!(" --threads {t}"));
        }
        if let Some(n) = self.streams {
            s.push_str(&format!(" --streams {n}"));
        }
        if let Some(d) = self.disk {
            s.push_str(&format!(" --disk {d}"));
        }
        if self.repeat > 1 {
            s.push_str(&format!(" --repeat {}", self.repeat));
        }
        s
    }
}

/// Runs `ordo bench`: prints the table (and writes JSON and the chart when
/// asked). Returns the exit code: 0 when every row ran, 1 when some failed.
pub fn run(args: &BenchArgs) -> Result<i32> {
    if args.repeat > 1 && matches!(args.workloads.as_str(), "ganger" | "nofs-scan") {
        return Err(BenchError::Usage(format!(
            "--repeat: {} runs once (it has its own runs and report)",
            args.workloads
        )));
    }
    if args.workloads == "ganger" {
        return run_ganger(args);
    }
    if args.workloads == "nofs-scan" {
        return run_nofs_scan(args);
    }
    let plan = args.plan()?;
    let command = args.command_line();
    let rows = run_plan(&plan, |r| {
        let line = match &r.error {
            Some(e) => format!("FAILED: {e}"),
            None => format!("{:.0} ops/s", r.ops_per_sec),
        };
        eprintln!("ordo bench: {} on {}: {line}", r.title(), r.target);
    })?;
    println!("{}", crate::report::table(&rows));
    println!("reproduce with: {command}");
    if let Some(p) = &args.json {
        crate::report::write_json(p, &rows, &command)?;
        println!("results: {}", p.display());
    }
    if let Some(p) = &args.chart {
        let m = crate::report::Machine::here();
        let caption = format!(
            "{command}\n{}, {} CPUs, kernel {}, {}",
            m.cpu, m.cpus, m.kernel, m.date_utc
        );
        std::fs::write(p, crate::chart::svg(&rows, &caption)).map_err(|e| BenchError::Output {
            path: p.clone(),
            source: e,
        })?;
        println!("chart: {}", p.display());
    }
    Ok(if rows.iter().any(|r| r.error.is_some()) {
        1
    } else {
        0
    })
}

/// `ordo bench nofs-scan`: the scanners' cost after a crash and the mount
/// after a crash (see [`crate::nofs_scan`]). In-process: no root needed
/// (as root, the host's page cache is dropped before the wall-clock
/// mount); `--targets` may name the protocols (`backpointers,journal` by
/// default, `ordo-lib:` prefixes accepted), `--disk` the model (default
/// `hdd`), `--size` the image (default 1G).
fn run_nofs_scan(args: &BenchArgs) -> Result<i32> {
    let default_targets = "ext4:ordered,tmpfs";
    let modes: Vec<ordo_fs::ProtocolKind> = if args.targets == default_targets {
        vec![
            ordo_fs::ProtocolKind::named("backpointers"),
            ordo_fs::ProtocolKind::named("journal"),
        ]
    } else {
        args.targets
            .split(',')
            .filter(|t| !t.is_empty())
            .map(|t| {
                let name = t.strip_prefix("ordo-lib:").unwrap_or(t);
                name.parse::<ordo_fs::ProtocolKind>()
                    .map_err(|e| BenchError::Usage(format!("nofs-scan --targets: '{t}': {e}")))
            })
            .collect::<Result<_>>()?
    };
    let disk = args
        .disk
        .unwrap_or(DiskSpec::from(crate::target::DiskName::Hdd));
    let suite = crate::nofs_scan::ScanSuite {
        scale: args.scale,
        seed: args.seed,
        image_bytes: args.size.unwrap_or(crate::nofs_scan::GOAL_IMAGE_BYTES),
        disk: disk.model(),
        disk_name: disk.to_string(),
        workdir: args.workdir.clone(),
        modes: modes.clone(),
        drop_host_cache: true,
    };
    let mut command = format!(
        "ordo bench nofs-scan --scale {} --seed {}",
        args.scale.name(),
        args.seed
    );
    if args.targets != default_targets {
        command.push_str(&format!(" --targets {}", args.targets));
    }
    if let Some(size) = args.size {
        command.push_str(&format!(" --size {}M", size >> 20));
    }
    if args.disk.is_some() {
        command.push_str(&format!(" --disk {disk}"));
    }
    let runs = suite.run(|r| {
        if !args.quiet {
            match &r.error {
                Some(e) => eprintln!("ordo bench nofs-scan: {} {} MiB: FAILED: {e}", r.mode, r.data_mib),
                None => eprintln!(
                    "ordo bench nofs-scan: {} {} MiB: mount {:.3} s + scan {:.3} s virtual; {:.3} s + {:.3} s wall",
                    r.mode, r.data_mib, r.mount_s, r.scan_s, r.wall_mount_s, r.wall_scan_s
                ),
            }
        }
    })?;
    println!("{}", crate::nofs_scan::report(&runs, &suite));
    println!("reproduce with: {command}");
    if let Some(p) = &args.json {
        write_runs_json(p, &command, &runs)?;
    }
    Ok(if runs.iter().any(|r| r.error.is_some() || !r.fsck_clean) {
        1
    } else {
        0
    })
}

/// `ordo bench ganger`: Ganger & Patt's tables in virtual time (see
/// [`crate::ganger`]). Runs in-process: no root, no devices, no targets.
fn run_ganger(args: &BenchArgs) -> Result<i32> {
    let list = |s: &Option<String>| -> Vec<String> {
        s.as_deref()
            .unwrap_or("")
            .split(',')
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect()
    };
    let suite = crate::ganger::Suite {
        scale: args.scale,
        seed: args.seed,
        only: list(&args.tables),
        modes: list(&args.modes),
    };
    let mut command = format!(
        "ordo bench ganger --scale {} --seed {}",
        args.scale.name(),
        args.seed
    );
    if let Some(t) = &args.tables {
        command.push_str(&format!(" --tables {t}"));
    }
    if let Some(m) = &args.modes {
        command.push_str(&format!(" --modes {m}"));
    }
    let runs = suite.run(|r| {
        if !args.quiet {
            eprintln!(
                "ordo bench ganger: {} {} on {}: {:.2} s virtual, {} disk requests ({} reads); {}",
                r.table,
                r.case,
                r.mode,
                r.elapsed_s,
                r.disk_requests,
                r.reads,
                r.protocol
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    })?;
    println!("{}", crate::ganger::report(&runs, &suite));
    println!("reproduce with: {command}");
    if let Some(p) = &args.json {
        write_runs_json(p, &command, &runs)?;
    }
    if let Some(p) = &args.chart {
        let rows = crate::ganger::rows(&runs, &suite);
        let caption = format!("{command}\nvirtual time on the HP C2447 model; deterministic");
        std::fs::write(p, crate::chart::svg(&rows, &caption)).map_err(|e| BenchError::Output {
            path: p.clone(),
            source: e,
        })?;
        println!("chart: {}", p.display());
    }
    Ok(0)
}

/// `{"command": ..., "runs": [...]}` to `path`, and a line saying where.
fn write_runs_json(
    path: &std::path::Path,
    command: &str,
    runs: &impl serde::Serialize,
) -> Result<()> {
    let doc = serde_json::json!({ "command": command, "runs": runs });
    let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    std::fs::write(path, text + "\n").map_err(|e| BenchError::Output {
        path: path.to_path_buf(),
        source: e,
    })?;
    println!("results: {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn target_options_stay_with_their_target() {
        assert_eq!(
            super::split_targets("ordo:journal,data=writeback,threads=16,ext4:ordered,,tmpfs"),
            vec![
                "ordo:journal,data=writeback,threads=16",
                "ext4:ordered",
                "tmpfs"
            ]
        );
        assert_eq!(
            super::split_targets(
                "ordo-lib:streams,fuse,fuse-floor,ordo-lib:journal,data=journal,fuse"
            ),
            vec![
                "ordo-lib:streams,fuse",
                "fuse-floor",
                "ordo-lib:journal,data=journal,fuse"
            ]
        );
    }

    #[test]
    fn all_stands_for_every_protocol_of_the_registry() {
        let modes: Vec<&str> = ordo_fs::ProtocolKind::all().map(|k| k.name()).collect();
        assert!(modes.len() >= 10, "{modes:?}");
        let t = super::split_targets("ext4:ordered,ordo:all,threads=2,ordo-lib:all");
        assert_eq!(t.len(), 1 + 2 * modes.len());
        assert_eq!(t[0], "ext4:ordered");
        for (k, m) in modes.iter().enumerate() {
            assert_eq!(t[1 + k], format!("ordo:{m},threads=2"));
            assert_eq!(t[1 + modes.len() + k], format!("ordo-lib:{m}"));
            t[1 + k].parse::<crate::target::TargetSpec>().unwrap();
        }
    }

    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn parses_a_full_command_line() {
        let cli = Cli::try_parse_from([
            "bench",
            "fcmicro,varmail",
            "--targets",
            "ext4:ordered,tmpfs,ordo:journal",
            "--scale",
            "smoke",
            "--fsync-every",
            "sweep",
            "--size",
            "512M",
            "--seed",
            "7",
        ])
        .unwrap();
        let plan = cli.args.plan().unwrap();
        assert_eq!(
            plan.workloads,
            vec![WorkloadName::Fcmicro, WorkloadName::Varmail]
        );
        assert_eq!(plan.targets.len(), 3);
        assert_eq!(plan.overrides.fsync_every.len(), 11);
        assert_eq!(plan.config.size_bytes, 512 << 20);
        assert_eq!(plan.seed, 7);
        let cmd = cli.args.command_line();
        assert!(
            cmd.contains("--fsync-every sweep") && cmd.contains("--seed 7"),
            "{cmd}"
        );
        // Written images are the default, and only the other kind is
        // spelled out in the reproducing command.
        assert_eq!(plan.config.image, ImageKind::Written);
        assert!(!cmd.contains("--image"), "{cmd}");
        let sparse = Cli::try_parse_from(["bench", "fcmicro", "--image", "sparse"]).unwrap();
        assert_eq!(sparse.args.plan().unwrap().config.image, ImageKind::Sparse);
        let cmd = sparse.args.command_line();
        assert!(cmd.contains("--image sparse"), "{cmd}");
        assert!(!cmd.contains("--repeat"), "{cmd}");
        let again = Cli::try_parse_from(["bench", "read", "--repeat", "5"]).unwrap();
        assert_eq!(again.args.plan().unwrap().repeat, 5);
        assert!(again.args.command_line().ends_with(" --repeat 5"));
        assert!(Cli::try_parse_from(["bench", "read", "--repeat", "0"]).is_err());
    }

    #[test]
    fn rejects_bad_names() {
        let parse = |w: &str, t: &str| {
            Cli::try_parse_from(["bench", w, "--targets", t])
                .unwrap()
                .args
                .plan()
        };
        assert!(parse("nope", "tmpfs").is_err());
        assert!(parse("varmail", "ext5:x").is_err());
        assert_eq!(parse("all", "tmpfs").unwrap().workloads.len(), 25);
        assert_eq!(
            parse("twofile-repeat,streams-git", "tmpfs")
                .unwrap()
                .workloads,
            vec![WorkloadName::TwofileRepeat, WorkloadName::StreamsGit]
        );
        assert!(parse_fsync_every("0").is_err());
        assert_eq!(parse_fsync_every("1,8").unwrap(), vec![1, 8]);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert!(parse_size("2Q").is_err());
    }
}
