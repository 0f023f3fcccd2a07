//! Passes 3 and 4: connectivity and link counts (e2fsck's `pass3.c` and
//! `pass4.c`).
//!
//! Pass 3 walks each directory's ".." up to the root: a directory that
//! does not reach it, or whose ".." differs from the directory naming it,
//! is unsafe. Pass 4 compares each in-use inode's i_links_count with the
//! links pass 2 counted (with the dir_nlink rule: a directory past
//! `EXT4_LINK_MAX` keeps a count of 1), and finds in-use inodes no entry
//! names.
//!
//! Repairs: link counts that are too *high* (lowered to the counted
//! value) and leaked inodes, in use but named by nothing (released, with
//! the blocks they claim), which an in-place file system leaves when a
//! crash falls between writing an inode and its entry. A link count too
//! low, or an unreachable directory, is unsafe.

use std::collections::{BTreeMap, HashSet};

use super::checker::*;

impl<'a> Checker<'a> {
    pub(super) fn pass3(&mut self) {
        let dirs: Vec<u32> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.is_dir())
            .map(|(&n, _)| n)
            .collect();
        if !self.inodes.get(&2).is_some_and(|i| i.is_dir()) {
            // Already reported in pass 1; nothing is reachable.
            return;
        }
        let limit = dirs.len() + 1;
        for &d in &dirs {
            if d == 2 {
                if let Some(&dd) = self.dotdot.get(&2) {
                    if dd != 2 {
                        problem!(
                            self,
                            Unsafe,
                            Connectivity,
                            Some(2),
                            None,
                            "root directory '..' is {dd}, should be 2"
                        );
                    }
                }
                continue;
            }
            // Walk up to the root.
            let mut cur = d;
            let mut steps = 0;
            let mut connected = false;
            while steps <= limit {
                match self.parent.get(&cur) {
                    Some(&2) => {
                        connected = true;
                        break;
                    }
                    Some(&p) => cur = p,
                    None => break,
                }
                steps += 1;
            }
            if !connected {
                let empty = !self.nonempty_dirs.contains(&d) && !self.parent.contains_key(&d);
                if empty {
                    // An empty directory no entry names: leaked by a crash
                    // between writing it and writing its entry.
                    problem!(
                        self,
                        Benign,
                        LeakedInode,
                        Some(d),
                        None,
                        "empty directory inode {d} is not referenced by any entry"
                    );
                    self.leaked.push(d);
                } else {
                    problem!(
                        self,
                        Unsafe,
                        Connectivity,
                        Some(d),
                        None,
                        "directory inode {d} is not connected to the root"
                    );
                }
                continue;
            }
            if let (Some(&p), Some(&dd)) = (self.parent.get(&d), self.dotdot.get(&d)) {
                if p != dd {
                    problem!(
                        self,
                        Unsafe,
                        Connectivity,
                        Some(d),
                        None,
                        "directory inode {d} '..' is {dd}, its parent is {p}"
                    );
                }
            }
        }
    }

    pub(super) fn pass4(&mut self) {
        let leaked_dirs: HashSet<u32> = self.leaked.iter().copied().collect();
        // Entries inside leaked (empty) directories do not count: their
        // ".." goes away with them.
        let mut counted = self.counted.clone();
        for &d in &leaked_dirs {
            if let Some(&dd) = self.dotdot.get(&d) {
                if let Some(c) = counted.get_mut(&dd) {
                    *c = c.saturating_sub(1);
                }
            }
        }
        let inos: Vec<u32> = self.inodes.keys().copied().collect();
        for ino in inos {
            if ino < self.sb.first_ino && ino != 2 {
                continue;
            }
            if leaked_dirs.contains(&ino) {
                continue;
            }
            let info = &self.inodes[&ino];
            let is_dir = info.is_dir();
            let links = info.links as u32;
            let raw_counted = self.counted.get(&ino).copied().unwrap_or(0);
            let mut c = counted.get(&ino).copied().unwrap_or(0);
            if raw_counted == 0 {
                if !is_dir {
                    problem!(
                        self,
                        Benign,
                        LeakedInode,
                        Some(ino),
                        None,
                        "inode {ino} (i_links_count {links}) is in use but no entry names it"
                    );
                    self.leaked.push(ino);
                }
                continue;
            }
            if is_dir && c > EXT4_LINK_MAX {
                c = 1;
            }
            if links != c {
                if links > c {
                    problem!(
                        self,
                        Benign,
                        LinkCount,
                        Some(ino),
                        None,
                        "inode {ino} i_links_count is {links}, counted {c} (too high)"
                    );
                } else {
                    problem!(
                        self,
                        Unsafe,
                        LinkCount,
                        Some(ino),
                        None,
                        "inode {ino} i_links_count is {links}, counted {c} (too low)"
                    );
                }
            }
        }
    }

    /// Link counts as the benign repair should set them.
    pub(crate) fn wanted_links(&self) -> BTreeMap<u32, u32> {
        let leaked: HashSet<u32> = self.leaked.iter().copied().collect();
        let mut counted = self.counted.clone();
        for &d in &self.leaked {
            if let Some(&dd) = self.dotdot.get(&d) {
                if let Some(c) = counted.get_mut(&dd) {
                    *c = c.saturating_sub(1);
                }
            }
        }
        let mut out = BTreeMap::new();
        for (&ino, info) in &self.inodes {
            if (ino < self.sb.first_ino && ino != 2) || leaked.contains(&ino) {
                continue;
            }
            let mut c = counted.get(&ino).copied().unwrap_or(0);
            if info.is_dir() && c > EXT4_LINK_MAX {
                c = 1;
            }
            if c > 0 && (info.links as u32) > c {
                out.insert(ino, c);
            }
        }
        out
    }
}
