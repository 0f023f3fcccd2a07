//! Application crash checking: real programs (SQLite, git, LevelDB, an
//! editor's atomic save) run on a FUSE mount of ordo (or on the kernel's
//! ext4 over a recording loop device) while the device records; every crash
//! state is recovered by the protocol and the application's own checker
//! says whether what it finds is consistent with what it was promised.
//! See `docs/CRASH.md`, "Application crash checking".

pub mod explore;
pub mod kernel;
pub mod script;
