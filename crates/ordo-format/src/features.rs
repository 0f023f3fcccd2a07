//! ext4 feature flags, by the names mke2fs and the kernel use, and the policy
//! of which ones ordo can open read-write.
//!
//! ext4's compatibility rule: an unknown *compat* feature may be ignored, an
//! unknown *ro_compat* feature allows read-only use only, an unknown
//! *incompat* feature forbids mounting at all. ordo writes, so it must
//! understand every incompat and ro_compat bit it leaves set. The tables
//! below are the single place that policy lives; `docs/FORMAT.md` explains
//! each refusal.

/// `s_feature_compat` bits.
pub mod compat {
    pub const DIR_PREALLOC: u32 = 0x0001;
    pub const IMAGIC_INODES: u32 = 0x0002;
    pub const HAS_JOURNAL: u32 = 0x0004;
    pub const EXT_ATTR: u32 = 0x0008;
    pub const RESIZE_INODE: u32 = 0x0010;
    pub const DIR_INDEX: u32 = 0x0020;
    pub const LAZY_BG: u32 = 0x0040;
    pub const EXCLUDE_INODE: u32 = 0x0080;
    pub const EXCLUDE_BITMAP: u32 = 0x0100;
    pub const SPARSE_SUPER2: u32 = 0x0200;
    pub const FAST_COMMIT: u32 = 0x0400;
    pub const STABLE_INODES: u32 = 0x0800;
    pub const ORPHAN_FILE: u32 = 0x1000;
}

/// `s_feature_incompat` bits.
pub mod incompat {
    pub const COMPRESSION: u32 = 0x0001;
    pub const FILETYPE: u32 = 0x0002;
    /// "needs_recovery": the journal holds transactions not yet replayed.
    pub const RECOVER: u32 = 0x0004;
    pub const JOURNAL_DEV: u32 = 0x0008;
    pub const META_BG: u32 = 0x0010;
    pub const EXTENTS: u32 = 0x0040;
    pub const INCOMPAT_64BIT: u32 = 0x0080;
    pub const MMP: u32 = 0x0100;
    pub const FLEX_BG: u32 = 0x0200;
    pub const EA_INODE: u32 = 0x0400;
    pub const DIRDATA: u32 = 0x1000;
    pub const CSUM_SEED: u32 = 0x2000;
    pub const LARGEDIR: u32 = 0x4000;
    pub const INLINE_DATA: u32 = 0x8000;
    pub const ENCRYPT: u32 = 0x10000;
    pub const CASEFOLD: u32 = 0x20000;
}

/// `s_feature_ro_compat` bits.
pub mod ro_compat {
    pub const SPARSE_SUPER: u32 = 0x0001;
    pub const LARGE_FILE: u32 = 0x0002;
    pub const BTREE_DIR: u32 = 0x0004;
    pub const HUGE_FILE: u32 = 0x0008;
    /// "uninit_bg": group descriptors carry a crc16.
    pub const GDT_CSUM: u32 = 0x0010;
    pub const DIR_NLINK: u32 = 0x0020;
    pub const EXTRA_ISIZE: u32 = 0x0040;
    pub const HAS_SNAPSHOT: u32 = 0x0080;
    pub const QUOTA: u32 = 0x0100;
    pub const BIGALLOC: u32 = 0x0200;
    pub const METADATA_CSUM: u32 = 0x0400;
    pub const REPLICA: u32 = 0x0800;
    pub const READONLY: u32 = 0x1000;
    pub const PROJECT: u32 = 0x2000;
    pub const SHARED_BLOCKS: u32 = 0x4000;
    pub const VERITY: u32 = 0x8000;
    pub const ORPHAN_PRESENT: u32 = 0x10000;
}

/// Which of the three feature words a flag lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FeatureKind {
    Compat,
    Incompat,
    RoCompat,
}

/// One feature: its word, bit, and mke2fs name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feature {
    pub kind: FeatureKind,
    pub bit: u32,
    /// The name `mke2fs -O` and `dumpe2fs` use.
    pub name: &'static str,
}

const fn f(kind: FeatureKind, bit: u32, name: &'static str) -> Feature {
    Feature { kind, bit, name }
}

/// Every feature ext4 defines, with the names e2fsprogs prints (lib/e2p/feature.c).
pub const ALL_FEATURES: &[Feature] = &[
    f(FeatureKind::Compat, compat::DIR_PREALLOC, "dir_prealloc"),
    f(FeatureKind::Compat, compat::IMAGIC_INODES, "imagic_inodes"),
    f(FeatureKind::Compat, compat::HAS_JOURNAL, "has_journal"),
    f(FeatureKind::Compat, compat::EXT_ATTR, "ext_attr"),
    f(FeatureKind::Compat, compat::RESIZE_INODE, "resize_inode"),
    f(FeatureKind::Compat, compat::DIR_INDEX, "dir_index"),
    f(FeatureKind::Compat, compat::LAZY_BG, "lazy_bg"),
    f(FeatureKind::Compat, compat::EXCLUDE_INODE, "snapshot_klist"),
    f(
        FeatureKind::Compat,
        compat::EXCLUDE_BITMAP,
        "snapshot_bitmap",
    ),
    f(FeatureKind::Compat, compat::SPARSE_SUPER2, "sparse_super2"),
    f(FeatureKind::Compat, compat::FAST_COMMIT, "fast_commit"),
    f(FeatureKind::Compat, compat::STABLE_INODES, "stable_inodes"),
    f(FeatureKind::Compat, compat::ORPHAN_FILE, "orphan_file"),
    f(
        FeatureKind::RoCompat,
        ro_compat::SPARSE_SUPER,
        "sparse_super",
    ),
    f(FeatureKind::RoCompat, ro_compat::LARGE_FILE, "large_file"),
    f(FeatureKind::RoCompat, ro_compat::BTREE_DIR, "btree_dir"),
    f(FeatureKind::RoCompat, ro_compat::HUGE_FILE, "huge_file"),
    f(FeatureKind::RoCompat, ro_compat::GDT_CSUM, "uninit_bg"),
    f(FeatureKind::RoCompat, ro_compat::DIR_NLINK, "dir_nlink"),
    f(FeatureKind::RoCompat, ro_compat::EXTRA_ISIZE, "extra_isize"),
    f(FeatureKind::RoCompat, ro_compat::HAS_SNAPSHOT, "snapshot"),
    f(FeatureKind::RoCompat, ro_compat::QUOTA, "quota"),
    f(FeatureKind::RoCompat, ro_compat::BIGALLOC, "bigalloc"),
    f(
        FeatureKind::RoCompat,
        ro_compat::METADATA_CSUM,
        "metadata_csum",
    ),
    f(FeatureKind::RoCompat, ro_compat::REPLICA, "replica"),
    f(FeatureKind::RoCompat, ro_compat::READONLY, "read-only"),
    f(FeatureKind::RoCompat, ro_compat::PROJECT, "project"),
    f(
        FeatureKind::RoCompat,
        ro_compat::SHARED_BLOCKS,
        "shared_blocks",
    ),
    f(FeatureKind::RoCompat, ro_compat::VERITY, "verity"),
    f(
        FeatureKind::RoCompat,
        ro_compat::ORPHAN_PRESENT,
        "orphan_present",
    ),
    f(FeatureKind::Incompat, incompat::COMPRESSION, "compression"),
    f(FeatureKind::Incompat, incompat::FILETYPE, "filetype"),
    f(FeatureKind::Incompat, incompat::RECOVER, "needs_recovery"),
    f(FeatureKind::Incompat, incompat::JOURNAL_DEV, "journal_dev"),
    f(FeatureKind::Incompat, incompat::META_BG, "meta_bg"),
    f(FeatureKind::Incompat, incompat::EXTENTS, "extent"),
    f(FeatureKind::Incompat, incompat::INCOMPAT_64BIT, "64bit"),
    f(FeatureKind::Incompat, incompat::MMP, "mmp"),
    f(FeatureKind::Incompat, incompat::FLEX_BG, "flex_bg"),
    f(FeatureKind::Incompat, incompat::EA_INODE, "ea_inode"),
    f(FeatureKind::Incompat, incompat::DIRDATA, "dirdata"),
    f(
        FeatureKind::Incompat,
        incompat::CSUM_SEED,
        "metadata_csum_seed",
    ),
    f(FeatureKind::Incompat, incompat::LARGEDIR, "large_dir"),
    f(FeatureKind::Incompat, incompat::INLINE_DATA, "inline_data"),
    f(FeatureKind::Incompat, incompat::ENCRYPT, "encrypt"),
    f(FeatureKind::Incompat, incompat::CASEFOLD, "casefold"),
];

/// Other spellings mke2fs accepts.
const ALIASES: &[(&str, &str)] = &[
    ("extents", "extent"),
    ("uninit_groups", "uninit_bg"),
    ("gdt_csum", "uninit_bg"),
    ("fname_encoding", "casefold"),
    ("exclude_inode", "snapshot_klist"),
    ("exclude_bitmap", "snapshot_bitmap"),
    ("largedir", "large_dir"),
    ("csum_seed", "metadata_csum_seed"),
];

/// Look a feature up by its mke2fs name (or an alias), case-insensitively.
pub fn feature_by_name(name: &str) -> Option<Feature> {
    let lower = name.to_ascii_lowercase();
    let canonical = ALIASES
        .iter()
        .find(|(a, _)| *a == lower)
        .map(|(_, c)| *c)
        .unwrap_or(lower.as_str());
    ALL_FEATURES.iter().copied().find(|f| f.name == canonical)
}

/// The three feature words of a file system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FeatureSet {
    pub compat: u32,
    pub incompat: u32,
    pub ro_compat: u32,
}

impl FeatureSet {
    /// No features.
    pub const EMPTY: FeatureSet = FeatureSet {
        compat: 0,
        incompat: 0,
        ro_compat: 0,
    };

    /// Whether `feature` is set.
    pub fn has(&self, feature: Feature) -> bool {
        self.word(feature.kind) & feature.bit != 0
    }
    /// Set or clear `feature`.
    pub fn set(&mut self, feature: Feature, on: bool) {
        let w = self.word_mut(feature.kind);
        if on {
            *w |= feature.bit;
        } else {
            *w &= !feature.bit;
        }
    }
    /// Whether a compat bit is set.
    pub fn has_compat(&self, bit: u32) -> bool {
        self.compat & bit != 0
    }
    /// Whether an incompat bit is set.
    pub fn has_incompat(&self, bit: u32) -> bool {
        self.incompat & bit != 0
    }
    /// Whether a ro_compat bit is set.
    pub fn has_ro_compat(&self, bit: u32) -> bool {
        self.ro_compat & bit != 0
    }
    fn word(&self, kind: FeatureKind) -> u32 {
        match kind {
            FeatureKind::Compat => self.compat,
            FeatureKind::Incompat => self.incompat,
            FeatureKind::RoCompat => self.ro_compat,
        }
    }
    fn word_mut(&mut self, kind: FeatureKind) -> &mut u32 {
        match kind {
            FeatureKind::Compat => &mut self.compat,
            FeatureKind::Incompat => &mut self.incompat,
            FeatureKind::RoCompat => &mut self.ro_compat,
        }
    }

    /// Names of every set feature, in dumpe2fs order (compat, incompat,
    /// ro_compat within the table), unknown bits as `FEATURE_C12`-style
    /// names like e2fsprogs prints.
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (kind, word, letter) in [
            (FeatureKind::Compat, self.compat, 'C'),
            (FeatureKind::Incompat, self.incompat, 'I'),
            (FeatureKind::RoCompat, self.ro_compat, 'R'),
        ] {
            for bit in 0..32 {
                let mask = 1u32 << bit;
                if word & mask == 0 {
                    continue;
                }
                match ALL_FEATURES
                    .iter()
                    .find(|f| f.kind == kind && f.bit == mask)
                {
                    Some(f) => out.push(f.name.to_string()),
                    None => out.push(format!("FEATURE_{letter}{bit}")),
                }
            }
        }
        out
    }

    /// Incompat features ordo cannot handle at all, by name. `needs_recovery`
    /// is not listed: it is a state, not a format, and the caller reports it
    /// separately (see [`FeatureSet::needs_recovery`]).
    pub fn unsupported_incompat(&self) -> Vec<String> {
        unsupported(
            self.incompat,
            SUPPORTED_INCOMPAT | incompat::RECOVER,
            'I',
            FeatureKind::Incompat,
        )
    }

    /// Ro_compat features that forbid ordo from writing, by name.
    pub fn unsupported_ro_compat(&self) -> Vec<String> {
        unsupported(
            self.ro_compat,
            SUPPORTED_RO_COMPAT,
            'R',
            FeatureKind::RoCompat,
        )
    }

    /// Everything that stops a read-write open: unsupported incompat and
    /// ro_compat features.
    pub fn unsupported_for_write(&self) -> Vec<String> {
        let mut v = self.unsupported_incompat();
        v.extend(self.unsupported_ro_compat());
        v
    }

    /// The journal holds transactions that must be replayed first.
    pub fn needs_recovery(&self) -> bool {
        self.incompat & incompat::RECOVER != 0
    }
}

fn unsupported(word: u32, supported: u32, letter: char, kind: FeatureKind) -> Vec<String> {
    let bad = word & !supported;
    (0..32)
        .map(|b| 1u32 << b)
        .filter(|m| bad & m != 0)
        .map(|m| {
            ALL_FEATURES
                .iter()
                .find(|f| f.kind == kind && f.bit == m)
                .map(|f| f.name.to_string())
                .unwrap_or_else(|| format!("FEATURE_{letter}{}", m.trailing_zeros()))
        })
        .collect()
}

/// Incompat features ordo reads and writes. `large_dir` only raises the
/// htree depth limit to 3 and the dirent size limit; linear directories and
/// two-level trees are unaffected, so ordo accepts it. `needs_recovery` is
/// handled separately.
pub const SUPPORTED_INCOMPAT: u32 = incompat::FILETYPE
    | incompat::EXTENTS
    | incompat::INCOMPAT_64BIT
    | incompat::FLEX_BG
    | incompat::CSUM_SEED
    | incompat::LARGEDIR;

/// Ro_compat features ordo keeps correct when it writes.
pub const SUPPORTED_RO_COMPAT: u32 = ro_compat::SPARSE_SUPER
    | ro_compat::LARGE_FILE
    | ro_compat::HUGE_FILE
    | ro_compat::GDT_CSUM
    | ro_compat::DIR_NLINK
    | ro_compat::EXTRA_ISIZE
    | ro_compat::METADATA_CSUM;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_lookup() {
        for feat in ALL_FEATURES {
            assert_eq!(feature_by_name(feat.name), Some(*feat));
        }
        assert_eq!(feature_by_name("extents").unwrap().bit, incompat::EXTENTS);
        assert_eq!(feature_by_name("nonsense"), None);
    }

    #[test]
    fn unsupported_lists_refused_features_by_name() {
        let fs = FeatureSet {
            compat: compat::HAS_JOURNAL | compat::RESIZE_INODE,
            incompat: incompat::FILETYPE
                | incompat::EXTENTS
                | incompat::INLINE_DATA
                | incompat::RECOVER
                | 0x8000_0000,
            ro_compat: ro_compat::METADATA_CSUM | ro_compat::BIGALLOC,
        };
        assert_eq!(
            fs.unsupported_incompat(),
            vec!["inline_data", "FEATURE_I31"]
        );
        assert_eq!(fs.unsupported_ro_compat(), vec!["bigalloc"]);
        assert!(fs.needs_recovery());
        assert!(FeatureSet {
            incompat: incompat::FILETYPE | incompat::LARGEDIR,
            ..FeatureSet::EMPTY
        }
        .unsupported_for_write()
        .is_empty());
    }
}
