//! Backlinks (`Capabilities::backlinks`, NoFS): every inode names the
//! directories that link to it, and a name resolves only to an inode that
//! names its directory back.
//!
//! The list is the value of the extended attribute `trusted.ordo.bl`,
//! kept in the inode's own attribute area: one little-endian u32 per link
//! (a directory holding two names of a file appears twice), at most
//! [`BACKLINKS_MAX`]; a file with more links than that keeps the first
//! ones and a final [`OVERFLOW`] entry, which any directory matches
//! (docs/FORMAT.md, "Backlinks"). Directories have one link from their
//! parent; `.` and `..` are not counted. The attribute is written in the
//! same handle as the entry it mirrors, but with no order between the two
//! blocks: after a crash an entry may name an inode that does not name its
//! directory back (a stale name, which lookups refuse and the scanners
//! remove), or an inode may name a directory whose entry never reached the
//! disk (an orphan, which the scanners link back).

use ordo_format::xattr::index;

use crate::error::{errno, Result};
use crate::state::Core;
use crate::update::Ino;

/// The attribute's name in the `trusted.` namespace.
pub const NAME: &[u8] = b"ordo.bl";
/// The attribute naming a file's blocks that read as EIO (`trusted.`
/// namespace): blocks the scanners took from the file because another
/// file's owner record proves them its own. Little-endian u32 logical
/// blocks, ascending, at most [`POISON_MAX`].
pub const EIO_NAME: &[u8] = b"ordo.eio";

/// The attribute (index 4, `trusted.`) by which an attribute block names
/// its owner under backlinks: `le32 ino, le32 i_generation`. ext4 seeds an
/// attribute block's checksum with the block number only, so without it a
/// block freed by one file and taken by the next could show the earlier
/// file's attributes after a crash (docs/FORMAT.md, "Backlinks").
pub const OWNER_NAME: &[u8] = b"ordo.own";

/// The owner mark of inode `ino` of generation `generation`.
pub(crate) fn owner_mark(ino: Ino, generation: u32) -> ordo_format::xattr::Attr {
    let mut value = ino.to_le_bytes().to_vec();
    value.extend_from_slice(&generation.to_le_bytes());
    ordo_format::xattr::Attr {
        index: ordo_format::xattr::index::TRUSTED,
        name: OWNER_NAME.to_vec(),
        value,
    }
}
/// Most blocks a poison list holds (a file that would need more is cut
/// short at the first instead).
pub const POISON_MAX: usize = 32;

/// Most directories a list names before it overflows.
pub const BACKLINKS_MAX: usize = 16;
/// The last entry of an overflowed list: any directory matches.
pub const OVERFLOW: u32 = u32::MAX;

/// Decode a list (a truncated trailing entry is ignored).
pub fn decode(v: &[u8]) -> Vec<u32> {
    v.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// Encode a list, bounded: more than [`BACKLINKS_MAX`] links keep the
/// first `BACKLINKS_MAX - 1` and [`OVERFLOW`].
pub fn encode(list: &[u32]) -> Vec<u8> {
    let mut l: Vec<u32> = list.to_vec();
    if l.len() > BACKLINKS_MAX || l.contains(&OVERFLOW) {
        l.retain(|&d| d != OVERFLOW);
        l.truncate(BACKLINKS_MAX - 1);
        l.push(OVERFLOW);
    }
    l.iter().flat_map(|d| d.to_le_bytes()).collect()
}

impl Core {
    /// `ino`'s backlinks (empty when it has none).
    pub(crate) fn backlinks_of(&mut self, ino: Ino) -> Result<Vec<u32>> {
        Ok(self
            .xattr_get_raw(ino, index::TRUSTED, NAME)?
            .map(|v| decode(&v))
            .unwrap_or_default())
    }

    /// Replace `ino`'s backlinks.
    pub(crate) fn set_backlinks(&mut self, ino: Ino, list: &[u32]) -> Result<()> {
        let v = (!list.is_empty()).then(|| encode(list));
        self.xattr_put_raw(ino, index::TRUSTED, NAME, v)
    }

    /// Whether `ino` names `dir` among its backlinks.
    pub(crate) fn names_back(&mut self, ino: Ino, dir: Ino) -> Result<bool> {
        let l = self.backlinks_of(ino)?;
        Ok(l.contains(&dir) || l.contains(&OVERFLOW))
    }

    /// A name of `ino` was added in `dir` (with backlinks on).
    pub(crate) fn backlink_add(&mut self, ino: Ino, dir: Ino) -> Result<()> {
        if !self.backlinks || self.backlinks_frozen {
            return Ok(());
        }
        let mut l = self.backlinks_of(ino)?;
        if l.contains(&OVERFLOW) {
            return Ok(());
        }
        l.push(dir);
        self.set_backlinks(ino, &l)
    }

    /// A name of `ino` in `dir` was removed (with backlinks on).
    pub(crate) fn backlink_remove(&mut self, ino: Ino, dir: Ino) -> Result<()> {
        if !self.backlinks || self.backlinks_frozen {
            return Ok(());
        }
        let mut l = self.backlinks_of(ino)?;
        if let Some(at) = l.iter().position(|&d| d == dir) {
            l.remove(at);
            self.set_backlinks(ino, &l)?;
        }
        Ok(())
    }

    /// `ino`'s poisoned logical blocks (EIO on read), ascending.
    pub(crate) fn poisoned(&mut self, ino: Ino) -> Result<Vec<u32>> {
        let mut v = self
            .xattr_get_raw(ino, index::TRUSTED, EIO_NAME)?
            .map(|v| decode(&v))
            .unwrap_or_default();
        v.sort_unstable();
        Ok(v)
    }

    /// Replace `ino`'s poisoned blocks.
    pub(crate) fn set_poisoned(&mut self, ino: Ino, list: &[u32]) -> Result<()> {
        let v = (!list.is_empty()).then(|| list.iter().flat_map(|l| l.to_le_bytes()).collect());
        self.xattr_put_raw(ino, index::TRUSTED, EIO_NAME, v)
    }

    /// Forget the poisoned blocks of `ino` in `lo..hi` (written again, or
    /// cut off): they read as what is written there now.
    pub(crate) fn unpoison(&mut self, ino: Ino, lo: u64, hi: u64) -> Result<()> {
        if !self.backlinks {
            return Ok(());
        }
        let mut v = self.poisoned(ino)?;
        let n = v.len();
        v.retain(|&l| u64::from(l) < lo || u64::from(l) >= hi);
        if v.len() != n {
            self.set_poisoned(ino, &v)?;
        }
        Ok(())
    }

    /// Under backlinks, metadata that fails its checks on access (a tree
    /// or directory block that is another inode's, after a crash) is EIO,
    /// as NoFS answers; elsewhere the error stays as it is.
    pub(crate) fn nofs_eio(&self, e: crate::error::FsError) -> crate::error::FsError {
        if self.backlinks && e.errno() == libc::EUCLEAN {
            errno(libc::EIO)
        } else {
            e
        }
    }

    /// The lookup check: `child`, found under a name in `dir`, must be in
    /// use and name `dir` back; otherwise the name is stale (ENOENT).
    pub(crate) fn check_backlink(&mut self, dir: Ino, child: Ino) -> Result<()> {
        let i = match self.read_inode(child) {
            Ok(i) => i,
            Err(e) if e.errno() == libc::EIO || e.errno() == libc::EUCLEAN => {
                self.nofs.stale_names += 1;
                return Err(errno(libc::EIO));
            }
            Err(e) => return Err(e),
        };
        if i.mode == 0 || i.links == 0 || !self.names_back(child, dir)? {
            self.nofs.stale_names += 1;
            return Err(errno(libc::ENOENT));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip_and_overflow() {
        assert_eq!(decode(&encode(&[2, 12, 12])), vec![2, 12, 12]);
        let many: Vec<u32> = (100..120).collect();
        let l = decode(&encode(&many));
        assert_eq!(l.len(), BACKLINKS_MAX);
        assert_eq!(*l.last().unwrap(), OVERFLOW);
        assert_eq!(l[0], 100);
    }
}
