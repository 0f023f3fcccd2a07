//! ccfs streams in the oracle: the trees a crash may leave when a protocol
//! keeps order per stream, not across streams
//! (`Capabilities::stream_prefix_after_crash`).
//!
//! A workload moves between streams with `setstream NAME` (operations
//! before any run in `default`). Of its operations, those that change the
//! tree (not fsync, fdatasync, sync, osync, dsync, write-back ticks,
//! setstream or streamsync, which only order or promise) form one sequence
//! per stream. A candidate is a [`Tuple`]: how many of each stream's
//! operations are in, that is a prefix of each stream's sequence. Its
//! tree is the base with the operations that are in applied in the order
//! the workload ran them. A candidate is valid when
//!
//! - it is closed under relations: if an operation that is in is related
//!   to an earlier operation of another stream, that one is in too
//!   ([`Analysis::related`], ccfs's relations: the same file or inode, the
//!   same name in the same directory, a node or directory the earlier one
//!   made), and
//! - the model applies every operation that is in (a subset that would
//!   unlink a name that is not there, say, is not a candidate).
//!
//! A crash state is judged against the valid candidates between a lower
//! bound, what the promises returned before the crash require
//! ([`Analysis::required_by`]), and an upper bound, every operation up to
//! the one in flight (which may be in or out). The trees of the
//! candidates are built on demand, from the nearest snapshot of the
//! recording that is a prefix of the candidate, and their digests cached
//! by tuple in [`Candidates`], which one recording's states share.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use crate::model::{Listing, NodeData, NodeId, Shape, Tree};
use crate::workload::Op;

/// The stream every operation before the first `setstream` runs in.
pub const DEFAULT_STREAM: &str = "default";

/// How many tree-changing operations of each stream a candidate keeps
/// (indexed as [`Analysis::names`]).
pub type Tuple = Vec<u32>;

/// Most candidate tuples one state is judged against (the box between its
/// lower and upper bound); a state with more is not judged
/// ([`Verdict::TooMany`]). Workloads of a few streams and tens of
/// operations between promises stay far below it.
pub const BOX_MAX: u64 = 16_384;

/// Most candidates whose trees are compared with a recovered tree that
/// matched none, to name the closest.
const CLOSEST_MAX: usize = 48;

/// Most tuples whose digest the cache of one recording keeps.
const CACHE_MAX: usize = 1 << 20;

/// What a sequence's operations are, stream by stream: streams, paths and
/// the relations between operations of different streams.
pub struct Analysis {
    ops: Vec<Op>,
    /// Stream names; `names[0]` is [`DEFAULT_STREAM`].
    names: Vec<String>,
    /// Stream of each operation (by 0-based position).
    stream_of: Vec<usize>,
    /// Per stream, the 1-based indices of its tree-changing operations.
    tree_ops: Vec<Vec<usize>>,
    /// What each operation changes, as model nodes (by 0-based position).
    touch: Vec<Touch>,
    /// The node an fsync, fdatasync or dsync names, as it ran (by 0-based
    /// position).
    synced: Vec<Option<NodeId>>,
    /// Whether an fsync or fdatasync ran in a stream with `IGNORE_FSYNC`
    /// on (by 0-based position): it only ordered, and bounds nothing.
    ignored: Vec<bool>,
    /// `need[s][m]`: the least tuple closed under the relations of the
    /// first `m` operations of stream `s` with earlier operations of other
    /// streams (its own entry is 0).
    need: Vec<Vec<Tuple>>,
    /// `prefix[k]`: the tuple of every operation up to `k` (1-based; `[0]`
    /// none).
    prefix: Vec<Tuple>,
}

fn norm(p: &str) -> String {
    let t = p.trim_end_matches('/');
    if t.is_empty() {
        "/".to_string()
    } else {
        t.to_string()
    }
}

/// The paths an operation names (both of link and rename; not a
/// symlink's target, which is only its content).
pub fn op_paths(op: &Op) -> Vec<String> {
    match op {
        Op::Link { src, dst } | Op::Rename { src, dst } => vec![norm(src), norm(dst)],
        Op::Creat(p)
        | Op::Mkdir(p)
        | Op::Unlink(p)
        | Op::Rmdir(p)
        | Op::Fsync(p)
        | Op::Fdatasync(p)
        | Op::Osync(p)
        | Op::Dsync(p) => vec![norm(p)],
        Op::Write { path, .. }
        | Op::Append { path, .. }
        | Op::Falloc { path, .. }
        | Op::Punch { path, .. }
        | Op::Zero { path, .. }
        | Op::Collapse { path, .. }
        | Op::Insert { path, .. }
        | Op::Truncate { path, .. }
        | Op::Symlink { path, .. }
        | Op::SetXattr { path, .. }
        | Op::RemoveXattr { path, .. }
        | Op::SetAcl { path, .. } => vec![norm(path)],
        Op::Sync | Op::Writeback | Op::SetStream(_) | Op::Streamsync | Op::IgnoreFsync(_) => {
            Vec::new()
        }
    }
}

/// What an operation changes, as nodes of the model (their ids in the
/// whole run): what ccfs's relations are about.
#[derive(Clone, Debug, Default)]
struct Touch {
    /// Nodes whose data, size, attributes or link count it changes
    /// (writes, attributes, link, unlink, rmdir, a rename replacing one).
    nodes: Vec<NodeId>,
    /// Directory entries it adds, removes or retargets, as (directory,
    /// name); a directory moved to another parent also changes its `..`.
    entries: Vec<(NodeId, Vec<u8>)>,
    /// The node it makes (creat, mkdir, symlink).
    made: Option<NodeId>,
}

impl Touch {
    /// What `op` changes, given the model's trees before and after it.
    fn of(op: &Op, before: &Tree, after: Option<&Tree>) -> Touch {
        let node = |p: &str| before.resolve(p);
        let entry = |p: &str| before.parent_of(p);
        let mut t = Touch::default();
        match op {
            Op::Write { path, .. }
            | Op::Append { path, .. }
            | Op::Falloc { path, .. }
            | Op::Punch { path, .. }
            | Op::Zero { path, .. }
            | Op::Collapse { path, .. }
            | Op::Insert { path, .. }
            | Op::Truncate { path, .. }
            | Op::SetXattr { path, .. }
            | Op::RemoveXattr { path, .. }
            | Op::SetAcl { path, .. } => t.nodes.extend(node(path)),
            Op::Creat(p) | Op::Mkdir(p) | Op::Symlink { path: p, .. } => {
                t.entries.extend(entry(p));
                t.made = after.and_then(|a| a.resolve(p));
            }
            Op::Link { src, dst } => {
                t.nodes.extend(node(src));
                t.entries.extend(entry(dst));
            }
            Op::Unlink(p) | Op::Rmdir(p) => {
                t.nodes.extend(node(p));
                t.entries.extend(entry(p));
            }
            Op::Rename { src, dst } => {
                let (from, to) = (entry(src), entry(dst));
                t.nodes.extend(node(dst));
                if let (Some(id), Some(f), Some(d)) = (node(src), &from, &to) {
                    let is_dir = before
                        .node(id)
                        .is_some_and(|n| matches!(n.data, NodeData::Dir { .. }));
                    if is_dir && f.0 != d.0 {
                        t.entries.push((id, b"..".to_vec()));
                    }
                }
                t.entries.extend(from);
                t.entries.extend(to);
            }
            _ => {}
        }
        t
    }

    /// Whether the operation changes node `n` for the promise of an fsync
    /// of `n`: its data, attributes or link count, an entry of directory
    /// `n`, or `n` itself made.
    fn touches(&self, n: NodeId) -> bool {
        self.nodes.contains(&n) || self.entries.iter().any(|(d, _)| *d == n) || self.made == Some(n)
    }

    /// Whether `later` is related to `self` (an earlier operation of
    /// another stream): they change one node or one entry, or `self` made
    /// the node `later` changes, or the directory `later` changes an
    /// entry of.
    fn relates(&self, later: &Touch) -> bool {
        self.nodes.iter().any(|n| later.nodes.contains(n))
            || self.entries.iter().any(|e| later.entries.contains(e))
            || self.made.is_some_and(|m| {
                later.nodes.contains(&m) || later.entries.iter().any(|(d, _)| *d == m)
            })
    }
}

/// `op`, which ran on tree `ran` in the whole sequence, with its paths
/// renamed to reach the same nodes in `tree` (a candidate's tree, where an
/// operation of another stream that renamed a directory on the way may be
/// left out): a node it changes by any path to it, an entry it adds or
/// removes by its directory's path. ccfs orders an operation after the
/// ones it is related to, not after whatever renamed the path it was
/// called with. `None` when a node or directory it names is not in
/// `tree` (its creation is left out).
fn at_nodes(op: &Op, ran: &Tree, tree: &Tree) -> Option<Op> {
    let mut paths: Option<HashMap<NodeId, String>> = None;
    let mut path_of = |id: NodeId| -> Option<String> {
        let map =
            paths.get_or_insert_with(|| tree.walk().into_iter().map(|(p, n)| (n, p)).collect());
        map.get(&id).cloned()
    };
    // A node's path in `tree` (unchanged when it resolves alike).
    let mut node = |p: &str| -> Option<String> {
        let id = ran.resolve(p)?;
        if tree.resolve(p) == Some(id) {
            return Some(p.to_string());
        }
        path_of(id)
    };
    let node_paths = |op: &Op, f: &mut dyn FnMut(&str) -> Option<String>| -> Option<Op> {
        let mut o = op.clone();
        match &mut o {
            Op::Write { path, .. }
            | Op::Append { path, .. }
            | Op::Falloc { path, .. }
            | Op::Punch { path, .. }
            | Op::Zero { path, .. }
            | Op::Collapse { path, .. }
            | Op::Insert { path, .. }
            | Op::Truncate { path, .. }
            | Op::SetXattr { path, .. }
            | Op::RemoveXattr { path, .. }
            | Op::SetAcl { path, .. } => *path = f(path)?,
            Op::Link { src, .. } => *src = f(src)?,
            _ => {}
        }
        Some(o)
    };
    let o = node_paths(op, &mut node)?;
    // An entry's path in `tree`: its directory's path and its name.
    let entry = |p: &str| -> Option<String> {
        let (dir, name) = ran.parent_of(p)?;
        if tree.parent_of(p).map(|(d, _)| d) == Some(dir) {
            return Some(p.to_string());
        }
        let map: HashMap<NodeId, String> = tree.walk().into_iter().map(|(p, n)| (n, p)).collect();
        let d = map.get(&dir)?;
        let name = String::from_utf8_lossy(&name);
        Some(if d == "/" {
            format!("/{name}")
        } else {
            format!("{d}/{name}")
        })
    };
    let mut o = o;
    match &mut o {
        Op::Creat(p) | Op::Mkdir(p) | Op::Unlink(p) | Op::Rmdir(p) => *p = entry(p)?,
        Op::Symlink { path, .. } => *path = entry(path)?,
        Op::Link { dst, .. } => *dst = entry(dst)?,
        Op::Rename { src, dst } => {
            *src = entry(src)?;
            *dst = entry(dst)?;
        }
        _ => {}
    }
    Some(o)
}

impl Analysis {
    /// Analyse `ops` (the recorded operations). `before(k)` is the model's
    /// tree before operation `k` (1-based), which says whether a rename
    /// moves a directory.
    pub fn new<'a>(ops: &[Op], before: impl Fn(usize) -> &'a Tree) -> Analysis {
        let mut names = vec![DEFAULT_STREAM.to_string()];
        let mut cur = 0usize;
        let mut stream_of = Vec::with_capacity(ops.len());
        let mut ignoring = vec![false];
        let mut ignored = Vec::with_capacity(ops.len());
        for op in ops {
            if let Op::SetStream(name) = op {
                cur = match names.iter().position(|n| n == name) {
                    Some(i) => i,
                    None => {
                        names.push(name.clone());
                        ignoring.push(false);
                        names.len() - 1
                    }
                };
            }
            if let Op::IgnoreFsync(on) = op {
                ignoring[cur] = *on;
            }
            ignored.push(matches!(op, Op::Fsync(_) | Op::Fdatasync(_)) && ignoring[cur]);
            stream_of.push(cur);
        }
        let ns = names.len();
        let mut tree_ops = vec![Vec::new(); ns];
        for (i, op) in ops.iter().enumerate() {
            if op.changes_tree() {
                tree_ops[stream_of[i]].push(i + 1);
            }
        }
        let synced: Vec<Option<NodeId>> = ops
            .iter()
            .enumerate()
            .map(|(i, op)| match op {
                Op::Fsync(p) | Op::Fdatasync(p) | Op::Dsync(p) => before(i + 1).resolve(p),
                _ => None,
            })
            .collect();
        let touch: Vec<Touch> = ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                if op.changes_tree() {
                    let after = (i + 2 <= ops.len() + 1).then(|| before(i + 2));
                    Touch::of(op, before(i + 1), after)
                } else {
                    Touch::default()
                }
            })
            .collect();
        let mut prefix = vec![vec![0u32; ns]];
        for (i, op) in ops.iter().enumerate() {
            let mut t = prefix[i].clone();
            if op.changes_tree() {
                t[stream_of[i]] += 1;
            }
            prefix.push(t);
        }
        let mut a = Analysis {
            ops: ops.to_vec(),
            names,
            stream_of,
            tree_ops,
            touch,
            synced,
            ignored,
            need: Vec::new(),
            prefix,
        };
        let mut need = Vec::with_capacity(ns);
        for s in 0..ns {
            let mut rows = vec![vec![0u32; ns]];
            for &k in &a.tree_ops[s] {
                let mut row = rows.last().expect("starts with a row").clone();
                for i in 1..k {
                    let si = a.stream_of[i - 1];
                    if si != s && a.related(i, k) {
                        row[si] = row[si].max(a.prefix[i][si]);
                    }
                }
                rows.push(row);
            }
            need.push(rows);
        }
        a.need = need;
        a
    }

    /// The streams, `default` first, then in order of first `setstream`.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The operations analysed.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The stream (index into [`Analysis::names`]) operation `k` (1-based)
    /// runs in.
    pub fn stream_of(&self, k: usize) -> usize {
        self.stream_of[k - 1]
    }

    /// The 1-based indices of the tree-changing operations of stream `s`.
    pub fn stream_ops(&self, s: usize) -> &[usize] {
        &self.tree_ops[s]
    }

    /// Whether operations `i < j` (1-based) are related, as ccfs defines
    /// it: they change the same file or inode (its data, size,
    /// attributes, link count), or an entry of the same name in the same
    /// directory, or `i` made the node `j` changes or the directory `j`
    /// adds, removes or renames an entry in. Paths are resolved in the
    /// model as each operation ran, so a name that moved is the same
    /// node. (Operations of one stream are ordered anyway.)
    pub fn related(&self, i: usize, j: usize) -> bool {
        if i >= j || i == 0 || j > self.ops.len() {
            return false;
        }
        self.touch[i - 1].relates(&self.touch[j - 1])
    }

    /// The tuple of every operation up to `k` (1-based; 0: none): the
    /// upper bound of a state whose operation in flight is `k`.
    pub fn prefix(&self, k: usize) -> &Tuple {
        &self.prefix[k.min(self.ops.len())]
    }

    /// Whether `t` is closed under the relations: every operation it
    /// keeps has the earlier operations of other streams it is related
    /// to kept too.
    pub fn is_closed(&self, t: &[u32]) -> bool {
        t.len() == self.names.len()
            && (0..t.len()).all(|s| {
                let row = &self.need[s][t[s] as usize];
                row.iter().zip(t).all(|(n, have)| n <= have)
            })
    }

    /// The least tuple closed under the relations that is at least `t`.
    pub fn close(&self, t: &[u32]) -> Tuple {
        let mut t = t.to_vec();
        loop {
            let mut changed = false;
            for s in 0..t.len() {
                let row = self.need[s][t[s] as usize].clone();
                for (x, n) in t.iter_mut().zip(row) {
                    if n > *x {
                        *x = n;
                        changed = true;
                    }
                }
            }
            if !changed {
                return t;
            }
        }
    }

    /// What the promise of operation `p` (1-based), returned, requires:
    /// for `sync` every operation before it; for `streamsync` in stream S
    /// every operation of S before it; for fsync, fdatasync or dsync of
    /// a path by stream S, S's operations before it and, of every other
    /// stream, its operations up to its last one before `p` that changed
    /// the node the path named when the fsync ran (its data, attributes
    /// or link count, an entry of it, or made it). Not closed under the
    /// relations ([`Analysis::close`]).
    pub fn required_by(&self, p: usize) -> Tuple {
        let ns = self.names.len();
        let mut t = vec![0u32; ns];
        let Some(op) = self.ops.get(p.wrapping_sub(1)) else {
            return t;
        };
        let s = self.stream_of(p);
        match op {
            Op::Sync => t = self.prefix[p - 1].clone(),
            Op::Streamsync => t[s] = self.prefix[p - 1][s],
            Op::Fsync(_) | Op::Fdatasync(_) if self.ignored[p - 1] => {}
            Op::Fsync(_) | Op::Fdatasync(_) | Op::Dsync(_) => {
                t[s] = self.prefix[p - 1][s];
                // The node the fsync named as it ran: an operation before
                // it under the same path may have reached another node.
                let Some(n) = self.synced[p - 1] else {
                    return t;
                };
                for (other, ops) in self.tree_ops.iter().enumerate() {
                    if other == s {
                        continue;
                    }
                    if let Some(pos) = ops
                        .iter()
                        .rposition(|&k| k < p && self.touch[k - 1].touches(n))
                    {
                        t[other] = pos as u32 + 1;
                    }
                }
            }
            _ => {}
        }
        t
    }

    /// The lower bound of a state whose returned promises were made by
    /// operations `promises` (1-based; 0, the base, requires nothing):
    /// what each requires, closed under the relations.
    pub fn lower_bound(&self, promises: &[usize]) -> Tuple {
        let mut t = vec![0u32; self.names.len()];
        for &p in promises {
            for (x, r) in t.iter_mut().zip(self.required_by(p)) {
                *x = (*x).max(r);
            }
        }
        self.close(&t)
    }

    /// The operations `t` keeps, in the order they ran (1-based).
    pub fn included(&self, t: &[u32]) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .tree_ops
            .iter()
            .zip(t)
            .flat_map(|(ops, &n)| ops[..(n as usize).min(ops.len())].iter().copied())
            .collect();
        v.sort_unstable();
        v
    }

    /// `t` for a report: each stream with operations, how many of them it
    /// keeps (and the last one kept), and the earlier operations it leaves
    /// out while keeping a later one (at most 8 named).
    pub fn describe(&self, t: &[u32]) -> String {
        const NAMED_MAX: usize = 8;
        let streams: Vec<String> = self
            .names
            .iter()
            .enumerate()
            .filter(|(s, _)| !self.tree_ops[*s].is_empty())
            .map(|(s, n)| {
                let kept = t[s] as usize;
                let of = self.tree_ops[s].len();
                match kept.checked_sub(1).map(|i| self.tree_ops[s][i]) {
                    Some(last) => format!("{n} {kept}/{of} to op {last}"),
                    None => format!("{n} 0/{of}"),
                }
            })
            .collect();
        let kept = self.included(t);
        let last = kept.last().copied().unwrap_or(0);
        let mut left_out: Vec<usize> = self
            .tree_ops
            .iter()
            .flatten()
            .copied()
            .filter(|&k| k < last && kept.binary_search(&k).is_err())
            .collect();
        left_out.sort_unstable();
        let mut out = format!("[{}]", streams.join(", "));
        if !left_out.is_empty() {
            let named: Vec<String> = left_out
                .iter()
                .take(NAMED_MAX)
                .map(|k| k.to_string())
                .collect();
            out += &format!(" without op(s) {}", named.join(","));
            if left_out.len() > NAMED_MAX {
                out += &format!(" and {} more", left_out.len() - NAMED_MAX);
            }
        }
        out
    }

    /// The largest `k` whose prefix tuple is at most `t`.
    fn covered_prefix(&self, t: &[u32]) -> usize {
        let le = |k: usize| self.prefix[k].iter().zip(t).all(|(a, b)| a <= b);
        // `le` holds for 0 and is monotone (prefix tuples only grow).
        let (mut lo, mut hi) = (0usize, self.ops.len());
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if le(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

/// How a recovered tree compares with the candidates of a state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It is the tree of this valid candidate.
    Match(Tuple),
    /// It is no valid candidate's tree: what is wrong, naming the closest.
    Mismatch(String),
    /// The state has more candidate tuples than [`BOX_MAX`]; not judged.
    TooMany(u64),
}

/// The candidates of one recorded sequence and their cached digests.
pub struct Candidates {
    analysis: Analysis,
    /// The model after each operation (`[0]` the base).
    snapshots: Vec<Arc<Tree>>,
    /// The node each operation made in the whole run (by 0-based position).
    created: Vec<Option<NodeId>>,
    /// Length of the setup (serials of the recorded operations follow it).
    setup_len: u32,
    /// Hash of every snapshot's file contents, by address.
    known: OnceLock<HashMap<usize, u64>>,
    /// The listing of every snapshot.
    listings: OnceLock<Vec<Listing>>,
    /// Digest of the tree of a tuple (`None`: the model refuses it).
    cache: Mutex<HashMap<Tuple, Option<u64>>>,
}

impl Candidates {
    /// The candidates of `ops`, recorded with model snapshots `snapshots`
    /// (`snapshots[k]` after operation `k`, `[0]` the base) after a setup
    /// of `setup_len` operations.
    pub fn new(ops: &[Op], snapshots: Vec<Arc<Tree>>, setup_len: u32) -> Candidates {
        assert_eq!(snapshots.len(), ops.len() + 1, "a snapshot per operation");
        let analysis = Analysis::new(ops, |k| &snapshots[k - 1]);
        let created = (1..=ops.len())
            .map(|k| {
                let (a, b) = (snapshots[k - 1].nodes.len(), snapshots[k].nodes.len());
                (b > a).then(|| b - 1)
            })
            .collect();
        Candidates {
            analysis,
            snapshots,
            created,
            setup_len,
            known: OnceLock::new(),
            listings: OnceLock::new(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The candidates of `ops` run on `base` (the tree after a setup of
    /// `setup_len` operations), snapshots made by the model: for tests
    /// and hand-built sequences. Errors if the model refuses an operation.
    pub fn from_ops(base: Tree, setup_len: u32, ops: &[Op]) -> Result<Candidates, String> {
        let mut t = base;
        let mut snapshots = vec![Arc::new(t.clone())];
        for (i, op) in ops.iter().enumerate() {
            t.apply(op, setup_len + i as u32 + 1)
                .map_err(|e| format!("operation {} '{op}': {e}", i + 1))?;
            snapshots.push(Arc::new(t.clone()));
        }
        Ok(Candidates::new(ops, snapshots, setup_len))
    }

    /// The analysis of the operations.
    pub fn analysis(&self) -> &Analysis {
        &self.analysis
    }

    fn known(&self) -> &HashMap<usize, u64> {
        self.known.get_or_init(|| {
            let mut h = HashMap::new();
            for t in &self.snapshots {
                for n in t.nodes.iter().flatten() {
                    if let NodeData::File { content } = &n.data {
                        h.entry(Arc::as_ptr(content) as usize)
                            .or_insert_with(|| crate::model::content_hash(content));
                    }
                }
            }
            h
        })
    }

    /// The listing of snapshot `k` (the tree after operation `k`).
    pub fn snapshot_listing(&self, k: usize) -> &Listing {
        let all = self.listings.get_or_init(|| {
            let known = self.known();
            self.snapshots
                .iter()
                .map(|t| t.listing_known(known))
                .collect()
        });
        &all[k]
    }

    /// The tree of `t` (closed or not): the operations it keeps applied in
    /// the order they ran, each node given the id it had in the whole run.
    /// An error says which operation the model refuses.
    pub fn tree(&self, t: &[u32]) -> Result<Tree, String> {
        let a = &self.analysis;
        if t.len() != a.names.len() {
            return Err(format!(
                "a tuple of {} streams, not {}",
                t.len(),
                a.names.len()
            ));
        }
        if t.iter()
            .zip(&a.tree_ops)
            .any(|(&n, ops)| n as usize > ops.len())
        {
            return Err("a tuple beyond a stream's operations".into());
        }
        let g = a.covered_prefix(t);
        let mut tree = (*self.snapshots[g]).clone();
        for k in a.included(t).into_iter().filter(|&k| k > g) {
            let op = &a.ops[k - 1];
            let placed = at_nodes(op, &self.snapshots[k - 1], &tree)
                .ok_or_else(|| format!("op {k} '{op}': a node it names is not there"))?;
            tree.apply_placed(&placed, self.setup_len + k as u32, self.created[k - 1])
                .map_err(|e| format!("op {k} '{op}': {e}"))?;
        }
        Ok(tree)
    }

    /// The listing of the tree of `t`, as [`Candidates::tree`].
    pub fn listing(&self, t: &[u32]) -> Result<Listing, String> {
        let g = self.analysis.covered_prefix(t);
        if self.analysis.prefix[g] == t {
            return Ok(self.snapshot_listing(g).clone());
        }
        Ok(self.tree(t)?.listing_known(self.known()))
    }

    /// The digest of the tree of `t` (`None`: the model refuses one of
    /// its operations), from the cache.
    fn digest(&self, t: &[u32]) -> Option<u64> {
        if let Some(d) = self.lock().get(t) {
            return *d;
        }
        let g = self.analysis.covered_prefix(t);
        let d = if self.analysis.prefix[g] == t {
            Some(self.snapshot_listing(g).digest)
        } else {
            self.tree(t)
                .ok()
                .map(|tree| tree.listing_known(self.known()).digest)
        };
        let mut cache = self.lock();
        if cache.len() < CACHE_MAX {
            cache.insert(t.to_vec(), d);
        }
        d
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Tuple, Option<u64>>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Judge `recovered` for a state whose operation in flight is `j` and
    /// whose returned promises were made by operations `promises`.
    pub fn check_state(&self, recovered: &Listing, promises: &[usize], j: usize) -> Verdict {
        let hi = self.analysis.prefix(j).clone();
        let lo = self.analysis.lower_bound(promises);
        self.check(recovered, &lo, &hi, |_, _| None)
    }

    /// Whether `recovered` is the tree of a valid candidate `t` with
    /// `lo <= t <= hi` (componentwise). The prefixes of the whole
    /// sequence (the model's snapshots, always closed) are tried first,
    /// from the latest; then every tuple of the box, from `hi` down.
    /// `detail(tree, path)` may add to the description of a file whose
    /// bytes differ from a close candidate's.
    pub fn check(
        &self,
        recovered: &Listing,
        lo: &[u32],
        hi: &[u32],
        mut detail: impl FnMut(&Tree, &str) -> Option<String>,
    ) -> Verdict {
        let a = &self.analysis;
        let within = |t: &[u32]| t.iter().zip(lo).zip(hi).all(|((x, l), h)| l <= x && x <= h);
        for k in (0..=a.ops.len()).rev() {
            if within(&a.prefix[k]) && self.snapshot_listing(k).same(recovered) {
                return Verdict::Match(a.prefix[k].clone());
            }
        }
        let size = lo
            .iter()
            .zip(hi)
            .try_fold(1u64, |acc, (l, h)| {
                if h < l {
                    Some(0)
                } else {
                    acc.checked_mul(u64::from(h - l) + 1)
                }
            })
            .unwrap_or(u64::MAX);
        if size > BOX_MAX {
            return Verdict::TooMany(size);
        }
        let mut valid: Vec<(Tuple, u64)> = Vec::new();
        if size > 0 {
            let mut t = hi.to_vec();
            'tuples: loop {
                if a.is_closed(&t) {
                    if let Some(d) = self.digest(&t) {
                        if d == recovered.digest
                            && self.listing(&t).is_ok_and(|l| l.same(recovered))
                        {
                            return Verdict::Match(t);
                        }
                        valid.push((t.clone(), d));
                    }
                }
                // The next tuple down (an odometer, the last stream fastest).
                let mut s = t.len();
                loop {
                    if s == 0 {
                        break 'tuples;
                    }
                    s -= 1;
                    if t[s] > lo[s] {
                        t[s] -= 1;
                        for (x, h) in t.iter_mut().zip(hi).skip(s + 1) {
                            *x = *h;
                        }
                        continue 'tuples;
                    }
                }
            }
        }
        Verdict::Mismatch(self.mismatch(recovered, lo, hi, valid, &mut detail))
    }

    /// The message for a recovered tree that is no candidate's: the bounds
    /// and the two closest distinct candidate trees.
    fn mismatch(
        &self,
        recovered: &Listing,
        lo: &[u32],
        hi: &[u32],
        mut valid: Vec<(Tuple, u64)>,
        detail: &mut impl FnMut(&Tree, &str) -> Option<String>,
    ) -> String {
        let a = &self.analysis;
        // Distinct trees, those keeping the most operations first.
        valid.sort_by_key(|(t, _)| std::cmp::Reverse(t.iter().map(|&x| x as u64).sum::<u64>()));
        let mut seen = HashSet::new();
        valid.retain(|(_, d)| seen.insert(*d));
        let count = valid.len();
        let mut closest: Vec<(usize, Tuple, Listing)> = valid
            .into_iter()
            .take(CLOSEST_MAX)
            .filter_map(|(t, _)| {
                let l = self.listing(&t).ok()?;
                Some((recovered.diff(&l).1, t, l))
            })
            .collect();
        closest.sort_by_key(|(n, t, _)| (*n, std::cmp::Reverse(t.iter().sum::<u32>())));
        let what = |s: Option<Shape>| s.map_or("nothing".to_string(), |s| s.to_string());
        let near: Vec<String> = closest
            .iter()
            .take(2)
            .map(|(n, t, l)| {
                let (first, _) = recovered.diff(l);
                match first {
                    Some((path, have, want)) => {
                        let both_files = matches!(
                            (have, want),
                            (Some(Shape::File { .. }), Some(Shape::File { .. }))
                        );
                        let more = if both_files {
                            self.tree(t).ok().and_then(|tree| detail(&tree, path))
                        } else {
                            None
                        };
                        format!(
                            "{}: {n} path(s) differ, first {path}: recovered {}, model {}{}",
                            a.describe(t),
                            what(have),
                            what(want),
                            more.unwrap_or_default()
                        )
                    }
                    None => format!("{}: equal", a.describe(t)),
                }
            })
            .collect();
        let bounds: Vec<String> = a
            .names
            .iter()
            .enumerate()
            .filter(|(s, _)| !a.tree_ops[*s].is_empty())
            .map(|(s, n)| {
                if lo[s] == hi[s] {
                    format!("{n} {}", lo[s])
                } else {
                    format!("{n} {}..={}", lo[s], hi[s])
                }
            })
            .collect();
        format!(
            "the recovered tree is not the model's after any per-stream prefix closed under \
             relations (operations kept per stream: {}; {count} distinct candidate tree(s)); \
             closest {}",
            bounds.join(", "),
            if near.is_empty() {
                "none (the model refuses every candidate)".to_string()
            } else {
                near.join("; ")
            }
        )
    }
}
