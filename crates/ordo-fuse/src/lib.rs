//! FUSE adapter (skeleton).
