//! Extent trees of any depth (skeleton; see the extent owner's module).
