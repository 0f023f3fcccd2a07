//! `ordo mkfs` (skeleton).
