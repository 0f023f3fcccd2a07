//! Ganger and Patt's benchmarks ("Metadata Update Performance in File
//! Systems", OSDI '94, and "Soft Updates", CMU-CS-94): N users each copying
//! a directory tree of 535 files totalling 14.3 MB, N users each removing
//! such a tree, and 10,000 1 KiB files created, removed, or created and
//! removed one after the other. These are the metadata-bound workloads where
//! synchronous ordered writes (`sync`) lose to delayed ones (`async`,
//! soft updates, journaling).
//!
//! The paper's source tree is not available; the tree here is synthetic
//! and seeded: 535 files whose sizes follow a gamma(0.5) distribution scaled
//! to add up to exactly 14.3 MB (10^6 bytes), about ten files per directory
//! in a four-way tree of directories. Each user copies or removes its own
//! tree, as separate users would.

use serde_json::json;

use super::{pattern, run_threads, Case, Overrides, RunCtx, RunOutput, Scale};
use crate::error::{BenchError, Result};
use crate::stats::{gamma, thread_rng};
use crate::vfs::{mkdir_all, remove_all, Vfs};

/// Files in the paper's tree.
pub const TREE_FILES: u64 = 535;
/// Bytes in the paper's tree (14.3 MB).
pub const TREE_BYTES: u64 = 14_300_000;
/// Files per directory in the synthetic tree.
const FILES_PER_DIR: u64 = 10;
/// Directories per directory in the synthetic tree.
const DIR_FANOUT: u64 = 4;
/// Copy request size.
const COPY_IO_BYTES: usize = 64 << 10;

/// A synthetic tree: directory paths (parents first) and files with sizes.
#[derive(Clone, Debug)]
pub struct Tree {
    /// Directories, relative to the tree's root, parents before children.
    pub dirs: Vec<String>,
    /// Files, relative to the tree's root, with their sizes in bytes.
    pub files: Vec<(String, u64)>,
}

impl Tree {
    /// A seeded tree of `files` files adding up to `total_bytes`.
    pub fn generate(files: u64, total_bytes: u64, seed: u64) -> Tree {
        let mut rng = thread_rng(seed ^ 0x7EEE, 0);
        let raw: Vec<f64> = (0..files).map(|_| gamma(&mut rng, 0.5, 1.0)).collect();
        let sum: f64 = raw.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let mut sizes: Vec<u64> = raw
            .iter()
            .map(|x| (x / sum * total_bytes as f64).floor() as u64)
            .collect();
        // Give the rounding remainder to the first file: the total is exact.
        let short = total_bytes.saturating_sub(sizes.iter().sum());
        if let Some(first) = sizes.first_mut() {
            *first += short;
        }
        let ndirs = files.div_ceil(FILES_PER_DIR).max(1);
        let mut dirs: Vec<String> = Vec::with_capacity(ndirs as usize);
        for k in 0..ndirs {
            let name = if k == 0 {
                "d0".to_string()
            } else {
                format!("{}/d{k}", dirs[((k - 1) / DIR_FANOUT) as usize])
            };
            dirs.push(name);
        }
        let files = sizes
            .into_iter()
            .enumerate()
            .map(|(i, size)| {
                let d = &dirs[i % ndirs as usize];
                (format!("{d}/f{i}"), size)
            })
            .collect();
        Tree { dirs, files }
    }

    /// Bytes in the tree.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.1).sum()
    }

    /// Writes the tree under `root`.
    pub fn write(&self, vfs: &dyn Vfs, root: &str, seed: u64) -> Result<()> {
        mkdir_all(vfs, root)?;
        for d in &self.dirs {
            vfs.mkdir(&format!("{root}/{d}"))?;
        }
        let buf = pattern(COPY_IO_BYTES, seed);
        for (path, size) in &self.files {
            let f = vfs.create(&format!("{root}/{path}"))?;
            let mut off = 0;
            while off < *size {
                let n = (*size - off).min(COPY_IO_BYTES as u64) as usize;
                f.write_at(off, &buf[..n])?;
                off += n as u64;
            }
        }
        Ok(())
    }
}

/// Copies the file `src` to a new file `dst` through `buf`, a read and a
/// write per `buf.len()` bytes, like `cp`; returns the bytes copied.
pub fn copy_file(vfs: &dyn Vfs, src: &str, dst: &str, buf: &mut [u8]) -> Result<u64> {
    let from = vfs.open(src)?;
    let to = vfs.create(dst)?;
    let mut off = 0u64;
    loop {
        let n = from.read_at(off, buf)?;
        if n == 0 {
            return Ok(off);
        }
        to.write_at(off, &buf[..n])?;
        off += n as u64;
    }
}

/// Copies the tree `src` to `dst`, like `cp -r`; returns the files copied.
pub fn copy_tree(vfs: &dyn Vfs, src: &str, dst: &str, ctx: &RunCtx) -> Result<u64> {
    vfs.mkdir(dst)?;
    let mut copied = 0;
    let mut buf = vec![0u8; COPY_IO_BYTES];
    for (name, is_dir) in vfs.list(src)? {
        let (s, d) = (format!("{src}/{name}"), format!("{dst}/{name}"));
        if is_dir {
            copied += copy_tree(vfs, &s, &d, ctx)?;
            continue;
        }
        copy_file(vfs, &s, &d, &mut buf)?;
        copied += 1;
        ctx.tick(1);
    }
    Ok(copied)
}

/// Scaled tree: a fraction of the paper's files and bytes.
fn tree_for(scale: Scale) -> (u64, u64) {
    let div = scale.pick(20, 5, 1, 1);
    (TREE_FILES / div, TREE_BYTES / div)
}

/// N-user copy or remove.
pub struct TreeCase {
    remove: bool,
    users: u32,
    files: u64,
    bytes: u64,
}

/// N users copy their own tree (ops: files copied).
pub fn copy(scale: Scale, o: &Overrides) -> Box<dyn Case> {
    let (files, bytes) = tree_for(scale);
    Box::new(TreeCase {
        remove: false,
        users: o.users.unwrap_or(scale.pick(1, 2, 2, 4)),
        files,
        bytes,
    })
}

/// N users remove their own tree (ops: files removed).
pub fn remove(scale: Scale, o: &Overrides) -> Box<dyn Case> {
    let (files, bytes) = tree_for(scale);
    Box::new(TreeCase {
        remove: true,
        users: o.users.unwrap_or(scale.pick(1, 2, 2, 4)),
        files,
        bytes,
    })
}

impl Case for TreeCase {
    fn workload(&self) -> &'static str {
        if self.remove {
            "remove"
        } else {
            "copy"
        }
    }
    fn label(&self) -> String {
        format!("users={}", self.users)
    }
    fn params(&self) -> serde_json::Value {
        json!({
            "users": self.users,
            "tree_files": self.files,
            "tree_bytes": self.bytes,
            "files_per_dir": FILES_PER_DIR,
        })
    }
    fn expected_ops(&self) -> u64 {
        self.files * self.users as u64
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        let tree = Tree::generate(self.files, self.bytes, seed);
        for u in 0..self.users {
            tree.write(vfs, &format!("user{u}/src"), seed ^ u as u64)?;
        }
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        let out = run_threads(self.workload(), self.users, |u| {
            let n = if self.remove {
                let n = remove_all(vfs, &format!("user{u}/src"))?;
                ctx.tick(n);
                n
            } else {
                copy_tree(vfs, &format!("user{u}/src"), &format!("user{u}/dst"), ctx)?
            };
            Ok((n, Vec::new()))
        })?;
        if out.ops != self.expected_ops() {
            return Err(BenchError::Workload {
                workload: self.workload().into(),
                detail: format!(
                    "{} files handled, expected {}",
                    out.ops,
                    self.expected_ops()
                ),
            });
        }
        Ok(out)
    }
}

/// Which small-file phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Create,
    Remove,
    CreateRemove,
}

/// 1 KiB files: create, remove, or create-then-remove each.
pub struct SmallFiles {
    phase: Phase,
    files: u64,
    users: u32,
}

/// Bytes in each small file.
pub const SMALL_FILE_BYTES: usize = 1024;

/// The three phases, one case each (ops: files).
pub fn smallfiles_cases(scale: Scale, o: &Overrides) -> Vec<Box<dyn Case>> {
    let files = scale.pick(50, 1000, 10_000, 10_000);
    let users = o.users.unwrap_or(1);
    [Phase::Create, Phase::Remove, Phase::CreateRemove]
        .into_iter()
        .map(|phase| {
            Box::new(SmallFiles {
                phase,
                files,
                users,
            }) as Box<dyn Case>
        })
        .collect()
}

impl SmallFiles {
    fn per_user(&self) -> u64 {
        self.files / self.users as u64
    }
}

impl Case for SmallFiles {
    fn workload(&self) -> &'static str {
        "smallfiles"
    }
    fn label(&self) -> String {
        match self.phase {
            Phase::Create => "create",
            Phase::Remove => "remove",
            Phase::CreateRemove => "create-remove",
        }
        .to_string()
    }
    fn params(&self) -> serde_json::Value {
        json!({ "phase": self.label(), "files": self.files, "file_bytes": SMALL_FILE_BYTES, "users": self.users })
    }
    fn expected_ops(&self) -> u64 {
        self.per_user() * self.users as u64
    }
    fn setup(&self, vfs: &dyn Vfs, seed: u64) -> Result<()> {
        let data = pattern(SMALL_FILE_BYTES, seed);
        for u in 0..self.users {
            vfs.mkdir(&format!("small{u}"))?;
            if self.phase == Phase::Remove {
                for i in 0..self.per_user() {
                    let f = vfs.create(&format!("small{u}/f{i}"))?;
                    f.write_at(0, &data)?;
                }
            }
        }
        Ok(())
    }
    fn run(&self, vfs: &dyn Vfs, ctx: &RunCtx) -> Result<RunOutput> {
        run_threads("smallfiles", self.users, |u| {
            let data = pattern(SMALL_FILE_BYTES, ctx.seed ^ u as u64);
            for i in 0..self.per_user() {
                let p = format!("small{u}/f{i}");
                if self.phase != Phase::Remove {
                    let f = vfs.create(&p)?;
                    f.write_at(0, &data)?;
                }
                if self.phase != Phase::Create {
                    vfs.unlink(&p)?;
                }
                ctx.tick(1);
            }
            Ok((self.per_user(), Vec::new()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::PosixVfs;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn the_tree_has_the_papers_shape() {
        let t = Tree::generate(TREE_FILES, TREE_BYTES, 1);
        assert_eq!(t.files.len() as u64, TREE_FILES);
        assert_eq!(t.bytes(), TREE_BYTES);
        assert_eq!(t.dirs.len(), 54);
        assert!(t.dirs.iter().all(|d| d.starts_with("d0")));
        let again = Tree::generate(TREE_FILES, TREE_BYTES, 1);
        assert_eq!(t.files, again.files, "seeded");
    }

    #[test]
    fn copy_remove_and_smallfiles_run() {
        let ctx = || RunCtx {
            seed: 3,
            progress: Arc::new(AtomicU64::new(0)),
        };
        let mut cases = vec![
            copy(Scale::Smoke, &Overrides::default()),
            remove(Scale::Smoke, &Overrides::default()),
        ];
        cases.extend(smallfiles_cases(Scale::Smoke, &Overrides::default()));
        for c in cases {
            let dir = tempfile::tempdir().unwrap();
            let vfs = PosixVfs::new(dir.path());
            c.setup(&vfs, 3).unwrap();
            let cx = ctx();
            let out = c.run(&vfs, &cx).unwrap();
            assert_eq!(out.ops, c.expected_ops(), "{} {}", c.workload(), c.label());
            assert_eq!(cx.progress.load(Ordering::Relaxed), out.ops);
            let left = vfs.list("").unwrap();
            match (c.workload(), c.label().as_str()) {
                ("remove", _) => assert_eq!(left, vec![("user0".to_string(), true)]),
                ("smallfiles", "create") => {
                    assert_eq!(vfs.list("small0").unwrap().len() as u64, out.ops)
                }
                ("smallfiles", _) => assert!(vfs.list("small0").unwrap().is_empty()),
                _ => {}
            }
        }
    }
}
