//! `ordo fsck` (skeleton).
