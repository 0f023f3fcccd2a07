// Extent trees written by others, read and edited by ordo.
//
// The in-memory tests prove the tree algorithms against a model; these prove
// the format against the implementations that define it. `debugfs` (through
// libext2fs) and the Linux kernel each write a deep, fragmented file into a
// fresh `mkfs.ext4` image with 1 KiB blocks; ordo walks the tree straight
// from the image file (verifying every tail checksum with its own seed
// chain) and must see exactly the extents `debugfs -R 'ex'` lists. Then
// ordo edits the kernel's tree in place (conversions, punches, thousands of
// inserts that split leaves and grow the tree) and e2fsck must find nothing
// wrong with the tree it wrote.
//
// Needs `mkfs.ext4`, `debugfs` and `e2fsck`. The kernel half also needs
// root and loop devices; without them it says so and only the debugfs half
// runs.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use ordo_format::csum::fs_csum_seed;
use ordo_format::extent::set_tail;
use ordo_fs::error::Result;
use ordo_fs::extent::{
    check, extents, insert, lookup, mark_written, remove_range, ExtentStore, LBLK_END,
    ROOT_SIZE_BYTES,
};
use ordo_fs::update::{Ino, UpdateKind};

const BLOCK_SIZE: u32 = 1024;

fn run(cmd: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn debugfs(img: &Path, request: &str) -> String {
    let (rc, out) = run("debugfs", &["-R", request, img.to_str().unwrap()]);
    assert_eq!(rc, 0, "debugfs -R {request}: {out}");
    out
}

fn debugfs_w(img: &Path, request: &str) -> String {
    let (rc, out) = run(
        "debugfs",
        &["-w", "-n", "-R", request, img.to_str().unwrap()],
    );
    assert_eq!(rc, 0, "debugfs -w -R {request}: {out}");
    out
}

fn mkfs(img: &Path) {
    let f = File::create(img).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let (rc, out) = run(
        "mkfs.ext4",
        &["-q", "-F", "-b", "1024", img.to_str().unwrap()],
    );
    assert_eq!(rc, 0, "mkfs.ext4: {out}");
}

/// Logical block -> (physical block, unwritten).
type Model = BTreeMap<u32, (u64, bool)>;

/// The leaf extents of `file` as `debugfs -R 'ex -l'` lists them, and the
/// tree blocks (children of interior entries) from `ex -n`.
fn debugfs_tree(img: &Path, file: &str) -> (Model, Vec<u64>) {
    let mut model = Model::new();
    for line in debugfs(img, &format!("ex -l {file}")).lines().skip(1) {
        let t: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == '/' || c == '-')
            .filter(|s| !s.is_empty())
            .collect();
        if t.len() < 9 || t[0].parse::<u32>().is_err() {
            continue;
        }
        let lblk: u32 = t[4].parse().unwrap();
        let pblk: u64 = t[6].parse().unwrap();
        let len: u32 = t[8].parse().unwrap();
        let unwritten = t.get(9) == Some(&"Uninit");
        for i in 0..len {
            model.insert(lblk + i, (pblk + u64::from(i), unwritten));
        }
    }
    let mut tree = Vec::new();
    for line in debugfs(img, &format!("ex -n {file}")).lines().skip(1) {
        let t: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == '/' || c == '-')
            .filter(|s| !s.is_empty())
            .collect();
        if t.len() < 8 || t[0].parse::<u32>().is_err() {
            continue;
        }
        tree.push(t[6].parse().unwrap());
    }
    (model, tree)
}

/// An inode's extent tree read from (and written to) an image file.
struct ImageStore {
    file: File,
    blocks_count: u64,
    fs_seed: u32,
    metadata_csum: bool,
    ino: Ino,
    generation: u32,
    root: [u8; ROOT_SIZE_BYTES],
    /// Byte offset of the inode in the image.
    inode_offset: u64,
    /// Free blocks (per debugfs) this store may hand out, last first.
    pool: Vec<u64>,
    tree_allocated: u64,
    tree_freed: u64,
    updates: Vec<UpdateKind>,
}

impl ImageStore {
    fn open(img: &Path, file: &str) -> Self {
        let f = OpenOptions::new().read(true).write(true).open(img).unwrap();
        let mut sb = [0u8; 1024];
        f.read_exact_at(&mut sb, 1024).unwrap();
        let le32 = |o: usize| u32::from_le_bytes(sb[o..o + 4].try_into().unwrap());
        assert_eq!(1024u32 << le32(0x18), BLOCK_SIZE);
        let incompat = le32(0x60);
        let ro_compat = le32(0x64);
        let mut blocks_count = u64::from(le32(0x04));
        if incompat & 0x80 != 0 {
            blocks_count |= u64::from(le32(0x150)) << 32;
        }
        let uuid: [u8; 16] = sb[0x68..0x78].try_into().unwrap();
        let fs_seed = if incompat & 0x2000 != 0 {
            le32(0x270)
        } else {
            fs_csum_seed(&uuid)
        };
        // "Inode 13 is part of block group 0\n\tlocated at block 278, offset 0x0000"
        let imap = debugfs(img, &format!("imap {file}"));
        let ino: Ino = imap
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("imap: {imap}"));
        let after = imap.split("located at block ").nth(1).unwrap();
        let block: u64 = after.split(',').next().unwrap().trim().parse().unwrap();
        let off = u64::from_str_radix(
            after
                .split("offset 0x")
                .nth(1)
                .unwrap()
                .trim()
                .get(..4)
                .unwrap(),
            16,
        )
        .unwrap();
        let inode_offset = block * u64::from(BLOCK_SIZE) + off;
        let mut inode = [0u8; 128];
        f.read_exact_at(&mut inode, inode_offset).unwrap();
        ImageStore {
            file: f,
            blocks_count,
            fs_seed,
            metadata_csum: ro_compat & 0x400 != 0,
            ino,
            generation: u32::from_le_bytes(inode[0x64..0x68].try_into().unwrap()),
            root: inode[0x28..0x64].try_into().unwrap(),
            inode_offset,
            pool: Vec::new(),
            tree_allocated: 0,
            tree_freed: 0,
            updates: Vec::new(),
        }
    }

    /// Write the root back into the inode (its checksum is then stale:
    /// the caller has debugfs rewrite the inode).
    fn store_root(&self) {
        self.file
            .write_all_at(&self.root, self.inode_offset + 0x28)
            .unwrap();
    }

    fn take_free_block(&mut self) -> u64 {
        self.pool.pop().expect("free block pool exhausted")
    }
}

impl ExtentStore for ImageStore {
    fn block_size(&self) -> u32 {
        BLOCK_SIZE
    }
    fn blocks_count(&self) -> u64 {
        self.blocks_count
    }
    fn ino(&self) -> Ino {
        self.ino
    }
    fn root(&self) -> [u8; ROOT_SIZE_BYTES] {
        self.root
    }
    fn set_root(&mut self, offset: u32, bytes: &[u8], kind: UpdateKind) -> Result<()> {
        let o = offset as usize;
        self.root[o..o + bytes.len()].copy_from_slice(bytes);
        self.updates.push(kind);
        Ok(())
    }
    fn read_tree_block(&mut self, pblk: u64) -> Result<Vec<u8>> {
        let mut b = vec![0u8; BLOCK_SIZE as usize];
        self.file
            .read_exact_at(&mut b, pblk * u64::from(BLOCK_SIZE))?;
        Ok(b)
    }
    fn alloc_tree_block(&mut self, _goal: u64) -> Result<u64> {
        self.tree_allocated += 1;
        Ok(self.take_free_block())
    }
    fn init_tree_block(&mut self, pblk: u64, image: &[u8]) -> Result<()> {
        self.file
            .write_all_at(image, pblk * u64::from(BLOCK_SIZE))?;
        self.updates
            .push(UpdateKind::ExtentBlockInit { ino: self.ino });
        Ok(())
    }
    fn modify_tree_block(
        &mut self,
        pblk: u64,
        offset: u32,
        bytes: &[u8],
        kind: UpdateKind,
    ) -> Result<()> {
        self.file
            .write_all_at(bytes, pblk * u64::from(BLOCK_SIZE) + u64::from(offset))?;
        self.updates.push(kind);
        Ok(())
    }
    fn free_tree_block(&mut self, _pblk: u64) -> Result<()> {
        self.tree_freed += 1;
        Ok(())
    }
    fn csum_tree_block(&self, image: &mut [u8]) {
        if self.metadata_csum {
            let _ = set_tail(self.fs_seed, self.ino, self.generation, image);
        }
    }
}

fn ordo_model(s: &mut ImageStore) -> Model {
    let mut m = Model::new();
    for e in extents(s, 0..LBLK_END).unwrap() {
        for i in 0..e.len {
            m.insert(e.lblk + i, (e.pblk + u64::from(i), e.unwritten));
        }
    }
    m
}

/// ordo reads the tree of `file` exactly as debugfs lists it.
fn assert_reads_like_debugfs(img: &Path, file: &str, depth_min: u16) -> (ImageStore, Model) {
    let (want, want_tree) = debugfs_tree(img, file);
    assert!(want.len() > 500, "{file}: only {} blocks", want.len());
    let mut s = ImageStore::open(img, file);
    assert!(s.metadata_csum, "mkfs.ext4 default has metadata_csum");
    let sum = check(&mut s).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert!(sum.depth >= depth_min, "{file}: depth {}", sum.depth);
    let mut tree = sum.tree_blocks.clone();
    tree.sort_unstable();
    let mut want_tree = want_tree;
    want_tree.sort_unstable();
    assert_eq!(tree, want_tree, "{file}: tree blocks");
    let got = ordo_model(&mut s);
    assert_eq!(got.len(), want.len(), "{file}: mapped blocks");
    assert!(got == want, "{file}: mappings differ from debugfs");
    assert_eq!(sum.mapped_blocks, want.len() as u64);
    // Point lookups agree too, holes included.
    for l in (0..want.keys().last().unwrap() + 3).step_by(7) {
        let m = lookup(&mut s, l).unwrap();
        let got = m.and_then(|m| m.pblk_of(l).map(|p| (p, m.unwritten)));
        assert_eq!(got, want.get(&l).copied(), "{file}: lookup {l}");
    }
    (s, want)
}

/// A host file with data in every other 1 KiB block and zeros between: the
/// zero blocks become holes when debugfs copies it in.
fn write_sparse_source(path: &Path, blocks: u32) {
    let f = File::create(path).unwrap();
    for i in (0..blocks).step_by(2) {
        let b = vec![(i % 251) as u8 + 1; BLOCK_SIZE as usize];
        f.write_all_at(&b, u64::from(i) * u64::from(BLOCK_SIZE))
            .unwrap();
    }
    f.set_len(u64::from(blocks) * u64::from(BLOCK_SIZE))
        .unwrap();
}

#[test]
fn reads_a_deep_tree_written_by_debugfs() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let src = dir.path().join("src.bin");
    mkfs(&img);
    write_sparse_source(&src, 3000);
    debugfs_w(&img, &format!("write {} /frag", src.display()));
    let (_, model) = assert_reads_like_debugfs(&img, "/frag", 2);
    assert_eq!(model.len(), 1500);
}

/// The kernel's half: a file written through a loop mount. Returns false
/// when this machine cannot mount.
fn kernel_write(img: &Path, mnt: &Path) -> bool {
    std::fs::create_dir_all(mnt).unwrap();
    let mount = match ordo_dev::KernelMount::mount(img, mnt, "") {
        Ok(m) => m,
        Err(e) => {
            eprintln!("kernel half skipped: {e}");
            return false;
        }
    };
    let result = std::panic::catch_unwind(|| {
        // Preallocated (unwritten) space with every other block written:
        // alternating written and unwritten extents, physically contiguous.
        let f = File::create(mnt.join("k")).unwrap();
        let r = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, 1800 * 1024) };
        assert_eq!(r, 0, "fallocate");
        for i in (0..1800u64).step_by(2) {
            f.write_all_at(&[0xa5; 1024], i * 1024).unwrap();
        }
        // Beyond the preallocation, written blocks with holes between.
        for i in (2000..2600u64).step_by(3) {
            f.write_all_at(&[0x5a; 1024], i * 1024).unwrap();
        }
        f.sync_all().unwrap();
    });
    // A loop mount just written can be busy for a moment (the loop
    // device's probe): the unmount retries before calling it a failure.
    if let Err(e) = mount.unmount() {
        panic!("umount: {e}");
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    true
}

#[test]
fn reads_and_edits_a_deep_tree_written_by_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    mkfs(&img);
    if !kernel_write(&img, &dir.path().join("mnt")) {
        return;
    }
    let (mut s, mut model) = assert_reads_like_debugfs(&img, "/k", 2);
    assert!(model.values().any(|v| v.1) && model.values().any(|v| !v.1));
    // A generation the kernel chose: the seed chain is really exercised.
    assert_ne!(s.generation, 0);

    // Blocks ordo may allocate, as debugfs sees them free.
    let ffb = debugfs(&img, "ffb 25000 20000");
    let mut pool: Vec<u64> = ffb
        .split("Free blocks found:")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map_while(|t| t.parse().ok())
        .collect();
    assert!(pool.len() >= 25_000);
    pool.reverse();
    s.pool = pool;
    let blockcount_before: u64 = debugfs(&img, "stat /k")
        .split("Blockcount: ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut data_delta: i64 = 0;

    // Convert part of the preallocation: the written halves merge.
    mark_written(&mut s, 100, 300).unwrap();
    for (_, v) in model.range_mut(100..400) {
        v.1 = false;
    }
    // Punch holes: one inside an extent run, one across many extents.
    for (l, n) in [(11u32, 1u32), (1500, 200), (2003, 30)] {
        let freed = remove_range(&mut s, l, u64::from(n)).unwrap();
        let before = model.len();
        model.retain(|&k, _| k < l || k >= l + n);
        let freed_n: u64 = freed.iter().map(|&(_, n)| u64::from(n)).sum();
        assert_eq!(freed_n as usize, before - model.len());
        data_delta -= freed_n as i64;
    }
    // Thousands of single-block extents past the end, in scrambled order:
    // leaves split and the tree grows a level.
    let n: u64 = 24_000;
    for k in 0..n {
        // A permutation of 0..n (2477 is coprime with n).
        let x = (k * 2477) % n;
        let lblk = 4000 + 2 * x as u32;
        let pblk = s.take_free_block();
        insert(&mut s, lblk, pblk, 1, false).unwrap();
        model.insert(lblk, (pblk, false));
    }
    data_delta += n as i64;
    // And drop a stretch of them again.
    let freed = remove_range(&mut s, 6000, 3000).unwrap();
    let freed_n: u64 = freed.iter().map(|&(_, n)| u64::from(n)).sum();
    model.retain(|&k, _| !(6000..9000).contains(&k));
    data_delta -= freed_n as i64;

    let sum = check(&mut s).unwrap();
    assert_eq!(
        sum.depth, 3,
        "24000 scattered inserts grow the tree to depth 3"
    );
    assert!(ordo_model(&mut s) == model, "ordo's own view after editing");
    assert!(s
        .updates
        .iter()
        .any(|k| matches!(k, UpdateKind::ExtentBlockInit { .. })));

    // Put the root into the inode and have debugfs fix the inode's size,
    // block count and checksum; bitmaps and free counts are e2fsck's job.
    s.store_root();
    let tree_delta = s.tree_allocated as i64 - s.tree_freed as i64;
    let sectors = (BLOCK_SIZE / 512) as i64;
    let blockcount = blockcount_before as i64 + (data_delta + tree_delta) * sectors;
    let size = (u64::from(*model.keys().last().unwrap()) + 1) * u64::from(BLOCK_SIZE);
    let ino = s.ino;
    drop(s);
    debugfs_w(&img, &format!("sif <{ino}> blocks {blockcount}"));
    debugfs_w(&img, &format!("sif <{ino}> size {size}"));

    // libext2fs reads back what ordo wrote.
    let (after, _) = debugfs_tree(&img, "/k");
    assert!(after == model, "debugfs reads ordo's tree differently");

    // e2fsck may only find allocation bookkeeping to fix (ordo's store did
    // not touch bitmaps or counters), nothing about the file or its tree.
    // Leaves filled in scrambled order "could be narrower": an optimization
    // e2fsck offers, not an error, so it is turned off.
    let img_s = img.to_str().unwrap();
    let (rc, out) = run("e2fsck", &["-fn", "-E", "no_optimize_extents", img_s]);
    let problems: Vec<&str> = out
        .lines()
        .filter(|l| {
            !(l.is_empty()
                || l.starts_with("Pass ")
                || l.starts_with("e2fsck ")
                || l.starts_with("Block bitmap differences")
                || l.contains("is marked BLOCK_UNINIT")
                || l.chars().all(|c| " +-()0123456789".contains(c))
                || l.starts_with("Free blocks count wrong")
                || l.starts_with("Fix? no")
                || l.contains("********** WARNING")
                || l.starts_with(img_s))
        })
        .collect();
    assert!(rc <= 4, "e2fsck -fn exit {rc}: {out}");
    assert!(
        problems.is_empty(),
        "e2fsck found more than bitmap bookkeeping: {problems:#?}"
    );
    let (rc, out) = run("e2fsck", &["-fy", "-E", "no_optimize_extents", img_s]);
    assert!(rc <= 1, "e2fsck -fy exit {rc}: {out}");
    let (rc, out) = run("e2fsck", &["-fn", "-E", "no_optimize_extents", img_s]);
    assert_eq!(rc, 0, "e2fsck -fn after fixing the counts: {out}");
    let (after, _) = debugfs_tree(&img, "/k");
    assert!(after == model, "the tree e2fsck left differs");
}
