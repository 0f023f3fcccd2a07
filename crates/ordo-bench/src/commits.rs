//! Commit statistics: how many fsyncs became fast commits, how many fell
//! back to full JBD2 commits and why, and how large the fast commits were.
//!
//! The fast-commit paper's claims are about these shares (81 % of commits
//! fit one block on an SSD, 98.5 % of varmail's commits are fast), and
//! the device counters alone cannot tell a fast commit from a full one.
//! Both sides count them per mount, so the figures cover the measured
//! mount up to the moment before its unmount (the commit an unmount makes
//! is in neither):
//!
//! - ordo: `Fs::protocol_stats()` (in-process targets directly; `ordo
//!   mount` adds them to the counters line it writes at unmount, see
//!   [`ProtocolStats::parse_last_line`]): `fc_fast_commits`,
//!   `fc_full_commits`, `fc_single_block_commits`, `fc_blocks_written`,
//!   `fc_ineligible_<reason>`, `jbd2_commits` (`commits` in journal mode).
//! - the kernel: `/proc/fs/ext4/<dev>/fc_info` (fast commits, ineligible
//!   commits, fast-commit blocks, the ineligibility reasons) and
//!   `/proc/fs/jbd2/<dev>-8/info` (transactions: the full commits). The
//!   kernel does not count single-block fast commits; blocks per fast
//!   commit is what it offers instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A protocol's statistics, as `Fs::protocol_stats()` returns them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolStats {
    /// The protocol (`fast_commit`, `journal`, ...).
    pub mode: String,
    /// Every counter the protocol keeps, by name.
    pub stats: BTreeMap<String, u64>,
}

/// The key of the protocol statistics in a counters line.
pub const COUNTERS_LINE_KEY: &str = "protocol";

impl ProtocolStats {
    /// From `Fs::protocol_stats()`'s pair.
    pub fn from_pair(mode: &str, stats: &[(String, u64)]) -> ProtocolStats {
        ProtocolStats {
            mode: mode.to_string(),
            stats: stats.iter().cloned().collect(),
        }
    }

    /// The `"protocol"` object of the last JSON line of a counters file;
    /// `None` for a line written before `ordo mount` reported it.
    pub fn parse_last_line(text: &str) -> Option<ProtocolStats> {
        let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        serde_json::from_value(v.get(COUNTERS_LINE_KEY)?.clone()).ok()
    }

    fn get(&self, name: &str) -> Option<u64> {
        self.stats.get(name).copied()
    }

    /// The commit counts these statistics hold; `None` for a protocol that
    /// does not commit (async, sync).
    pub fn commit_counts(&self) -> Option<CommitCounts> {
        if let Some(fast) = self.get("fc_fast_commits") {
            let full = self.get("fc_full_commits").unwrap_or(0);
            let mut ineligible = BTreeMap::new();
            for (k, &n) in &self.stats {
                if let Some(reason) = k.strip_prefix("fc_ineligible_") {
                    ineligible.insert(reason.to_string(), n);
                }
            }
            // A full commit with no reason: the commit interval, sync(2),
            // write-back under memory pressure.
            let reasoned: u64 = ineligible.values().sum();
            ineligible.insert(TIMER_OR_OTHER.to_string(), full.saturating_sub(reasoned));
            return Some(CommitCounts {
                source: "ordo".into(),
                fast_commits: fast,
                full_commits: full,
                ineligible,
                single_block_commits: self.get("fc_single_block_commits"),
                fc_blocks: self.get("fc_blocks_written"),
                jbd2_commits: self.get("jbd2_commits"),
            });
        }
        // A JBD2 protocol's statistics count its commits as "commits".
        if let Some(commits) = self.get("commits") {
            return Some(CommitCounts {
                source: "ordo".into(),
                fast_commits: 0,
                full_commits: commits,
                ineligible: BTreeMap::new(),
                single_block_commits: None,
                fc_blocks: None,
                jbd2_commits: Some(commits),
            });
        }
        None
    }
}

/// The name of the full commits that had no ineligibility reason.
pub const TIMER_OR_OTHER: &str = "timer_or_other";

/// Fast and full commits of one measured mount.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CommitCounts {
    /// Who counted: "ordo" or "kernel".
    pub source: String,
    /// Fast commits.
    pub fast_commits: u64,
    /// Full (JBD2) commits.
    pub full_commits: u64,
    /// Ineligibility reasons, each with its count. ordo: each full commit
    /// has one reason, `timer_or_other` when nothing was ineligible. The
    /// kernel: the counts of `fc_info`, which count operations marked
    /// ineligible, not commits.
    pub ineligible: BTreeMap<String, u64>,
    /// Fast commits that fit in one block (ordo only).
    pub single_block_commits: Option<u64>,
    /// Blocks written to the fast-commit area.
    pub fc_blocks: Option<u64>,
    /// JBD2 commits (the full commits, counted by the journal).
    pub jbd2_commits: Option<u64>,
}

/// The kernel's `/proc/fs/ext4/<dev>/fc_info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelFcInfo {
    /// "N commits": fast commits.
    pub commits: u64,
    /// "N ineligible": commits that fell back to a full commit.
    pub ineligible: u64,
    /// "N numblks": blocks written to the fast-commit area.
    pub numblks: u64,
    /// "Ineligible reasons:" lines, `"Dir renamed": 1`.
    pub reasons: BTreeMap<String, u64>,
}

/// Parses `fc_info`:
///
/// ```text
/// fc stats:
/// 2 commits
/// 1 ineligible
/// 2 numblks
/// 1524us avg_commit_time
/// Ineligible reasons:
/// "Extended attributes changed":<TAB>0
/// "Dir renamed":<TAB>1
/// ```
pub fn parse_fc_info(text: &str) -> std::result::Result<KernelFcInfo, String> {
    let mut info = KernelFcInfo::default();
    let (mut commits, mut ineligible, mut numblks) = (None, None, None);
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix('"') {
            let (name, count) = rest
                .rsplit_once("\":")
                .ok_or_else(|| format!("fc_info: bad reason line '{line}'"))?;
            let n = count
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("fc_info: bad count in '{line}'"))?;
            info.reasons.insert(name.to_string(), n);
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(value), Some(name)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = value.parse::<u64>() else {
            continue; // "fc stats:", "Ineligible reasons:", "1524us ..."
        };
        match name {
            "commits" => commits = Some(n),
            "ineligible" => ineligible = Some(n),
            "numblks" => numblks = Some(n),
            _ => {}
        }
    }
    match (commits, ineligible, numblks) {
        (Some(c), Some(i), Some(b)) => {
            info.commits = c;
            info.ineligible = i;
            info.numblks = b;
            Ok(info)
        }
        _ => Err("fc_info: no 'commits', 'ineligible' and 'numblks' lines".into()),
    }
}

/// The kernel's `/proc/fs/jbd2/<dev>-8/info`, first line:
/// `5 transactions (1 requested), each up to 2730 blocks`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Jbd2Info {
    /// Transactions committed since the mount.
    pub transactions: u64,
    /// Of which requested (by fsync or sync) rather than by the timer.
    pub requested: u64,
}

/// Parses the first line of a jbd2 `info` file.
pub fn parse_jbd2_info(text: &str) -> std::result::Result<Jbd2Info, String> {
    let first = text.lines().next().unwrap_or("").trim();
    let bad = || format!("jbd2 info: unexpected first line '{first}'");
    let (count, rest) = first.split_once(" transactions").ok_or_else(bad)?;
    let transactions = count.trim().parse::<u64>().map_err(|_| bad())?;
    let requested = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or_else(bad)?;
    Ok(Jbd2Info {
        transactions,
        requested,
    })
}

/// The kernel's counts for one mounted device at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelCommitStats {
    /// `fc_info`, when the file system has fast commits.
    pub fc: Option<KernelFcInfo>,
    /// The journal's `info`.
    pub jbd2: Jbd2Info,
}

impl KernelCommitStats {
    /// Reads the `/proc` files of `dev` (`/dev/loop3`) while it is
    /// mounted.
    pub fn read(dev: &Path) -> std::result::Result<KernelCommitStats, String> {
        Self::read_in(Path::new("/proc/fs"), dev)
    }

    /// As [`KernelCommitStats::read`], under `proc_fs` instead of
    /// `/proc/fs`.
    pub fn read_in(proc_fs: &Path, dev: &Path) -> std::result::Result<KernelCommitStats, String> {
        let name = dev
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: no device name", dev.display()))?;
        let fc_path = proc_fs.join("ext4").join(name).join("fc_info");
        let fc = match std::fs::read_to_string(&fc_path) {
            Ok(t) => Some(parse_fc_info(&t).map_err(|e| format!("{}: {e}", fc_path.display()))?),
            Err(_) => None,
        };
        let jbd2_path = jbd2_info_path(proc_fs, name)?;
        let text = std::fs::read_to_string(&jbd2_path)
            .map_err(|e| format!("{}: {e}", jbd2_path.display()))?;
        let jbd2 = parse_jbd2_info(&text).map_err(|e| format!("{}: {e}", jbd2_path.display()))?;
        Ok(KernelCommitStats { fc, jbd2 })
    }

    /// The counts of `self` minus those of `start` (read earlier in the
    /// same mount).
    pub fn since(&self, start: &KernelCommitStats) -> CommitCounts {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let full = d(self.jbd2.transactions, start.jbd2.transactions);
        let mut c = CommitCounts {
            source: "kernel".into(),
            full_commits: full,
            jbd2_commits: Some(full),
            ..CommitCounts::default()
        };
        if let Some(fc) = &self.fc {
            let zero = KernelFcInfo::default();
            let s = start.fc.as_ref().unwrap_or(&zero);
            c.fast_commits = d(fc.commits, s.commits);
            c.fc_blocks = Some(d(fc.numblks, s.numblks));
            for (reason, &n) in &fc.reasons {
                let before = s.reasons.get(reason).copied().unwrap_or(0);
                c.ineligible.insert(reason.clone(), d(n, before));
            }
        }
        c
    }
}

/// `/proc/fs/jbd2/<name>-8/info`; the suffix is the journal's inode
/// number, 8 for every internal journal, but any `<name>-N` is taken.
fn jbd2_info_path(proc_fs: &Path, name: &str) -> std::result::Result<PathBuf, String> {
    let dir = proc_fs.join("jbd2");
    let usual = dir.join(format!("{name}-8")).join("info");
    if usual.exists() {
        return Ok(usual);
    }
    let prefix = format!("{name}-");
    std::fs::read_dir(&dir)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .map(|p| p.join("info"))
        .ok_or_else(|| format!("{}: no journal of {name}", dir.display()))
}

/// A row's commit figures: the counts and the shares the paper reports.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CommitFigures {
    /// The raw counts.
    #[serde(flatten)]
    pub counts: CommitCounts,
    /// Fast commits per fsync point (fsync the workload timed).
    pub fast_per_fsync: Option<f64>,
    /// Fast commits among all commits, percent.
    pub fast_share_pct: Option<f64>,
    /// Single-block commits among fast commits, percent (ordo only: the
    /// kernel does not count them).
    pub single_block_share_pct: Option<f64>,
    /// Fast-commit blocks per fast commit.
    pub fc_blocks_per_fast: Option<f64>,
}

impl CommitFigures {
    /// The figures of `counts` for a window with `fsyncs` fsync points.
    pub fn new(counts: CommitCounts, fsyncs: u64) -> CommitFigures {
        let pct = |a: u64, b: u64| (b > 0).then(|| 100.0 * a as f64 / b as f64);
        let fast = counts.fast_commits;
        CommitFigures {
            fast_per_fsync: (fsyncs > 0).then(|| fast as f64 / fsyncs as f64),
            fast_share_pct: pct(fast, fast + counts.full_commits),
            single_block_share_pct: counts.single_block_commits.and_then(|s| pct(s, fast)),
            fc_blocks_per_fast: counts
                .fc_blocks
                .and_then(|b| (fast > 0).then(|| b as f64 / fast as f64)),
            counts,
        }
    }

    /// The nonzero ineligibility reasons, "name n, ...", or "-".
    pub fn reasons(&self) -> String {
        let v: Vec<String> = self
            .counts
            .ineligible
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        if v.is_empty() {
            "-".into()
        } else {
            v.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fc_info` as kernel 6.18 printed it after two fast commits and a
    /// directory rename.
    const FC_INFO: &str = "fc stats:\n2 commits\n1 ineligible\n2 numblks\n1524us avg_commit_time\n\
Ineligible reasons:\n\"Extended attributes changed\":\t0\n\"Cross rename\":\t0\n\
\"Journal flag changed\":\t0\n\"Insufficient memory\":\t0\n\"Swap boot\":\t0\n\"Resize\":\t0\n\
\"Dir renamed\":\t1\n\"Falloc range op\":\t0\n\"Data journalling\":\t0\n\"Encrypted filename\":\t0\n";

    /// The journal's `info` of the same mount.
    const JBD2_INFO: &str = "1 transactions (1 requested), each up to 2730 blocks\naverage: \n  \
0ms waiting for transaction\n  0ms request delay\n  20ms running transaction\n  \
4333us average transaction commit time\n  4 handles per transaction\n";

    #[test]
    fn parses_the_kernels_fc_info() {
        let f = parse_fc_info(FC_INFO).unwrap();
        assert_eq!((f.commits, f.ineligible, f.numblks), (2, 1, 2));
        assert_eq!(f.reasons.len(), 10);
        assert_eq!(f.reasons["Dir renamed"], 1);
        assert_eq!(f.reasons["Extended attributes changed"], 0);
        assert!(parse_fc_info("fc stats:\n2 commits\n").is_err());
        assert!(parse_fc_info("2 commits\n1 ineligible\n3 numblks\n\"Resize\" 1\n").is_err());
    }

    #[test]
    fn parses_the_kernels_jbd2_info() {
        assert_eq!(
            parse_jbd2_info(JBD2_INFO).unwrap(),
            Jbd2Info {
                transactions: 1,
                requested: 1
            }
        );
        // A mount that committed nothing prints the first line only.
        assert_eq!(
            parse_jbd2_info("0 transactions (0 requested), each up to 8192 blocks\n")
                .unwrap()
                .transactions,
            0
        );
        assert!(parse_jbd2_info("").is_err());
        assert!(parse_jbd2_info("many transactions (0 requested)").is_err());
    }

    #[test]
    fn kernel_counts_are_differences_within_a_mount() {
        let dir = tempfile::tempdir().unwrap();
        let ext4 = dir.path().join("ext4/loop7");
        let jbd2 = dir.path().join("jbd2/loop7-8");
        std::fs::create_dir_all(&ext4).unwrap();
        std::fs::create_dir_all(&jbd2).unwrap();
        std::fs::write(ext4.join("fc_info"), FC_INFO).unwrap();
        std::fs::write(jbd2.join("info"), JBD2_INFO).unwrap();
        let start = KernelCommitStats::read_in(dir.path(), Path::new("/dev/loop7")).unwrap();
        let later = FC_INFO
            .replace("2 commits", "12 commits")
            .replace("2 numblks", "15 numblks");
        std::fs::write(ext4.join("fc_info"), later).unwrap();
        std::fs::write(
            jbd2.join("info"),
            JBD2_INFO.replace("1 transactions", "3 transactions"),
        )
        .unwrap();
        let end = KernelCommitStats::read_in(dir.path(), Path::new("/dev/loop7")).unwrap();
        let c = end.since(&start);
        assert_eq!((c.fast_commits, c.full_commits), (10, 2));
        assert_eq!(c.fc_blocks, Some(13));
        assert_eq!(c.ineligible["Dir renamed"], 0);
        assert_eq!(c.single_block_commits, None);
        let f = CommitFigures::new(c, 12);
        assert_eq!(f.fast_share_pct.map(|p| p.round()), Some(83.0));
        assert_eq!(f.fc_blocks_per_fast, Some(1.3));
        assert_eq!(f.single_block_share_pct, None);
        // A device with no journal is an error, not zeros.
        assert!(KernelCommitStats::read_in(dir.path(), Path::new("/dev/loop8")).is_err());
    }

    #[test]
    fn ordo_fast_commit_stats_give_counts_and_shares() {
        let pairs: Vec<(String, u64)> = [
            ("fc_fast_commits", 81),
            ("fc_full_commits", 19),
            ("fc_single_block_commits", 66),
            ("fc_blocks_written", 100),
            ("fc_ineligible_no_live_log", 1),
            ("fc_ineligible_rename_dir", 3),
            ("jbd2_commits", 19),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
        let s = ProtocolStats::from_pair("fast_commit", &pairs);
        let c = s.commit_counts().unwrap();
        assert_eq!(c.ineligible[TIMER_OR_OTHER], 15);
        assert_eq!(c.ineligible["rename_dir"], 3);
        let f = CommitFigures::new(c, 100);
        assert_eq!(f.fast_per_fsync, Some(0.81));
        assert_eq!(f.fast_share_pct, Some(81.0));
        assert_eq!(
            f.single_block_share_pct.map(|p| (p * 10.0).round()),
            Some(815.0)
        );
        assert_eq!(
            f.reasons(),
            "no_live_log 1, rename_dir 3, timer_or_other 15"
        );
        let journal = ProtocolStats::from_pair("journal", &[("commits".into(), 7)]);
        let j = journal.commit_counts().unwrap();
        assert_eq!((j.fast_commits, j.full_commits), (0, 7));
        assert!(ProtocolStats::from_pair("async", &[])
            .commit_counts()
            .is_none());
    }

    #[test]
    fn counters_lines_with_and_without_protocol_stats() {
        let old = "{\"by_class\":[],\"flushes\":3}";
        assert_eq!(ProtocolStats::parse_last_line(old), None);
        let new = "{\"by_class\":[],\"flushes\":3,\"protocol\":{\"mode\":\"fast_commit\",\
\"stats\":{\"fc_fast_commits\":4}}}";
        let p = ProtocolStats::parse_last_line(&format!("{old}\n{new}\n")).unwrap();
        assert_eq!(p.mode, "fast_commit");
        assert_eq!(p.stats["fc_fast_commits"], 4);
    }
}
