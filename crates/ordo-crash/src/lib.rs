//! ordo's crash explorer: every disk state a crash can leave, recovered and
//! checked.
//!
//! A workload ([`workload`]) runs through the library API (or, with
//! `--fuse`, through the FUSE mount: [`fuse`]) on a recording device
//! ([`log`]), next to a model of what the tree should hold
//! ([`model`]); every fsync / fdatasync / sync that returns is logged as a
//! promise ([`record`]). From the write log, [`states`] generates the crash
//! states the device's rule allows: everything before the last completed
//! flush and every FUA write is on disk, any subset of the other
//! acknowledged writes may be. Each state is materialized copy-on-write over
//! the base image, recovered as the protocol defines, and checked by the
//! [`oracle`]: ordo's fsck and `e2fsck -fn`, the promises, no foreign or
//! stale data, and the protocol's own invariants (among them, for ccfs
//! streams, a prefix of each stream: [`streams`]); a NoFS protocol is
//! checked for data consistency after its scanners instead ([`nofs`]).
//! [`explore()`] runs it all in parallel and [`report`] says what it found,
//! with a command that rebuilds each failing state. See `docs/CRASH.md`.

pub mod app;
pub mod backend;
pub mod cli;
pub mod error;
pub mod explore;
pub mod fuse;
pub mod judge;
pub mod log;
pub mod model;
pub mod nofs;
pub mod oracle;
pub mod pattern;
pub mod read;
pub mod record;
pub mod report;
pub mod soak;
pub mod states;
pub mod stop;
pub mod streams;
pub mod workload;

pub use error::CrashError;
pub use explore::{explore, ExploreParams, StateId};
pub use report::Report;
