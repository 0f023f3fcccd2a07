//! ordo's benchmark harness.
//!
//! Each paper ordo reproduces measured its idea against a different
//! baseline on different hardware. The harness runs the papers' workloads
//! on ordo's protocols *and* on the kernel's own ext4, on the same kind of
//! device, and says per operation (and per fsync) how many writes, bytes
//! and flushes each costs, counted by the kernel's block layer for every
//! target alike (`/sys/block/loopN/stat`) and, for ordo, by its own device
//! layer by block class.
//!
//! Layout: [`workload`] (the papers' workloads against the small [`vfs`]
//! interface, or real programs on a mounted target), [`target`] (fresh
//! devices, mkfs, mounts, measurement windows), [`runner`] (cases ×
//! targets → [`report::Row`]s), [`commits`] (fast and full commits,
//! ordo's and the kernel's), [`report`] (table, JSON), [`chart`] (SVG),
//! [`cli`] (`ordo bench`). `docs/BENCH.md` documents every workload and
//! parameter and the paper it comes from.

pub mod chart;
pub mod cli;
pub mod commits;
pub mod error;
pub mod ganger;
pub mod nofs_scan;
pub mod report;
pub mod runner;
pub mod stats;
pub mod sys;
pub mod target;
pub mod vfs;
pub mod workload;

pub use error::{BenchError, Result};
