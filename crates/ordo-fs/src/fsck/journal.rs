//! The journal check (the part of e2fsck's `journal.c` that `e2fsck -n`
//! runs).
//!
//! A `needs_recovery` flag without a journal is unsafe, as is a journal
//! superblock with a bad magic or block type. A journal that needs
//! recovery (the flag, or `s_start != 0` in the journal superblock) is
//! reported as info: like `e2fsck -n` the check runs on the image as it
//! is, without replaying it.
//!
//! Repairs: none. The benign repair refuses to run on a journal that
//! needs recovery: replay comes first (`protocol::recover`).

use ordo_dev::BlockClass;

use super::checker::*;
use super::layout::*;
use crate::error::FsError;

impl<'a> Checker<'a> {
    pub(super) fn check_journal(&mut self) -> Result<(), FsError> {
        let recover = self.sb.has_incompat(INCOMPAT_RECOVER);
        if !self.sb.has_compat(COMPAT_HAS_JOURNAL) {
            if recover {
                problem!(
                    self,
                    Unsafe,
                    Journal,
                    None,
                    None,
                    "superblock has needs_recovery set but no journal"
                );
            }
            return Ok(());
        }
        let jino = self.sb.journal_inum;
        let first = self.journal_first_block_from_inode(jino)?;
        let mut needs = recover;
        let mut recover_start = false;
        if let Some(b) = first {
            let data = self.disk.read_block(b, BlockClass::Journal)?;
            let magic = be32(&data, 0);
            let btype = be32(&data, 4);
            if magic != 0xC03B_3998 || !(btype == 3 || btype == 4) {
                problem!(
                    self,
                    Unsafe,
                    Journal,
                    Some(jino),
                    Some(b),
                    "journal superblock (block {b}) has bad magic {magic:#010x} / type {btype}"
                );
                return Ok(());
            }
            if be32(&data, 0x1C) != 0 {
                needs = true;
                recover_start = true;
            }
        }
        if needs {
            // As `e2fsck -n`: the check runs on the image as it is, without
            // replaying; the journal is reported, and the benign repair
            // refuses to run (replay must come first).
            self.journal_needs_recovery = true;
            problem!(
                self,
                Info,
                Journal,
                Some(jino),
                first,
                "journal needs recovery (needs_recovery flag {}, journal s_start {}); checked \
                 without replaying it",
                if recover { "set" } else { "clear" },
                if recover_start { "set" } else { "zero" }
            );
        }
        Ok(())
    }

    /// Physical block of logical block 0 of `ino`, from a depth-0 or deeper
    /// extent tree.
    fn journal_first_block_from_inode(&self, ino: u32) -> Result<Option<u64>, FsError> {
        let Some(inode) = self.read_inode(ino)? else {
            return Ok(None);
        };
        if inode.flags & INODE_EXTENTS_FL == 0 {
            let b = le32(inode.i_block(), 0) as u64;
            return Ok(self.geo.in_range(b).then_some(b));
        }
        let mut node = inode.i_block().to_vec();
        for _ in 0..=EXT_MAX_DEPTH {
            if le16(&node, 0) != 0xF30A || le16(&node, 2) == 0 {
                return Ok(None);
            }
            let depth = le16(&node, 6);
            let e = &node[12..24];
            if depth == 0 {
                if le32(e, 0) != 0 {
                    return Ok(None);
                }
                let p = le32(e, 8) as u64 | ((le16(e, 6) as u64) << 32);
                return Ok(self.geo.in_range(p).then_some(p));
            }
            let child = le32(e, 4) as u64 | ((le16(e, 8) as u64) << 32);
            if !self.geo.in_range(child) {
                return Ok(None);
            }
            node = self.disk.read_block(child, BlockClass::ExtentTree)?;
        }
        Ok(None)
    }
}
