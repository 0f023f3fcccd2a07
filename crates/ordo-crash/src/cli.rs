//! `ordo crash`: the command-line face of the explorer.
//!
//! ```text
//! ordo crash --mode M [--data D] --workload W [--states N] [--seed S] [--jobs J]
//!            [--json FILE] [--shard I/N] [--prefix-only] [--torn] [--no-e2fsck]
//!            [--state ID] [--keep DIR]
//! ordo crash merge A.json B.json... [--json OUT]
//! ordo crash --app APP[,APP..|all] --mode M[,M..|kernel|all] [--steps N]
//!            [--states N] [--states-per-point K] [--shard I/N] [--json FILE]
//!            [--table FILE] [--state 0.P.I --keep DIR]
//! ```
//!
//! Exit status: 0 when every checked state passed, 1 when some failed;
//! usage errors and runs that could not start are `Err`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use ordo_fs::{DataMode, ProtocolKind};

use crate::app::explore::{AppParams, AppReport, TableCell, Target};
use crate::app::script::App;
use crate::backend::ImageParams;
use crate::error::CrashError;
use crate::explore::{self, E2fsckPolicy, ExploreParams, JudgePolicy, LogFault, StateId};
use crate::report::{self, Report};
use crate::states::StateParams;
use crate::workload::WorkloadParams;

/// Explore the disk states a crash can leave, recover and check each one.
#[derive(Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CrashArgs {
    #[command(subcommand)]
    pub command: Option<CrashCommand>,
    /// Consistency protocol (`-o mode=`; `ordo mount --help` lists them).
    /// With `--app` also `kernel` (the kernel's ext4), `MODE/DATA`
    /// (`journal/writeback`), a comma list, or `all`.
    #[arg(long)]
    pub mode: Option<Targets>,
    /// Run a real application instead of a file-system workload:
    /// sqlite-rollback, sqlite-wal, git, leveldb, editor, a comma list, or
    /// `all` (docs/CRASH.md, "Application crash checking").
    #[arg(long, conflicts_with = "workload")]
    pub app: Option<Apps>,
    /// Updates the application workload makes after its setup.
    #[arg(long, default_value_t = crate::app::explore::STEPS_DEFAULT)]
    pub steps: u32,
    /// With `--app`: write the table of every application and target
    /// (markdown) here.
    #[arg(long)]
    pub table: Option<PathBuf>,
    /// With `--app`: read each recovered image through ordo (read-only) or
    /// through the kernel (a read-only loop mount).
    #[arg(long, default_value = "ordo")]
    pub serve: crate::app::explore::Serve,
    /// JBD2 data mode (ordered, writeback, journal).
    #[arg(long, default_value = "ordered")]
    pub data: DataMode,
    /// seq1, seq2, random, mix, htree, enospc (random on a full file
    /// system), streams (related operations in ccfs streams),
    /// nofs-table3 (NoFS's 20 dropped-write cases), or a scenario file.
    #[arg(long, short = 'w')]
    pub workload: Option<String>,
    /// Check at most N states (a seeded sample of all of them).
    #[arg(long)]
    pub states: Option<usize>,
    /// Seed of every random choice (samples, the random workload).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Worker threads (default: one per core).
    #[arg(long, short = 'j', default_value_t = 0)]
    pub jobs: usize,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<String>,
    /// Check only shard I of N (every N-th state from I).
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<(usize, usize)>,
    /// Only prefixes of the write log (no reordering).
    #[arg(long)]
    pub prefix_only: bool,
    /// Also tear the newest write at 512-byte sectors.
    #[arg(long)]
    pub torn: bool,
    /// Never run e2fsck -fn (ordo's fsck still runs on every state).
    #[arg(long, conflicts_with = "e2fsck_every")]
    pub no_e2fsck: bool,
    /// Run e2fsck -fn on every state (default: every 100th).
    #[arg(long)]
    pub e2fsck_every: bool,
    /// Run e2fsck -fn on every K-th state.
    #[arg(long, default_value_t = 100, conflicts_with_all = ["no_e2fsck", "e2fsck_every"])]
    pub e2fsck_sample: usize,
    /// Recover every K-th state also with the kernel (loop mount) and
    /// `e2fsck -fy` and compare with ordo's recovery (protocols whose log the kernel replays).
    #[arg(long, default_value_t = crate::explore::JUDGE_SAMPLE_DEFAULT, conflicts_with = "no_judge")]
    pub judge_every: usize,
    /// Never run the kernel / `e2fsck -fy` judge.
    #[arg(long)]
    pub no_judge: bool,
    /// Upper bound of states per crash point (all subsets below it;
    /// default 256, with `--app` 16).
    #[arg(long)]
    pub states_per_point: Option<usize>,
    /// Rebuild and check only this state (SEQUENCE.POINT.INDEX).
    #[arg(long)]
    pub state: Option<StateId>,
    /// Keep images of the state given by --state (or of failures) here.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// The base image's geometry.
    #[command(flatten)]
    pub image: ImageArgs,
    /// Operations per random sequence.
    #[arg(long, default_value_t = WorkloadParams::default().random_ops)]
    pub random_ops: usize,
    /// Upper bound of seq2 sequences.
    #[arg(long, default_value_t = WorkloadParams::default().seq2_max)]
    pub seq2_max: usize,
    /// Failing states to minimize.
    #[arg(long, default_value_t = 20)]
    pub minimize: usize,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Failures printed in the summary.
    #[arg(long, default_value_t = 10)]
    pub show: usize,
    /// Record through a FUSE mount of the file system (needs /dev/fuse and
    /// fusermount3) instead of the library API.
    #[arg(long)]
    pub fuse: bool,
    /// With --fuse: mount with `open_requests=off` (the kernel opens files
    /// without asking; an unlinked file lives until the kernel forgets it).
    #[arg(long, requires = "fuse")]
    pub fuse_no_open: bool,
    /// Test-only fault injection into recorded logs.
    #[arg(long, hide = true)]
    pub fault: Option<LogFault>,
}

/// `ordo crash soak`: random workloads, seed after seed, until a target of
/// states (crate::soak).
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// Consistency protocol.
    #[arg(long, required_unless_present = "summary")]
    pub mode: Option<ProtocolKind>,
    /// JBD2 data mode (ordered, writeback, journal).
    #[arg(long, default_value = "ordered")]
    pub data: DataMode,
    /// States to check over all shards.
    #[arg(long, default_value_t = crate::soak::SOAK_TARGET_DEFAULT)]
    pub target: u64,
    /// Directory of the seed reports (default: soak/MODE-DATA).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run only shard I of N (seeds I, I+N, ...; target/N states).
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<(usize, usize)>,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// The seeded workload: mix (every operation, a directory past one
    /// block) or random.
    #[arg(long, short = 'w', default_value = "mix")]
    pub workload: String,
    /// Operations per random sequence.
    #[arg(long, default_value_t = crate::soak::SOAK_RANDOM_OPS_DEFAULT)]
    pub random_ops: usize,
    /// Worker threads (default: one per core).
    #[arg(long, short = 'j', default_value_t = 0)]
    pub jobs: usize,
    /// Run e2fsck -fn on every K-th state of a seed (0: never).
    #[arg(long, default_value_t = 100)]
    pub e2fsck_sample: usize,
    /// Kernel / e2fsck -fy judge on every K-th state of a seed (0: never).
    #[arg(long, default_value_t = crate::explore::JUDGE_SAMPLE_DEFAULT)]
    pub judge_every: usize,
    /// Only merge the seed reports of these soak directories and print the
    /// summary.
    #[arg(long, num_args = 1..)]
    pub summary: Vec<PathBuf>,
    /// Write the summary as JSON here.
    #[arg(long)]
    pub json: Option<String>,
    /// No line per seed.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Record every seed through a FUSE mount (needs /dev/fuse and
    /// fusermount3): the kernel's requests, not the library's calls, reach
    /// the protocol. Collapses and inserts, which FUSE refuses, become
    /// punches and zeroed ranges.
    #[arg(long)]
    pub fuse: bool,
    /// With --fuse: mount with `open_requests=off`.
    #[arg(long, requires = "fuse")]
    pub fuse_no_open: bool,
    /// The base image's geometry.
    #[command(flatten)]
    pub image: ImageArgs,
}

/// The geometry of the base image, for `ordo crash` and its soak.
#[derive(Args, Debug, Clone)]
pub struct ImageArgs {
    /// Image size in MiB (default 16, with `--app` 32).
    #[arg(long)]
    pub size_mib: Option<u64>,
    /// File-system block size.
    #[arg(long, default_value_t = ImageParams::default().block_size)]
    pub block_size: u32,
    /// Blocks per group (mke2fs -g; a multiple of 8, at least 256): 1024
    /// makes the default image four groups, so that directories spread
    /// over groups and a group's descriptor, bitmaps and unused
    /// inode-table tail change in flight. Default: one group.
    #[arg(long)]
    pub blocks_per_group: Option<u32>,
}

impl ImageArgs {
    /// The image these flags describe.
    pub fn params(&self) -> ImageParams {
        ImageParams {
            size_mib: self.size_mib.unwrap_or(ImageParams::default().size_mib),
            block_size: self.block_size,
            blocks_per_group: self.blocks_per_group,
        }
    }
}

/// Subcommands of `ordo crash`.
#[derive(Subcommand, Debug, Clone)]
pub enum CrashCommand {
    /// Random workloads over seed after seed until a target number of
    /// states (default 1,000,000), sharded and resumable.
    Soak(SoakArgs),
    /// Combine the JSON reports of the shards of one run.
    Merge {
        /// Reports to merge.
        #[arg(required = true)]
        reports: Vec<String>,
        /// Write the merged JSON here.
        #[arg(long)]
        json: Option<String>,
    },
}

/// `--mode` as given: one target, a comma list, or `all`.
#[derive(Clone, Debug, PartialEq)]
pub struct Targets(pub Vec<Target>);

impl std::str::FromStr for Targets {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(Targets(Target::all()));
        }
        s.split(',')
            .map(|t| t.trim().parse::<Target>())
            .collect::<Result<Vec<_>, _>>()
            .map(Targets)
    }
}

/// `--app` as given: one application, a comma list, or `all`.
#[derive(Clone, Debug, PartialEq)]
pub struct Apps(pub Vec<App>);

impl std::str::FromStr for Apps {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(Apps(App::ALL.to_vec()));
        }
        s.split(',')
            .map(|a| a.trim().parse::<App>())
            .collect::<Result<Vec<_>, _>>()
            .map(Apps)
    }
}

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}' is not I/N"))?;
    let i: usize = i.parse().map_err(|_| format!("'{s}' is not I/N"))?;
    let n: usize = n.parse().map_err(|_| format!("'{s}' is not I/N"))?;
    if n == 0 || i >= n {
        return Err(format!("shard {i}/{n}: need 0 <= I < N"));
    }
    Ok((i, n))
}

/// Explore the disk states a crash can leave, recover and check each one
/// (docs/CRASH.md). Exit status: 0 every state passed, 1 some failed.
#[derive(Parser, Debug)]
#[command(name = "ordo crash")]
struct Standalone {
    #[command(flatten)]
    args: CrashArgs,
}

impl CrashArgs {
    /// The exploration these arguments ask for.
    pub fn explore_params(&self) -> Result<ExploreParams, CrashError> {
        let (mode, data) = match self.mode.as_ref().map(|t| t.0.as_slice()) {
            Some([Target::Ordo {
                mode,
                data,
                osync: false,
            }]) => (
                *mode,
                if *data == DataMode::Ordered {
                    self.data
                } else {
                    *data
                },
            ),
            Some([Target::Kernel { .. }]) => {
                return Err(CrashError::Invalid(
                    "--mode kernel is for --app (the kernel's ext4 runs applications, not ordo's workloads)"
                        .into(),
                ))
            }
            Some(_) => {
                return Err(CrashError::Invalid(
                    "one --mode for a file-system workload (lists and `all` are for --app)".into(),
                ))
            }
            None => return Err(CrashError::Invalid("--mode is required".into())),
        };
        let workload = self
            .workload
            .clone()
            .ok_or_else(|| CrashError::Invalid("--workload is required".into()))?;
        let mut p = ExploreParams::new(mode, &workload);
        p.data = data;
        p.states = StateParams {
            seed: self.seed,
            max_states_per_point: self
                .states_per_point
                .unwrap_or(StateParams::default().max_states_per_point)
                .max(1),
            prefix_only: self.prefix_only,
            torn: self.torn,
        };
        p.workload_params = WorkloadParams {
            seed: self.seed,
            random_ops: self.random_ops,
            seq2_max: self.seq2_max,
            ..WorkloadParams::default()
        };
        p.max_states = self.states;
        p.jobs = self.jobs;
        p.shard = self.shard;
        p.e2fsck = if self.no_e2fsck {
            E2fsckPolicy::Never
        } else if self.e2fsck_every {
            E2fsckPolicy::Every
        } else {
            E2fsckPolicy::Sample(self.e2fsck_sample.max(1))
        };
        p.judge = if self.no_judge || self.judge_every == 0 {
            JudgePolicy::Never
        } else {
            JudgePolicy::Sample(self.judge_every)
        };
        p.image = self.image.params();
        p.minimize_max = self.minimize;
        p.progress = !self.quiet;
        p.only_state = self.state;
        p.keep = self.keep.clone();
        p.fault = self.fault;
        p.fuse = self.fuse;
        p.fuse_no_open = self.fuse_no_open;
        if self.state.is_some() && self.shard.is_some() {
            return Err(CrashError::Invalid(
                "--state and --shard exclude each other".into(),
            ));
        }
        Ok(p)
    }
}

/// Run `ordo crash` with parsed arguments; prints the summary and returns
/// the exit status.
pub fn run_args(args: &CrashArgs) -> Result<i32, CrashError> {
    if let Some(CrashCommand::Soak(s)) = &args.command {
        return run_soak(s);
    }
    if let Some(CrashCommand::Merge { reports, json }) = &args.command {
        if let Some(first) = reports.first() {
            if AppReport::read_json(first).is_ok() {
                let loaded = reports
                    .iter()
                    .map(|r| AppReport::read_json(r))
                    .collect::<Result<Vec<_>, _>>()?;
                let merged = crate::app::explore::merge(&loaded)?;
                print!("{}", merged.summary(args.show));
                if let Some(out) = json {
                    merged.write_json(out)?;
                }
                return Ok(if merged.inconsistent() == 0 { 0 } else { 1 });
            }
        }
        let mut loaded = Vec::new();
        for path in reports {
            loaded.push((path.clone(), Report::read_json(path)?));
        }
        let merged = report::merge(&loaded)?;
        print!("{}", merged.summary(args.show));
        if let Some(out) = json {
            merged.write_json(out)?;
        }
        return Ok(if merged.failures_total == 0 { 0 } else { 1 });
    }
    if args.app.is_some() {
        return run_apps(args);
    }
    let params = args.explore_params()?;
    let report = explore::explore(&params)?;
    print!("{}", report.summary(args.show));
    if let (Some(dir), Some(id)) = (&params.keep, params.only_state) {
        println!(
            "state {id}: images, scenario and findings kept in {}",
            dir.display()
        );
    }
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    Ok(if report.failures_total == 0 { 0 } else { 1 })
}

impl CrashArgs {
    /// The application explorations these arguments ask for, one per
    /// application and target.
    pub fn app_params(&self) -> Result<Vec<AppParams>, CrashError> {
        let apps = self
            .app
            .as_ref()
            .ok_or_else(|| CrashError::Invalid("--app is required".into()))?;
        let targets = self
            .mode
            .as_ref()
            .ok_or_else(|| CrashError::Invalid("--mode is required".into()))?;
        let cells = apps.0.len() * targets.0.len();
        if cells > 1 && (self.state.is_some() || self.shard.is_some()) {
            return Err(CrashError::Invalid(
                "--state and --shard take one --app and one --mode".into(),
            ));
        }
        if self.state.is_some() && self.shard.is_some() {
            return Err(CrashError::Invalid(
                "--state and --shard exclude each other".into(),
            ));
        }
        let mut out = Vec::new();
        for &app in &apps.0 {
            for &target in &targets.0 {
                let target = match target {
                    Target::Ordo {
                        mode,
                        data: DataMode::Ordered,
                        osync,
                    } => Target::Ordo {
                        mode,
                        data: self.data,
                        osync,
                    },
                    t => t,
                };
                let mut p = AppParams::new(app, target);
                p.steps = self.steps;
                p.states = StateParams {
                    seed: self.seed,
                    max_states_per_point: self
                        .states_per_point
                        .unwrap_or(p.states.max_states_per_point)
                        .max(1),
                    prefix_only: self.prefix_only,
                    torn: self.torn,
                };
                p.max_states = self.states;
                p.jobs = self.jobs;
                p.shard = self.shard;
                p.progress = !self.quiet;
                p.image = ImageParams {
                    size_mib: self.image.size_mib.unwrap_or(p.image.size_mib),
                    ..self.image.params()
                };
                p.only_state = self.state;
                p.keep = self.keep.clone();
                p.serve = self.serve;
                out.push(p);
            }
        }
        Ok(out)
    }
}

/// `ordo crash --app`: every application on every target asked for.
fn run_apps(args: &CrashArgs) -> Result<i32, CrashError> {
    let all = args.app_params()?;
    let mut cells = Vec::new();
    for p in &all {
        let report = crate::app::explore::explore_app(p)?;
        print!("{}", report.summary(args.show));
        if let (Some(dir), Some(id)) = (&p.keep, p.only_state) {
            println!(
                "state {id}: crash.img, recovered.img and the application's files (app/) kept in {}",
                dir.display()
            );
        }
        cells.push(TableCell {
            app: report.app.clone(),
            target: report.target.clone(),
            report,
        });
    }
    if cells.len() > 1 {
        print!("\n{}", crate::app::explore::table(&cells));
    }
    if let Some(path) = &args.json {
        if let [one] = cells.as_slice() {
            one.report.write_json(path)?;
        } else {
            let text = serde_json::to_string_pretty(&cells)
                .map_err(|e| CrashError::Invalid(format!("JSON: {e}")))?;
            std::fs::write(path, text).map_err(|e| CrashError::io(format!("writing {path}"), e))?;
        }
    }
    if let Some(path) = &args.table {
        std::fs::write(path, crate::app::explore::table(&cells))
            .map_err(|e| CrashError::io(format!("writing {}", path.display()), e))?;
    }
    Ok(if cells.iter().all(|c| c.report.inconsistent() == 0) {
        0
    } else {
        1
    })
}

fn run_soak(a: &SoakArgs) -> Result<i32, CrashError> {
    use crate::soak::{soak, summarize, SoakParams};
    let summary = if !a.summary.is_empty() {
        summarize(&a.summary)?
    } else {
        let mode = a
            .mode
            .ok_or_else(|| CrashError::Invalid("--mode is required".into()))?;
        let mut t = ExploreParams::new(mode, &a.workload);
        t.data = a.data;
        t.workload_params = WorkloadParams {
            random_ops: a.random_ops,
            ..WorkloadParams::default()
        };
        t.jobs = a.jobs;
        t.e2fsck = if a.e2fsck_sample == 0 {
            E2fsckPolicy::Never
        } else {
            E2fsckPolicy::Sample(a.e2fsck_sample)
        };
        t.judge = if a.judge_every == 0 {
            JudgePolicy::Never
        } else {
            JudgePolicy::Sample(a.judge_every)
        };
        t.minimize_max = 5;
        t.image = a.image.params();
        t.fuse = a.fuse;
        t.fuse_no_open = a.fuse_no_open;
        let dir = a.dir.clone().unwrap_or_else(|| {
            PathBuf::from(format!(
                "soak/{}-{}-{}{}{}",
                a.workload,
                mode,
                explore::data_name(a.data),
                if a.fuse { "-fuse" } else { "" },
                if t.image == ImageParams::default() {
                    String::new()
                } else {
                    format!(
                        "-{}k-{}m-g{}",
                        t.image.block_size / 1024,
                        t.image.size_mib,
                        t.image.blocks_per_group.unwrap_or(0)
                    )
                }
            ))
        });
        let (i, n) = a.shard.unwrap_or((0, 1));
        let p = SoakParams {
            template: t,
            target: a.target,
            shard: (i as u64, n as u64),
            first_seed: a.first_seed,
            dir,
            verbose: !a.quiet,
        };
        soak(&p)?
    };
    print!("{}", summary.text());
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&summary)
            .map_err(|e| CrashError::Invalid(format!("JSON: {e}")))?;
        std::fs::write(path, text).map_err(|e| CrashError::io(format!("writing {path}"), e))?;
    }
    Ok(if summary.failing_states == 0 { 0 } else { 1 })
}

/// Parse `args` (the words after `ordo crash`) and run. `--help` prints
/// the help and returns 0; a usage error or a failed run is `Err` with the
/// message to print.
pub fn run(args: &[String]) -> Result<i32, String> {
    let mut argv = vec!["ordo crash".to_string()];
    argv.extend(args.iter().cloned());
    let parsed = match Standalone::try_parse_from(argv) {
        Ok(p) => p,
        Err(e) => {
            use clap::error::ErrorKind;
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    print!("{e}");
                    Ok(0)
                }
                _ => Err(e.render().to_string()),
            };
        }
    };
    run_args(&parsed.args).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<CrashArgs, String> {
        let mut argv = vec!["ordo crash"];
        argv.extend(args);
        Standalone::try_parse_from(argv)
            .map(|s| s.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parses_the_documented_flags() {
        let a = parse(&[
            "--mode",
            "sync",
            "--workload",
            "seq1",
            "--states",
            "100",
            "--seed",
            "3",
            "--jobs",
            "2",
            "--json",
            "r.json",
            "--shard",
            "1/4",
            "--torn",
            "--no-e2fsck",
        ])
        .unwrap();
        let p = a.explore_params().unwrap();
        assert_eq!(p.mode, ProtocolKind::named("sync"));
        assert_eq!(p.max_states, Some(100));
        assert_eq!(p.shard, Some((1, 4)));
        assert_eq!(p.e2fsck, E2fsckPolicy::Never);
        assert!(p.states.torn);
        assert_eq!(p.states.seed, 3);
        assert!(parse(&["--mode", "sync", "--workload", "seq1", "--shard", "4/4"]).is_err());
        assert!(parse(&["--mode", "nope", "--workload", "seq1"]).is_err());
    }

    #[test]
    fn app_flags_parse() {
        let a = parse(&[
            "--app",
            "sqlite-wal,git",
            "--mode",
            "journal/journal,kernel,async",
            "--states",
            "50",
        ])
        .unwrap();
        let ps = a.app_params().unwrap();
        assert_eq!(ps.len(), 6);
        assert_eq!(ps[0].app, App::SqliteWal);
        assert_eq!(ps[0].target.to_string(), "journal/journal");
        assert_eq!(ps[1].target, Target::Kernel { nobarrier: false });
        assert_eq!(ps[0].max_states, Some(50));
        assert_eq!(ps[0].states.max_states_per_point, 16);
        let all = parse(&["--app", "all", "--mode", "all"]).unwrap();
        let ps = all.app_params().unwrap();
        assert_eq!(ps.len(), App::ALL.len() * Target::all().len());
        assert!(parse(&["--app", "emacs", "--mode", "journal"]).is_err());
        assert!(parse(&["--app", "git", "--mode", "journal/bogus"]).is_err());
        // One state names one run.
        let a = parse(&[
            "--app",
            "git",
            "--mode",
            "journal,async",
            "--state",
            "0.3.1",
        ])
        .unwrap();
        assert!(a.app_params().is_err());
        // The kernel runs applications, not ordo's workloads.
        let a = parse(&["--mode", "kernel", "--workload", "seq1"]).unwrap();
        assert!(a.explore_params().is_err());
    }

    #[test]
    fn image_geometry_flags_parse_for_runs_and_soaks() {
        let a = parse(&[
            "--mode",
            "backpointers",
            "--workload",
            "seq1",
            "--blocks-per-group",
            "1024",
            "--size-mib",
            "32",
        ])
        .unwrap();
        let p = a.explore_params().unwrap();
        assert_eq!(p.image.blocks_per_group, Some(1024));
        assert_eq!(p.image.size_mib, 32);
        // The reproduce command carries them.
        let cmd = p.state_options();
        assert!(cmd.contains("--blocks-per-group 1024"), "{cmd}");
        assert!(cmd.contains("--size-mib 32"), "{cmd}");
        let a = parse(&[
            "soak",
            "--mode",
            "softdep",
            "--blocks-per-group",
            "256",
            "--block-size",
            "1024",
        ])
        .unwrap();
        match a.command {
            Some(CrashCommand::Soak(s)) => {
                assert_eq!(s.image.blocks_per_group, Some(256));
                assert_eq!(s.image.block_size, 1024);
            }
            other => panic!("{other:?}"),
        }
        // Application runs take the same geometry, and their reproduce
        // command carries it; without it they keep 32 MiB of 4 KiB blocks.
        let a = parse(&[
            "--app",
            "git",
            "--mode",
            "journal",
            "--block-size",
            "1024",
            "--blocks-per-group",
            "2048",
        ])
        .unwrap();
        let p = &a.app_params().unwrap()[0];
        assert_eq!(p.image.block_size, 1024);
        assert_eq!(p.image.blocks_per_group, Some(2048));
        assert_eq!(p.image.size_mib, 32);
        let cmd = p.state_options();
        assert!(cmd.contains("--block-size 1024"), "{cmd}");
        assert!(cmd.contains("--blocks-per-group 2048"), "{cmd}");
        let a = parse(&["--app", "git", "--mode", "journal"]).unwrap();
        let p = &a.app_params().unwrap()[0];
        assert_eq!(
            (
                p.image.size_mib,
                p.image.block_size,
                p.image.blocks_per_group
            ),
            (32, 4096, None)
        );
        assert!(!p.state_options().contains("--block-size"));
    }

    #[test]
    fn merge_subcommand_parses() {
        let a = parse(&["merge", "a.json", "b.json", "--json", "out.json"]).unwrap();
        match a.command {
            Some(CrashCommand::Merge { reports, json }) => {
                assert_eq!(reports, vec!["a.json", "b.json"]);
                assert_eq!(json.as_deref(), Some("out.json"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn state_and_keep_parse() {
        let a = parse(&[
            "--mode",
            "async",
            "--workload",
            "seq1",
            "--state",
            "2.30.1",
            "--keep",
            "/tmp/x",
        ])
        .unwrap();
        let p = a.explore_params().unwrap();
        assert_eq!(p.only_state.unwrap().to_string(), "2.30.1");
        assert!(parse(&["--mode", "sync"])
            .unwrap()
            .explore_params()
            .is_err());
    }
}
