//! Workloads: what the explorer runs on a recording device.
//!
//! A workload is a list of independent [`Sequence`]s. Each sequence starts
//! from a fresh image holding its setup tree (made durable by a clean
//! unmount, so it is the base every crash state starts from) and then runs
//! its recorded operations. Crash states are taken only inside the recorded
//! part.
//!
//! The built-in workloads follow ACE (CrashMonkey's bounded workload
//! generator): `seq1` runs each core operation once, followed by a
//! persistence point on the file or directory it changed (or `sync`), on a
//! small preset tree; `seq2` runs bounded pairs; `random` is a seeded long
//! run. Anything else is a scenario file in the text format of
//! [`parse_scenario`], one operation per line, so a new case needs no code.

use std::fmt;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::CrashError;
use crate::model::Tree;

/// One file-system operation of a workload, by path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create an empty regular file.
    Creat(String),
    /// Create a directory.
    Mkdir(String),
    /// Write `len` pattern bytes at `off` (overwrite, fill or extend).
    Write { path: String, off: u64, len: u64 },
    /// Write `len` pattern bytes at the file's current size.
    Append { path: String, len: u64 },
    /// fallocate `[off, off+len)`; with `keep_size` the size does not grow.
    Falloc {
        path: String,
        off: u64,
        len: u64,
        keep_size: bool,
    },
    /// Punch a hole (FALLOC_FL_PUNCH_HOLE | KEEP_SIZE).
    Punch { path: String, off: u64, len: u64 },
    /// Zero a range (FALLOC_FL_ZERO_RANGE); with `keep_size` the size does
    /// not grow.
    Zero {
        path: String,
        off: u64,
        len: u64,
        keep_size: bool,
    },
    /// Remove a range of whole blocks, ending before the end of the file,
    /// and move what follows down (FALLOC_FL_COLLAPSE_RANGE).
    Collapse { path: String, off: u64, len: u64 },
    /// Insert a hole of whole blocks at an offset before the end of the
    /// file, moving what follows up (FALLOC_FL_INSERT_RANGE).
    Insert { path: String, off: u64, len: u64 },
    /// Set the size (shrink or extend).
    Truncate { path: String, size: u64 },
    /// New hard link `dst` to `src`.
    Link { src: String, dst: String },
    /// Remove a name of a non-directory.
    Unlink(String),
    /// rename(2), replacing `dst` if it exists.
    Rename { src: String, dst: String },
    /// Remove an empty directory.
    Rmdir(String),
    /// Symbolic link at `path` pointing to `target`.
    Symlink { target: String, path: String },
    /// setxattr(2) of `name` to `len` bytes that depend on the name and
    /// length only (so that equal attributes on two files are equal and
    /// ext4 may share their block).
    SetXattr {
        path: String,
        name: String,
        len: u64,
    },
    /// removexattr(2).
    RemoveXattr { path: String, name: String },
    /// An access ACL granting user `uid` read and write (and, on a
    /// directory, the same default ACL), as `setfacl -m u:UID:rw` (and
    /// `-d`) sets it.
    SetAcl { path: String, uid: u32 },
    /// fsync(2) of a file or directory: a promise.
    Fsync(String),
    /// fdatasync(2) of a file: a promise.
    Fdatasync(String),
    /// sync(2): a promise covering everything.
    Sync,
    /// OptFS's osync of a file or directory (`Fs::osync`): an ordering
    /// point. What ran before it reaches the disk before what runs after
    /// it, but nothing need be durable when it returns, so it makes no
    /// promise; its ordering is what the prefix oracle checks, on the
    /// protocols that keep a prefix of the operations after a crash.
    Osync(String),
    /// The periodic write-back runs once (`Fs::write_back`: the commit
    /// interval's tick, the syncer): background commits, flushes and
    /// checkpoints happen inside recordings. No promise.
    Writeback,
    /// OptFS's dsync of a file or directory (`Fs::dsync`): durability, the
    /// promise of an fsync of the same path.
    Dsync(String),
    /// ccfs: the thread running the workload moves to stream `NAME`
    /// (`Fs::setstream`, made on first use); every later operation runs in
    /// it until the next `SetStream`. Operations before any run in the
    /// stream named `default`. Changes no tree and promises nothing.
    SetStream(String),
    /// ccfs's streamsync of the current stream (`Fs::streamsync`): a
    /// promise that every operation the stream ran before it is durable
    /// (on a protocol without streams, a sync).
    Streamsync,
    /// ccfs's `IGNORE_FSYNC` on (`true`) or off for the current stream
    /// (`Fs::set_stream_flags`): while it is on, the stream's fsyncs and
    /// fdatasyncs only order (ccfs+) and promise nothing; the stream's
    /// order and its streamsyncs still hold. Changes no tree.
    IgnoreFsync(bool),
}

impl Op {
    /// True for the operations after which the workload holds a promise:
    /// fsync, fdatasync, sync, dsync and streamsync. Not osync, which
    /// orders without making anything durable (on a protocol without a
    /// native osync it is an fsync, but the workload may not count on
    /// that).
    pub fn is_persistence(&self) -> bool {
        matches!(
            self,
            Op::Fsync(_) | Op::Fdatasync(_) | Op::Sync | Op::Dsync(_) | Op::Streamsync
        )
    }

    /// The stream flags `ignorefsync on|off` sets (`None` for another
    /// operation).
    pub fn stream_flags(&self) -> Option<u32> {
        match self {
            Op::IgnoreFsync(true) => Some(ordo_fs::stream::IGNORE_FSYNC),
            Op::IgnoreFsync(false) => Some(0),
            _ => None,
        }
    }

    /// True for the operations that change the tree (the model's): not
    /// the ones that only order or promise (fsync, fdatasync, sync, osync,
    /// dsync, write-back ticks, setstream, streamsync).
    pub fn changes_tree(&self) -> bool {
        !matches!(
            self,
            Op::Fsync(_)
                | Op::Fdatasync(_)
                | Op::Sync
                | Op::Osync(_)
                | Op::Writeback
                | Op::Dsync(_)
                | Op::SetStream(_)
                | Op::Streamsync
                | Op::IgnoreFsync(_)
        )
    }
}

impl fmt::Display for Op {
    /// The scenario-file form of the operation (parsed back by
    /// [`parse_scenario`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Creat(p) => write!(f, "creat {p}"),
            Op::Mkdir(p) => write!(f, "mkdir {p}"),
            Op::Write { path, off, len } => write!(f, "write {path} {off} {len}"),
            Op::Append { path, len } => write!(f, "append {path} {len}"),
            Op::Falloc {
                path,
                off,
                len,
                keep_size,
            } => {
                write!(f, "falloc {path} {off} {len}")?;
                if *keep_size {
                    write!(f, " keep_size")?;
                }
                Ok(())
            }
            Op::Punch { path, off, len } => write!(f, "punch {path} {off} {len}"),
            Op::Zero {
                path,
                off,
                len,
                keep_size,
            } => {
                write!(f, "zero {path} {off} {len}")?;
                if *keep_size {
                    write!(f, " keep_size")?;
                }
                Ok(())
            }
            Op::Collapse { path, off, len } => write!(f, "collapse {path} {off} {len}"),
            Op::Insert { path, off, len } => write!(f, "insert {path} {off} {len}"),
            Op::Truncate { path, size } => write!(f, "truncate {path} {size}"),
            Op::Link { src, dst } => write!(f, "link {src} {dst}"),
            Op::Unlink(p) => write!(f, "unlink {p}"),
            Op::Rename { src, dst } => write!(f, "rename {src} {dst}"),
            Op::Rmdir(p) => write!(f, "rmdir {p}"),
            Op::Symlink { target, path } => write!(f, "symlink {target} {path}"),
            Op::SetXattr { path, name, len } => write!(f, "setxattr {path} {name} {len}"),
            Op::RemoveXattr { path, name } => write!(f, "removexattr {path} {name}"),
            Op::SetAcl { path, uid } => write!(f, "setacl {path} {uid}"),
            Op::Fsync(p) => write!(f, "fsync {p}"),
            Op::Fdatasync(p) => write!(f, "fdatasync {p}"),
            Op::Sync => write!(f, "sync"),
            Op::Osync(p) => write!(f, "osync {p}"),
            Op::Writeback => write!(f, "writeback"),
            Op::Dsync(p) => write!(f, "dsync {p}"),
            Op::SetStream(name) => write!(f, "setstream {name}"),
            Op::Streamsync => write!(f, "streamsync"),
            Op::IgnoreFsync(on) => write!(f, "ignorefsync {}", if *on { "on" } else { "off" }),
        }
    }
}

/// One recorded run: a setup tree, then the operations crash states are
/// taken in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequence {
    /// Short name for reports ("seq1/creat+fsync").
    pub name: String,
    /// Operations run before recording; their result is the durable base.
    pub setup: Vec<Op>,
    /// The recorded operations.
    pub ops: Vec<Op>,
}

/// A named list of sequences.
#[derive(Clone, Debug)]
pub struct Workload {
    /// `seq1`, `seq2`, `random` or the scenario file's path.
    pub name: String,
    /// The sequences, in a fixed order (sequence index is part of a state id).
    pub sequences: Vec<Sequence>,
    /// The base image is made by the kernel (mkfs.ext4 and a loop mount)
    /// with this directory holding these names, rather than by ordo's mkfs.
    pub kernel_dir: Option<KernelDir>,
}

/// A directory the kernel fills in the base image: `names` (empty
/// regular files) in `path`, enough of them that the kernel indexes the
/// directory (htree), which ordo's own mkfs and core never do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelDir {
    /// The directory's absolute path (one component).
    pub path: String,
    /// The names, without the directory.
    pub names: Vec<String>,
}

/// Parameters of the built-in workloads.
#[derive(Clone, Copy, Debug)]
pub struct WorkloadParams {
    /// Seed of the `random` workload.
    pub seed: u64,
    /// Operations per `random` sequence.
    pub random_ops: usize,
    /// Number of `random` sequences.
    pub random_sequences: usize,
    /// Upper bound on `seq2` sequences (taken in a fixed interleaved order,
    /// so a smaller bound is a prefix of a larger one).
    pub seq2_max: usize,
    /// Use OptFS's durability calls too: `seq1` gets osync and dsync
    /// persistence points, and `random` and `mix` (with `enospc` and
    /// `htree`) turn some of their fsyncs and fdatasyncs into osyncs and
    /// dsyncs. Off, every workload is what it was without these calls
    /// (the same seed makes the same sequences). The explorer turns it on
    /// for the protocols whose capabilities promise a prefix of the
    /// operations after a crash, where osync's ordering is checked.
    pub durability_calls: bool,
    /// Interleave ccfs streams: `random`, `mix`, `htree` and `enospc` move
    /// between 2 or 3 streams at random points (`setstream`) and turn
    /// some persistence points into `streamsync`s; `seq2` adds, after
    /// each pair, the pair with its two operations in two streams; `seq1`
    /// adds [`stream_scenarios`]. Off, every workload is what it was (the
    /// same seed makes the same sequences). The explorer turns it on for
    /// the protocols whose capabilities keep a prefix of each stream
    /// after a crash.
    pub streams: bool,
    /// Recorded through a FUSE mount: the kernel's FUSE module answers
    /// collapse and insert ranges with EOPNOTSUPP without asking the file
    /// system, so the seeded workloads (`random`, `mix`, `htree`,
    /// `enospc`) get a punched hole in place of a collapse and a zeroed
    /// range in place of an insert, at the same place, and the sequences
    /// of `seq1`, `seq2` and scenario files that use them are left out.
    /// Off, every workload is what it was.
    pub fuse: bool,
}

impl Default for WorkloadParams {
    fn default() -> Self {
        WorkloadParams {
            seed: 0,
            random_ops: 60,
            random_sequences: 4,
            seq2_max: 2000,
            durability_calls: false,
            streams: false,
            fuse: false,
        }
    }
}

/// Resolve a workload name: `seq1`, `seq2`, `random`, `mix`, `htree`,
/// `enospc`, `streams`, `nofs-table3`, or a scenario file.
pub fn by_name(name: &str, params: &WorkloadParams) -> Result<Workload, CrashError> {
    let sequences = match name {
        "seq1" => seq1_with(params),
        "seq2" => seq2_with(params),
        "streams" => stream_scenarios(),
        "nofs-table3" => nofs_table3(),
        "random" => random(params),
        "mix" => mix(params),
        "htree" => htree(params),
        "enospc" => enospc(params),
        path => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                CrashError::Workload(format!(
                    "'{path}' is not a built-in workload (seq1, seq2, random, mix, htree, enospc, streams, nofs-table3) and can not be read: {e}"
                ))
            })?;
            let stem = std::path::Path::new(path)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.to_string());
            vec![parse_scenario(&stem, &text)?]
        }
    };
    let seeded = matches!(name, "random" | "mix" | "htree" | "enospc");
    let sequences = if params.fuse {
        without_shifts(sequences, seeded, name)?
    } else {
        sequences
    };
    let kernel_dir = (name == "htree").then(htree_dir);
    let base = kernel_dir.as_ref().map(KernelDir::ops).unwrap_or_default();
    for s in &sequences {
        validate_on(&base, s)?;
    }
    Ok(Workload {
        name: name.to_string(),
        sequences,
        kernel_dir,
    })
}

/// The sequences a FUSE recording can run ([`WorkloadParams::fuse`]): in
/// a seeded workload (`replace`) each collapse becomes a punched hole and
/// each insert a zeroed range that keeps the size, over the same blocks
/// (valid wherever the shift was, and the operations after it do not
/// depend on the file's size); elsewhere a sequence that shifts is left
/// out, and a workload left with none is an error.
fn without_shifts(
    sequences: Vec<Sequence>,
    replace: bool,
    name: &str,
) -> Result<Vec<Sequence>, CrashError> {
    let is_shift = |op: &Op| matches!(op, Op::Collapse { .. } | Op::Insert { .. });
    if !replace {
        let had = sequences.len();
        let kept: Vec<Sequence> = sequences
            .into_iter()
            .filter(|s| !s.setup.iter().chain(&s.ops).any(is_shift))
            .collect();
        if kept.is_empty() && had > 0 {
            return Err(CrashError::Workload(format!(
                "'{name}': every sequence collapses or inserts a range, which the kernel's FUSE module refuses (EOPNOTSUPP); it cannot be recorded with --fuse"
            )));
        }
        return Ok(kept);
    }
    let unshift = |op: Op| match op {
        Op::Collapse { path, off, len } => Op::Punch { path, off, len },
        Op::Insert { path, off, len } => Op::Zero {
            path,
            off,
            len,
            keep_size: true,
        },
        other => other,
    };
    Ok(sequences
        .into_iter()
        .map(|s| Sequence {
            name: s.name,
            setup: s.setup.into_iter().map(unshift).collect(),
            ops: s.ops.into_iter().map(unshift).collect(),
        })
        .collect())
}

impl KernelDir {
    /// What the directory adds to an empty tree, as operations.
    pub fn ops(&self) -> Vec<Op> {
        let mut v = vec![Op::Mkdir(self.path.clone())];
        v.extend(
            self.names
                .iter()
                .map(|n| Op::Creat(format!("{}/{n}", self.path))),
        );
        v
    }
}

/// Check a sequence against the model: every operation must succeed.
pub fn validate(seq: &Sequence) -> Result<(), CrashError> {
    validate_on(&[], seq)
}

/// [`validate`] on a base tree that `base` builds.
fn validate_on(base: &[Op], seq: &Sequence) -> Result<(), CrashError> {
    let mut tree = Tree::new();
    let mut serial = 0u32;
    for op in base {
        serial += 1;
        tree.apply(op, serial)
            .map_err(|e| CrashError::Workload(format!("the base tree: '{op}': {e}")))?;
    }
    for (i, op) in seq.setup.iter().chain(&seq.ops).enumerate() {
        serial += 1;
        tree.apply(op, serial).map_err(|e| {
            CrashError::Workload(format!("{}: operation {} '{op}': {e}", seq.name, i + 1))
        })?;
    }
    Ok(())
}

/// The preset tree every built-in sequence starts from.
///
/// ```text
/// /A/foo  8 KiB      /A/bar  4 KiB     /A/empty  0 B
/// /B/sub/x  1000 B   /B/lnk -> /A/foo
/// /C/ (empty)        /foo  16 KiB
/// ```
pub fn preset() -> Vec<Op> {
    let w = |p: &str, len| Op::Write {
        path: p.into(),
        off: 0,
        len,
    };
    vec![
        Op::Mkdir("/A".into()),
        Op::Mkdir("/B".into()),
        Op::Mkdir("/C".into()),
        Op::Mkdir("/B/sub".into()),
        Op::Creat("/A/foo".into()),
        w("/A/foo", 8192),
        Op::Creat("/A/bar".into()),
        w("/A/bar", 4096),
        Op::Creat("/A/empty".into()),
        Op::Creat("/B/sub/x".into()),
        w("/B/sub/x", 1000),
        Op::Creat("/foo".into()),
        w("/foo", 16384),
        Op::Symlink {
            target: "/A/foo".into(),
            path: "/B/lnk".into(),
        },
        // Attributes: one in /A/foo's inode, and one too large for it that
        // /A/foo and /A/bar share a block for.
        xa("/A/foo", "user.tag", 16),
        xa("/A/foo", "user.big", 600),
        xa("/A/bar", "user.big", 600),
    ]
}

fn xa(path: &str, name: &str, len: u64) -> Op {
    Op::SetXattr {
        path: path.into(),
        name: name.into(),
        len,
    }
}

/// The value [`Op::SetXattr`] sets.
pub fn xattr_value(name: &str, len: u64) -> Vec<u8> {
    let seed = name
        .bytes()
        .fold(len as u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    (0..len).map(|i| seed.wrapping_add(i as u8) | 1).collect()
}

/// The ACL [`Op::SetAcl`] sets, in the VFS's form (`system.posix_acl_*`).
pub fn acl_value(uid: u32) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 6, uid),
        (0x04, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// One core operation of seq-1 with the objects a persistence point after
/// it can name.
struct CoreOp {
    name: &'static str,
    op: Op,
    /// File or directory the operation changed, if it still exists after.
    target: Option<&'static str>,
    /// Whether `target` is a regular file (fdatasync applies).
    target_is_file: bool,
    /// Parent directories whose entries changed.
    parents: &'static [&'static str],
}

fn core_ops() -> Vec<CoreOp> {
    let s = |x: &str| x.to_string();
    let c = |name, op, target, target_is_file, parents| CoreOp {
        name,
        op,
        target,
        target_is_file,
        parents,
    };
    vec![
        c(
            "creat",
            Op::Creat(s("/A/new")),
            Some("/A/new"),
            true,
            &["/A"],
        ),
        c(
            "mkdir",
            Op::Mkdir(s("/A/dnew")),
            Some("/A/dnew"),
            false,
            &["/A"],
        ),
        c(
            "write",
            Op::Write {
                path: s("/A/empty"),
                off: 0,
                len: 8192,
            },
            Some("/A/empty"),
            true,
            &[],
        ),
        c(
            "overwrite",
            Op::Write {
                path: s("/A/foo"),
                off: 4096,
                len: 4096,
            },
            Some("/A/foo"),
            true,
            &[],
        ),
        c(
            "overwrite-unaligned",
            Op::Write {
                path: s("/foo"),
                off: 1000,
                len: 5000,
            },
            Some("/foo"),
            true,
            &[],
        ),
        c(
            "append",
            Op::Append {
                path: s("/A/foo"),
                len: 4096,
            },
            Some("/A/foo"),
            true,
            &[],
        ),
        c(
            "append-unaligned",
            Op::Append {
                path: s("/B/sub/x"),
                len: 6000,
            },
            Some("/B/sub/x"),
            true,
            &[],
        ),
        c(
            "falloc",
            Op::Falloc {
                path: s("/A/foo"),
                off: 8192,
                len: 8192,
                keep_size: false,
            },
            Some("/A/foo"),
            true,
            &[],
        ),
        c(
            "falloc-keep-size",
            Op::Falloc {
                path: s("/A/bar"),
                off: 4096,
                len: 8192,
                keep_size: true,
            },
            Some("/A/bar"),
            true,
            &[],
        ),
        c(
            "punch",
            Op::Punch {
                path: s("/foo"),
                off: 4096,
                len: 4096,
            },
            Some("/foo"),
            true,
            &[],
        ),
        c(
            "zero-range",
            Op::Zero {
                path: s("/foo"),
                off: 1000,
                len: 20000,
                keep_size: false,
            },
            Some("/foo"),
            true,
            &[],
        ),
        c(
            "zero-range-keep-size",
            Op::Zero {
                path: s("/A/foo"),
                off: 4096,
                len: 8192,
                keep_size: true,
            },
            Some("/A/foo"),
            true,
            &[],
        ),
        c(
            "collapse",
            Op::Collapse {
                path: s("/foo"),
                off: 4096,
                len: 4096,
            },
            Some("/foo"),
            true,
            &[],
        ),
        c(
            "insert",
            Op::Insert {
                path: s("/foo"),
                off: 4096,
                len: 8192,
            },
            Some("/foo"),
            true,
            &[],
        ),
        c(
            "truncate-shrink",
            Op::Truncate {
                path: s("/A/foo"),
                size: 1000,
            },
            Some("/A/foo"),
            true,
            &[],
        ),
        c(
            "truncate-extend",
            Op::Truncate {
                path: s("/A/bar"),
                size: 12288,
            },
            Some("/A/bar"),
            true,
            &[],
        ),
        c(
            "link",
            Op::Link {
                src: s("/A/foo"),
                dst: s("/B/foo2"),
            },
            Some("/B/foo2"),
            true,
            &["/B"],
        ),
        c("unlink", Op::Unlink(s("/A/bar")), None, false, &["/A"]),
        c(
            "rename",
            Op::Rename {
                src: s("/A/bar"),
                dst: s("/B/bar2"),
            },
            Some("/B/bar2"),
            true,
            &["/A", "/B"],
        ),
        c(
            "rename-replace",
            Op::Rename {
                src: s("/A/bar"),
                dst: s("/A/foo"),
            },
            Some("/A/foo"),
            true,
            &["/A"],
        ),
        c(
            "rename-dir",
            Op::Rename {
                src: s("/C"),
                dst: s("/B/C2"),
            },
            Some("/B/C2"),
            false,
            &["/", "/B"],
        ),
        c("rmdir", Op::Rmdir(s("/C")), None, false, &["/"]),
        c(
            "setxattr-inode",
            xa("/A/empty", "user.s", 24),
            Some("/A/empty"),
            true,
            &[],
        ),
        // /A/bar's shared block is copied before it changes.
        c(
            "setxattr-cow",
            xa("/A/bar", "user.other", 900),
            Some("/A/bar"),
            true,
            &[],
        ),
        // /A/bar's attribute block: /A/foo's again, shared.
        c(
            "setxattr-share",
            xa("/A/empty", "user.big", 600),
            Some("/A/empty"),
            true,
            &[],
        ),
        c(
            "removexattr-shared",
            Op::RemoveXattr {
                path: s("/A/foo"),
                name: s("user.big"),
            },
            Some("/A/foo"),
            true,
            &[],
        ),
        c(
            "removexattr-inode",
            Op::RemoveXattr {
                path: s("/A/foo"),
                name: s("user.tag"),
            },
            Some("/A/foo"),
            true,
            &[],
        ),
        c(
            "setacl",
            Op::SetAcl {
                path: s("/A/foo"),
                uid: 1000,
            },
            Some("/A/foo"),
            true,
            &[],
        ),
        // Later creations in /A inherit its default ACL.
        c(
            "setacl-dir",
            Op::SetAcl {
                path: s("/A"),
                uid: 1000,
            },
            Some("/A"),
            false,
            &["/"],
        ),
        c(
            "symlink",
            Op::Symlink {
                target: s("/A/foo"),
                path: s("/A/sym"),
            },
            None,
            false,
            &["/A"],
        ),
    ]
}

/// The persistence points that can follow a core operation, with a label;
/// with `durability_calls` also osync and dsync of the target and of the
/// parents (after the others, so the others keep their order).
fn persistence_points(c: &CoreOp, durability_calls: bool) -> Vec<(String, Op)> {
    let mut out = Vec::new();
    if let Some(t) = c.target {
        out.push(("fsync".to_string(), Op::Fsync(t.to_string())));
        if c.target_is_file {
            out.push(("fdatasync".to_string(), Op::Fdatasync(t.to_string())));
        }
    }
    for p in c.parents {
        out.push((format!("fsync{p}"), Op::Fsync(p.to_string())));
    }
    out.push(("sync".to_string(), Op::Sync));
    if durability_calls {
        let target = c.target.map(|t| (String::new(), t));
        let parents = c.parents.iter().map(|p| (p.to_string(), *p));
        for (at, path) in target.into_iter().chain(parents) {
            out.push((format!("osync{at}"), Op::Osync(path.to_string())));
            out.push((format!("dsync{at}"), Op::Dsync(path.to_string())));
        }
    }
    out
}

/// seq-1: every core operation followed by each persistence point that
/// applies to it, on the preset tree (without OptFS's durability calls).
pub fn seq1() -> Vec<Sequence> {
    seq1_with(&WorkloadParams::default())
}

/// [`seq1`] as `params` asks: with [`WorkloadParams::durability_calls`]
/// also every core operation followed by an osync or a dsync (of its
/// target, or of a parent directory), and [`osync_chains`] after the rest.
/// Without it, exactly [`seq1`].
pub fn seq1_with(params: &WorkloadParams) -> Vec<Sequence> {
    let mut out = Vec::new();
    for c in core_ops() {
        for (label, p) in persistence_points(&c, params.durability_calls) {
            out.push(Sequence {
                name: format!("seq1/{}+{label}", c.name),
                setup: preset(),
                ops: vec![c.op.clone(), p],
            });
        }
    }
    if params.durability_calls {
        out.extend(osync_chains());
    }
    if params.streams {
        out.extend(stream_scenarios());
    }
    out
}

/// Short sequences of related operations in different streams (ccfs), on
/// the preset tree: what a protocol that keeps order per stream must keep
/// together across streams, and what it may not lose once a stream's
/// fsync or streamsync returned. The workload `streams`; with
/// [`WorkloadParams::streams`] also part of `seq1`.
///
/// - `same-file`: two streams write one file; the second stream's fsync
///   of another file covers the first stream's write (related to its own);
/// - `create-unlink`: one stream creates a name, another unlinks it and
///   creates another in the same directory, the first creates the name
///   again;
/// - `mkdir-then-create`: a directory made in one stream, a file created
///   and written in it by another (related: the file is under the
///   directory);
/// - `rename-across`: a file made by one stream renamed over an existing
///   one by another; a directory renamed by one stream, a file created in
///   it by another;
/// - `independent`: unrelated operations of two streams (new files in
///   two directories, writes), each made durable by its own stream only;
/// - `three-streams`: three streams appending to one file and creating
///   names beside it, ended by one streamsync each.
pub fn stream_scenarios() -> Vec<Sequence> {
    let cases: [(&str, &str); 7] = [
        (
            "same-file",
            "setstream s1\nwrite /A/foo 0 8192\nsetstream s2\nwrite /A/foo 4096 8192\n\
             write /B/sub/x 0 4096\nfsync /B/sub/x\nsetstream s1\nappend /A/foo 3000\n\
             fsync /A/foo\n",
        ),
        (
            "create-unlink",
            "setstream s1\ncreat /C/n\nwrite /C/n 0 4096\nsetstream s2\nunlink /C/n\n\
             creat /C/m\nfsync /C\nsetstream s1\ncreat /C/n\nstreamsync\n",
        ),
        (
            "mkdir-then-create",
            "setstream s1\nmkdir /A/d\nsetstream s2\ncreat /A/d/f\nwrite /A/d/f 0 4096\n\
             fsync /A/d/f\nsetstream s1\nmkdir /A/d/e\nwrite /foo 0 4096\nstreamsync\n",
        ),
        (
            "rename-across",
            "setstream s1\ncreat /B/t\nwrite /B/t 0 8192\nsetstream s2\nrename /B/t /A/bar\n\
             fsync /A\nsetstream s1\nrename /C /B/C2\nsetstream s2\ncreat /B/C2/in\n\
             write /B/C2/in 0 4096\nstreamsync\nsetstream s1\nstreamsync\n",
        ),
        (
            "independent",
            "setstream s1\ncreat /A/n1\nwrite /foo 0 4096\nsetstream s2\ncreat /B/sub/n2\n\
             write /B/sub/n2 0 4096\nfsync /B/sub/n2\nsetstream s1\nappend /A/bar 5000\n\
             streamsync\nsetstream s2\ntruncate /B/sub/n2 100\nsync\n",
        ),
        (
            "three-streams",
            "setstream s1\nappend /A/foo 3000\ncreat /A/n1\nsetstream s2\nappend /A/foo 3000\n\
             creat /A/n2\nsetstream s3\ncreat /A/n3\nappend /A/foo 3000\nsetstream s2\n\
             streamsync\nsetstream s1\nstreamsync\nsetstream s3\nstreamsync\n",
        ),
        (
            // An append whose block is delayed, then overwrites that are
            // journaled until the stream's transaction outgrows its bound
            // and commits at a handle's end: that commit must carry the
            // append's block with its size (order-preserving delayed
            // allocation).
            "delalloc-over-bound",
            "setstream s1\ncreat /A/big\nwrite /A/big 0 900000\nwrite /A/big 900000 900000\n\
             fsync /A/big\nappend /A/foo 9000\nwrite /A/big 0 900000\nsetstream s2\n\
             creat /B/sub/n2\nwrite /B/sub/n2 0 4096\nsetstream s1\n\
             write /A/big 900000 900000\nsetstream s2\nfsync /B/sub/n2\nsetstream s1\n\
             streamsync\n",
        ),
    ];
    cases
        .iter()
        .map(|(name, text)| {
            let ops = text
                .lines()
                .map(|l| parse_op(l).expect("the stream scenarios parse"))
                .collect();
            Sequence {
                name: format!("streams/{name}"),
                setup: preset(),
                ops,
            }
        })
        .collect()
}

/// NoFS's Table 3 (Chidambaram et al., FAST '12, "Consistency Without
/// Ordering"): the 20 cases of writes dropped from one operation (or from
/// two that share an inode or a block), on the preset tree. The workload
/// `nofs-table3`.
///
/// Each sequence ends in a `sync`, so that every write of its operations
/// is in one unflushed epoch and the crash states drop every subset of
/// them (up to the per-point bound); the table's case, named after the
/// operation and the blocks it drops (`C` the child, `P` its parent
/// directory, `O`/`N` the old and new directory, `inode`, `dir` a
/// directory block, `data`, `ind` an extent-tree block), is among those
/// subsets. The sequences of one operation differ in where it acts, so
/// that each case is also met in another setting:
///
/// - `mkdir` ×6: C-inode, C-dir, P-dir, C-inode+C-dir, C-inode+P-dir,
///   C-dir+P-dir (a bad entry, an orphan inode or block, reclaimed by the
///   scan or refused on access);
/// - `link` ×2: C-inode (the link count), P-dir (the new name);
/// - `unlink` ×2: C-inode of a file with two names, O-dir;
/// - `rename` ×2: N-dir, O-dir (a file in both directories, or in none);
/// - `write` ×5: C-data, C-ind, C-inode+C-data, C-inode+C-ind,
///   C-data+C-ind (garbage data, orphan blocks); an extent-tree block
///   needs a fifth extent, hence the sparse files;
/// - `delete-create`: a new file reuses an unlinked one's inode, the old
///   directory block dropped;
/// - `truncate-write`: a block freed by a truncate given to a new file,
///   the truncated inode dropped (two inodes point at one block);
/// - `unlink-link`: a freed inode reused and linked under a second name,
///   the old directory block dropped.
pub fn nofs_table3() -> Vec<Sequence> {
    // A file of five extents (one more than the inode holds): an
    // extent-tree block.
    let sparse = |p: &str| {
        (0..5)
            .map(|k| format!("write {p} {} 4096\n", k * 65536))
            .collect::<String>()
    };
    let sparse_c = format!("creat /C/s\n{}", sparse("/C/s"));
    let cases: Vec<(&str, String, String)> = vec![
        ("mkdir-C-inode", String::new(), "mkdir /C/d\nsync\n".into()),
        ("mkdir-C-dir", String::new(), "mkdir /A/d\nsync\n".into()),
        (
            "mkdir-P-dir",
            String::new(),
            "mkdir /B/sub/d\nsync\n".into(),
        ),
        (
            "mkdir-C-inode+C-dir",
            String::new(),
            "mkdir /d\nsync\n".into(),
        ),
        (
            "mkdir-C-inode+P-dir",
            String::new(),
            "mkdir /C/d\ncreat /C/d/f\nsync\n".into(),
        ),
        (
            "mkdir-C-dir+P-dir",
            String::new(),
            "mkdir /C/d\nmkdir /C/d/e\nsync\n".into(),
        ),
        (
            "link-C-inode",
            String::new(),
            "link /A/foo /C/l\nsync\n".into(),
        ),
        (
            "link-P-dir",
            String::new(),
            "link /B/sub/x /A/l\nsync\n".into(),
        ),
        (
            "unlink-C-inode",
            "link /A/foo /C/l\n".into(),
            "unlink /A/foo\nsync\n".into(),
        ),
        (
            "unlink-O-dir",
            String::new(),
            "unlink /A/bar\nsync\n".into(),
        ),
        (
            "rename-N-dir",
            String::new(),
            "rename /A/bar /C/bar\nsync\n".into(),
        ),
        (
            "rename-O-dir",
            String::new(),
            "rename /B/sub/x /A/x\nsync\n".into(),
        ),
        (
            "write-C-data",
            String::new(),
            "write /A/empty 0 8192\nsync\n".into(),
        ),
        ("write-C-ind", String::new(), format!("{sparse_c}sync\n")),
        (
            "write-C-inode+C-data",
            String::new(),
            "append /foo 8192\nsync\n".into(),
        ),
        (
            "write-C-inode+C-ind",
            String::new(),
            format!("{}sync\n", sparse("/A/foo")),
        ),
        (
            "write-C-data+C-ind",
            sparse_c.clone(),
            "write /C/s 327680 4096\nwrite /C/s 0 4096\nsync\n".into(),
        ),
        (
            "delete-create",
            String::new(),
            "unlink /A/bar\ncreat /C/n\nwrite /C/n 0 4096\nsync\n".into(),
        ),
        (
            "truncate-write",
            String::new(),
            "truncate /foo 0\ncreat /C/n\nwrite /C/n 0 16384\nsync\n".into(),
        ),
        (
            "unlink-link",
            String::new(),
            "unlink /A/bar\ncreat /B/n\nlink /B/n /C/l\nsync\n".into(),
        ),
    ];
    let parse = |text: &str| -> Vec<Op> {
        text.lines()
            .map(|l| parse_op(l).expect("the Table 3 scenarios parse"))
            .collect()
    };
    cases
        .iter()
        .map(|(name, setup, ops)| {
            let mut s = preset();
            s.extend(parse(setup));
            Sequence {
                name: format!("nofs-table3/{name}"),
                setup: s,
                ops: parse(ops),
            }
        })
        .collect()
}

/// Stream names the generators use: `default` (where a sequence starts),
/// then `s1`, `s2`.
const GEN_STREAMS: [&str; 3] = ["default", "s1", "s2"];

/// `ops` interleaved over 2 or 3 streams ([`WorkloadParams::streams`]),
/// from `rng` (drawn from only here, so the operations themselves are
/// those of the same seed without streams): before roughly one operation
/// in four the workload moves to another stream; a third of the fsyncs,
/// fdatasyncs and syncs become a `streamsync` of the current stream, and
/// one more `streamsync` follows roughly one operation in twenty. One move
/// in five to `s1` or `s2` turns that stream's `IGNORE_FSYNC` on, or back
/// off (`ignorefsync on|off`): its fsyncs then promise nothing.
fn with_streams(rng: &mut ChaCha8Rng, ops: Vec<Op>) -> Vec<Op> {
    // The flags are drawn from a generator of their own, so that the
    // interleaving is the one the same seed gave before they existed.
    let mut flags_rng = ChaCha8Rng::seed_from_u64(rng.clone().gen::<u64>() ^ 0x1f5c);
    let mut ignoring = [false; GEN_STREAMS.len()];
    let n = rng.gen_range(2..=3usize);
    let mut cur = 0usize;
    let mut out = Vec::with_capacity(ops.len() + ops.len() / 3);
    for op in ops {
        if rng.gen_range(0..4) == 0 {
            cur = (cur + rng.gen_range(1..n)) % n;
            out.push(Op::SetStream(GEN_STREAMS[cur].to_string()));
            // ccfs+: a stream other than the default one turns
            // IGNORE_FSYNC on (or back off) now and then.
            if cur != 0 && flags_rng.gen_range(0..5) == 0 {
                ignoring[cur] = !ignoring[cur];
                out.push(Op::IgnoreFsync(ignoring[cur]));
            }
        }
        let op = match op {
            Op::Fsync(_) | Op::Fdatasync(_) | Op::Sync if rng.gen_range(0..3) == 0 => {
                Op::Streamsync
            }
            op => op,
        };
        out.push(op);
        if rng.gen_range(0..20) == 0 {
            out.push(Op::Streamsync);
        }
    }
    out
}

/// The generator of [`with_streams`] for sequence `k` of a seeded
/// workload (`tag` tells the workloads apart).
fn streams_rng(seed: u64, k: usize, tag: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ (0x2545_f491 * (k as u64 + 1)) ^ tag ^ 0x7374_7265_616d)
}

/// Short sequences of several operations separated by osyncs, where the
/// order matters: a crash must keep a prefix of them, and the dsync at the
/// end makes them all durable.
pub fn osync_chains() -> Vec<Sequence> {
    let chains: [(&str, &str); 3] = [
        (
            "data-then-rename",
            "write /A/foo 0 8192\nosync /A/foo\nrename /A/foo /C/foo\nosync /C\n\
             append /C/foo 5000\ndsync /C/foo\n",
        ),
        (
            "create-write-link",
            "creat /B/new\nwrite /B/new 0 12288\nosync /B/new\nlink /B/new /A/new\n\
             osync /A\nunlink /A/bar\nosync /A\ndsync /B/new\n",
        ),
        (
            "overwrite-order",
            "write /foo 0 4096\nosync /foo\nwrite /A/bar 0 4096\nosync /A/bar\n\
             truncate /foo 100\nosync /foo\nwrite /foo 8192 4096\ndsync /foo\n",
        ),
    ];
    chains
        .iter()
        .map(|(name, text)| {
            let ops = text
                .lines()
                .map(|l| parse_op(l).expect("the osync chains parse"))
                .collect();
            Sequence {
                name: format!("seq1/osync-chain-{name}"),
                setup: preset(),
                ops,
            }
        })
        .collect()
}

/// seq-2: ordered pairs of core operations in three shapes, skipping
/// pairs the model rejects (e.g. unlink then rename of the same name):
///
/// - `a; p(a); b; p(b)` and the same with other persistence points (the
///   points that apply are cycled through, so every kind is used);
/// - `a; b; p(b)`: no persistence point between the two.
///
/// Sequences are taken in a diagonal order over the pairs, so that the
/// first `max` cover every first operation evenly.
pub fn seq2(max: usize) -> Vec<Sequence> {
    seq2_with(&WorkloadParams {
        seq2_max: max,
        ..WorkloadParams::default()
    })
}

/// [`seq2`] as `params` asks (at most [`WorkloadParams::seq2_max`]
/// sequences): with [`WorkloadParams::streams`] each pair is followed by
/// the same pair with its two operations in two streams (`s1`, `s2`),
/// each persistence point in the stream of the operation before it (in
/// the first shape; in the second `p(a)` becomes a `streamsync` of `a`'s
/// stream). Without it, exactly [`seq2`].
pub fn seq2_with(params: &WorkloadParams) -> Vec<Sequence> {
    let max = params.seq2_max;
    let ops = core_ops();
    let n = ops.len();
    let mut out = Vec::new();
    let set = |s: &str| Op::SetStream(s.to_string());
    'outer: for shape in 0..3 {
        for d in 0..n {
            for i in 0..n {
                let j = (i + d) % n;
                let (a, b) = (&ops[i], &ops[j]);
                let pa = persistence_points(a, false);
                let pb = persistence_points(b, false);
                let (la, opa) = &pa[(i + j + shape) % pa.len()];
                let (lb, opb) = &pb[(i + 2 * j + 1 + shape) % pb.len()];
                let (name, seq_ops, streamed) = if shape == 2 {
                    (
                        format!("seq2/{}/{}+{lb}", a.name, b.name),
                        vec![a.op.clone(), b.op.clone(), opb.clone()],
                        vec![
                            set("s1"),
                            a.op.clone(),
                            set("s2"),
                            b.op.clone(),
                            opb.clone(),
                        ],
                    )
                } else {
                    let pa_streamed = if shape == 1 {
                        Op::Streamsync
                    } else {
                        opa.clone()
                    };
                    (
                        format!("seq2/{}+{la}/{}+{lb}", a.name, b.name),
                        vec![a.op.clone(), opa.clone(), b.op.clone(), opb.clone()],
                        vec![
                            set("s1"),
                            a.op.clone(),
                            pa_streamed,
                            set("s2"),
                            b.op.clone(),
                            opb.clone(),
                        ],
                    )
                };
                let seq = Sequence {
                    name: name.clone(),
                    setup: preset(),
                    ops: seq_ops,
                };
                if validate(&seq).is_ok() && !out.iter().any(|s: &Sequence| s.ops == seq.ops) {
                    out.push(seq);
                    if out.len() >= max {
                        break 'outer;
                    }
                    if params.streams {
                        out.push(Sequence {
                            name: format!("{name}@s1,s2"),
                            setup: preset(),
                            ops: streamed,
                        });
                        if out.len() >= max {
                            break 'outer;
                        }
                    }
                }
            }
        }
    }
    out
}

/// A seeded random workload: `random_sequences` sequences of `random_ops`
/// operations each over a small namespace, with a persistence point after
/// roughly one operation in four.
pub fn random(params: &WorkloadParams) -> Vec<Sequence> {
    (0..params.random_sequences)
        .map(|k| {
            let mut rng = ChaCha8Rng::seed_from_u64(params.seed ^ (0x9e37_79b9 * (k as u64 + 1)));
            let mut ops = random_ops(&mut rng, params.random_ops, params.durability_calls);
            if params.streams {
                ops = with_streams(&mut streams_rng(params.seed, k, 0x72), ops);
            }
            Sequence {
                name: format!("random/{}#{k}", params.seed),
                setup: preset(),
                ops,
            }
        })
        .collect()
}

/// The setup of the `mix` workload: the preset tree and an empty directory
/// `/D` that the operations fill with long names until it needs more than
/// one block.
pub fn mix_setup() -> Vec<Op> {
    let mut s = preset();
    s.push(Op::Mkdir("/D".into()));
    s
}

/// Names in `/D`: 96 names of 60 bytes (68-byte entries) fill about 1.6
/// blocks of 4 KiB, so creates, links and renames there grow the
/// directory past its first block.
const MIX_BIG_NAMES: u32 = 96;

fn mix_big_name(k: u32) -> String {
    format!("/D/{}", mix_big_leaf(k))
}

fn mix_big_leaf(k: u32) -> String {
    format!("{k:03}-{}", "n".repeat(56))
}

/// Names of `/D` the kernel makes in the `htree` workload's base: 72 of
/// the 96 long names (about 4.8 KiB of entries, so the kernel indexes the
/// directory once it outgrows its first 4 KiB block), every third name
/// left out for creates to add.
fn htree_dir() -> KernelDir {
    KernelDir {
        path: "/D".into(),
        names: (0..MIX_BIG_NAMES)
            .filter(|k| k % 4 != 3)
            .map(mix_big_leaf)
            .collect(),
    }
}

/// The `mix` workload over a base image made by the kernel, whose `/D`
/// already holds 72 long names in an indexed (htree) directory: every
/// operation of `mix`, with the first change to `/D` converting the index
/// as ordo does (and as fast-commit replay does), under every crash.
pub fn htree(params: &WorkloadParams) -> Vec<Sequence> {
    let mut known = htree_dir().ops();
    known.extend(preset());
    (0..params.random_sequences)
        .map(|k| {
            let mut rng = ChaCha8Rng::seed_from_u64(
                params.seed ^ (0x7f4a_7c15 * (k as u64 + 1)) ^ 0x6874_7265,
            );
            let mut ops =
                mix_ops_from(&mut rng, params.random_ops, &known, params.durability_calls);
            if params.streams {
                ops = with_streams(&mut streams_rng(params.seed, k, 0x68), ops);
            }
            Sequence {
                name: format!("htree/{}#{k}", params.seed),
                setup: preset(),
                ops,
            }
        })
        .collect()
}

/// A seeded random workload over every operation the explorer knows:
/// creates, writes (aligned, unaligned, extending), appends, fallocate
/// (with and without KEEP_SIZE), punch, truncate up and down, hard links,
/// renames over existing names, directory renames (across directories and
/// over empty directories), mkdir/rmdir, symlinks, and many long names in
/// one directory (`/D`) so that it grows past one block; with a
/// persistence point after roughly one operation in five.
pub fn mix(params: &WorkloadParams) -> Vec<Sequence> {
    (0..params.random_sequences)
        .map(|k| {
            let mut rng = ChaCha8Rng::seed_from_u64(
                params.seed ^ (0x7f4a_7c15 * (k as u64 + 1)) ^ 0x006d_6978,
            );
            let mut ops = mix_ops(&mut rng, params.random_ops, params.durability_calls);
            if params.streams {
                ops = with_streams(&mut streams_rng(params.seed, k, 0x6d), ops);
            }
            Sequence {
                name: format!("mix/{}#{k}", params.seed),
                setup: mix_setup(),
                ops,
            }
        })
        .collect()
}

fn mix_ops(rng: &mut ChaCha8Rng, count: usize, durability_calls: bool) -> Vec<Op> {
    mix_ops_from(rng, count, &mix_setup(), durability_calls)
}

/// With `durability_calls`, an fsync or fdatasync becomes an osync with
/// probability 1/2, a dsync with probability 1/4 and a write-back tick
/// with probability 1/8, from one more draw of `rng`; without, `op` is
/// returned and `rng` is not touched (so the sequences of a seed stay what
/// they were).
fn with_durability_calls(rng: &mut ChaCha8Rng, op: Op, durability_calls: bool) -> Op {
    if !durability_calls {
        return op;
    }
    let path = match &op {
        Op::Fsync(p) | Op::Fdatasync(p) => p.clone(),
        _ => return op,
    };
    match rng.gen_range(0..8) {
        0..=3 => Op::Osync(path),
        4 | 5 => Op::Dsync(path),
        6 => Op::Writeback,
        _ => op,
    }
}

/// `mix`'s operations on a tree that `known` builds (the setup, and what
/// the base image already holds).
fn mix_ops_from(
    rng: &mut ChaCha8Rng,
    count: usize,
    known: &[Op],
    durability_calls: bool,
) -> Vec<Op> {
    const DIRS: [&str; 6] = ["/A", "/B", "/C", "/B/sub", "/A/d0", "/B/d1"];
    const NAMES: [&str; 5] = ["f1", "f2", "foo", "bar", "l"];
    const SUBDIRS: [&str; 6] = ["/A/d0", "/A/d1", "/B/d1", "/B/d2", "/C/d0", "/B/sub/d3"];
    let mut tree = Tree::new();
    let mut serial = 0u32;
    for op in known {
        serial += 1;
        tree.apply(op, serial).expect("the mix setup tree is valid");
    }
    let mut ops = Vec::new();
    let mut attempts = 0usize;
    while ops.len() < count && attempts < count * 50 {
        attempts += 1;
        let small = |rng: &mut ChaCha8Rng| {
            format!(
                "{}/{}",
                DIRS[rng.gen_range(0..DIRS.len())],
                NAMES[rng.gen_range(0..NAMES.len())]
            )
        };
        // One name in three is a long one in the big directory.
        let path = |rng: &mut ChaCha8Rng| {
            if rng.gen_range(0..3) == 0 {
                mix_big_name(rng.gen_range(0..MIX_BIG_NAMES))
            } else {
                small(rng)
            }
        };
        let subdir = |rng: &mut ChaCha8Rng| SUBDIRS[rng.gen_range(0..SUBDIRS.len())].to_string();
        let block = |rng: &mut ChaCha8Rng| rng.gen_range(0..12u64) * 4096;
        let op = match rng.gen_range(0..29) {
            0..=3 => Op::Creat(path(rng)),
            4 => Op::Mkdir(subdir(rng)),
            5 | 6 => {
                let unaligned = rng.gen_bool(0.3);
                let off = block(rng) + if unaligned { rng.gen_range(1..4096) } else { 0 };
                let len = if unaligned {
                    rng.gen_range(1..10000)
                } else {
                    4096 * rng.gen_range(1..4)
                };
                Op::Write {
                    path: path(rng),
                    off,
                    len,
                }
            }
            7 => Op::Append {
                path: path(rng),
                len: rng.gen_range(1..9000),
            },
            8 => Op::Falloc {
                path: path(rng),
                off: block(rng),
                len: 4096 * rng.gen_range(1..4),
                keep_size: rng.gen_bool(0.5),
            },
            9 => {
                let (p, off) = (path(rng), block(rng));
                shift_or_punch(rng, p, off)
            }
            10 => Op::Truncate {
                path: path(rng),
                size: rng.gen_range(0..50000),
            },
            11 | 12 => Op::Link {
                src: path(rng),
                dst: path(rng),
            },
            13 => Op::Unlink(path(rng)),
            14 | 15 => Op::Rename {
                src: path(rng),
                dst: path(rng),
            },
            // A directory moved across directories or over an empty one.
            16 => Op::Rename {
                src: subdir(rng),
                dst: subdir(rng),
            },
            17 => Op::Rmdir(subdir(rng)),
            18 => Op::Symlink {
                target: if rng.gen_bool(0.5) {
                    small(rng)
                } else {
                    // A slow symlink: a target longer than the inode holds.
                    format!("/{}", "t".repeat(rng.gen_range(60..200)))
                },
                path: path(rng),
            },
            19 => Op::Fsync(path(rng)),
            20 => Op::Fsync(if rng.gen_bool(0.5) {
                "/D".to_string()
            } else {
                DIRS[rng.gen_range(0..DIRS.len())].to_string()
            }),
            21 => Op::Fdatasync(path(rng)),
            22 => Op::Sync,
            // Attributes: in the inode, in a block shared by files with the
            // same set, past the inode's room, removed; ACLs on files and
            // default ACLs on directories that new files inherit.
            23 => Op::SetXattr {
                path: path(rng),
                name: ["user.a", "user.b", "security.c"][rng.gen_range(0..3)].into(),
                len: [0, 24, 700, 2000][rng.gen_range(0..4)],
            },
            24 => Op::RemoveXattr {
                path: path(rng),
                name: ["user.a", "user.b", "security.c"][rng.gen_range(0..3)].into(),
            },
            25 => Op::SetAcl {
                path: if rng.gen_bool(0.5) {
                    path(rng)
                } else {
                    DIRS[rng.gen_range(0..DIRS.len())].to_string()
                },
                uid: 1000 + rng.gen_range(0..2),
            },
            _ => Op::Creat(mix_big_name(rng.gen_range(0..MIX_BIG_NAMES))),
        };
        let op = with_durability_calls(rng, op, durability_calls);
        serial += 1;
        let mut trial = tree.clone();
        if trial.apply(&op, serial).is_ok() {
            tree = trial;
            ops.push(op);
        }
    }
    ops
}

/// A punch, a zeroed range, a collapse or an insert at block `off` of
/// `path` (the model refuses the ones ext4 would: a collapse must end
/// before the end of the file, an insert start before it).
fn shift_or_punch(rng: &mut ChaCha8Rng, path: String, off: u64) -> Op {
    let len = 4096 * rng.gen_range(1..3);
    match rng.gen_range(0..4) {
        0 => Op::Punch { path, off, len },
        1 => {
            let unaligned = rng.gen_bool(0.5);
            Op::Zero {
                path,
                off: off + if unaligned { rng.gen_range(1..4096) } else { 0 },
                len: if unaligned {
                    rng.gen_range(1..10000)
                } else {
                    len
                },
                keep_size: rng.gen_bool(0.5),
            }
        }
        2 => Op::Collapse { path, off, len },
        _ => Op::Insert { path, off, len },
    }
}

fn random_ops(rng: &mut ChaCha8Rng, count: usize, durability_calls: bool) -> Vec<Op> {
    const DIRS: [&str; 4] = ["/A", "/B", "/C", "/B/sub"];
    const NAMES: [&str; 4] = ["f1", "f2", "foo", "bar"];
    let mut tree = Tree::new();
    let mut serial = 0u32;
    for op in preset() {
        serial += 1;
        tree.apply(&op, serial).expect("the preset tree is valid");
    }
    let mut ops = Vec::new();
    let mut attempts = 0usize;
    while ops.len() < count && attempts < count * 50 {
        attempts += 1;
        let path = |rng: &mut ChaCha8Rng| {
            format!(
                "{}/{}",
                DIRS[rng.gen_range(0..DIRS.len())],
                NAMES[rng.gen_range(0..NAMES.len())]
            )
        };
        let block = |rng: &mut ChaCha8Rng| rng.gen_range(0..8u64) * 4096;
        let op = match rng.gen_range(0..19) {
            0 => Op::Creat(path(rng)),
            1 => Op::Mkdir(format!(
                "{}/d{}",
                DIRS[rng.gen_range(0..2)],
                rng.gen_range(0..3)
            )),
            2 | 3 => {
                let unaligned = rng.gen_bool(0.3);
                let off = block(rng) + if unaligned { rng.gen_range(1..4096) } else { 0 };
                let len = if unaligned {
                    rng.gen_range(1..10000)
                } else {
                    4096 * rng.gen_range(1..4)
                };
                Op::Write {
                    path: path(rng),
                    off,
                    len,
                }
            }
            4 => Op::Append {
                path: path(rng),
                len: rng.gen_range(1..9000),
            },
            5 => Op::Falloc {
                path: path(rng),
                off: block(rng),
                len: 4096 * rng.gen_range(1..3),
                keep_size: rng.gen_bool(0.5),
            },
            6 => {
                let (p, off) = (path(rng), block(rng));
                shift_or_punch(rng, p, off)
            }
            7 => Op::Truncate {
                path: path(rng),
                size: rng.gen_range(0..40000),
            },
            8 => Op::Link {
                src: path(rng),
                dst: path(rng),
            },
            9 => Op::Unlink(path(rng)),
            10 => Op::Rename {
                src: path(rng),
                dst: path(rng),
            },
            11 => Op::Rmdir(format!(
                "{}/d{}",
                DIRS[rng.gen_range(0..2)],
                rng.gen_range(0..3)
            )),
            12 => Op::Symlink {
                target: path(rng),
                path: path(rng),
            },
            13 => Op::Fsync(path(rng)),
            14 => Op::Fdatasync(path(rng)),
            15 => {
                const XNAMES: [&str; 3] = ["user.a", "user.b", "trusted.c"];
                const XLENS: [u64; 4] = [0, 20, 300, 1500];
                Op::SetXattr {
                    path: path(rng),
                    name: XNAMES[rng.gen_range(0..XNAMES.len())].into(),
                    len: XLENS[rng.gen_range(0..XLENS.len())],
                }
            }
            16 => Op::RemoveXattr {
                path: path(rng),
                name: ["user.a", "user.b", "trusted.c"][rng.gen_range(0..3)].into(),
            },
            17 => Op::SetAcl {
                path: if rng.gen_bool(0.5) {
                    path(rng)
                } else {
                    DIRS[rng.gen_range(0..DIRS.len())].to_string()
                },
                uid: 1000 + rng.gen_range(0..2),
            },
            _ => Op::Sync,
        };
        let op = with_durability_calls(rng, op, durability_calls);
        serial += 1;
        let mut trial = tree.clone();
        if trial.apply(&op, serial).is_ok() {
            tree = trial;
            ops.push(op);
        }
    }
    ops
}

/// The `random` workload on a full file system: the setup fills the
/// image (on the default 16 MiB image a 16 MiB write runs out of space and
/// is kept short) after a 16 KiB file `/pad`; the recorded part deletes
/// `/pad` and runs a `random` sequence, which soon runs out of space
/// again. Operations that get ENOSPC change nothing (a write may be cut
/// short), and the crash states must be as consistent as any others.
pub fn enospc(params: &WorkloadParams) -> Vec<Sequence> {
    let mut setup = preset();
    setup.extend([
        Op::Creat("/pad".into()),
        Op::Write {
            path: "/pad".into(),
            off: 0,
            len: 16 * 1024,
        },
        Op::Creat("/fill".into()),
        Op::Write {
            path: "/fill".into(),
            off: 0,
            len: 16 << 20,
        },
    ]);
    random(params)
        .into_iter()
        .map(|r| {
            let mut ops = vec![Op::Unlink("/pad".into())];
            ops.extend(r.ops);
            Sequence {
                name: r.name.replacen("random/", "enospc/", 1),
                setup: setup.clone(),
                ops,
            }
        })
        .collect()
}

/// Parse a scenario: one operation per line, `#` starts a comment, blank
/// lines are ignored. A line `---` separates the setup (above, made durable
/// before recording) from the recorded operations (below); without it the
/// whole file is recorded and the setup is empty. In the setup, the line
/// `preset` stands for the preset tree of the built-in workloads.
///
/// ```text
/// preset
/// ---
/// creat /A/x
/// write /A/x 0 4096        # path offset length
/// append /A/x 100          # path length
/// falloc /A/x 0 8192 [keep_size]
/// punch /A/x 0 4096
/// zero /A/x 100 5000 [keep_size]
/// insert /A/x 0 4096       # whole blocks, offset before the end
/// collapse /A/x 4096 4096  # whole blocks, ending before the end
/// truncate /A/x 10
/// link /A/x /B/y
/// rename /A/x /A/z
/// unlink /B/y
/// mkdir /D
/// rmdir /D
/// symlink /A/z /s          # target path
/// fsync /A/z               # file or directory
/// fdatasync /A/z
/// sync
/// osync /A/z               # ordering point, no promise
/// dsync /A/z               # durability, as fsync
/// setstream s1             # later operations run in stream s1 (ccfs)
/// streamsync               # the current stream made durable
/// ```
pub fn parse_scenario(name: &str, text: &str) -> Result<Sequence, CrashError> {
    let mut setup = Vec::new();
    let mut ops = Vec::new();
    let mut seen_separator = false;
    for (lineno, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |msg: String| CrashError::Workload(format!("{name}:{}: {msg}", lineno + 1));
        if line == "---" {
            if seen_separator {
                return Err(err("a second '---' separator".into()));
            }
            seen_separator = true;
            setup = std::mem::take(&mut ops);
            continue;
        }
        if line == "preset" {
            if seen_separator {
                return Err(err(
                    "'preset' is only allowed in the setup (above '---')".into()
                ));
            }
            ops.extend(preset());
            continue;
        }
        ops.push(parse_op(line).map_err(err)?);
    }
    Ok(Sequence {
        name: format!("scenario/{name}"),
        setup,
        ops,
    })
}

/// Parse one scenario line (already stripped of comments).
pub fn parse_op(line: &str) -> Result<Op, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let num = |i: usize| -> Result<u64, String> {
        let w = words
            .get(i)
            .ok_or_else(|| format!("'{}' needs more arguments", words[0]))?;
        w.parse::<u64>()
            .map_err(|_| format!("'{w}' is not a non-negative integer"))
    };
    let path = |i: usize| -> Result<String, String> {
        let w = words
            .get(i)
            .ok_or_else(|| format!("'{}' needs more arguments", words[0]))?;
        if !w.starts_with('/') {
            return Err(format!("'{w}' is not an absolute path"));
        }
        Ok(w.to_string())
    };
    let arity = |n: usize| -> Result<(), String> {
        if words.len() == n + 1 {
            Ok(())
        } else {
            Err(format!(
                "'{}' takes {n} argument(s), got {}",
                words[0],
                words.len() - 1
            ))
        }
    };
    let op = match words[0] {
        "creat" => {
            arity(1)?;
            Op::Creat(path(1)?)
        }
        "mkdir" => {
            arity(1)?;
            Op::Mkdir(path(1)?)
        }
        "write" => {
            arity(3)?;
            Op::Write {
                path: path(1)?,
                off: num(2)?,
                len: num(3)?,
            }
        }
        "append" => {
            arity(2)?;
            Op::Append {
                path: path(1)?,
                len: num(2)?,
            }
        }
        "falloc" => {
            let keep_size = match words.get(4) {
                None => false,
                Some(&"keep_size") => true,
                Some(w) => return Err(format!("unknown falloc flag '{w}' (known: keep_size)")),
            };
            if words.len() > 5 {
                return Err("'falloc' takes at most 4 arguments".into());
            }
            Op::Falloc {
                path: path(1)?,
                off: num(2)?,
                len: num(3)?,
                keep_size,
            }
        }
        "punch" => {
            arity(3)?;
            Op::Punch {
                path: path(1)?,
                off: num(2)?,
                len: num(3)?,
            }
        }
        "zero" => {
            let keep_size = match words.get(4) {
                None => false,
                Some(&"keep_size") => true,
                Some(w) => return Err(format!("unknown zero flag '{w}' (known: keep_size)")),
            };
            if words.len() > 5 {
                return Err("'zero' takes at most 4 arguments".into());
            }
            Op::Zero {
                path: path(1)?,
                off: num(2)?,
                len: num(3)?,
                keep_size,
            }
        }
        "collapse" => {
            arity(3)?;
            Op::Collapse {
                path: path(1)?,
                off: num(2)?,
                len: num(3)?,
            }
        }
        "insert" => {
            arity(3)?;
            Op::Insert {
                path: path(1)?,
                off: num(2)?,
                len: num(3)?,
            }
        }
        "truncate" => {
            arity(2)?;
            Op::Truncate {
                path: path(1)?,
                size: num(2)?,
            }
        }
        "link" => {
            arity(2)?;
            Op::Link {
                src: path(1)?,
                dst: path(2)?,
            }
        }
        "unlink" => {
            arity(1)?;
            Op::Unlink(path(1)?)
        }
        "rename" => {
            arity(2)?;
            Op::Rename {
                src: path(1)?,
                dst: path(2)?,
            }
        }
        "rmdir" => {
            arity(1)?;
            Op::Rmdir(path(1)?)
        }
        "symlink" => {
            arity(2)?;
            Op::Symlink {
                target: path(1)?,
                path: path(2)?,
            }
        }
        "setxattr" => {
            arity(3)?;
            Op::SetXattr {
                path: path(1)?,
                name: words[2].to_string(),
                len: num(3)?,
            }
        }
        "removexattr" => {
            arity(2)?;
            Op::RemoveXattr {
                path: path(1)?,
                name: words[2].to_string(),
            }
        }
        "setacl" => {
            arity(2)?;
            Op::SetAcl {
                path: path(1)?,
                uid: u32::try_from(num(2)?).map_err(|_| "uid out of range".to_string())?,
            }
        }
        "fsync" => {
            arity(1)?;
            Op::Fsync(path(1)?)
        }
        "fdatasync" => {
            arity(1)?;
            Op::Fdatasync(path(1)?)
        }
        "sync" => {
            arity(0)?;
            Op::Sync
        }
        "osync" => {
            arity(1)?;
            Op::Osync(path(1)?)
        }
        "writeback" => {
            arity(0)?;
            Op::Writeback
        }
        "dsync" => {
            arity(1)?;
            Op::Dsync(path(1)?)
        }
        "setstream" => {
            arity(1)?;
            let name = words[1];
            if name.len() > ordo_fs::stream::STREAM_NAME_MAX_BYTES {
                return Err(format!(
                    "stream name '{name}' is longer than {} bytes",
                    ordo_fs::stream::STREAM_NAME_MAX_BYTES
                ));
            }
            Op::SetStream(name.to_string())
        }
        "streamsync" => {
            arity(0)?;
            Op::Streamsync
        }
        "ignorefsync" => {
            arity(1)?;
            Op::IgnoreFsync(match words[1] {
                "on" => true,
                "off" => false,
                w => return Err(format!("ignorefsync takes 'on' or 'off', not '{w}'")),
            })
        }
        other => return Err(format!("unknown operation '{other}'")),
    };
    Ok(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_sequences_are_valid() {
        let s1 = seq1();
        assert!(s1.len() >= 40, "seq1 has {} sequences", s1.len());
        for s in &s1 {
            validate(s).unwrap();
        }
        let s2 = seq2(10_000);
        assert!(s2.len() > 200, "seq2 has {} sequences", s2.len());
        assert_eq!(seq2(17).len(), 17);
        assert_eq!(seq2(17), s2[..17].to_vec());
    }

    #[test]
    fn random_is_deterministic_by_seed() {
        let p = WorkloadParams {
            seed: 42,
            ..Default::default()
        };
        let a = random(&p);
        let b = random(&p);
        assert_eq!(a, b);
        assert_eq!(a[0].ops.len(), p.random_ops);
        let c = random(&WorkloadParams { seed: 43, ..p });
        assert_ne!(a, c);
        for s in &a {
            validate(s).unwrap();
        }
    }

    #[test]
    fn fuse_workloads_neither_collapse_nor_insert() {
        let shifts = |w: &Workload| {
            w.sequences
                .iter()
                .flat_map(|s| s.setup.iter().chain(&s.ops))
                .filter(|op| matches!(op, Op::Collapse { .. } | Op::Insert { .. }))
                .count()
        };
        let off = WorkloadParams {
            seed: 7,
            random_ops: 400,
            ..Default::default()
        };
        let on = WorkloadParams { fuse: true, ..off };
        for name in ["random", "mix", "seq1", "seq2"] {
            let plain = by_name(name, &off).unwrap();
            let fuse = by_name(name, &on).unwrap();
            assert!(shifts(&plain) > 0, "{name} shifts nothing without --fuse");
            assert_eq!(shifts(&fuse), 0, "{name} still shifts with --fuse");
            if matches!(name, "random" | "mix") {
                // Same sequences, the shifts replaced in place.
                assert_eq!(plain.sequences.len(), fuse.sequences.len());
                for (a, b) in plain.sequences.iter().zip(&fuse.sequences) {
                    assert_eq!(a.ops.len(), b.ops.len());
                }
            } else {
                assert!(fuse.sequences.len() < plain.sequences.len());
            }
        }
        let dir = std::env::temp_dir().join(format!("ordo-shift-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("shift.txt");
        std::fs::write(&path, "creat /f\nwrite /f 0 12288\ncollapse /f 0 4096\n").unwrap();
        let path = path.to_str().unwrap();
        assert!(by_name(path, &off).is_ok());
        let err = by_name(path, &on).unwrap_err().to_string();
        assert!(err.contains("EOPNOTSUPP"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mix_covers_every_operation_and_grows_a_directory() {
        let p = WorkloadParams {
            seed: 7,
            random_ops: 400,
            ..Default::default()
        };
        let a = mix(&p);
        assert_eq!(a, mix(&p));
        let mut kinds = std::collections::HashSet::new();
        let mut dir_renames = 0;
        let mut slow_symlinks = 0;
        for s in &a {
            validate(s).unwrap();
            assert_eq!(s.ops.len(), 400);
            for op in &s.ops {
                kinds.insert(std::mem::discriminant(op));
                match op {
                    Op::Rename { src, .. } if src.contains("/d") => dir_renames += 1,
                    Op::Symlink { target, .. } if target.len() > 59 => slow_symlinks += 1,
                    _ => {}
                }
            }
            // The big directory outgrows one 4 KiB block at some point.
            let mut tree = Tree::new();
            let mut serial = 0;
            let mut most = 0usize;
            for op in s.setup.iter().chain(&s.ops) {
                serial += 1;
                tree.apply(op, serial).unwrap();
                most = most.max(tree_names_under(&tree, "/D"));
            }
            assert!(most * 68 > 4096, "{}: at most {most} names in /D", s.name);
        }
        // Creat, Mkdir, Write, Append, Falloc, Punch, Zero, Collapse,
        // Insert, Truncate, Link, Unlink, Rename, Rmdir, Symlink, Fsync,
        // Fdatasync, Sync, SetXattr, RemoveXattr, SetAcl.
        assert_eq!(kinds.len(), 21, "every operation kind appears");
        assert!(dir_renames > 0 && slow_symlinks > 0);
    }

    fn tree_names_under(tree: &Tree, dir: &str) -> usize {
        let prefix = format!("{dir}/");
        tree.walk()
            .iter()
            .filter(|(p, _)| p.starts_with(&prefix) && !p[prefix.len()..].contains('/'))
            .count()
    }

    #[test]
    fn scenario_round_trips_through_display() {
        let text = "preset\n---\ncreat /A/x  # new\nwrite /A/x 0 4096\nappend /A/x 10\n\
                    falloc /A/x 0 8192 keep_size\npunch /A/x 0 4096\nzero /A/x 10 20 keep_size\n\
                    insert /A/x 0 4096\ncollapse /A/x 4096 4096\ntruncate /A/x 5\n\
                    link /A/x /B/y\nrename /A/x /A/z\nunlink /B/y\nmkdir /D\nrmdir /D\n\
                    symlink /A/z /s\nfsync /A/z\nfdatasync /A/z\nsync\nosync /A/z\n\
                    dsync /A\n";
        let s = parse_scenario("t", text).unwrap();
        assert_eq!(s.setup, preset());
        assert_eq!(s.ops.len(), 20);
        assert_eq!(s.ops[18], Op::Osync("/A/z".into()));
        assert_eq!(s.ops[19], Op::Dsync("/A".into()));
        assert!(!s.ops[18].is_persistence() && s.ops[19].is_persistence());
        let again: Vec<Op> = s
            .ops
            .iter()
            .map(|o| parse_op(&o.to_string()).unwrap())
            .collect();
        assert_eq!(again, s.ops);
        validate(&s).unwrap();
    }

    #[test]
    fn durability_calls_are_opt_in() {
        let off = WorkloadParams {
            seed: 5,
            random_ops: 200,
            ..Default::default()
        };
        let on = WorkloadParams {
            durability_calls: true,
            ..off
        };
        let calls = |seqs: &[Sequence]| {
            seqs.iter()
                .flat_map(|s| &s.ops)
                .filter(|o| matches!(o, Op::Osync(_) | Op::Dsync(_)))
                .count()
        };
        // Off: none, and seq1 is the plain one.
        for w in [random(&off), mix(&off), htree(&off), seq1_with(&off)] {
            assert_eq!(calls(&w), 0);
        }
        assert_eq!(seq1_with(&off), seq1());
        // On: both kinds, in valid sequences.
        for w in [random(&on), mix(&on), enospc(&on)] {
            let ops: Vec<&Op> = w.iter().flat_map(|s| &s.ops).collect();
            assert!(ops.iter().any(|o| matches!(o, Op::Osync(_))));
            assert!(ops.iter().any(|o| matches!(o, Op::Dsync(_))));
            assert!(ops.iter().any(|o| matches!(o, Op::Fsync(_))));
        }
        for s in random(&on).iter().chain(&mix(&on)) {
            validate(s).unwrap();
        }
        // seq1 keeps its plain sequences, in order, and adds osync / dsync
        // points and the chains, all valid and named apart.
        let plain = seq1();
        let with = seq1_with(&on);
        let kept: Vec<Sequence> = with
            .iter()
            .filter(|s| calls(std::slice::from_ref(*s)) == 0)
            .cloned()
            .collect();
        assert_eq!(kept, plain);
        assert!(with.len() > plain.len() + core_ops().len());
        let mut names = std::collections::HashSet::new();
        for s in &with {
            validate(s).unwrap();
            assert!(names.insert(s.name.clone()), "{} twice", s.name);
        }
        assert!(with.iter().any(|s| s.name == "seq1/rename+osync/A"));
        assert!(with.iter().any(|s| s.name.starts_with("seq1/osync-chain-")));
        let chains = osync_chains();
        assert!(chains
            .iter()
            .all(|c| matches!(c.ops.last(), Some(Op::Dsync(_)))
                && c.ops.iter().filter(|o| matches!(o, Op::Osync(_))).count() >= 2));
    }

    #[test]
    fn streams_are_opt_in() {
        let off = WorkloadParams {
            seed: 11,
            random_ops: 120,
            seq2_max: 200,
            ..Default::default()
        };
        let on = WorkloadParams {
            streams: true,
            ..off
        };
        let stream_ops = |seqs: &[Sequence]| {
            seqs.iter()
                .flat_map(|s| &s.ops)
                .filter(|o| matches!(o, Op::SetStream(_) | Op::Streamsync))
                .count()
        };
        // Off: none, and every workload is what it was.
        for w in [
            random(&off),
            mix(&off),
            htree(&off),
            enospc(&off),
            seq1_with(&off),
            seq2_with(&off),
        ] {
            assert_eq!(stream_ops(&w), 0);
        }
        assert_eq!(seq2_with(&off), seq2(200));
        // On: the same operations, interleaved over 2 or 3 streams, some
        // persistence points streamsyncs, all valid.
        let mut counts = std::collections::HashSet::new();
        for (plain, streamed, base) in [
            (random(&off), random(&on), Vec::new()),
            (mix(&off), mix(&on), Vec::new()),
            (htree(&off), htree(&on), htree_dir().ops()),
        ] {
            for (a, b) in plain.iter().zip(&streamed) {
                validate_on(&base, b).unwrap();
                let names: std::collections::HashSet<&str> = b
                    .ops
                    .iter()
                    .filter_map(|o| match o {
                        Op::SetStream(n) => Some(n.as_str()),
                        _ => None,
                    })
                    .chain(["default"])
                    .collect();
                assert!((2..=3).contains(&names.len()), "{names:?}");
                counts.insert(names.len());
                assert!(b.ops.contains(&Op::Streamsync));
                assert!(b.ops.iter().any(|o| matches!(o, Op::Fsync(_))));
                let changes = |s: &Sequence| -> Vec<Op> {
                    s.ops.iter().filter(|o| o.changes_tree()).cloned().collect()
                };
                assert_eq!(changes(a), changes(b));
            }
        }
        assert_eq!(counts.len(), 2, "2 and 3 streams both appear");
        // Some streams turn IGNORE_FSYNC on, and an fsync runs under it.
        let mut ignored_fsyncs = 0;
        for s in random(&on).iter().chain(&mix(&on)) {
            let mut ignoring: std::collections::HashSet<&str> = Default::default();
            let mut cur = "default";
            for o in &s.ops {
                match o {
                    Op::SetStream(n) => cur = n,
                    Op::IgnoreFsync(true) => {
                        ignoring.insert(cur);
                    }
                    Op::IgnoreFsync(false) => {
                        ignoring.remove(cur);
                    }
                    Op::Fsync(_) | Op::Fdatasync(_) if ignoring.contains(cur) => {
                        ignored_fsyncs += 1
                    }
                    _ => {}
                }
            }
        }
        assert!(ignored_fsyncs > 0, "no fsync ran under IGNORE_FSYNC");
        // seq2: each pair, then the pair in two streams.
        let s2 = seq2_with(&on);
        assert_eq!(s2.len(), 200);
        for pair in s2.chunks(2) {
            validate(&pair[1]).unwrap();
            assert_eq!(pair[1].name, format!("{}@s1,s2", pair[0].name));
            let changes = |s: &Sequence| -> Vec<Op> {
                s.ops.iter().filter(|o| o.changes_tree()).cloned().collect()
            };
            assert_eq!(changes(&pair[0]), changes(&pair[1]));
            assert_eq!(pair[1].ops[0], Op::SetStream("s1".into()));
        }
        assert_eq!(s2.iter().step_by(2).cloned().collect::<Vec<_>>(), seq2(100));
        // seq1 adds the named scenarios, which are valid and use streams.
        let s1 = seq1_with(&on);
        assert_eq!(s1.len(), seq1().len() + stream_scenarios().len());
        for s in stream_scenarios() {
            validate(&s).unwrap();
            assert!(s.ops.iter().any(|o| matches!(o, Op::SetStream(_))));
            assert!(s.ops.iter().any(|o| o.is_persistence()));
        }
        let w = by_name("streams", &off).unwrap();
        assert_eq!(w.sequences, stream_scenarios());
    }

    #[test]
    fn stream_ops_parse_and_print() {
        let s = parse_scenario(
            "t",
            "preset\n---\nsetstream s1\ncreat /A/x\nstreamsync\nsetstream default\nsync\n",
        )
        .unwrap();
        assert_eq!(s.ops[0], Op::SetStream("s1".into()));
        assert_eq!(s.ops[2], Op::Streamsync);
        assert!(s.ops[2].is_persistence() && !s.ops[0].is_persistence());
        assert!(!s.ops[0].changes_tree() && !s.ops[2].changes_tree());
        for op in &s.ops {
            assert_eq!(&parse_op(&op.to_string()).unwrap(), op);
        }
        validate(&s).unwrap();
        assert!(parse_op("setstream").is_err());
        assert!(parse_op("setstream a b").is_err());
        assert!(parse_op("streamsync x").is_err());
        assert!(parse_op(&format!("setstream {}", "n".repeat(256))).is_err());
    }

    #[test]
    fn scenario_errors_name_the_line() {
        let e = parse_scenario("t", "creat /a\nwrite /a x 1\n").unwrap_err();
        assert!(e.to_string().contains("t:2"), "{e}");
        let e = parse_scenario("t", "frobnicate /a\n").unwrap_err();
        assert!(e.to_string().contains("unknown operation"), "{e}");
        let s = parse_scenario("t", "creat /a\nunlink /b\n").unwrap();
        assert!(validate(&s).is_err());
    }
}
