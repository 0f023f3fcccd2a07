//! Decode images made by e2fsprogs' `mkfs.ext4` and compare with what
//! `dumpe2fs` reports: the strongest check that ordo reads ext4 the way the
//! reference tools write it. Every structure is also re-encoded and must come
//! out byte-identical, checksums included.

mod common;

use std::process::Command;

use common::*;
use ordo_format::csum;
use ordo_format::dir;
use ordo_format::group;
use ordo_format::inode;
use ordo_format::superblock::{GroupCsum, Superblock};

fn check_image(tag: &str, size: &str, args: &[&str]) -> (TempImage, Image) {
    let t = mkfs(tag, size, args);
    let img = Image::load(&t.path);
    img.check_all(&dumpe2fs_h(&t.path));
    (t, img)
}

#[test]
fn default_ext4_1k_blocks() {
    let (_t, img) = check_image("default", "64M", &[]);
    assert!(img.sb.has_journal());
    assert_eq!(
        img.sb.group_csum(),
        GroupCsum::Crc32c {
            seed: img.sb.csum_seed()
        }
    );
    assert_eq!(img.sb.first_data_block, 1);
    // Backups where sparse_super puts them.
    for g in 0..img.sb.groups_count() {
        let first = img.sb.group_first_block(g) as usize * img.bs();
        let here = &img.bytes[first..first + 1024];
        let is_sb = Superblock::decode(here).is_ok();
        assert_eq!(is_sb, img.sb.has_super(g), "group {g}");
        if is_sb && g > 0 {
            assert_eq!(Superblock::decode(here).unwrap().block_group_nr as u64, g);
        }
    }
}

#[test]
fn default_ext4_4k_blocks_large() {
    let (_t, img) = check_image("4k", "1G", &["-b", "4096"]);
    assert_eq!(img.sb.first_data_block, 0);
    assert_eq!(img.sb.groups_count(), 8);
}

#[test]
fn short_last_group() {
    let (_t, img) = check_image("short", "33M", &["-b", "4096"]);
    let last = img.sb.groups_count() - 1;
    assert!(img.sb.blocks_in_group(last) < img.sb.blocks_per_group);
}

#[test]
fn uninit_bg_crc16_descriptors() {
    let (_t, img) = check_image("crc16", "64M", &["-O", "^metadata_csum,uninit_bg"]);
    assert!(matches!(img.sb.group_csum(), GroupCsum::Crc16 { .. }));
}

#[test]
fn no_64bit_small_descriptors() {
    let (_t, img) = check_image("32desc", "64M", &["-O", "^64bit"]);
    assert_eq!(img.sb.desc_size(), 32);
}

#[test]
fn plain_ext2_layout() {
    let (_t, img) = check_image(
        "ext2",
        "16M",
        &[
            "-O",
            "^has_journal,^metadata_csum,^extent,^flex_bg,^64bit,^huge_file",
        ],
    );
    assert!(!img.sb.has_group_csum());
}

#[test]
fn csum_seed_feature() {
    let (_t, img) = check_image("seed", "32M", &["-O", "metadata_csum_seed"]);
    assert_ne!(img.sb.checksum_seed, 0);
    assert_eq!(img.sb.csum_seed(), img.sb.checksum_seed);
}

#[test]
fn htree_directory_from_e2fsck_rehash() {
    let t = temp_path("htree");
    let src = t.with_extension("src");
    let big = src.join("big");
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..400 {
        std::fs::write(big.join(format!("a-fairly-long-file-name-{i:05}")), b"x").unwrap();
    }
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "1024", "-E", "root_owner=0:0", "-d"])
        .arg(&src)
        .arg(&t)
        .arg("32M")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let guard = TempImage { path: t.clone() };
    // -D rebuilds (and indexes) directories.
    let st = Command::new("e2fsck")
        .args(["-fyD"])
        .arg(&t)
        .output()
        .unwrap();
    assert!(
        st.status.code().unwrap() <= 1,
        "{}",
        String::from_utf8_lossy(&st.stdout)
    );
    let img = Image::load(&guard.path);
    let root = img.list_dir(inode::ROOT_INO);
    let big_ino = root.iter().find(|(n, _, _)| n == "big").unwrap().1;
    let bi = img.inode(big_ino);
    assert!(
        bi.has_flag(inode::flags::INDEX),
        "e2fsck -D indexes a 400-entry dir"
    );
    let names = img.list_dir(big_ino);
    assert_eq!(names.len(), 402);
    // Dropping the index: every dx block linearizes into a valid leaf.
    let seed = csum::inode_csum_seed(img.sb.csum_seed(), big_ino, bi.generation);
    let blocks = img.leaf_blocks(&bi);
    let mut root_blk = img.block(blocks[0]).to_vec();
    dir::linearize_dx_block(&mut root_blk, img.layout(), dir::DxKind::Root);
    dir::set_dirent_tail_checksum(&mut root_blk, seed);
    dir::validate_block(&root_blk, img.layout(), None).unwrap();
    dir::verify_dirent_block(&root_blk, seed).unwrap();
}

#[test]
fn flipped_bytes_are_detected_in_a_real_image() {
    let t = mkfs("flip", "16M", &[]);
    let img = Image::load(&t.path);
    // Superblock: any byte of the checksummed area.
    for pos in [0x00usize, 0x5C, 0x68, 0x100, 0x3FB] {
        let mut sbb = img.bytes[1024..2048].to_vec();
        sbb[pos] ^= 0x01;
        assert!(
            Superblock::decode(&sbb).is_err(),
            "superblock byte {pos:#x}"
        );
    }
    // Group descriptor 0.
    let gdt = 2 * img.bs();
    let ds = usize::from(img.sb.desc_size());
    let mut slot = img.bytes[gdt..gdt + ds].to_vec();
    slot[4] ^= 0x80;
    assert!(group::verify_group_desc(&slot, 0, img.sb.group_csum()).is_err());
    // Root inode.
    let mut raw = img.inode_slot(2).to_vec();
    raw[0x20] ^= 0x02;
    assert!(inode::verify_inode_checksum(&raw, img.sb.csum_seed(), 2).is_err());
    // Root directory block.
    let root = img.inode(2);
    let pblk = img.leaf_blocks(&root)[0];
    let mut blk = img.block(pblk).to_vec();
    blk[9] ^= 0x04;
    let seed = csum::inode_csum_seed(img.sb.csum_seed(), 2, root.generation);
    assert!(dir::verify_dirent_block(&blk, seed).is_err());
    // Block bitmap of group 0.
    let mut bm = img.block(img.descs[0].block_bitmap).to_vec();
    bm[100] ^= 0x10;
    let c = group::block_bitmap_checksum(img.sb.csum_seed(), &bm, img.sb.clusters_per_group);
    assert!(!group::bitmap_csum_matches(
        img.descs[0].block_bitmap_csum,
        c,
        64
    ));
}
