//! The NoFS property (`Capabilities::data_consistent_after_scan`,
//! `mode=backpointers`; Chidambaram et al., FAST '12, "Consistency Without
//! Ordering"): no ordering promise, but *data consistency* once the
//! scanners have run. Checked instead of tree equality and the repair
//! verdicts of the other protocols (`docs/CRASH.md`, section 4c).
//!
//! On every crash state:
//!
//! 1. The crash image is mounted read-write with the protocol and **no
//!    recovery pass**, and NoFS's scanners run: in one pass
//!    (`Fs::scan_to_end`) on half of the states, the metadata scanner in
//!    batches (`Fs::scan_step`, as the background thread runs it) on the
//!    other half (class `mount`, `recovery` when either fails).
//! 2. **Names**: the tree is walked from the root (readdir, then a lookup
//!    of every name). A lookup resolves or fails with ENOENT or EIO (a
//!    stale name the file system refuses); anything else is a failure
//!    (hook `nofs-access`). A name must be one its directory had (or
//!    `#INO`, an orphan the scanners linked back), and a reached inode,
//!    told by its number *and generation*, must be a file, directory or
//!    symlink of the workload of the same kind (class `foreign_data`).
//!    Stale names and a file reachable under two names are allowed.
//! 3. **Data**: every regular file reached is read block by block (one
//!    EIO block does not hide the others). A block that reads must hold,
//!    byte for byte, what some version of *that* model file (the node its
//!    inode number and generation name) held at that offset, zeros only
//!    where a version had zeros or ended (class `foreign_data`): old or new
//!    data, never another file's bytes or bytes never written. Its size is
//!    not larger than any size the file had.
//! 4. **Durability** (class `broken_promise`): every promise logged before
//!    the crash holds, against the window of versions from the promise to
//!    the operation in flight: a promised file's inode is still that file,
//!    its size and bytes are one of the window's (a block may read EIO
//!    only where an operation after the promise changed it), its
//!    attributes are one version's, and a covered name or directory entry
//!    that no later operation changed resolves to it.
//! 5. **Nothing is allocated twice** (hook `nofs-allocation`): new files
//!    in a fresh directory take inode numbers past every inode reached and
//!    then every free block (until ENOSPC, bounded), then every file
//!    verified in 3 must read the same bytes (or the same EIO) and every
//!    name resolve as before; the filler is deleted.
//! 6. **A clean unmount leaves a clean image**: ordo's fsck finds nothing
//!    at all (class `recovery`), and `e2fsck -fn` agrees when the state is
//!    sampled for it (classes `e2fsck`, `fsck_disagree`).
//!
//! Which model node an inode is: the inode tables of the base image and
//! of every write of the recording name, for each inode number, the
//! generation it had when written; the node is the one the model gave that
//! number at the operation the write belongs to ([`Identities`]). A reused
//! inode number therefore names two nodes, told apart by the generation.
//!
//! [`check_state`] runs the property on a state of any protocol (the
//! tests prove it fails on `async`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use ordo_dev::{BlockClass, BlockDevice, MemDevice};
use ordo_format::inode::off as inode_off;
use ordo_fs::{Attr, Creds, DirEntry, FileType, Fs, FsError, Ino, ROOT_INO};

use crate::backend;
use crate::log::EventKind;
use crate::model::{Node, NodeData, NodeId, Tree};
use crate::oracle::{self, CheckParams, Failure, FailureClass, Note};
use crate::pattern;
use crate::record::{Promised, Recording};
use crate::states::StateSpec;

/// Bound on a file the check reads (the workloads write at most 16 MiB).
const FILE_BYTES_MAX: u64 = 1 << 26;
/// Bound on entries read from one directory.
const DIR_ENTRIES_MAX: usize = 100_000;
/// The directory the filler goes in (under the root; `-N` appended if the
/// name is taken).
const FILL_DIR: &str = "nofs-fill";
/// Bound on filler files (each of the data phase holds up to
/// [`FILL_FILE_BYTES`]).
const FILL_FILES_MAX: usize = 512;
/// Bytes per filler write.
const FILL_CHUNK: usize = 256 << 10;
/// Bytes per filler file of the data phase.
const FILL_FILE_BYTES: u64 = 1 << 20;
/// The pattern file id of the filler: far above any model node id, so
/// that a filler byte in a verified file says where it came from.
const FILL_ID_BASE: u32 = 0xf111_0000;
/// The bytes every filler write stores: filler records (of offsets
/// `0..FILL_CHUNK`, wherever they go), made once.
fn fill_chunk() -> &'static [u8] {
    static CHUNK: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    CHUNK.get_or_init(|| pattern::fill(FILL_ID_BASE, 1, 0, FILL_CHUNK))
}

/// Mixed into the seed of the checking mount's random source (inode
/// generations).
const REBOOT_SEED: u64 = 0x6e6f_6673_7265_626f;

/// The attribute names the file system keeps for itself (backlinks), not
/// part of the model's attributes.
const PRIVATE_XATTR_PREFIX: &[u8] = b"trusted.ordo.";

/// Which model nodes an inode of an image may be: by inode number and
/// generation (`i_generation`), every node that number was written for.
pub struct Identities {
    by_gen: HashMap<(Ino, u32), BTreeSet<NodeId>>,
}

impl Identities {
    /// The identities of a recording: every inode in the base image's
    /// tables and in every inode-table write of the log, each matched to
    /// the node the model gave its number at the operation of the write
    /// (at the operation before, for an inode written with no links: the
    /// node an unlink in that operation removed).
    pub fn of(rec: &Recording) -> Result<Identities, String> {
        let tables = InodeTables::of(rec.base.as_ref())?;
        let inos: Vec<HashMap<Ino, NodeId>> = rec
            .snapshots
            .iter()
            .map(|t| {
                t.nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(id, n)| n.as_ref().map(|n| (n.ino, id)))
                    .filter(|&(ino, _)| ino != 0)
                    .collect()
            })
            .collect();
        let node_at = |ino: Ino, op: usize| {
            (0..=op.min(inos.len() - 1))
                .rev()
                .find_map(|s| inos[s].get(&ino).copied())
        };
        let mut by_gen: HashMap<(Ino, u32), BTreeSet<NodeId>> = HashMap::new();
        let mut note = |ino: Ino, raw: &[u8], op: usize| {
            let le16 = |o: usize| u16::from_le_bytes([raw[o], raw[o + 1]]);
            if le16(inode_off::MODE) == 0 {
                return;
            }
            let links = le16(inode_off::LINKS_COUNT);
            let g = inode_off::GENERATION;
            let generation = u32::from_le_bytes([raw[g], raw[g + 1], raw[g + 2], raw[g + 3]]);
            let op = if links == 0 { op.saturating_sub(1) } else { op };
            if let Some(id) = node_at(ino, op) {
                by_gen.entry((ino, generation)).or_default().insert(id);
            }
        };
        let bs = tables.bs;
        for b in tables.blocks() {
            let mut data = vec![0u8; bs];
            rec.base
                .read(b, &mut data, BlockClass::InodeTable)
                .map_err(|e| format!("inode table block {b}: {e}"))?;
            tables.each(b, &data, |ino, raw| note(ino, raw, 0));
        }
        for e in &rec.events {
            if let EventKind::Write(w) = &e.kind {
                for (k, chunk) in w.data.chunks_exact(bs).enumerate() {
                    tables.each(w.block + k as u64, chunk, |ino, raw| note(ino, raw, e.op));
                }
            }
        }
        Ok(Identities { by_gen })
    }

    /// The nodes inode `ino` with generation `generation` was written for.
    pub fn nodes(&self, ino: Ino, generation: u32) -> Option<&BTreeSet<NodeId>> {
        self.by_gen.get(&(ino, generation))
    }
}

/// Where the inode tables are.
struct InodeTables {
    /// First block of each group's table.
    starts: Vec<u64>,
    /// Blocks per table.
    len: u64,
    inodes_per_group: u32,
    inode_size: usize,
    bs: usize,
}

impl InodeTables {
    fn of(dev: &dyn BlockDevice) -> Result<InodeTables, String> {
        let bs = dev.block_size() as usize;
        let (sb, descs) = backend::raw_groups(dev)?;
        let starts = descs.iter().map(|d| d.inode_table).collect();
        Ok(InodeTables {
            starts,
            len: u64::from(sb.inode_table_blocks()),
            inodes_per_group: sb.inodes_per_group,
            inode_size: usize::from(sb.inode_size()),
            bs,
        })
    }

    fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.starts.iter().flat_map(|&s| s..s + self.len)
    }

    /// Every inode of table block `b` (holding `data`), if it is one.
    fn each(&self, b: u64, data: &[u8], mut f: impl FnMut(Ino, &[u8])) {
        let Some((g, k)) = self
            .starts
            .iter()
            .enumerate()
            .find(|(_, &s)| b >= s && b < s + self.len)
            .map(|(g, &s)| (g as u64, b - s))
        else {
            return;
        };
        let per_block = (self.bs / self.inode_size) as u64;
        for (i, raw) in data.chunks_exact(self.inode_size).enumerate() {
            let idx = k * per_block + i as u64;
            if idx >= u64::from(self.inodes_per_group) {
                break;
            }
            let ino = g * u64::from(self.inodes_per_group) + idx + 1;
            f(ino as Ino, raw);
        }
    }
}

/// A block of a file as read: its bytes, or the errno of the read.
type BlockRead = Result<Vec<u8>, i32>;

/// A regular file the walk reached and read.
struct Reached {
    path: String,
    ino: Ino,
    generation: u32,
    size: u64,
    blocks: Vec<BlockRead>,
}

/// A name the walk looked up, and what it resolved to: `(inode,
/// generation)` or the errno of a refused lookup.
struct Edge {
    parent: Ino,
    name: Vec<u8>,
    path: String,
    outcome: Result<(Ino, u32), i32>,
}

/// What the walk found.
#[derive(Default)]
struct Walked {
    files: Vec<Reached>,
    edges: Vec<Edge>,
    /// The largest inode number reached.
    max_ino: Ino,
}

/// Whether an error is one NoFS answers a stale name or block with.
fn refused(e: &FsError) -> bool {
    matches!(e.errno(), libc::ENOENT | libc::EIO)
}

fn join(dir: &str, name: &[u8]) -> String {
    if dir == "/" {
        format!("/{}", String::from_utf8_lossy(name))
    } else {
        format!("{dir}/{}", String::from_utf8_lossy(name))
    }
}

fn kind_of(n: &Node) -> FileType {
    match n.data {
        NodeData::File { .. } => FileType::Regular,
        NodeData::Dir { .. } => FileType::Directory,
        NodeData::Symlink { .. } => FileType::Symlink,
    }
}

/// `content`'s bytes `[off, off+len)`, zeros past its end.
fn padded(content: &[u8], off: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let start = (off as usize).min(content.len());
    let end = (off as usize + len).min(content.len());
    out[..end - start].copy_from_slice(&content[start..end]);
    out
}

/// The first offset of `data` (at file offset `off`) whose byte no
/// version of `contents` held there (zero past a version's end).
fn first_foreign(data: &[u8], off: u64, contents: &[Arc<Vec<u8>>]) -> Option<u64> {
    let whole = contents.iter().any(|c| {
        let start = (off as usize).min(c.len());
        let n = (c.len() - start).min(data.len());
        data[..n] == c[start..start + n] && ordo_dev::is_zero(&data[n..])
    });
    if whole {
        return None;
    }
    data.iter().enumerate().find_map(|(i, &b)| {
        let o = off as usize + i;
        (!contents.iter().any(|c| c.get(o).copied().unwrap_or(0) == b)).then_some(o as u64)
    })
}

/// What the bytes at `at` (file offset `off + at`) of `data` are.
fn describe(data: &[u8], off: u64, at: usize) -> String {
    match pattern::decode(data, off, off + at as u64) {
        Some(o) if o.file_id == FILL_ID_BASE => {
            "the filler's bytes (the block was allocated twice)".to_string()
        }
        Some(o) => format!(
            "bytes written by model file {} (write {}) for offset {}",
            o.file_id, o.write_seq, o.offset
        ),
        None if data[at..].iter().take(16).all(|&b| b == 0) => "zeros".to_string(),
        None => format!(
            "unrecognized bytes {:02x?}",
            &data[at..(at + 8).min(data.len())]
        ),
    }
}

/// One state's check.
struct Check<'a> {
    rec: &'a Recording,
    fs: &'a Fs,
    ids: &'a Identities,
    /// The operation in flight.
    j: usize,
    bs: u64,
    out: Vec<Failure>,
    notes: BTreeSet<Note>,
    /// Blocks read, by inode (a promise check reads what the walk read).
    reads: HashMap<Ino, Vec<BlockRead>>,
    /// Every inode the walk reached by a name from the root.
    reached: HashSet<Ino>,
}

impl Check<'_> {
    fn fail(&mut self, class: FailureClass, detail: String) {
        self.out.push(Failure::new(class, detail));
    }

    /// An error NoFS has no business returning.
    fn access(&mut self, detail: String) {
        self.fail(FailureClass::Hook, format!("nofs-access: {detail}"));
    }

    /// Every entry of directory `ino` but `.` and `..`.
    fn entries(&self, ino: Ino) -> Result<Vec<DirEntry>, Result<FsError, String>> {
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let batch = self.fs.readdir(ino, cookie, 256).map_err(Ok)?;
            if batch.is_empty() {
                return Ok(out);
            }
            let before = cookie;
            for e in batch {
                cookie = e.next_offset;
                if e.name != b"." && e.name != b".." {
                    out.push(e);
                }
            }
            if cookie == before {
                return Err(Err("readdir does not advance".into()));
            }
            if out.len() > DIR_ENTRIES_MAX {
                return Err(Err(format!("more than {DIR_ENTRIES_MAX} entries")));
            }
        }
    }

    /// File `ino` of `size` bytes, block by block (uncached).
    /// Reads that fail otherwise than with EIO are one failure per file
    /// (the first, and how many blocks).
    fn read_blocks(&mut self, what: &str, ino: Ino, size: u64) -> Vec<BlockRead> {
        let mut out = Vec::new();
        let mut off = 0;
        let mut bad: Option<(String, usize)> = None;
        while off < size {
            let want = (size - off).min(self.bs) as u32;
            match self.fs.read(ino, off, want) {
                Ok(d) if d.len() == want as usize => out.push(Ok(d)),
                Ok(d) => {
                    let n = bad.get_or_insert_with(|| {
                        (
                            format!(
                                "a read of {want} bytes at {off} (size {size}) returned {}",
                                d.len()
                            ),
                            0,
                        )
                    });
                    n.1 += 1;
                    out.push(Err(0));
                }
                Err(e) if e.errno() == libc::EIO => {
                    self.notes.insert(Note::NofsReadEio);
                    out.push(Err(libc::EIO));
                }
                Err(e) => {
                    let n = bad.get_or_insert_with(|| (format!("read at {off}: {e}"), 0));
                    n.1 += 1;
                    out.push(Err(e.errno()));
                }
            }
            off += self.bs;
        }
        if let Some((first, n)) = bad {
            let more = if n > 1 {
                format!(" ({n} blocks fail so)")
            } else {
                String::new()
            };
            self.access(format!("{what}: {first}{more}"));
        }
        out
    }

    /// [`Check::read_blocks`], once per inode.
    fn blocks_of(&mut self, what: &str, ino: Ino, size: u64) -> Vec<BlockRead> {
        if let Some(b) = self.reads.get(&ino) {
            if b.len() as u64 == size.div_ceil(self.bs) {
                return b.clone();
            }
        }
        let b = self.read_blocks(what, ino, size);
        self.reads.insert(ino, b.clone());
        b
    }

    /// The model nodes `attr` may be (by number and generation, existing
    /// by the operation in flight, of its kind), or the failure.
    fn identity(&mut self, path: &str, attr: &Attr) -> Option<Vec<NodeId>> {
        let Some(set) = self.ids.nodes(attr.ino, attr.generation) else {
            self.fail(
                FailureClass::ForeignData,
                format!(
                    "{path}: inode {} with generation {:#x} was never written for a file of the workload",
                    attr.ino, attr.generation
                ),
            );
            return None;
        };
        let cands: Vec<(NodeId, FileType)> = self
            .rec
            .versions_of(attr.ino, self.j)
            .into_iter()
            .filter(|(id, _)| set.contains(id))
            .map(|(id, v)| (id, kind_of(v[0])))
            .collect();
        if cands.is_empty() {
            self.fail(
                FailureClass::ForeignData,
                format!(
                    "{path}: inode {} (generation {:#x}) is model node(s) {set:?}, none of which existed by op {}",
                    attr.ino, attr.generation, self.j
                ),
            );
            return None;
        }
        let same: Vec<NodeId> = cands
            .iter()
            .filter(|(_, k)| *k == attr.kind)
            .map(|&(id, _)| id)
            .collect();
        if same.is_empty() {
            self.fail(
                FailureClass::ForeignData,
                format!(
                    "{path}: inode {} is a {:?}, model node {} is a {:?}",
                    attr.ino, attr.kind, cands[0].0, cands[0].1
                ),
            );
            return None;
        }
        Some(same)
    }

    /// The distinct versions of node `id` (inode `ino`) up to the
    /// operation in flight.
    fn versions(&self, ino: Ino, id: NodeId) -> Vec<&Node> {
        self.rec
            .versions_of(ino, self.j)
            .into_iter()
            .find(|(n, _)| *n == id)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    /// Steps 2 and 3: walk, resolve, read.
    fn walk(&mut self) -> Walked {
        let mut w = Walked::default();
        let root = match self.fs.getattr(ROOT_INO) {
            Ok(a) => a,
            Err(e) => {
                self.access(format!("getattr of the root: {e}"));
                return w;
            }
        };
        let Some(root_nodes) = self.identity("/", &root) else {
            return w;
        };
        let mut queue = VecDeque::from([("/".to_string(), ROOT_INO, root_nodes)]);
        let mut visited = HashSet::from([ROOT_INO]);
        while let Some((path, dir, nodes)) = queue.pop_front() {
            let entries = match self.entries(dir) {
                Ok(e) => e,
                Err(Ok(e)) if e.errno() == libc::EIO => {
                    self.notes.insert(Note::NofsReadEio);
                    continue;
                }
                Err(Ok(e)) => {
                    self.access(format!("{path}: readdir: {e}"));
                    continue;
                }
                Err(Err(e)) => {
                    self.access(format!("{path}: {e}"));
                    continue;
                }
            };
            let had: HashSet<Vec<u8>> = nodes
                .iter()
                .flat_map(|&id| self.versions(dir, id))
                .filter_map(|n| n.entries())
                .flat_map(|e| e.keys().cloned())
                .collect();
            for e in entries {
                let cpath = join(&path, &e.name);
                let attr = match self.fs.lookup(dir, &e.name) {
                    Ok(a) => a,
                    Err(err) if refused(&err) => {
                        self.notes.insert(Note::NofsLookupRefused);
                        w.edges.push(Edge {
                            parent: dir,
                            name: e.name.clone(),
                            path: cpath,
                            outcome: Err(err.errno()),
                        });
                        continue;
                    }
                    Err(err) => {
                        self.access(format!("lookup {cpath}: {err}"));
                        continue;
                    }
                };
                w.edges.push(Edge {
                    parent: dir,
                    name: e.name.clone(),
                    path: cpath.clone(),
                    outcome: Ok((attr.ino, attr.generation)),
                });
                w.max_ino = w.max_ino.max(attr.ino);
                self.reached.insert(attr.ino);
                if attr.ino != e.ino {
                    self.access(format!(
                        "{cpath}: readdir names inode {}, lookup resolves to inode {}",
                        e.ino, attr.ino
                    ));
                }
                if e.name == format!("#{}", attr.ino).as_bytes() {
                    self.notes.insert(Note::NofsOrphanRelinked);
                } else if !had.contains(&e.name) {
                    self.fail(
                        FailureClass::ForeignData,
                        format!(
                            "{path}: entry '{}' the directory never had",
                            String::from_utf8_lossy(&e.name)
                        ),
                    );
                }
                let Some(cnodes) = self.identity(&cpath, &attr) else {
                    continue;
                };
                match attr.kind {
                    FileType::Directory => {
                        if visited.insert(attr.ino) {
                            queue.push_back((cpath, attr.ino, cnodes));
                        }
                    }
                    FileType::Regular => {
                        if let Some(r) = self.check_file(&cpath, &attr, &cnodes) {
                            w.files.push(r);
                        }
                    }
                    FileType::Symlink => self.check_symlink(&cpath, &attr, &cnodes),
                    other => self.fail(
                        FailureClass::ForeignData,
                        format!("{cpath}: unexpected file type {other:?}"),
                    ),
                }
            }
        }
        w
    }

    /// Step 3 for one file: every block that reads is one version's of
    /// one of `nodes` (the same node for every block).
    fn check_file(&mut self, path: &str, attr: &Attr, nodes: &[NodeId]) -> Option<Reached> {
        let what = format!("{path} (inode {})", attr.ino);
        if attr.size > FILE_BYTES_MAX {
            self.fail(
                FailureClass::ForeignData,
                format!("{what}: size {} is beyond anything written", attr.size),
            );
            return None;
        }
        let blocks = self.blocks_of(&what, attr.ino, attr.size);
        let per_node: Vec<(NodeId, Vec<Arc<Vec<u8>>>)> = nodes
            .iter()
            .map(|&id| {
                let mut contents: Vec<Arc<Vec<u8>>> = Vec::new();
                for c in self
                    .versions(attr.ino, id)
                    .into_iter()
                    .filter_map(|n| n.content())
                {
                    if !contents.iter().any(|d| Arc::ptr_eq(d, c) || d == c) {
                        contents.push(c.clone());
                    }
                }
                (id, contents)
            })
            .collect();
        let max_len = per_node
            .iter()
            .flat_map(|(_, c)| c.iter().map(|c| c.len() as u64))
            .max()
            .unwrap_or(0);
        if attr.size > max_len {
            self.fail(
                FailureClass::ForeignData,
                format!(
                    "{what}: size {} is larger than any size the file had ({max_len})",
                    attr.size
                ),
            );
        }
        let bad = |contents: &[Arc<Vec<u8>>]| {
            blocks.iter().enumerate().find_map(|(lblk, b)| {
                let data = b.as_ref().ok()?;
                let off = lblk as u64 * self.bs;
                first_foreign(data, off, contents).map(|o| (lblk, off, o))
            })
        };
        let verdicts: Vec<Option<(usize, u64, u64)>> =
            per_node.iter().map(|(_, c)| bad(c)).collect();
        if !verdicts.iter().any(|v| v.is_none()) {
            if let Some((lblk, off, o)) = verdicts[0] {
                let data = blocks[lblk].as_ref().expect("a block that read");
                self.fail(
                    FailureClass::ForeignData,
                    format!(
                        "{what}: block {lblk}, offset {o} holds {}, never model file {}'s there",
                        describe(data, off, (o - off) as usize),
                        per_node[0].0
                    ),
                );
            }
        }
        Some(Reached {
            path: path.to_string(),
            ino: attr.ino,
            generation: attr.generation,
            size: attr.size,
            blocks,
        })
    }

    fn check_symlink(&mut self, path: &str, attr: &Attr, nodes: &[NodeId]) {
        let targets: Vec<Vec<u8>> = nodes
            .iter()
            .flat_map(|&id| self.versions(attr.ino, id))
            .filter_map(|n| match &n.data {
                NodeData::Symlink { target } => Some(target.clone()),
                _ => None,
            })
            .collect();
        match self.fs.readlink(attr.ino) {
            Ok(t) if targets.contains(&t) => {}
            Ok(t) => self.fail(
                FailureClass::ForeignData,
                format!(
                    "{path}: symlink target '{}' was never written",
                    String::from_utf8_lossy(&t)
                ),
            ),
            Err(e) if e.errno() == libc::EIO => {
                self.notes.insert(Note::NofsReadEio);
            }
            Err(e) => self.access(format!("{path}: readlink: {e}")),
        }
    }

    /// Step 4: the promises logged before the crash.
    fn promises(&mut self, state: &StateSpec) {
        let rec = self.rec;
        for idx in oracle::promises_to_check(rec, state) {
            let promise = &rec.promises[idx];
            let w = oracle::Window::of(rec, promise.op, self.j);
            let win = w.trees;
            let mut broken = Vec::new();
            match &promise.what {
                Promised::All => {
                    for (path, node) in win[0].walk() {
                        match win[0].node(node).map(|n| &n.data) {
                            Some(NodeData::File { .. }) => {
                                self.promised_file(&w, node, &path, None, &mut broken)
                            }
                            Some(NodeData::Dir { .. }) => {
                                self.promised_dir(win, node, &path, &mut broken)
                            }
                            _ => {}
                        }
                    }
                }
                Promised::File { node, name, .. } => {
                    self.promised_file(&w, *node, "", name.as_ref(), &mut broken)
                }
                Promised::Dir { node } => self.promised_dir(win, *node, "", &mut broken),
                Promised::Stream { .. } => {}
            }
            for d in broken {
                self.fail(
                    FailureClass::BrokenPromise,
                    format!("{}: {d}", promise.label),
                );
            }
        }
    }

    /// A promised file: still that inode (number and generation), a size
    /// and bytes of the window's versions, EIO only where the window
    /// changed the block, one version's attributes, its covered name.
    fn promised_file(
        &mut self,
        w: &oracle::Window<'_>,
        node: NodeId,
        path: &str,
        name: Option<&(NodeId, Vec<u8>)>,
        broken: &mut Vec<String>,
    ) {
        let win = w.trees;
        let Some(versions) = win
            .iter()
            .map(|t| t.node(node))
            .collect::<Option<Vec<&Node>>>()
        else {
            // Removed by a later operation: nothing left to promise.
            return;
        };
        let ino = versions[0].ino;
        let what = if path.is_empty() {
            format!("inode {ino}")
        } else {
            format!("{path} (inode {ino})")
        };
        let attr = match self.fs.getattr(ino) {
            Ok(a) => a,
            Err(e) => {
                broken.push(format!("{what}: getattr: {e}"));
                return;
            }
        };
        if !self
            .ids
            .nodes(ino, attr.generation)
            .is_some_and(|s| s.contains(&node))
        {
            broken.push(format!(
                "{what}: the inode is another file now (generation {:#x})",
                attr.generation
            ));
            return;
        }
        self.reachable(win, node, ino, &what, broken);
        let mut contents: Vec<Arc<Vec<u8>>> = Vec::new();
        for c in versions.iter().filter_map(|n| n.content()) {
            if !contents.iter().any(|d| Arc::ptr_eq(d, c) || d == c) {
                contents.push(c.clone());
            }
        }
        // A write in flight may have reached the disk in part: any size
        // between the sizes before and after it.
        let growing = w.in_flight_writes_to(node);
        let in_flight = if growing {
            let len = |t: &Tree| t.node(node).and_then(|n| n.content()).map(|c| c.len());
            match (len(&win[win.len() - 2]), len(&win[win.len() - 1])) {
                (Some(b), Some(a)) => Some(b.min(a) as u64..=b.max(a) as u64),
                _ => None,
            }
        } else {
            None
        };
        if !contents.iter().any(|c| c.len() as u64 == attr.size)
            && !in_flight.is_some_and(|r| r.contains(&attr.size))
        {
            let sizes = oracle::dedup(contents.iter().map(|c| c.len()).collect());
            broken.push(format!("{what}: size {} but promised {sizes:?}", attr.size));
        }
        if attr.size <= FILE_BYTES_MAX {
            let blocks = self.blocks_of(&what, ino, attr.size);
            for (lblk, b) in blocks.iter().enumerate() {
                let off = lblk as u64 * self.bs;
                match b {
                    Ok(data) => {
                        if let Some(o) = first_foreign(data, off, &contents) {
                            let promised = contents[0].get(o as usize).copied().unwrap_or(0);
                            broken.push(format!(
                                "{what}: offset {o} holds {} (promised byte {promised:#04x})",
                                describe(data, off, (o - off) as usize)
                            ));
                            break;
                        }
                    }
                    Err(errno) => {
                        let n = self.bs as usize;
                        let first = padded(&contents[0], off, n);
                        // A write after the promise changed the block even
                        // when its bytes equal the ones it replaced (a write
                        // of zeros over a hole): it placed a block the crash
                        // may have left unwritten.
                        let changed = contents.iter().any(|c| padded(c, off, n) != first)
                            || w.writes_block(node, lblk as u64, self.bs);
                        if !changed {
                            broken.push(format!(
                                "{what}: block {lblk} fails ({}) though no operation after the promise changed it",
                                FsError::Errno(*errno)
                            ));
                            break;
                        }
                    }
                }
            }
        }
        match self.xattrs(ino) {
            Err(e) if e.errno() == libc::EIO => {
                broken.push(format!("{what}: its attributes read EIO"))
            }
            Err(e) => self.access(format!("{what}: attributes: {e}")),
            Ok(have) => {
                // No write is ordered before another, so an attribute
                // update that spans the inode and its attribute block may
                // land in part: each attribute on its own must be one a
                // version had (present with that value, or absent).
                let attr_ok = |name: &Vec<u8>| {
                    let got = have.get(name);
                    versions.iter().any(|n| n.xattrs.get(name) == got)
                };
                let names: BTreeSet<&Vec<u8>> = versions
                    .iter()
                    .flat_map(|n| n.xattrs.keys())
                    .chain(have.keys())
                    .collect();
                if !names.into_iter().all(attr_ok) {
                    let names = |m: &BTreeMap<Vec<u8>, Vec<u8>>| {
                        m.iter()
                            .map(|(k, v)| format!("{}={}B", String::from_utf8_lossy(k), v.len()))
                            .collect::<Vec<_>>()
                            .join(",")
                    };
                    broken.push(format!(
                        "{what}: attributes [{}] but promised [{}]",
                        names(&have),
                        names(&versions[versions.len() - 1].xattrs)
                    ));
                }
            }
        }
        if let Some((parent, entry)) = name {
            self.stable_entry(win, *parent, entry, node, &what, broken);
        }
    }

    /// Every attribute of `ino` but the file system's own.
    fn xattrs(&self, ino: Ino) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, FsError> {
        let names = self.fs.listxattr(ino, true)?;
        let mut out = BTreeMap::new();
        for n in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            if n.starts_with(PRIVATE_XATTR_PREFIX) {
                continue;
            }
            out.insert(n.to_vec(), self.fs.getxattr(ino, n)?);
        }
        Ok(out)
    }

    /// Entry `entry` of directory node `parent`, if every tree of the
    /// window has it naming `node`, resolves to `node`'s inode.
    fn stable_entry(
        &mut self,
        win: &[Arc<Tree>],
        parent: NodeId,
        entry: &[u8],
        node: NodeId,
        what: &str,
        broken: &mut Vec<String>,
    ) {
        let stable = win.iter().all(|t| {
            t.node(parent)
                .and_then(|p| p.entries())
                .and_then(|e| e.get(entry))
                == Some(&node)
        });
        if !stable {
            return;
        }
        let (Some(pino), Some(ino)) = (
            win[0].node(parent).map(|p| p.ino),
            win[0].node(node).map(|n| n.ino),
        ) else {
            return;
        };
        let name = String::from_utf8_lossy(entry);
        match self.fs.lookup(pino, entry) {
            Ok(a) if a.ino == ino => {}
            Ok(a) => broken.push(format!(
                "{what}: name '{name}' resolves to inode {}, not {ino}",
                a.ino
            )),
            Err(e) => broken.push(format!("{what}: name '{name}' (inode {ino}): {e}")),
        }
    }

    /// A promised file or directory that every version of the window has
    /// under some name must be reached by the walk: an fsync makes the
    /// path to a new file durable, and a recovery that keeps the file
    /// but loses a directory above it (or a scan that reclaims that
    /// directory) has lost the file all the same.
    fn reachable(
        &self,
        win: &[Arc<Tree>],
        node: NodeId,
        ino: Ino,
        what: &str,
        broken: &mut Vec<String>,
    ) {
        if !self.reached.contains(&ino) && win.iter().all(|t| t.reaches(node)) {
            broken.push(format!("{what}: no name from the root reaches it"));
        }
    }

    /// A promised directory: every entry no operation of the window
    /// changed resolves to its inode (extra names are allowed: stale).
    fn promised_dir(
        &mut self,
        win: &[Arc<Tree>],
        node: NodeId,
        path: &str,
        broken: &mut Vec<String>,
    ) {
        let Some(first) = win[0].node(node).and_then(|n| n.entries()) else {
            return;
        };
        if win.iter().any(|t| t.node(node).is_none()) {
            return;
        }
        let ino = win[0].node(node).map(|n| n.ino).unwrap_or(0);
        let what = if path.is_empty() {
            format!("directory inode {ino}")
        } else {
            format!("{path} (inode {ino})")
        };
        self.reachable(win, node, ino, &what, broken);
        for (name, &child) in first {
            self.stable_entry(win, node, name, child, &what, broken);
        }
    }

    /// Step 5: fill the inode numbers past every one reached and every free
    /// block, then everything reached must read and resolve as before;
    /// delete the filler.
    fn fill_and_recheck(&mut self, walked: &Walked) {
        let creds = Creds::root();
        let fs = self.fs;
        let mut dir_name = FILL_DIR.to_string();
        let mut k = 0;
        while fs.lookup(ROOT_INO, dir_name.as_bytes()).is_ok() {
            k += 1;
            dir_name = format!("{FILL_DIR}-{k}");
        }
        let dir = match fs.mkdir(ROOT_INO, dir_name.as_bytes(), 0o755, &creds) {
            Ok(a) => Some(a.ino),
            Err(e) if e.errno() == libc::ENOSPC => None,
            Err(e) => {
                self.fail(
                    FailureClass::Hook,
                    format!("nofs-allocation: filling the disk: mkdir /{dir_name}: {e}"),
                );
                return;
            }
        };
        let mut made: Vec<Vec<u8>> = Vec::new();
        if let Some(dir) = dir {
            // Inodes: up past the largest number reached.
            for i in 0..FILL_FILES_MAX {
                let name = format!("i{i}").into_bytes();
                match fs.create(dir, &name, FileType::Regular, 0o644, 0, &creds) {
                    Ok(a) => {
                        made.push(name);
                        if a.ino > walked.max_ino {
                            break;
                        }
                    }
                    Err(e) if e.errno() == libc::ENOSPC => break,
                    Err(e) => {
                        self.fail(
                            FailureClass::Hook,
                            format!("nofs-allocation: filling the disk: create: {e}"),
                        );
                        break;
                    }
                }
            }
            // Blocks: until ENOSPC.
            'files: for i in 0..FILL_FILES_MAX {
                let name = format!("d{i}").into_bytes();
                let ino = match fs.create(dir, &name, FileType::Regular, 0o644, 0, &creds) {
                    Ok(a) => a.ino,
                    Err(e) if e.errno() == libc::ENOSPC => break,
                    Err(e) => {
                        self.fail(
                            FailureClass::Hook,
                            format!("nofs-allocation: filling the disk: create: {e}"),
                        );
                        break;
                    }
                };
                made.push(name);
                let data = fill_chunk();
                let mut off = 0u64;
                while off < FILL_FILE_BYTES {
                    match fs.write(ino, off, data) {
                        Ok(n) if n as usize == data.len() => off += u64::from(n),
                        Ok(_) => break 'files,
                        Err(e) if e.errno() == libc::ENOSPC => {
                            if off == 0 {
                                break 'files;
                            }
                            break;
                        }
                        Err(e) => {
                            self.fail(
                                FailureClass::Hook,
                                format!("nofs-allocation: filling the disk: write: {e}"),
                            );
                            break 'files;
                        }
                    }
                }
            }
        }
        if let Err(e) = fs.sync() {
            self.fail(
                FailureClass::Hook,
                format!("nofs-allocation: sync after filling the disk: {e}"),
            );
        }
        self.notes.insert(Note::NofsDiskFilled);
        self.recheck(walked);
        if let Some(dir) = dir {
            for name in &made {
                if let Err(e) = fs.unlink(dir, name) {
                    self.fail(
                        FailureClass::Hook,
                        format!(
                            "nofs-allocation: removing filler file '{}': {e}",
                            String::from_utf8_lossy(name)
                        ),
                    );
                }
            }
            if let Err(e) = fs.rmdir(ROOT_INO, dir_name.as_bytes()) {
                self.fail(
                    FailureClass::Hook,
                    format!("nofs-allocation: removing /{dir_name}: {e}"),
                );
            }
        }
    }

    /// After the filler: the same names, inodes, sizes and bytes.
    fn recheck(&mut self, walked: &Walked) {
        let fail = |c: &mut Self, d: String| {
            c.fail(
                FailureClass::Hook,
                format!("nofs-allocation: after filling the disk, {d}"),
            )
        };
        for e in &walked.edges {
            let now = self
                .fs
                .lookup(e.parent, &e.name)
                .map(|a| (a.ino, a.generation))
                .map_err(|x| x.errno());
            if now != e.outcome {
                let say = |o: &Result<(Ino, u32), i32>| match o {
                    Ok((i, g)) => format!("inode {i} (generation {g:#x})"),
                    Err(n) => format!("{}", FsError::Errno(*n)),
                };
                fail(
                    self,
                    format!(
                        "{} resolves to {}, before to {}",
                        e.path,
                        say(&now),
                        say(&e.outcome)
                    ),
                );
            }
        }
        for f in &walked.files {
            let what = format!("{} (inode {})", f.path, f.ino);
            match self.fs.getattr(f.ino) {
                Ok(a) if a.generation != f.generation => {
                    fail(
                        self,
                        format!(
                            "{what} is another inode: generation {:#x}, was {:#x} (the inode was allocated twice)",
                            a.generation, f.generation
                        ),
                    );
                    continue;
                }
                Ok(a) if a.size != f.size => {
                    fail(self, format!("{what} has size {}, was {}", a.size, f.size));
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    fail(self, format!("{what}: getattr: {e}"));
                    continue;
                }
            }
            let now = self.read_blocks(&what, f.ino, f.size);
            for (lblk, (a, b)) in f.blocks.iter().zip(&now).enumerate() {
                if a == b {
                    continue;
                }
                let off = lblk as u64 * self.bs;
                let d = match (a, b) {
                    (_, Ok(data)) => {
                        let at = match a {
                            Ok(old) => old.iter().zip(data).position(|(x, y)| x != y).unwrap_or(0),
                            Err(_) => 0,
                        };
                        format!(
                            "{what}: block {lblk} now holds {} at offset {}",
                            describe(data, off, at),
                            off + at as u64
                        )
                    }
                    (Ok(_), Err(n)) => format!(
                        "{what}: block {lblk} read before and fails now ({})",
                        FsError::Errno(*n)
                    ),
                    (Err(x), Err(y)) => format!(
                        "{what}: block {lblk} failed with {} and now with {}",
                        FsError::Errno(*x),
                        FsError::Errno(*y)
                    ),
                };
                fail(self, d);
                break;
            }
        }
    }
}

/// Whether step 5 (fill the disk, re-verify) runs on `state`: always,
/// unless `ORDO_NOFS_FILL_EVERY=K` (K > 1) asks for one state in K.
fn fill_this(state: &StateSpec) -> bool {
    let every: u64 = std::env::var("ORDO_NOFS_FILL_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    if every <= 1 {
        return true;
    }
    let h = (state.point as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(state.index as u64)
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (h >> 17).is_multiple_of(every)
}

/// How many inodes the metadata scanner examines per batch on `state`:
/// every state alike in one pass (`u64::MAX`) on half of the states, as
/// `Fs::scan_to_end` runs it, and on the other half in batches of 1 to
/// 300, as a mount's background thread runs it (`scan_rate=`). Both must
/// find the same.
fn scan_batch_of(state: &StateSpec) -> u64 {
    let h = (state.index as u64)
        .wrapping_mul(0xD1B5_4A32_D192_ED03)
        .wrapping_add(state.point as u64)
        .wrapping_mul(0x94D0_49BB_1331_11EB);
    if (h >> 31) & 1 == 0 {
        u64::MAX
    } else {
        1 + (h >> 33) % 300
    }
}

/// Check a state of a protocol with `data_consistent_after_scan` (called
/// by the oracle for it): build nothing, `image` is the crash image; it is
/// left as the clean unmount left it.
pub(crate) fn check_image(
    rec: &Recording,
    state: &StateSpec,
    params: &CheckParams,
    image: &Arc<MemDevice>,
    notes: &mut Vec<Note>,
) -> Vec<Failure> {
    let mut out = Vec::new();
    let ids = match Identities::of(rec) {
        Ok(i) => i,
        Err(e) => {
            out.push(Failure::new(
                FailureClass::Hook,
                format!("nofs: the base image's inode tables: {e}"),
            ));
            return out;
        }
    };
    // The machine rebooted: the mount draws inode generations from
    // another seed than the recorded run's (as ext4 seeds its generation
    // counter at random at every mount), so that an inode number the
    // crash freed and a new file reuses gets another generation.
    let mut opts = backend::mount_options(params.mode, params.data, false);
    opts.seed = opts.seed.map(|s| s ^ REBOOT_SEED);
    let fs = match Fs::mount(image.clone(), opts) {
        Ok(fs) => fs,
        Err(e) => {
            out.push(Failure::new(
                FailureClass::Mount,
                format!("read-write mount with no recovery: {e}"),
            ));
            return out;
        }
    };
    if !fs.scan_pending() {
        notes.push(Note::NofsNoScan);
    }
    let batch = scan_batch_of(state);
    let scanned = (|| {
        while !fs.scan_step(batch)? {}
        fs.scan_to_end()
    })();
    if let Err(e) = scanned {
        out.push(Failure::new(
            FailureClass::Recovery,
            format!("the scan (batches of {batch} inodes): {e}"),
        ));
        return out;
    }
    let (_, stats) = fs.protocol_stats();
    let stat = |name: &str| {
        stats
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| *v)
            .sum::<u64>()
    };
    for (names, note) in [
        (&["nofs_entries_removed"][..], Note::NofsScanEntryRemoved),
        (&["nofs_inodes_reclaimed"][..], Note::NofsScanInodeReclaimed),
        (&["nofs_links_fixed"][..], Note::NofsScanLinkFixed),
        (
            &["nofs_conflicts_cut", "nofs_blocks_poisoned"][..],
            Note::NofsScanConflictCut,
        ),
        (
            &["nofs_block_bits_fixed", "nofs_inode_bits_fixed"][..],
            Note::NofsScanBitsFixed,
        ),
        (&["nofs_maps_rebuilt"][..], Note::NofsScanMapRebuilt),
    ] {
        if names.iter().map(|n| stat(n)).sum::<u64>() > 0 {
            notes.push(note);
        }
    }
    let mut c = Check {
        rec,
        fs: &fs,
        ids: &ids,
        j: state.op_in_flight(&rec.events).min(rec.snapshots.len() - 1),
        bs: u64::from(fs.block_size()),
        out: Vec::new(),
        notes: BTreeSet::new(),
        reads: HashMap::new(),
        reached: HashSet::from([ROOT_INO]),
    };
    let walked = c.walk();
    c.promises(state);
    // A panic while filling must not lose what the walk found. Filling
    // costs most of a state's time: `ORDO_NOFS_FILL_EVERY=K` fills on one
    // state in K (chosen by its point and index; the soak sets it).
    if fill_this(state) {
        let filled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.fill_and_recheck(&walked)));
        if let Err(p) = filled {
            c.fail(FailureClass::Panic, oracle::panic_message(p));
        }
    }
    out.append(&mut c.out);
    notes.extend(c.notes);
    if let Err(e) = fs.unmount() {
        out.push(Failure::new(
            FailureClass::Recovery,
            format!("clean unmount after the scan: {e}"),
        ));
        return out;
    }
    let clean = match backend::fsck(image.as_ref(), false) {
        Ok(v) if v.is_clean() => true,
        Ok(v) => {
            let all: Vec<String> = v
                .unsafe_problems
                .iter()
                .chain(&v.benign_problems)
                .take(6)
                .cloned()
                .collect();
            out.push(Failure::new(
                FailureClass::Recovery,
                format!(
                    "ordo's fsck after the scan and a clean unmount: {}",
                    all.join("; ")
                ),
            ));
            false
        }
        Err(e) => {
            out.push(Failure::new(FailureClass::Recovery, e));
            false
        }
    };
    if params.e2fsck {
        match oracle::e2fsck_clean(image) {
            Ok(true) if !clean => out.push(Failure::new(
                FailureClass::FsckDisagree,
                "e2fsck -fn is clean after the scan and a clean unmount, ordo's fsck is not",
            )),
            Ok(true) => {}
            Ok(false) => {
                out.push(Failure::new(
                    FailureClass::E2fsck,
                    "e2fsck -fn reports problems after the scan and a clean unmount",
                ));
                if clean {
                    out.push(Failure::new(
                        FailureClass::FsckDisagree,
                        "ordo's fsck finds the image clean after the scan and a clean unmount, e2fsck -fn does not",
                    ));
                }
            }
            Err(e) => out.push(Failure::new(FailureClass::E2fsck, e)),
        }
    }
    out
}

/// Check `state` of `rec` for the NoFS property, whatever the protocol
/// `params.mode` (on one without scanners `scan_to_end` does nothing):
/// the crash image is built and checked as the oracle does for NoFS, a panic
/// is a failure of class `panic`. Returns the failures, the notes and the
/// image as the check left it.
pub fn check_state(
    rec: &Recording,
    state: &StateSpec,
    params: &CheckParams,
) -> (Vec<Failure>, Vec<Note>, Arc<MemDevice>) {
    let image = oracle::build_image(rec, state);
    let mut notes = Vec::new();
    let failures = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_image(rec, state, params, &image, &mut notes)
    })) {
        Ok(f) => f,
        Err(p) => vec![Failure::new(FailureClass::Panic, oracle::panic_message(p))],
    };
    (failures, notes, image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_of_one_version_or_zeros_past_its_end() {
        let a = Arc::new(pattern::fill(3, 1, 0, 6000));
        let mut b = (*a).clone();
        b[4096..5000].copy_from_slice(&pattern::fill(3, 2, 4096, 904));
        let b = Arc::new(b);
        let both = [a.clone(), b.clone()];
        // The second block of either version, and a mix of both.
        assert_eq!(first_foreign(&padded(&a, 4096, 4096), 4096, &both), None);
        assert_eq!(first_foreign(&padded(&b, 4096, 4096), 4096, &both), None);
        let mut mix = padded(&b, 4096, 4096);
        mix[..16].copy_from_slice(&a[4096..4112]);
        assert_eq!(first_foreign(&mix, 4096, &both), None);
        // Another file's bytes, or the right file's from another offset.
        let other = pattern::fill(4, 1, 4096, 4096);
        // The tag matches: the file id is the first byte that differs.
        assert_eq!(first_foreign(&other, 4096, &both), Some(4100));
        let shifted = pattern::fill(3, 1, 0, 4096);
        assert!(
            matches!(first_foreign(&shifted, 4096, &both), Some(o) if (4096..4112).contains(&o))
        );
        // Zeros where every version has data.
        let mut z = padded(&a, 0, 4096);
        z[100..200].fill(0);
        assert_eq!(first_foreign(&z, 0, &both), Some(100));
        assert!(describe(&other, 4096, 0).contains("model file 4"));
        assert!(describe(fill_chunk(), 0, 0).contains("filler"));
    }
}
