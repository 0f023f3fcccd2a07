//! Helpers shared by the image tests: run e2fsprogs, load an image and walk
//! it with ordo-format's decoders, checking every checksum on the way.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use ordo_format::dir::{self, DirBlockLayout};
use ordo_format::group::{self, GroupDesc, BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use ordo_format::inode::{self, Inode};
use ordo_format::superblock::Superblock;
use ordo_format::{bitmap, csum};

pub struct TempImage {
    pub path: PathBuf,
}

impl Drop for TempImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir_all(self.path.with_extension("src"));
    }
}

pub fn temp_path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    std::env::temp_dir().join(format!(
        "ordo-format-test-{}-{tag}-{n}.img",
        std::process::id()
    ))
}

/// Run mkfs.ext4 with `args` on a fresh sparse image of `size` (e.g. "64M").
pub fn mkfs(tag: &str, size: &str, args: &[&str]) -> TempImage {
    let path = temp_path(tag);
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "root_owner=0:0"])
        .args(args)
        .arg(&path)
        .arg(size)
        .output()
        .expect("mkfs.ext4 must be installed (e2fsprogs)");
    assert!(
        out.status.success(),
        "mkfs.ext4 {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    TempImage { path }
}

pub fn dumpe2fs_h(path: &Path) -> HashMap<String, String> {
    let out = Command::new("dumpe2fs")
        .arg("-h")
        .arg(path)
        .output()
        .expect("dumpe2fs");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

pub fn num(map: &HashMap<String, String>, key: &str) -> u64 {
    map.get(key)
        .unwrap_or_else(|| panic!("dumpe2fs has no {key:?}"))
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("{key}: {:?}", map[key]))
}

pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// An image loaded into memory with its decoded superblock and descriptors.
pub struct Image {
    pub bytes: Vec<u8>,
    pub sb: Superblock,
    pub descs: Vec<GroupDesc>,
}

impl Image {
    pub fn load(path: &Path) -> Image {
        let bytes = std::fs::read(path).unwrap();
        let sb = Superblock::decode(&bytes[1024..2048]).expect("superblock decodes");
        let mut img = Image {
            bytes,
            sb,
            descs: Vec::new(),
        };
        let ds = usize::from(img.sb.desc_size());
        let gdt = img.sb.gdt_first_block(0) as usize * img.bs();
        for g in 0..img.sb.groups_count() as usize {
            let slot = &img.bytes[gdt + g * ds..gdt + (g + 1) * ds];
            group::verify_group_desc(slot, g as u32, img.sb.group_csum())
                .unwrap_or_else(|e| panic!("group {g}: {e}"));
            let d = GroupDesc::decode(slot, ds as u16).unwrap();
            assert_eq!(
                d.encode(ds as u16, g as u32, img.sb.group_csum()),
                slot,
                "group {g} re-encodes identically"
            );
            img.descs.push(d);
        }
        img
    }
    pub fn bs(&self) -> usize {
        self.sb.block_size() as usize
    }
    pub fn block(&self, b: u64) -> &[u8] {
        let bs = self.bs();
        &self.bytes[b as usize * bs..(b as usize + 1) * bs]
    }
    pub fn inode_slot(&self, ino: u32) -> &[u8] {
        let g = self.sb.group_of_inode(ino) as usize;
        let (blk, off) = self.sb.inode_location(self.descs[g].inode_table, ino);
        let isz = usize::from(self.sb.inode_size());
        let start = blk as usize * self.bs() + off;
        &self.bytes[start..start + isz]
    }
    pub fn inode(&self, ino: u32) -> Inode {
        let slot = self.inode_slot(ino);
        if let Some(seed) = self.sb.metadata_csum_seed() {
            inode::verify_inode_checksum(slot, seed, ino)
                .unwrap_or_else(|e| panic!("inode {ino}: {e}"));
        }
        let i = Inode::decode(slot).unwrap();
        let again = i.encode(self.sb.metadata_csum_seed().map(|s| (s, ino)));
        assert_eq!(again, slot, "inode {ino} re-encodes identically");
        i
    }
    /// Physical blocks of a file, in logical order: extent trees of depth 0
    /// or 1, or the direct blocks of a block-mapped (ext2) inode.
    pub fn leaf_blocks(&self, i: &Inode) -> Vec<u64> {
        if !i.uses_extents() {
            let count = (i.size as usize).div_ceil(self.bs()).min(12);
            return (0..count)
                .map(|k| u32::from_le_bytes(i.block[4 * k..4 * k + 4].try_into().unwrap()) as u64)
                .collect();
        }
        let mut out = Vec::new();
        self.walk_extents(&i.block, &mut out);
        out
    }
    pub fn walk_extents(&self, node: &[u8], out: &mut Vec<u64>) {
        let u16at = |o: usize| u16::from_le_bytes([node[o], node[o + 1]]) as u64;
        let u32at = |o: usize| u32::from_le_bytes(node[o..o + 4].try_into().unwrap()) as u64;
        assert_eq!(u16at(0), 0xF30A, "extent magic");
        let entries = u16at(2) as usize;
        let depth = u16at(6);
        for e in 0..entries {
            let o = 12 + 12 * e;
            if depth == 0 {
                let len = u16at(o + 4);
                let start = u16at(o + 6) << 32 | u32at(o + 8);
                out.extend(start..start + len);
            } else {
                let child = u16at(o + 8) << 32 | u32at(o + 4);
                let blk = self.block(child).to_vec();
                self.walk_extents(&blk, out);
            }
        }
    }
    /// A file's contents (its mapped blocks, cut to i_size; holes not supported).
    pub fn read_file(&self, i: &Inode) -> Vec<u8> {
        let mut out = Vec::new();
        for b in self.leaf_blocks(i) {
            out.extend_from_slice(self.block(b));
        }
        out.truncate(i.size as usize);
        out
    }
    pub fn layout(&self) -> DirBlockLayout {
        DirBlockLayout {
            block_size: self.bs(),
            has_tail: self.sb.has_metadata_csum(),
        }
    }
    /// Names and inode numbers in a linear directory, checking every block.
    pub fn list_dir(&self, ino: u32) -> Vec<(String, u32, u8)> {
        let i = self.inode(ino);
        assert!(i.is_dir());
        let seed = self
            .sb
            .metadata_csum_seed()
            .map(|s| csum::inode_csum_seed(s, ino, i.generation));
        let mut out = Vec::new();
        for (lblk, pblk) in self.leaf_blocks(&i).into_iter().enumerate() {
            let blk = self.block(pblk);
            if i.has_flag(inode::flags::INDEX) {
                let has_csum = seed.is_some();
                let d = if lblk == 0 {
                    Some(dir::decode_dx_root(blk, has_csum).expect("dx root"))
                } else if dir::looks_like_dx_node(blk) {
                    Some(dir::decode_dx_node(blk, has_csum).expect("dx node"))
                } else {
                    None
                };
                if let Some(d) = d {
                    if let Some(s) = seed {
                        dir::verify_dx_checksum(blk, &d, s).expect("dx checksum");
                    }
                    if lblk == 0 {
                        out.push((".".into(), ino, dir::ft::DIR));
                        out.push((
                            "..".into(),
                            u32::from_le_bytes(blk[12..16].try_into().unwrap()),
                            dir::ft::DIR,
                        ));
                    }
                    continue;
                }
            }
            dir::validate_block(blk, self.layout(), Some(self.sb.inodes_count))
                .unwrap_or_else(|e| panic!("dir {ino} block {pblk}: {e}"));
            if let Some(s) = seed {
                dir::verify_dirent_block(blk, s).unwrap();
            }
            for e in dir::iter(blk, self.layout()) {
                let e = e.unwrap();
                if e.inode != 0 {
                    out.push((
                        String::from_utf8_lossy(e.name).into_owned(),
                        e.inode,
                        e.file_type,
                    ));
                }
            }
        }
        out
    }

    /// Everything a fresh mkfs image must satisfy.
    pub fn check_all(&self, dump: &HashMap<String, String>) {
        let sb = &self.sb;
        assert_eq!(u64::from(sb.inodes_count), num(dump, "Inode count"));
        assert_eq!(sb.blocks_count, num(dump, "Block count"));
        assert_eq!(sb.r_blocks_count, num(dump, "Reserved block count"));
        assert_eq!(sb.free_blocks_count, num(dump, "Free blocks"));
        assert_eq!(u64::from(sb.free_inodes_count), num(dump, "Free inodes"));
        assert_eq!(u64::from(sb.first_data_block), num(dump, "First block"));
        assert_eq!(u64::from(sb.block_size()), num(dump, "Block size"));
        assert_eq!(
            u64::from(sb.blocks_per_group),
            num(dump, "Blocks per group")
        );
        assert_eq!(
            u64::from(sb.inodes_per_group),
            num(dump, "Inodes per group")
        );
        assert_eq!(u64::from(sb.inode_size()), num(dump, "Inode size"));
        assert_eq!(u64::from(sb.first_ino()), num(dump, "First inode"));
        assert_eq!(
            u64::from(sb.inode_table_blocks()),
            num(dump, "Inode blocks per group")
        );
        assert_eq!(uuid_string(&sb.uuid), dump["Filesystem UUID"]);
        if let Some(r) = dump.get("Reserved GDT blocks") {
            assert_eq!(u64::from(sb.reserved_gdt_blocks), r.parse::<u64>().unwrap());
        }
        if sb.has_64bit() {
            assert_eq!(
                u64::from(sb.desc_size()),
                num(dump, "Group descriptor size")
            );
        }
        if sb.has_flex_bg() {
            assert_eq!(sb.groups_per_flex(), num(dump, "Flex block group size"));
        }
        let features: Vec<&str> = dump["Filesystem features"].split_whitespace().collect();
        let mut ours = sb.features.names();
        ours.sort();
        let mut theirs: Vec<String> = features.iter().map(|s| s.to_string()).collect();
        theirs.sort();
        assert_eq!(ours, theirs);
        assert!(sb.features.unsupported_incompat().is_empty());
        if sb.has_metadata_csum() {
            assert_eq!(format!("{:#010x}", sb.checksum), dump["Checksum"]);
        }
        assert_eq!(dump["Filesystem state"], "clean");
        assert_eq!(sb.state & ordo_format::superblock::STATE_VALID, 1);
        assert_eq!(
            sb.encode()[..],
            self.bytes[1024..2048],
            "superblock re-encodes identically"
        );

        // Group counts add up to the superblock's, and bitmaps match.
        let mut free_blocks = 0u64;
        let mut free_inodes = 0u64;
        for (g, d) in self.descs.iter().enumerate() {
            free_blocks += u64::from(d.free_blocks_count);
            free_inodes += u64::from(d.free_inodes_count);
            if let Some(seed) = sb.metadata_csum_seed() {
                if !d.has_flag(BG_BLOCK_UNINIT) {
                    let c = group::block_bitmap_checksum(
                        seed,
                        self.block(d.block_bitmap),
                        sb.clusters_per_group,
                    );
                    assert!(
                        group::bitmap_csum_matches(d.block_bitmap_csum, c, sb.desc_size()),
                        "group {g} block bitmap csum"
                    );
                    let bm = self.block(d.block_bitmap);
                    let n = sb.blocks_in_group(g as u64) as usize;
                    assert_eq!(
                        bitmap::count_zero(bm, 0, n) as u32,
                        d.free_blocks_count,
                        "group {g} free blocks vs bitmap"
                    );
                }
                if d.has_flag(BG_BLOCK_UNINIT) {
                    // The bitmap the kernel would build agrees with the
                    // descriptor's free count.
                    let bm = group::uninit_block_bitmap(sb, g as u64, d);
                    let n = sb.blocks_in_group(g as u64) as usize;
                    assert_eq!(
                        bitmap::count_zero(&bm, 0, n) as u32,
                        d.free_blocks_count,
                        "group {g}: BLOCK_UNINIT bitmap vs free count"
                    );
                }
                if !d.has_flag(BG_INODE_UNINIT) {
                    let c = group::inode_bitmap_checksum(
                        seed,
                        self.block(d.inode_bitmap),
                        sb.inodes_per_group,
                    );
                    assert!(
                        group::bitmap_csum_matches(d.inode_bitmap_csum, c, sb.desc_size()),
                        "group {g} inode bitmap csum"
                    );
                }
            }
        }
        assert_eq!(free_blocks, sb.free_blocks_count);
        assert_eq!(free_inodes, u64::from(sb.free_inodes_count));

        // Every in-use inode of group 0 decodes, verifies and re-encodes.
        let ibm = self.block(self.descs[0].inode_bitmap);
        for idx in 0..sb.inodes_per_group as usize {
            if bitmap::test(ibm, idx) {
                let ino = idx as u32 + 1;
                let _ = self.inode(ino);
            }
        }
        let root = self.inode(inode::ROOT_INO);
        assert!(root.is_dir());
        assert_eq!(root.mode & 0o7777, 0o755);
        assert_eq!(root.links_count, 3);
        let names = self.list_dir(inode::ROOT_INO);
        let just: Vec<&str> = names.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(just, vec![".", "..", "lost+found"]);
        assert_eq!(names[2].1, inode::LOST_AND_FOUND_INO);
        if sb.has_filetype() {
            assert_eq!(names[2].2, dir::ft::DIR);
        }
        let lf = self.inode(inode::LOST_AND_FOUND_INO);
        assert_eq!(lf.mode & 0o7777, 0o700);
        assert_eq!(self.list_dir(inode::LOST_AND_FOUND_INO).len(), 2);
    }
}
