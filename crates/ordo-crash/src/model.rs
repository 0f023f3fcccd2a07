//! The model: what the tree should hold after each operation.
//!
//! The explorer runs every operation twice: on ordo through the library API,
//! and on this model. A snapshot of the model after each operation is what
//! the oracle compares a recovered image against: a promise made after
//! operation `p` must still hold in a state whose writes were issued while
//! operation `j` ran, allowing for whatever operations `p+1..=j` changed
//! (their effects may or may not have reached the disk).
//!
//! Nodes are identified by a model id that never changes (unlike names),
//! and carry the inode number ordo gave them, so a recovered inode can be
//! matched to the model node it should be.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use ordo_fs::Ino;

use crate::pattern;
use crate::workload::Op;

/// Index of a node in [`Tree::nodes`].
pub type NodeId = usize;

/// The root directory's node id.
pub const ROOT: NodeId = 0;

/// What a node is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeData {
    /// A regular file; `content.len()` is its size.
    File { content: Arc<Vec<u8>> },
    /// A directory: name -> node.
    Dir { entries: BTreeMap<Vec<u8>, NodeId> },
    /// A symbolic link.
    Symlink { target: Vec<u8> },
}

/// One file, directory or symlink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// ordo's inode number (0 until the operation that made it ran on ordo).
    pub ino: Ino,
    /// Names referring to the node (directories count their one name).
    pub links: u32,
    /// The content.
    pub data: NodeData,
    /// Extended attributes: full name -> value (ACLs in the VFS's form).
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Node {
    /// File content, if a regular file.
    pub fn content(&self) -> Option<&Arc<Vec<u8>>> {
        match &self.data {
            NodeData::File { content } => Some(content),
            _ => None,
        }
    }
    /// Directory entries, if a directory.
    pub fn entries(&self) -> Option<&BTreeMap<Vec<u8>, NodeId>> {
        match &self.data {
            NodeData::Dir { entries } => Some(entries),
            _ => None,
        }
    }
}

/// What an operation did, as the recorder needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A mutation; `created` is the node it made, if any.
    Changed { created: Option<NodeId> },
    /// fsync / fdatasync / dsync of a node (by the path it had); dsync is
    /// an fsync here.
    Fsync {
        node: NodeId,
        datasync: bool,
        path: String,
    },
    /// sync.
    Sync,
    /// osync of a node: an ordering point, which changes nothing and
    /// promises nothing.
    Osync { node: NodeId },
    /// streamsync of the caller's stream (the model does not know streams:
    /// the recorder says which one).
    Streamsync,
}

/// The whole tree. Nodes are never reused: a removed node's slot becomes
/// `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    /// Every node ever created, by id; `None` once removed.
    pub nodes: Vec<Option<Node>>,
}

impl Default for Tree {
    fn default() -> Self {
        Self::new()
    }
}

fn split(path: &str) -> Result<(&str, &[u8]), String> {
    let path = path.trim_end_matches('/');
    let idx = path
        .rfind('/')
        .ok_or_else(|| format!("'{path}' is not absolute"))?;
    let name = &path[idx + 1..];
    if name.is_empty() {
        return Err("the root has no name".into());
    }
    let parent = if idx == 0 { "/" } else { &path[..idx] };
    Ok((parent, name.as_bytes()))
}

impl Tree {
    /// An empty root directory (inode 2).
    pub fn new() -> Self {
        Tree {
            nodes: vec![Some(Node {
                ino: ordo_fs::ROOT_INO,
                links: 1,
                xattrs: BTreeMap::new(),
                data: NodeData::Dir {
                    entries: BTreeMap::new(),
                },
            })],
        }
    }

    /// The node `id`, if it exists.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id).and_then(|n| n.as_ref())
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id].as_mut().expect("live node")
    }

    /// Add a node that exists on disk already (what mkfs made) as `name`
    /// in `dir`, with its inode number.
    pub fn add_existing(&mut self, dir: NodeId, name: &[u8], ino: Ino, data: NodeData) -> NodeId {
        let id = self.new_node(data);
        self.node_mut(id).ino = ino;
        self.insert(dir, name, id);
        id
    }

    /// Resolve an absolute path (no symlink following).
    pub fn resolve(&self, path: &str) -> Option<NodeId> {
        let mut cur = ROOT;
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            cur = *self.node(cur)?.entries()?.get(comp.as_bytes())?;
        }
        Some(cur)
    }

    fn resolve_dir(&self, path: &str) -> Result<NodeId, String> {
        let id = self
            .resolve(path)
            .ok_or_else(|| format!("'{path}' does not exist"))?;
        match self.node(id).map(|n| &n.data) {
            Some(NodeData::Dir { .. }) => Ok(id),
            _ => Err(format!("'{path}' is not a directory")),
        }
    }

    fn lookup(&self, dir: NodeId, name: &[u8]) -> Option<NodeId> {
        self.node(dir)?.entries()?.get(name).copied()
    }

    fn insert(&mut self, dir: NodeId, name: &[u8], id: NodeId) {
        if let NodeData::Dir { entries } = &mut self.node_mut(dir).data {
            entries.insert(name.to_vec(), id);
        }
    }

    fn remove_entry(&mut self, dir: NodeId, name: &[u8]) -> Option<NodeId> {
        match &mut self.node_mut(dir).data {
            NodeData::Dir { entries } => entries.remove(name),
            _ => None,
        }
    }

    /// The file or directory at `path`, which may carry attribute `name`
    /// (`user.` ones only on files and directories, as the VFS allows).
    fn xattr_target(&self, path: &str, name: &str) -> Result<NodeId, String> {
        let id = self
            .resolve(path)
            .ok_or_else(|| format!("'{path}' does not exist"))?;
        match self.node(id).map(|n| &n.data) {
            Some(NodeData::File { .. }) | Some(NodeData::Dir { .. }) => Ok(id),
            _ if !name.starts_with("user.") => Ok(id),
            _ => Err(format!("'{path}' takes no user attributes")),
        }
    }

    fn new_node(&mut self, data: NodeData) -> NodeId {
        self.nodes.push(Some(Node {
            ino: 0,
            links: 1,
            data,
            xattrs: BTreeMap::new(),
        }));
        self.nodes.len() - 1
    }

    fn drop_link(&mut self, id: NodeId) {
        let n = self.node_mut(id);
        n.links -= 1;
        if n.links == 0 {
            self.nodes[id] = None;
        }
    }

    fn file(&self, path: &str) -> Result<(NodeId, Arc<Vec<u8>>), String> {
        let id = self
            .resolve(path)
            .ok_or_else(|| format!("'{path}' does not exist"))?;
        match self.node(id).and_then(|n| n.content()) {
            Some(c) => Ok((id, c.clone())),
            None => Err(format!("'{path}' is not a regular file")),
        }
    }

    fn set_content(&mut self, id: NodeId, content: Vec<u8>) {
        self.node_mut(id).data = NodeData::File {
            content: Arc::new(content),
        };
    }

    /// Whether `anc` is `id` or one of its ancestors (directories only).
    fn is_ancestor(&self, anc: NodeId, id: NodeId) -> bool {
        if anc == id {
            return true;
        }
        match self.node(anc).and_then(|n| n.entries()) {
            Some(entries) => entries.values().any(|&c| {
                matches!(self.node(c).map(|n| &n.data), Some(NodeData::Dir { .. }))
                    && self.is_ancestor(c, id)
            }),
            None => false,
        }
    }

    /// [`Tree::apply`], with the node `op` creates (if any) given id
    /// `id` rather than the next free one: a tree built from a subset of
    /// a sequence's operations gives each node the id it had when the
    /// whole sequence ran, so that the bytes a write stores (which encode
    /// the node id) are the ones the whole run wrote. `id` must not be
    /// below the number of node slots. On an error the tree is left as
    /// the failed operation left it (as with [`Tree::apply`], work on a
    /// copy).
    pub fn apply_placed(
        &mut self,
        op: &Op,
        serial: u32,
        id: Option<NodeId>,
    ) -> Result<Applied, String> {
        let Some(id) = id else {
            return self.apply(op, serial);
        };
        if id < self.nodes.len() {
            return Err(format!("node id {id} is taken"));
        }
        self.nodes.resize(id, None);
        let applied = self.apply(op, serial)?;
        match applied {
            Applied::Changed { created: Some(c) } if c == id => Ok(applied),
            _ => Err(format!("'{op}' did not create node {id}")),
        }
    }

    /// Apply `op` as POSIX would; `serial` numbers the operation in its
    /// sequence and is what written bytes encode. Errors are the reason the
    /// operation would fail (the model refuses what a workload must not do).
    pub fn apply(&mut self, op: &Op, serial: u32) -> Result<Applied, String> {
        let changed = |created| Ok(Applied::Changed { created });
        match op {
            Op::Creat(path) | Op::Mkdir(path) | Op::Symlink { path, .. } => {
                let (parent, name) = split(path)?;
                let dir = self.resolve_dir(parent)?;
                if self.lookup(dir, name).is_some() {
                    return Err(format!("'{path}' exists"));
                }
                let data = match op {
                    Op::Creat(_) => NodeData::File {
                        content: Arc::new(Vec::new()),
                    },
                    Op::Mkdir(_) => NodeData::Dir {
                        entries: BTreeMap::new(),
                    },
                    Op::Symlink { target, .. } => NodeData::Symlink {
                        target: target.as_bytes().to_vec(),
                    },
                    _ => unreachable!(),
                };
                let is_dir = matches!(data, NodeData::Dir { .. });
                let is_link = matches!(data, NodeData::Symlink { .. });
                let id = self.new_node(data);
                // A directory's default ACL is inherited (posix_acl_create),
                // with the mode the workload creates with (0644, 0755).
                let default = self
                    .node(dir)
                    .and_then(|d| d.xattrs.get(ordo_format::xattr::ACL_DEFAULT_NAME))
                    .cloned();
                if let (Some(def), false) = (default, is_link) {
                    let acl = ordo_format::xattr::Acl::from_xattr(&def)
                        .map_err(|e| format!("default ACL: {e}"))?;
                    let (access, _, not_equiv) =
                        acl.create_masq(if is_dir { 0o755 } else { 0o644 });
                    let n = self.node_mut(id);
                    if not_equiv {
                        n.xattrs.insert(
                            ordo_format::xattr::ACL_ACCESS_NAME.to_vec(),
                            access.to_xattr(),
                        );
                    }
                    if is_dir {
                        n.xattrs
                            .insert(ordo_format::xattr::ACL_DEFAULT_NAME.to_vec(), def);
                    }
                }
                self.insert(dir, name, id);
                changed(Some(id))
            }
            Op::Write { path, off, len } => {
                let (id, content) = self.file(path)?;
                self.write(id, &content, *off, *len, serial)?;
                changed(None)
            }
            Op::Append { path, len } => {
                let (id, content) = self.file(path)?;
                let off = content.len() as u64;
                self.write(id, &content, off, *len, serial)?;
                changed(None)
            }
            Op::Falloc {
                path,
                off,
                len,
                keep_size,
            } => {
                let (id, content) = self.file(path)?;
                if *len == 0 {
                    return Err("fallocate of zero bytes".into());
                }
                let end = off + len;
                if !keep_size && end > content.len() as u64 {
                    let mut c = content.to_vec();
                    c.resize(end as usize, 0);
                    self.set_content(id, c);
                }
                changed(None)
            }
            Op::Punch { path, off, len } => {
                let (id, content) = self.file(path)?;
                let mut c = content.to_vec();
                let size = c.len() as u64;
                let end = (off + len).min(size);
                if *off < end {
                    c[*off as usize..end as usize].fill(0);
                }
                self.set_content(id, c);
                changed(None)
            }
            Op::Zero {
                path,
                off,
                len,
                keep_size,
            } => {
                let (id, content) = self.file(path)?;
                if *len == 0 {
                    return Err("zero range of zero bytes".into());
                }
                let mut c = content.to_vec();
                let end = off + len;
                if !keep_size && end > c.len() as u64 {
                    c.resize(end as usize, 0);
                }
                let zero_end = end.min(c.len() as u64);
                if *off < zero_end {
                    c[*off as usize..zero_end as usize].fill(0);
                }
                self.set_content(id, c);
                changed(None)
            }
            Op::Collapse { path, off, len } => {
                let (id, content) = self.file(path)?;
                if *len == 0 || off % 4096 != 0 || len % 4096 != 0 {
                    return Err("collapse of a range that is not whole blocks".into());
                }
                if off + len >= content.len() as u64 {
                    return Err("collapse reaching the end of the file".into());
                }
                let mut c = content.to_vec();
                c.drain(*off as usize..(off + len) as usize);
                self.set_content(id, c);
                changed(None)
            }
            Op::Insert { path, off, len } => {
                let (id, content) = self.file(path)?;
                if *len == 0 || off % 4096 != 0 || len % 4096 != 0 {
                    return Err("insert of a range that is not whole blocks".into());
                }
                if *off >= content.len() as u64 {
                    return Err("insert at or past the end of the file".into());
                }
                if content.len() as u64 + len > 1 << 24 {
                    return Err("insert beyond 16 MiB".into());
                }
                let mut c = content.to_vec();
                c.splice(
                    *off as usize..*off as usize,
                    std::iter::repeat_n(0u8, *len as usize),
                );
                self.set_content(id, c);
                changed(None)
            }
            Op::Truncate { path, size } => {
                let (id, content) = self.file(path)?;
                if *size > 1 << 24 {
                    return Err("truncate beyond 16 MiB".into());
                }
                let mut c = content.to_vec();
                c.resize(*size as usize, 0);
                self.set_content(id, c);
                changed(None)
            }
            Op::Link { src, dst } => {
                let id = self
                    .resolve(src)
                    .ok_or_else(|| format!("'{src}' does not exist"))?;
                if matches!(self.node(id).map(|n| &n.data), Some(NodeData::Dir { .. })) {
                    return Err(format!("'{src}' is a directory"));
                }
                let (parent, name) = split(dst)?;
                let dir = self.resolve_dir(parent)?;
                if self.lookup(dir, name).is_some() {
                    return Err(format!("'{dst}' exists"));
                }
                self.insert(dir, name, id);
                self.node_mut(id).links += 1;
                changed(None)
            }
            Op::Unlink(path) => {
                let (parent, name) = split(path)?;
                let dir = self.resolve_dir(parent)?;
                let id = self
                    .lookup(dir, name)
                    .ok_or_else(|| format!("'{path}' does not exist"))?;
                if matches!(self.node(id).map(|n| &n.data), Some(NodeData::Dir { .. })) {
                    return Err(format!("'{path}' is a directory"));
                }
                self.remove_entry(dir, name);
                self.drop_link(id);
                changed(None)
            }
            Op::Rmdir(path) => {
                let (parent, name) = split(path)?;
                let dir = self.resolve_dir(parent)?;
                let id = self
                    .lookup(dir, name)
                    .ok_or_else(|| format!("'{path}' does not exist"))?;
                match self.node(id).and_then(|n| n.entries()) {
                    None => return Err(format!("'{path}' is not a directory")),
                    Some(e) if !e.is_empty() => return Err(format!("'{path}' is not empty")),
                    Some(_) => {}
                }
                self.remove_entry(dir, name);
                self.drop_link(id);
                changed(None)
            }
            Op::Rename { src, dst } => {
                let (sparent, sname) = split(src)?;
                let (dparent, dname) = split(dst)?;
                let sdir = self.resolve_dir(sparent)?;
                let ddir = self.resolve_dir(dparent)?;
                let id = self
                    .lookup(sdir, sname)
                    .ok_or_else(|| format!("'{src}' does not exist"))?;
                let src_is_dir =
                    matches!(self.node(id).map(|n| &n.data), Some(NodeData::Dir { .. }));
                if src_is_dir && self.is_ancestor(id, ddir) {
                    return Err(format!("'{dst}' is inside '{src}'"));
                }
                if let Some(old) = self.lookup(ddir, dname) {
                    if old == id {
                        return Err("rename onto itself (a no-op the model does not track)".into());
                    }
                    let old_entries = self.node(old).and_then(|n| n.entries());
                    match (src_is_dir, old_entries) {
                        (true, Some(e)) if e.is_empty() => {}
                        (true, Some(_)) => return Err(format!("'{dst}' is not empty")),
                        (true, None) => return Err(format!("'{dst}' is not a directory")),
                        (false, Some(_)) => return Err(format!("'{dst}' is a directory")),
                        (false, None) => {}
                    }
                    self.remove_entry(ddir, dname);
                    self.drop_link(old);
                }
                self.remove_entry(sdir, sname);
                self.insert(ddir, dname, id);
                changed(None)
            }
            Op::Fsync(path) | Op::Fdatasync(path) | Op::Dsync(path) | Op::Osync(path) => {
                let id = self
                    .resolve(path)
                    .ok_or_else(|| format!("'{path}' does not exist"))?;
                let datasync = matches!(op, Op::Fdatasync(_));
                match self.node(id).map(|n| &n.data) {
                    Some(NodeData::Symlink { .. }) => {
                        Err(format!("'{path}' is a symlink (can not be opened)"))
                    }
                    Some(NodeData::Dir { .. }) if datasync => {
                        Err(format!("'{path}': fdatasync is for files"))
                    }
                    _ if matches!(op, Op::Osync(_)) => Ok(Applied::Osync { node: id }),
                    _ => Ok(Applied::Fsync {
                        node: id,
                        datasync,
                        path: path.clone(),
                    }),
                }
            }
            Op::SetXattr { path, name, len } => {
                let id = self.xattr_target(path, name)?;
                let v = crate::workload::xattr_value(name, *len);
                self.node_mut(id).xattrs.insert(name.as_bytes().to_vec(), v);
                changed(None)
            }
            Op::RemoveXattr { path, name } => {
                let id = self.xattr_target(path, name)?;
                if self.node_mut(id).xattrs.remove(name.as_bytes()).is_none() {
                    return Err(format!("'{path}' has no attribute {name}"));
                }
                changed(None)
            }
            Op::SetAcl { path, uid } => {
                let id = self.xattr_target(path, "user.")?;
                let v = crate::workload::acl_value(*uid);
                let is_dir = self.node(id).and_then(|n| n.entries()).is_some();
                let n = self.node_mut(id);
                n.xattrs
                    .insert(ordo_format::xattr::ACL_ACCESS_NAME.to_vec(), v.clone());
                if is_dir {
                    n.xattrs
                        .insert(ordo_format::xattr::ACL_DEFAULT_NAME.to_vec(), v);
                }
                changed(None)
            }
            Op::Sync => Ok(Applied::Sync),
            // The tick changes nothing the model sees, and promises nothing;
            // nor does moving to another stream.
            Op::Writeback | Op::SetStream(_) | Op::IgnoreFsync(_) => {
                Ok(Applied::Changed { created: None })
            }
            Op::Streamsync => Ok(Applied::Streamsync),
        }
    }

    fn write(
        &mut self,
        id: NodeId,
        content: &Arc<Vec<u8>>,
        off: u64,
        len: u64,
        serial: u32,
    ) -> Result<(), String> {
        if len == 0 {
            return Err("write of zero bytes".into());
        }
        if off + len > 1 << 24 {
            return Err("write beyond 16 MiB".into());
        }
        let mut c = content.to_vec();
        let end = (off + len) as usize;
        if c.len() < end {
            c.resize(end, 0);
        }
        c[off as usize..end].copy_from_slice(&pattern::fill(id as u32, serial, off, len as usize));
        self.set_content(id, c);
        Ok(())
    }

    /// The bytes a write operation stores (the recorder passes the same to
    /// ordo). Only meaningful for `Write` and `Append`, before applying.
    pub fn write_payload(&self, op: &Op, serial: u32) -> Option<(NodeId, u64, Vec<u8>)> {
        let (path, off, len) = match op {
            Op::Write { path, off, len } => (path, *off, *len),
            Op::Append { path, len } => {
                let (_, c) = self.file(path).ok()?;
                (path, c.len() as u64, *len)
            }
            _ => return None,
        };
        let (id, _) = self.file(path).ok()?;
        Some((id, off, pattern::fill(id as u32, serial, off, len as usize)))
    }

    /// Every live node reachable from the root, with one path each
    /// (depth-first, names in byte order).
    pub fn walk(&self) -> Vec<(String, NodeId)> {
        let mut out = vec![("/".to_string(), ROOT)];
        let mut i = 0;
        while i < out.len() {
            let (path, id) = out[i].clone();
            if let Some(entries) = self.node(id).and_then(|n| n.entries()) {
                for (name, &child) in entries {
                    let p = if path == "/" {
                        format!("/{}", String::from_utf8_lossy(name))
                    } else {
                        format!("{path}/{}", String::from_utf8_lossy(name))
                    };
                    out.push((p, child));
                }
            }
            i += 1;
        }
        out
    }

    /// Whether some name leads from the root to node `id` (an unlinked
    /// file still open is a node no name reaches).
    pub fn reaches(&self, id: NodeId) -> bool {
        let mut seen = HashSet::from([ROOT]);
        let mut todo = vec![ROOT];
        while let Some(d) = todo.pop() {
            if d == id {
                return true;
            }
            if let Some(entries) = self.node(d).and_then(|n| n.entries()) {
                todo.extend(entries.values().copied().filter(|&c| seen.insert(c)));
            }
        }
        false
    }

    /// The parent directory of the node a path names, and the final name.
    pub fn parent_of(&self, path: &str) -> Option<(NodeId, Vec<u8>)> {
        let (parent, name) = split(path).ok()?;
        Some((self.resolve(parent)?, name.to_vec()))
    }

    /// Every reachable path with its [`Shape`] (see [`Listing`]).
    pub fn listing(&self) -> Listing {
        self.listing_hashed(&mut HashMap::new())
    }

    /// [`Tree::listing`], hashing each distinct file content once:
    /// `hashes` maps a content's address to its hash, so that the
    /// snapshots of one recording, which share the contents an operation
    /// did not change, hash only what changed. The contents must stay
    /// alive while `hashes` is in use (addresses are not reused then).
    pub fn listing_hashed(&self, hashes: &mut HashMap<usize, u64>) -> Listing {
        self.listing_by(|content| {
            *hashes
                .entry(Arc::as_ptr(content) as usize)
                .or_insert_with(|| content_hash(content))
        })
    }

    /// [`Tree::listing`], taking the hash of a file content from `known`
    /// (by the content's address, as [`Tree::listing_hashed`] fills it)
    /// when it is there: for trees that share most contents with trees
    /// already listed, and are listed from several threads at once. The
    /// contents `known` names must stay alive while it is in use.
    pub fn listing_known(&self, known: &HashMap<usize, u64>) -> Listing {
        self.listing_by(
            |content| match known.get(&(Arc::as_ptr(content) as usize)) {
                Some(&h) => h,
                None => content_hash(content),
            },
        )
    }

    fn listing_by(&self, mut hash: impl FnMut(&Arc<Vec<u8>>) -> u64) -> Listing {
        let names = self
            .walk()
            .into_iter()
            .filter_map(|(path, id)| {
                let shape = match &self.node(id)?.data {
                    NodeData::Dir { .. } => Shape::Dir,
                    NodeData::File { content } => Shape::File {
                        len: content.len() as u64,
                        hash: hash(content),
                    },
                    NodeData::Symlink { target } => Shape::Symlink {
                        hash: content_hash(target),
                    },
                };
                Some((path, shape))
            })
            .collect();
        Listing::new(names)
    }
}

/// What the prefix oracle compares of a reachable name: its kind and, for
/// files and symlinks, a hash of the bytes or the target. Inode numbers,
/// link counts, attributes and times are not part of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shape {
    /// A directory (its entries are the paths under it).
    Dir,
    /// A regular file of `len` bytes.
    File { len: u64, hash: u64 },
    /// A symbolic link.
    Symlink { hash: u64 },
    /// Anything else (a device, a fifo: no workload makes one).
    Other,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shape::Dir => write!(f, "a directory"),
            Shape::File { len, hash } => write!(f, "a file of {len} bytes (hash {hash:016x})"),
            Shape::Symlink { hash } => write!(f, "a symlink (target hash {hash:016x})"),
            Shape::Other => write!(f, "neither file, directory nor symlink"),
        }
    }
}

/// The hash [`Shape`] takes of file contents and symlink targets.
pub fn content_hash(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    // SipHash with fixed keys: the same bytes hash the same within a run,
    // which is all the comparison needs.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

/// A whole tree as the prefix oracle compares it: every reachable path
/// (each name of a hard-linked file) with its [`Shape`], sorted by path,
/// and a digest of all of it, so that unequal listings are usually told
/// apart without walking them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// `(path, shape)`, sorted by path.
    pub names: Vec<(String, Shape)>,
    /// A hash of `names`.
    pub digest: u64,
}

/// One difference between two listings: a path and what each has there
/// (`None`: nothing).
pub type ListingDiff<'a> = (&'a str, Option<Shape>, Option<Shape>);

impl Listing {
    /// A listing of `names` (in any order; duplicates are kept).
    pub fn new(mut names: Vec<(String, Shape)>) -> Self {
        use std::hash::{Hash, Hasher};
        names.sort_unstable();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        names.hash(&mut h);
        Listing {
            names,
            digest: h.finish(),
        }
    }

    /// Whether both list the same paths with the same shapes.
    pub fn same(&self, other: &Listing) -> bool {
        self.digest == other.digest && self.names == other.names
    }

    /// The paths whose shape differs between `self` and `other`, in path
    /// order: the first of them, and how many there are.
    pub fn diff<'a>(&'a self, other: &'a Listing) -> (Option<ListingDiff<'a>>, usize) {
        let (a, b) = (&self.names, &other.names);
        let (mut i, mut k) = (0, 0);
        let mut first = None;
        let mut count = 0;
        let mut note = |d: ListingDiff<'a>| {
            if first.is_none() {
                first = Some(d);
            }
            count += 1;
        };
        while i < a.len() || k < b.len() {
            match (a.get(i), b.get(k)) {
                (Some((pa, sa)), Some((pb, sb))) if pa == pb => {
                    if sa != sb {
                        note((pa, Some(*sa), Some(*sb)));
                    }
                    i += 1;
                    k += 1;
                }
                (Some((pa, sa)), Some((pb, _))) if pa < pb => {
                    note((pa, Some(*sa), None));
                    i += 1;
                }
                (Some(_), Some((pb, sb))) | (None, Some((pb, sb))) => {
                    note((pb, None, Some(*sb)));
                    k += 1;
                }
                (Some((pa, sa)), None) => {
                    note((pa, Some(*sa), None));
                    i += 1;
                }
                (None, None) => unreachable!("the loop runs while either has more"),
            }
        }
        (first, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree_with(ops: &[Op]) -> Tree {
        let mut t = Tree::new();
        for (i, op) in ops.iter().enumerate() {
            t.apply(op, i as u32 + 1).unwrap();
        }
        t
    }

    #[test]
    fn preset_tree_shape() {
        let t = tree_with(&crate::workload::preset());
        let foo = t.resolve("/A/foo").unwrap();
        assert_eq!(t.node(foo).unwrap().content().unwrap().len(), 8192);
        assert!(t.resolve("/C").is_some());
        assert_eq!(t.walk().len(), 11);
    }

    #[test]
    fn rename_replace_drops_the_old_target() {
        let mut t = tree_with(&crate::workload::preset());
        let bar = t.resolve("/A/bar").unwrap();
        let foo = t.resolve("/A/foo").unwrap();
        t.apply(
            &Op::Rename {
                src: "/A/bar".into(),
                dst: "/A/foo".into(),
            },
            100,
        )
        .unwrap();
        assert_eq!(t.resolve("/A/foo"), Some(bar));
        assert!(t.node(foo).is_none());
        assert!(t.resolve("/A/bar").is_none());
    }

    #[test]
    fn links_keep_a_node_alive() {
        let mut t = tree_with(&crate::workload::preset());
        let foo = t.resolve("/A/foo").unwrap();
        t.apply(
            &Op::Link {
                src: "/A/foo".into(),
                dst: "/B/f".into(),
            },
            100,
        )
        .unwrap();
        t.apply(&Op::Unlink("/A/foo".into()), 101).unwrap();
        assert_eq!(t.resolve("/B/f"), Some(foo));
        t.apply(&Op::Unlink("/B/f".into()), 102).unwrap();
        assert!(t.node(foo).is_none());
    }

    #[test]
    fn punch_and_truncate_zero_bytes() {
        let mut t = tree_with(&crate::workload::preset());
        let foo = t.resolve("/A/foo").unwrap();
        t.apply(
            &Op::Punch {
                path: "/A/foo".into(),
                off: 0,
                len: 4096,
            },
            100,
        )
        .unwrap();
        let c = t.node(foo).unwrap().content().unwrap().clone();
        assert!(c[..4096].iter().all(|&b| b == 0));
        assert!(c[4096..].iter().all(|&b| b != 0) || c[4096..].iter().any(|&b| b != 0));
        t.apply(
            &Op::Truncate {
                path: "/A/foo".into(),
                size: 10,
            },
            101,
        )
        .unwrap();
        assert_eq!(t.node(foo).unwrap().content().unwrap().len(), 10);
    }

    #[test]
    fn osync_and_dsync_change_nothing() {
        let base = tree_with(&crate::workload::preset());
        let mut t = base.clone();
        let foo = t.resolve("/A/foo").unwrap();
        assert_eq!(
            t.apply(&Op::Osync("/A/foo".into()), 100),
            Ok(Applied::Osync { node: foo })
        );
        assert_eq!(
            t.apply(&Op::Dsync("/A".into()), 101),
            Ok(Applied::Fsync {
                node: t.resolve("/A").unwrap(),
                datasync: false,
                path: "/A".into()
            })
        );
        assert_eq!(t, base);
        assert!(t.apply(&Op::Osync("/B/lnk".into()), 102).is_err());
        assert!(t.apply(&Op::Dsync("/nothing".into()), 103).is_err());
    }

    #[test]
    fn listings_tell_trees_apart() {
        let a = tree_with(&crate::workload::preset());
        let mut b = a.clone();
        assert!(a.listing().same(&b.listing()));
        assert_eq!(a.listing().names.len(), a.walk().len());
        // Same size, other bytes.
        b.apply(
            &Op::Write {
                path: "/A/foo".into(),
                off: 0,
                len: 10,
            },
            100,
        )
        .unwrap();
        let (la, lb) = (a.listing(), b.listing());
        assert!(!la.same(&lb));
        let (first, n) = la.diff(&lb);
        let (path, have, want) = first.unwrap();
        assert_eq!((path, n), ("/A/foo", 1));
        assert!(matches!(
            (have, want),
            (Some(Shape::File { len: 8192, hash: x }), Some(Shape::File { len: 8192, hash: y })) if x != y
        ));
        // A new name and a missing one, in path order.
        b.apply(
            &Op::Rename {
                src: "/A/bar".into(),
                dst: "/C/bar".into(),
            },
            101,
        )
        .unwrap();
        let lb = b.listing();
        let (first, n) = la.diff(&lb);
        assert_eq!(n, 3);
        let bar = la
            .names
            .iter()
            .find(|(p, _)| p == "/A/bar")
            .map(|(_, s)| *s);
        assert_eq!(first, Some(("/A/bar", bar, None)));
        assert_eq!(lb.diff(&la).0.map(|d| d.0), Some("/A/bar"));
        // Hard links are two paths; hashing through a shared cache agrees.
        b.apply(
            &Op::Link {
                src: "/foo".into(),
                dst: "/B/foo".into(),
            },
            102,
        )
        .unwrap();
        let mut cache = HashMap::new();
        let l = b.listing_hashed(&mut cache);
        assert!(l.same(&b.listing()));
        assert_eq!(l.names.len(), b.walk().len());
        assert!(l.names.iter().any(|(p, _)| p == "/B/foo"));
    }

    #[test]
    fn refuses_invalid_operations() {
        let mut t = tree_with(&crate::workload::preset());
        assert!(t.apply(&Op::Rmdir("/A".into()), 1).is_err());
        assert!(t.apply(&Op::Creat("/A/foo".into()), 1).is_err());
        assert!(t
            .apply(
                &Op::Rename {
                    src: "/B".into(),
                    dst: "/B/sub/z".into()
                },
                1
            )
            .is_err());
    }
}
