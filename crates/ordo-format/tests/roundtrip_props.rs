//! Property tests: for arbitrary field values, encode then decode gives the
//! same value and a valid checksum; and directory blocks edited by random
//! insert/remove sequences always match a simple model and stay valid.

use proptest::prelude::*;

use ordo_format::dir::{self, DirBlockLayout};
use ordo_format::group::{self, GroupDesc};
use ordo_format::inode::{self, Inode, Timestamp};
use ordo_format::superblock::{GroupCsum, Superblock};

fn ts() -> impl Strategy<Value = Timestamp> {
    (-0x8000_0000i64..0x3_8000_0000i64, 0u32..1_000_000_000)
        .prop_map(|(sec, nsec)| Timestamp { sec, nsec })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn group_desc_round_trips(
        bb in 0u64..1 << 48, ib in 0u64..1 << 48, it in 0u64..1 << 48,
        fb in any::<u32>(), fi in any::<u32>(), dirs in any::<u32>(), flags in any::<u16>(),
        bcs in any::<u32>(), ics in any::<u32>(), unused in any::<u32>(),
        grp in any::<u32>(), seed in any::<u32>(),
    ) {
        let d = GroupDesc {
            block_bitmap: bb, inode_bitmap: ib, inode_table: it,
            free_blocks_count: fb, free_inodes_count: fi, used_dirs_count: dirs,
            flags, exclude_bitmap: 0, block_bitmap_csum: bcs, inode_bitmap_csum: ics,
            itable_unused: unused, checksum: 0,
        };
        let csum = GroupCsum::Crc32c { seed };
        let slot = d.encode(64, grp, csum);
        let back = GroupDesc::decode(&slot, 64).unwrap();
        prop_assert_eq!(GroupDesc { checksum: 0, ..back }, d);
        prop_assert!(group::verify_group_desc(&slot, grp, csum).is_ok());
    }

    #[test]
    fn inode_round_trips(
        mode in any::<u16>(), uid in any::<u32>(), gid in any::<u32>(), size in any::<u64>(),
        a in ts(), c in ts(), m in ts(), cr in ts(), links in any::<u16>(),
        blocks in 0u64..1 << 48, flags in any::<u32>(), gen in any::<u32>(),
        acl in 0u64..1 << 48, block in prop::array::uniform32(any::<u8>()),
        ino in 1u32.., seed in any::<u32>(), dtime in any::<u32>(),
    ) {
        let mut i = Inode::new(256, 32);
        i.mode = mode; i.uid = uid; i.gid = gid; i.size = size;
        i.atime = a; i.ctime = c; i.mtime = m; i.crtime = cr;
        i.links_count = links; i.blocks = blocks; i.flags = flags;
        i.generation = gen; i.file_acl = acl; i.dtime = dtime;
        i.block[..32].copy_from_slice(&block);
        let raw = i.encode(Some((seed, ino)));
        prop_assert!(inode::verify_inode_checksum(&raw, seed, ino).is_ok());
        let back = Inode::decode(&raw).unwrap();
        prop_assert_eq!(back.mode, mode);
        prop_assert_eq!((back.uid, back.gid, back.size), (uid, gid, size));
        prop_assert_eq!((back.atime, back.ctime, back.mtime, back.crtime), (a, c, m, cr));
        prop_assert_eq!((back.links_count, back.blocks, back.flags), (links, blocks, flags));
        prop_assert_eq!((back.generation, back.file_acl, back.dtime), (gen, acl, dtime));
        prop_assert_eq!(back.block, i.block);
        prop_assert_eq!(back.encode(Some((seed, ino))), raw);
    }

    #[test]
    fn superblock_round_trips(
        free_blocks in 0u64..1 << 40, free_inodes in any::<u32>(), state in any::<u16>(),
        orphan in any::<u32>(), kbytes in any::<u64>(), wtime in 0u64..1 << 40,
        label in prop::array::uniform16(any::<u8>()), seed in prop::array::uniform4(any::<u32>()),
    ) {
        let mut sb = Superblock::blank();
        sb.features.incompat |= ordo_format::features::incompat::INCOMPAT_64BIT;
        sb.features.ro_compat |= ordo_format::features::ro_compat::METADATA_CSUM;
        sb.checksum_type = 1;
        sb.desc_size_raw = 64;
        sb.free_blocks_count = free_blocks; sb.free_inodes_count = free_inodes;
        sb.state = state; sb.last_orphan = orphan; sb.kbytes_written = kbytes;
        sb.wtime = wtime; sb.volume_name = label; sb.hash_seed = seed;
        let raw = sb.encode();
        let back = Superblock::decode(&raw).unwrap();
        prop_assert_eq!(back.free_blocks_count, free_blocks);
        prop_assert_eq!((back.free_inodes_count, back.state, back.last_orphan), (free_inodes, state, orphan));
        prop_assert_eq!((back.kbytes_written, back.wtime), (kbytes, wtime));
        prop_assert_eq!((back.volume_name, back.hash_seed), (label, seed));
        prop_assert_eq!(back.encode(), raw);
    }

    /// Random insert/remove sequences against a model of the block's names.
    #[test]
    fn dir_block_matches_model(ops in prop::collection::vec((any::<bool>(), 0u32..40, 1usize..40), 1..200)) {
        let layout = DirBlockLayout { block_size: 1024, has_tail: true };
        let mut blk = vec![0u8; 1024];
        dir::init_dot_dotdot(&mut blk, layout, 2, 2, true);
        let mut model: std::collections::BTreeMap<Vec<u8>, u32> = Default::default();
        for (insert, id, len) in ops {
            let name: Vec<u8> = format!("{id:0len$}").into_bytes();
            if insert {
                if model.contains_key(&name) { continue; }
                let before = blk.clone();
                match dir::insert(&mut blk, layout, 100 + id, &name, 1).unwrap() {
                    Some(r) => {
                        model.insert(name, 100 + id);
                        // Nothing outside the reported range changed.
                        for k in (0..1024).filter(|k| !r.contains(k)) {
                            prop_assert_eq!(before[k], blk[k]);
                        }
                    }
                    None => prop_assert_eq!(&before, &blk),
                }
            } else {
                let before = blk.clone();
                let got = dir::remove(&mut blk, layout, &name).unwrap();
                prop_assert_eq!(got.as_ref().map(|g| g.1), model.remove(&name));
                if let Some((r, _)) = got {
                    for k in (0..1024).filter(|k| !r.contains(k)) {
                        prop_assert_eq!(before[k], blk[k]);
                    }
                }
            }
            dir::validate_block(&blk, layout, None).unwrap();
            let live: std::collections::BTreeMap<Vec<u8>, u32> = dir::iter(&blk, layout)
                .map(|e| e.unwrap())
                .filter(|e| e.inode != 0 && e.name != b"." && e.name != b"..")
                .map(|e| (e.name.to_vec(), e.inode))
                .collect();
            prop_assert_eq!(&live, &model);
        }
    }
}
