//! Recording: run a sequence on ordo and on the model, log the device I/O
//! and every promise.
//!
//! The setup runs on a fresh copy of the empty image and ends with a clean
//! unmount, so its result is the *base*: durable, and promised as a whole
//! (promise 0). The recorded operations then run on a [`Recorder`] over a
//! copy of the base. After each fsync / fdatasync / dsync / sync returns,
//! the recorder gets a mark naming the promise (an osync makes none), and
//! after every operation the model takes a snapshot, so the oracle knows
//! both what was promised and what the tree looked like after every
//! operation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ordo_dev::MemDevice;
use ordo_fs::{Creds, DataMode, FallocFlags, FileType, Fs, Ino, ProtocolKind, SetAttr};

use crate::backend;
use crate::error::CrashError;
use crate::fuse::FuseMount;
use crate::log::{LogEvent, Recorder};
use crate::model::{Applied, Listing, Node, NodeData, NodeId, Tree};
use crate::workload::{Op, Sequence};

/// What a promise covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Promised {
    /// Everything in the tree (the base after setup, and `sync`).
    All,
    /// A file's data and size after fsync / fdatasync; with fsync of a file
    /// created in this sequence also its name in its parent (`name`).
    File {
        node: NodeId,
        datasync: bool,
        /// Parent directory node and entry name, when the name is covered.
        name: Option<(NodeId, Vec<u8>)>,
    },
    /// A directory's entries after fsync of the directory.
    Dir { node: NodeId },
    /// Every operation stream `stream` ran before a streamsync, where
    /// other streams ran operations too (a streamsync after operations of
    /// its own stream only is [`Promised::All`]). The common checks take
    /// it for nothing; the stream-prefix hook
    /// ([`crate::oracle::StreamPrefix`]) checks it.
    Stream { stream: String },
}

/// One promise the workload received.
#[derive(Clone, Debug)]
pub struct Promise {
    /// Index of the operation after which it was made (0 = the base).
    pub op: usize,
    /// What it covers.
    pub what: Promised,
    /// For reports: "fsync /A/foo after op 2".
    pub label: String,
}

/// A recorded sequence: everything the oracle needs.
pub struct Recording {
    /// Index of the sequence in its workload.
    pub index: usize,
    /// The sequence.
    pub sequence: Sequence,
    /// The image after setup (clean).
    pub base: Arc<MemDevice>,
    /// The write log of the recorded operations (and of the mount before).
    pub events: Vec<LogEvent>,
    /// `snapshots[i]` is the model after operation `i` (`[0]` = the base).
    pub snapshots: Vec<Arc<Tree>>,
    /// `promises[0]` is the base; the others in the order they were made
    /// (the log's marks name them).
    pub promises: Vec<Promise>,
    /// Every version of every model node by inode, built on first use
    /// ([`Recording::versions_of`]).
    versions: std::sync::OnceLock<VersionIndex>,
    /// The [`Listing`] of every snapshot, built on first use
    /// ([`Recording::listing`]).
    listings: std::sync::OnceLock<Vec<Listing>>,
    /// Every name any directory of each inode ever held, with the first
    /// snapshot it appears in, built on first use
    /// ([`Recording::had_entry`]).
    entry_names: std::sync::OnceLock<EntryIndex>,
    /// Recorded operations ordo answered with ENOSPC (a full file system,
    /// the `enospc` workload).
    pub out_of_space: usize,
    /// Recorded through a FUSE mount: the kernel may have split a write
    /// into several requests (a page or `max_write` each), which ordo
    /// serves as separate operations.
    pub through_fuse: bool,
    /// The stream-prefix candidates of the recording, built on first use
    /// ([`Recording::stream_candidates`]).
    stream_candidates: std::sync::OnceLock<crate::streams::Candidates>,
}

/// inode -> node -> its distinct versions, each with the first snapshot
/// it appears in, in snapshot order.
type VersionIndex = HashMap<Ino, std::collections::BTreeMap<NodeId, Vec<(usize, Node)>>>;

/// inode -> entry name -> the first snapshot in which a directory node
/// holding that inode had it.
type EntryIndex = HashMap<Ino, HashMap<Vec<u8>, usize>>;

impl Recording {
    /// The model nodes that had inode `ino` in some snapshot `0..=j`, each
    /// with every version it had there (the oracle's candidates for what an
    /// inode of the recovered image may hold). The index is built once per
    /// recording, so a state costs a lookup instead of a scan of every
    /// snapshot.
    pub fn versions_of(&self, ino: Ino, j: usize) -> Vec<(NodeId, Vec<&Node>)> {
        let Some(by_node) = self.version_index().get(&ino) else {
            return Vec::new();
        };
        by_node
            .iter()
            .filter_map(|(&id, versions)| {
                let v: Vec<&Node> = versions
                    .iter()
                    .take_while(|(si, _)| *si <= j)
                    .map(|(_, n)| n)
                    .collect();
                (!v.is_empty()).then_some((id, v))
            })
            .collect()
    }

    /// The version index, built on the first call.
    fn version_index(&self) -> &VersionIndex {
        self.versions.get_or_init(|| {
            let mut idx: VersionIndex = HashMap::new();
            for (si, snap) in self.snapshots.iter().enumerate() {
                for (id, n) in snap.nodes.iter().enumerate() {
                    let Some(n) = n else { continue };
                    let v = idx.entry(n.ino).or_default().entry(id).or_default();
                    if !v.iter().any(|(_, old)| old == n) {
                        v.push((si, n.clone()));
                    }
                }
            }
            idx
        })
    }

    /// Whether a directory node that had inode `ino` in some snapshot
    /// `0..=j` had an entry `name` in one of its versions there: the
    /// names of [`Recording::versions_of`]`(ino, j)`'s directory versions,
    /// answered from an index built once per recording, so that a state
    /// does not gather every version's entries again.
    pub fn had_entry(&self, ino: Ino, name: &[u8], j: usize) -> bool {
        let index = self.entry_names.get_or_init(|| {
            let mut idx: EntryIndex = HashMap::new();
            for (ino, by_node) in self.version_index() {
                let names = idx.entry(*ino).or_default();
                // Several nodes may have held the inode: the earliest
                // snapshot of any of them counts.
                for (si, n) in by_node.values().flatten() {
                    for name in n.entries().into_iter().flat_map(|e| e.keys()) {
                        let first = names.entry(name.clone()).or_insert(*si);
                        *first = (*first).min(*si);
                    }
                }
            }
            idx
        });
        index
            .get(&ino)
            .and_then(|names| names.get(name))
            .is_some_and(|&first| first <= j.min(self.snapshots.len() - 1))
    }

    /// The [`Listing`] of `snapshots[k]` (the tree after operation `k`).
    /// Every snapshot's is built on the first call, each distinct file
    /// content hashed once, so a state costs a lookup.
    pub fn listing(&self, k: usize) -> &Listing {
        let all = self.listings.get_or_init(|| {
            let mut hashes = HashMap::new();
            self.snapshots
                .iter()
                .map(|t| t.listing_hashed(&mut hashes))
                .collect()
        });
        &all[k]
    }

    /// The candidate trees of the stream-prefix hook (every per-stream
    /// prefix of the recorded operations, closed under relations), with
    /// their cache: built on first use and shared by every state of the
    /// recording.
    pub fn stream_candidates(&self) -> &crate::streams::Candidates {
        self.stream_candidates.get_or_init(|| {
            crate::streams::Candidates::new(
                &self.sequence.ops,
                self.snapshots.clone(),
                self.sequence.setup.len() as u32,
            )
        })
    }
}

/// How to record.
#[derive(Clone, Copy, Debug)]
pub struct RecordParams {
    /// The protocol.
    pub mode: ProtocolKind,
    /// Its data mode.
    pub data: DataMode,
    /// Run the recorded operations through a FUSE mount of the file system
    /// instead of the library API.
    pub fuse: bool,
    /// With `fuse`: the kernel opens files without OPEN and RELEASE
    /// (`open_requests=off`).
    pub fuse_no_open: bool,
}

/// A clean image after a setup, and the model of its tree.
type SetupImage = (Arc<MemDevice>, Arc<Tree>);

/// Setup images shared between sequences with the same setup.
#[derive(Default)]
pub struct SetupCache {
    done: Mutex<HashMap<Vec<String>, SetupImage>>,
}

fn rec_err(seq: &Sequence, op: usize, text: &str, detail: impl ToString) -> CrashError {
    CrashError::Record {
        sequence: seq.name.clone(),
        op,
        text: text.to_string(),
        detail: detail.to_string(),
    }
}

/// Whether ordo's answer is ENOSPC.
fn is_enospc(e: &ordo_fs::FsError) -> bool {
    e.errno() == libc::ENOSPC
}

/// Run one operation on ordo and on the model. `serial` numbers it for
/// the data pattern. Returns what the model says it did.
///
/// A full file system (the `enospc` workload) may answer ENOSPC: the
/// operation then changed nothing, and the model keeps its tree (a write
/// that wrote some bytes before running out is a short write, and the
/// model applies those). `out_of_space` counts those answers: once there
/// was one, the workload's later operations may name what a failed one
/// would have made, and the model's refusal of one means it is skipped.
///
/// `exec` runs the operation on ordo (through the library or through a
/// FUSE mount) with the bytes a write stores, and returns the inode it
/// created, if any.
fn run_op(
    tree: &mut Tree,
    op: &Op,
    serial: u32,
    out_of_space: &mut usize,
    exec: impl FnOnce(Option<Payload>) -> Result<Option<u32>, OrdoErr>,
) -> Result<Applied, String> {
    let unchanged = Applied::Changed { created: None };
    let payload = tree.write_payload(op, serial);
    let mut next = tree.clone();
    let applied = match next.apply(op, serial) {
        Ok(a) => a,
        Err(_) if *out_of_space > 0 => return Ok(unchanged),
        Err(e) => return Err(format!("the model refuses it: {e}")),
    };
    let created_ino = match exec(payload) {
        Ok(v) => v,
        Err(OrdoErr::NoSpace { done }) => {
            *out_of_space += 1;
            if done == 0 {
                return Ok(unchanged);
            }
            // A short write: the model writes the same first bytes.
            let short = match op {
                Op::Write { path, off, .. } => Op::Write {
                    path: path.clone(),
                    off: *off,
                    len: done as u64,
                },
                Op::Append { path, .. } => Op::Append {
                    path: path.clone(),
                    len: done as u64,
                },
                _ => return Err(format!("ordo answered ENOSPC to {op} after {done} bytes")),
            };
            let mut next = tree.clone();
            let applied = next
                .apply(&short, serial)
                .map_err(|e| format!("the model refuses the short write {short}: {e}"))?;
            *tree = next;
            return Ok(applied);
        }
        Err(OrdoErr::Other(what, e)) => return Err(format!("ordo {what}: {e}")),
        Err(OrdoErr::Text(t)) => return Err(t),
    };
    if let (Applied::Changed { created: Some(id) }, Some(ino)) = (&applied, created_ino) {
        if let Some(Some(n)) = next.nodes.get_mut(*id) {
            n.ino = ino;
        }
    }
    *tree = next;
    Ok(applied)
}

/// What a write stores: the model's node, the offset, the bytes.
pub(crate) type Payload = (crate::model::NodeId, u64, Vec<u8>);

/// Why an operation failed on ordo.
pub(crate) enum OrdoErr {
    /// ENOSPC, after `done` bytes of a write.
    NoSpace { done: usize },
    /// Another error of the named call.
    Other(&'static str, ordo_fs::FsError),
    /// A path that did not resolve, or the like.
    Text(String),
}

impl From<String> for OrdoErr {
    fn from(t: String) -> Self {
        OrdoErr::Text(t)
    }
}

impl From<&str> for OrdoErr {
    fn from(t: &str) -> Self {
        OrdoErr::Text(t.to_string())
    }
}

/// Run `op` on ordo; returns the inode it created, if any.
fn run_on_ordo(fs: &Fs, op: &Op, payload: Option<Payload>) -> Result<Option<u32>, OrdoErr> {
    let creds = Creds::root();
    let ino_of = |path: &str| -> Result<u32, String> {
        fs.lookup_path(path)
            .map(|a| a.ino)
            .map_err(|e| format!("lookup {path}: {e}"))
    };
    let parent_of = |path: &str| -> Result<(u32, Vec<u8>), String> {
        let path = path.trim_end_matches('/');
        let idx = path.rfind('/').ok_or("relative path")?;
        let parent = if idx == 0 { "/" } else { &path[..idx] };
        Ok((ino_of(parent)?, path.as_bytes()[idx + 1..].to_vec()))
    };
    let fs_err = |what: &'static str, e: ordo_fs::FsError| {
        if is_enospc(&e) {
            OrdoErr::NoSpace { done: 0 }
        } else {
            OrdoErr::Other(what, e)
        }
    };
    let mut created_ino = None;
    match op {
        Op::Creat(p) => {
            let (dir, name) = parent_of(p)?;
            let a = fs
                .create(dir, &name, FileType::Regular, 0o644, 0, &creds)
                .map_err(|e| fs_err("create", e))?;
            created_ino = Some(a.ino);
        }
        Op::Mkdir(p) => {
            let (dir, name) = parent_of(p)?;
            let a = fs
                .mkdir(dir, &name, 0o755, &creds)
                .map_err(|e| fs_err("mkdir", e))?;
            created_ino = Some(a.ino);
        }
        Op::Symlink { target, path } => {
            let (dir, name) = parent_of(path)?;
            let a = fs
                .symlink(dir, &name, target.as_bytes(), &creds)
                .map_err(|e| fs_err("symlink", e))?;
            created_ino = Some(a.ino);
        }
        Op::Write { path, .. } | Op::Append { path, .. } => {
            let ino = ino_of(path)?;
            let (_, off, data) = payload.ok_or("no payload")?;
            let mut done = 0usize;
            while done < data.len() {
                let n = match fs.write(ino, off + done as u64, &data[done..]) {
                    Ok(n) => n,
                    Err(e) if is_enospc(&e) => return Err(OrdoErr::NoSpace { done }),
                    Err(e) => return Err(OrdoErr::Other("write", e)),
                };
                if n == 0 {
                    return Err("ordo write returned 0 bytes".into());
                }
                done += n as usize;
            }
        }
        Op::Falloc {
            path,
            off,
            len,
            keep_size,
        } => {
            let ino = ino_of(path)?;
            let flags = FallocFlags {
                keep_size: *keep_size,
                punch_hole: false,
                zero_range: false,
                collapse_range: false,
                insert_range: false,
            };
            fs.fallocate(ino, *off, *len, flags)
                .map_err(|e| fs_err("fallocate", e))?;
        }
        Op::Punch { path, off, len } => {
            let ino = ino_of(path)?;
            let flags = FallocFlags {
                keep_size: true,
                punch_hole: true,
                zero_range: false,
                collapse_range: false,
                insert_range: false,
            };
            fs.fallocate(ino, *off, *len, flags)
                .map_err(|e| fs_err("punch", e))?;
        }
        Op::Zero {
            path,
            off,
            len,
            keep_size,
        } => {
            let ino = ino_of(path)?;
            let flags = FallocFlags {
                keep_size: *keep_size,
                zero_range: true,
                ..FallocFlags::default()
            };
            fs.fallocate(ino, *off, *len, flags)
                .map_err(|e| fs_err("zero range", e))?;
        }
        Op::Collapse { path, off, len } => {
            let ino = ino_of(path)?;
            let flags = FallocFlags {
                collapse_range: true,
                ..FallocFlags::default()
            };
            fs.fallocate(ino, *off, *len, flags)
                .map_err(|e| fs_err("collapse range", e))?;
        }
        Op::Insert { path, off, len } => {
            let ino = ino_of(path)?;
            let flags = FallocFlags {
                insert_range: true,
                ..FallocFlags::default()
            };
            fs.fallocate(ino, *off, *len, flags)
                .map_err(|e| fs_err("insert range", e))?;
        }
        Op::Truncate { path, size } => {
            let ino = ino_of(path)?;
            let set = SetAttr {
                size: Some(*size),
                ..SetAttr::default()
            };
            fs.setattr(ino, &set).map_err(|e| fs_err("truncate", e))?;
        }
        Op::Link { src, dst } => {
            let ino = ino_of(src)?;
            let (dir, name) = parent_of(dst)?;
            fs.link(ino, dir, &name).map_err(|e| fs_err("link", e))?;
        }
        Op::Unlink(p) => {
            let (dir, name) = parent_of(p)?;
            fs.unlink(dir, &name).map_err(|e| fs_err("unlink", e))?;
        }
        Op::Rmdir(p) => {
            let (dir, name) = parent_of(p)?;
            fs.rmdir(dir, &name).map_err(|e| fs_err("rmdir", e))?;
        }
        Op::Rename { src, dst } => {
            let (sdir, sname) = parent_of(src)?;
            let (ddir, dname) = parent_of(dst)?;
            fs.rename(sdir, &sname, ddir, &dname, Default::default())
                .map_err(|e| fs_err("rename", e))?;
        }
        Op::SetXattr { path, name, len } => {
            let ino = ino_of(path)?;
            let v = crate::workload::xattr_value(name, *len);
            fs.setxattr(ino, name.as_bytes(), &v, 0, &creds)
                .map_err(|e| fs_err("setxattr", e))?;
        }
        Op::RemoveXattr { path, name } => {
            let ino = ino_of(path)?;
            fs.removexattr(ino, name.as_bytes(), &creds)
                .map_err(|e| fs_err("removexattr", e))?;
        }
        Op::SetAcl { path, uid } => {
            let ino = ino_of(path)?;
            let v = crate::workload::acl_value(*uid);
            fs.setxattr(ino, ordo_format::xattr::ACL_ACCESS_NAME, &v, 0, &creds)
                .map_err(|e| fs_err("setacl", e))?;
            if fs
                .getattr(ino)
                .map(|a| a.kind == FileType::Directory)
                .unwrap_or(false)
            {
                fs.setxattr(ino, ordo_format::xattr::ACL_DEFAULT_NAME, &v, 0, &creds)
                    .map_err(|e| fs_err("setacl -d", e))?;
            }
        }
        Op::Fsync(p) | Op::Fdatasync(p) => {
            let ino = ino_of(p)?;
            fs.fsync(ino, matches!(op, Op::Fdatasync(_)))
                .map_err(|e| fs_err("fsync", e))?;
        }
        Op::Sync => fs.sync().map_err(|e| fs_err("sync", e))?,
        Op::Writeback => fs.write_back().map_err(|e| fs_err("write-back", e))?,
        Op::Osync(p) => {
            let ino = ino_of(p)?;
            fs.osync(ino).map_err(|e| fs_err("osync", e))?;
        }
        Op::Dsync(p) => {
            let ino = ino_of(p)?;
            fs.dsync(ino).map_err(|e| fs_err("dsync", e))?;
        }
        // The calling thread's stream: the recorder runs every operation
        // of a sequence on one thread, on a mount of its own.
        Op::SetStream(name) => {
            fs.setstream(name.as_bytes())
                .map_err(|e| fs_err("setstream", e))?;
        }
        Op::Streamsync => fs
            .streamsync(fs.getstream())
            .map_err(|e| fs_err("streamsync", e))?,
        Op::IgnoreFsync(_) => {
            let flags = op.stream_flags().expect("ignorefsync sets flags");
            fs.set_stream_flags(fs.getstream(), flags)
                .map_err(|e| fs_err("ignorefsync", e))?;
        }
    }
    Ok(created_ino)
}

/// Which stream each recorded operation runs in, as [`record`] tracks it.
#[derive(Default)]
struct StreamTrack {
    /// The current stream's name (`None`: the default stream).
    current: Option<String>,
    /// Whether an operation changed the tree in a stream other than the
    /// current one since recording started.
    others_changed: bool,
    /// The streams operations changed the tree in.
    changed_in: std::collections::HashSet<String>,
    /// The streams with `IGNORE_FSYNC` on: their fsyncs promise nothing.
    ignoring: std::collections::HashSet<String>,
}

impl StreamTrack {
    fn current(&self) -> &str {
        self.current.as_deref().unwrap_or("default")
    }

    /// Note that `op` ran (after it ran).
    fn note(&mut self, op: &Op) {
        match op {
            Op::SetStream(name) => {
                self.current = Some(name.clone());
                self.others_changed = self.changed_in.iter().any(|s| s != name);
            }
            Op::IgnoreFsync(on) => {
                let cur = self.current().to_string();
                if *on {
                    self.ignoring.insert(cur);
                } else {
                    self.ignoring.remove(&cur);
                }
            }
            op if op.changes_tree() => {
                let cur = self.current().to_string();
                self.changed_in.insert(cur);
            }
            _ => {}
        }
    }
}

/// The promise an operation's result makes, if any: fsync, fdatasync and
/// dsync (the model's [`Applied::Fsync`]) promise their file or directory
/// (fsync and fdatasync not in a stream with `IGNORE_FSYNC` on),
/// sync everything, streamsync what its stream did (everything, if no
/// other stream changed anything); osync promises nothing.
fn promise_for(
    before: &Tree,
    after: &Tree,
    base: &Tree,
    applied: &Applied,
    op_index: usize,
    op: &Op,
    streams: &StreamTrack,
) -> Option<Promise> {
    let label = match &streams.current {
        Some(s) => format!("{op} (op {op_index}, stream {s})"),
        None => format!("{op} (op {op_index})"),
    };
    // ccfs+: an fsync in a stream with IGNORE_FSYNC only orders.
    if matches!(op, Op::Fsync(_) | Op::Fdatasync(_)) && streams.ignoring.contains(streams.current())
    {
        return None;
    }
    let what = match applied {
        Applied::Changed { .. } | Applied::Osync { .. } => return None,
        Applied::Sync => Promised::All,
        Applied::Streamsync if !streams.others_changed => Promised::All,
        Applied::Streamsync => Promised::Stream {
            stream: streams.current().to_string(),
        },
        Applied::Fsync {
            node,
            datasync,
            path,
        } => match after.node(*node).map(|n| &n.data) {
            Some(NodeData::Dir { .. }) => Promised::Dir { node: *node },
            _ => {
                // The name is covered for a file created in this sequence.
                let is_new = base.node(*node).is_none();
                let name = if is_new && !datasync {
                    before.parent_of(path)
                } else {
                    None
                };
                Promised::File {
                    node: *node,
                    datasync: *datasync,
                    name,
                }
            }
        },
    };
    Some(Promise {
        op: op_index,
        what,
        label,
    })
}

impl SetupCache {
    /// The clean image and model after `seq`'s setup, made once per
    /// distinct setup.
    fn get(
        &self,
        empty: &Arc<MemDevice>,
        seq: &Sequence,
        params: &RecordParams,
    ) -> Result<SetupImage, CrashError> {
        let key: Vec<String> = seq.setup.iter().map(|o| o.to_string()).collect();
        if let Some(hit) = self.lock().get(&key) {
            return Ok(hit.clone());
        }
        let dev = Arc::new(empty.snapshot());
        let fs = backend::mount(dev.clone(), params.mode, params.data, false)
            .map_err(|e| rec_err(seq, 0, "mount (setup)", e))?;
        let mut tree = Tree::new();
        import(&fs, &mut tree, crate::model::ROOT, ordo_fs::ROOT_INO, 0)
            .map_err(|e| rec_err(seq, 0, "reading the empty file system", e))?;
        let mut enospc_ops = 0;
        for (i, op) in seq.setup.iter().enumerate() {
            run_op(&mut tree, op, i as u32 + 1, &mut enospc_ops, |p| {
                run_on_ordo(&fs, op, p)
            })
            .map_err(|e| rec_err(seq, 0, &format!("setup: {op}"), e))?;
        }
        fs.unmount()
            .map_err(|e| rec_err(seq, 0, "unmount (setup)", e))?;
        let out = (Arc::new(dev.snapshot()), Arc::new(tree));
        self.lock().insert(key, out.clone());
        Ok(out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<String>, SetupImage>> {
        self.done.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Directory depth the import of mkfs's tree follows.
const IMPORT_DEPTH_MAX: usize = 8;

/// Add what mkfs created (lost+found) under `dir` to the model, so that the
/// oracle knows it.
fn import(fs: &Fs, tree: &mut Tree, dir: NodeId, ino: u32, depth: usize) -> Result<(), String> {
    if depth > IMPORT_DEPTH_MAX {
        return Err("directory tree too deep".into());
    }
    let mut cookie = 0;
    loop {
        let batch = fs
            .readdir(ino, cookie, 256)
            .map_err(|e| format!("readdir {ino}: {e}"))?;
        if batch.is_empty() {
            return Ok(());
        }
        let before = cookie;
        for e in batch {
            cookie = e.next_offset;
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let data = match e.kind {
                FileType::Directory => NodeData::Dir {
                    entries: Default::default(),
                },
                FileType::Regular => {
                    let size = fs.getattr(e.ino).map_err(|x| x.to_string())?.size;
                    let content = fs.read(e.ino, 0, size as u32).map_err(|x| x.to_string())?;
                    NodeData::File {
                        content: Arc::new(content),
                    }
                }
                FileType::Symlink => NodeData::Symlink {
                    target: fs.readlink(e.ino).map_err(|x| x.to_string())?,
                },
                other => return Err(format!("unexpected {other:?} in the empty file system")),
            };
            let id = tree.add_existing(dir, &e.name, e.ino, data);
            if e.kind == FileType::Directory {
                import(fs, tree, id, e.ino, depth + 1)?;
            }
        }
        if cookie == before {
            return Err(format!("readdir of inode {ino} does not advance"));
        }
    }
}

/// Record sequence `index` of a workload on a copy of `empty` (a freshly
/// made file system).
pub fn record(
    empty: &Arc<MemDevice>,
    setups: &SetupCache,
    index: usize,
    seq: &Sequence,
    params: &RecordParams,
) -> Result<Recording, CrashError> {
    if params.fuse {
        if let Some(why) = crate::fuse::refuses(seq) {
            return Err(CrashError::Workload(why));
        }
    }
    let (base, base_tree) = setups.get(empty, seq, params)?;
    let rec = Recorder::new(base.clone());
    let fs = Arc::new(
        backend::mount(rec.device(), params.mode, params.data, false)
            .map_err(|e| rec_err(seq, 0, "mount", e))?,
    );
    let mnt = if params.fuse {
        Some(
            FuseMount::with_open_requests(fs.clone(), !params.fuse_no_open)
                .map_err(|e| rec_err(seq, 0, "FUSE mount", e))?,
        )
    } else {
        None
    };
    if params.mode.caps().settle_with_sync {
        // Steady state: a mounted fast-commit file system has made a full
        // commit (the timer makes one every few seconds). The kernel's
        // rule, which ordo follows, makes every fsync before the first
        // full commit of a mount a full commit itself, so without this a
        // seq-1 sequence would never fast-commit. Its writes belong to op
        // 0, whose crash states promise the base tree.
        fs.sync()
            .map_err(|e| rec_err(seq, 0, "sync after mount", e))?;
    }
    let mut tree = (*base_tree).clone();
    let mut snapshots = vec![base_tree.clone()];
    let mut promises = vec![Promise {
        op: 0,
        what: Promised::All,
        label: "the base tree (clean unmount after setup)".into(),
    }];
    let mut enospc_ops = 0;
    let mut streams = StreamTrack::default();
    for (i, op) in seq.ops.iter().enumerate() {
        let op_index = i + 1;
        rec.set_op(op_index);
        let serial = (seq.setup.len() + op_index) as u32;
        let before = tree.clone();
        let applied = match &mnt {
            Some(m) => run_op(&mut tree, op, serial, &mut enospc_ops, |p| {
                crate::fuse::run_on_mount(m.path(), &fs, op, p)
            }),
            None => run_op(&mut tree, op, serial, &mut enospc_ops, |p| {
                run_on_ordo(&fs, op, p)
            }),
        }
        .map_err(|e| rec_err(seq, op_index, &op.to_string(), e))?;
        streams.note(op);
        if let Some(p) = promise_for(&before, &tree, &base_tree, &applied, op_index, op, &streams) {
            promises.push(p);
            rec.mark(promises.len() - 1);
        }
        snapshots.push(Arc::new(tree.clone()));
    }
    let events = rec.events();
    // The crash happens here: the file system is dropped without unmount
    // (the FUSE session goes first; it does not unmount the library's file
    // system, and anything written from now on is not in `events`).
    if let Some(m) = mnt {
        m.unmount()
            .map_err(|e| rec_err(seq, seq.ops.len(), "FUSE unmount", e))?;
    }
    drop(fs);
    Ok(Recording {
        index,
        sequence: seq.clone(),
        base,
        events,
        snapshots,
        promises,
        versions: std::sync::OnceLock::new(),
        listings: std::sync::OnceLock::new(),
        entry_names: std::sync::OnceLock::new(),
        out_of_space: enospc_ops,
        through_fuse: params.fuse,
        stream_candidates: std::sync::OnceLock::new(),
    })
}
