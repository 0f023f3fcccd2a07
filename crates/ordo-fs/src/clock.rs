//! Where the file system reads the time.
//!
//! Every timestamp ordo writes (inode `atime`/`mtime`/`ctime`/`crtime`/
//! `dtime`, the superblock's mount and write times, JBD2 commit-block
//! times, the `dtime` a fast-commit replay or a benign repair stamps) is
//! read from a [`Clock`] handed in at mount ([`crate::MountOptions::clock`],
//! [`crate::fsck::FsckOptions::clock`]) and passed to the protocols in
//! [`crate::protocol::ProtocolEnv::clock`]. Nothing in the library reads
//! the system time behind the caller's back.
//!
//! Why: with the system clock, two runs of the same workload write
//! different bytes (and the inode generations drawn at random differ too,
//! see [`crate::random`]), so a failure found by the crash explorer or a
//! simulation cannot be replayed bit for bit. A [`SimClock`] makes the
//! time a function of how many times it was read, which the code path
//! alone decides; with a fixed seed, the same workload then writes the
//! same image.
//!
//! Only wall time is modelled: nothing in the library measures durations
//! (the background write-back thread sleeps in real time, and is off in
//! simulation: `MountOptions::background` is `false`).

use std::fmt;
use std::sync::{Arc, Mutex};

/// A timestamp with nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timespec {
    /// Seconds since the epoch (ext4 stores 34 bits: 1901..2446).
    pub sec: i64,
    /// Nanoseconds, < 1e9.
    pub nsec: u32,
}

impl Timespec {
    /// The system's wall-clock time. The library itself reads the time
    /// only through a [`Clock`] (this is
    /// [`SystemClock`]), so that a run can be made
    /// deterministic.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }
}

/// Nanoseconds in a second.
const NS_PER_SEC: i128 = 1_000_000_000;

/// A source of wall-clock time.
///
/// `Send + Sync` because one clock serves a mount whose operations run on
/// many threads; `Debug` so that the options carrying it stay printable.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current wall-clock time. Successive readings should not go
    /// backwards (ext4 does not require it, but users expect it).
    fn now(&self) -> Timespec;
}

/// The system's real-time clock: the default, today's behaviour.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timespec {
        Timespec::now()
    }
}

/// The system clock, shared: what a mount uses when given no clock.
pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// A simulated clock: starts at a given time and advances by a fixed step
/// after every reading, and otherwise only when told ([`SimClock::advance`]).
///
/// The step makes successive operations get distinct, increasing times
/// (as they would on a real machine), while keeping every reading a pure
/// function of the start, the step and the number of earlier readings.
/// A step of 0 gives a fixed clock.
pub struct SimClock {
    /// Current time, nanoseconds since the epoch (i128: ext4's 34-bit
    /// seconds with nanoseconds do not fit an i64 of nanoseconds).
    now_ns: Mutex<i128>,
    /// Advance after each reading, nanoseconds.
    step_ns: u64,
}

impl SimClock {
    /// A clock reading `start` first, then `start + step_ns`, and so on.
    pub fn new(start: Timespec, step_ns: u64) -> Self {
        assert!(start.nsec < 1_000_000_000, "nanoseconds out of range");
        SimClock {
            now_ns: Mutex::new(start.sec as i128 * NS_PER_SEC + start.nsec as i128),
            step_ns,
        }
    }

    /// A clock that always reads `at` (until advanced).
    pub fn fixed(at: Timespec) -> Self {
        Self::new(at, 0)
    }

    /// Move the clock forward by `ns` nanoseconds without reading it.
    pub fn advance(&self, ns: u64) {
        *self.lock() += ns as i128;
    }

    /// What the next reading will return, without advancing.
    pub fn peek(&self) -> Timespec {
        to_timespec(*self.lock())
    }

    /// The advance after each reading, nanoseconds.
    pub fn step_ns(&self) -> u64 {
        self.step_ns
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, i128> {
        // One integer, updated in one statement: a poisoned lock still
        // holds a valid time.
        self.now_ns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for SimClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimClock")
            .field("now", &self.peek())
            .field("step_ns", &self.step_ns)
            .finish()
    }
}

impl Clock for SimClock {
    fn now(&self) -> Timespec {
        let mut ns = self.lock();
        let t = to_timespec(*ns);
        *ns += self.step_ns as i128;
        t
    }
}

fn to_timespec(ns: i128) -> Timespec {
    let t = Timespec {
        sec: ns.div_euclid(NS_PER_SEC) as i64,
        nsec: ns.rem_euclid(NS_PER_SEC) as u32,
    };
    debug_assert!(t.nsec < 1_000_000_000);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_clock_steps_per_reading() {
        let c = SimClock::new(
            Timespec {
                sec: 1_700_000_000,
                nsec: 999_999_999,
            },
            1,
        );
        assert_eq!(
            c.now(),
            Timespec {
                sec: 1_700_000_000,
                nsec: 999_999_999
            }
        );
        assert_eq!(
            c.now(),
            Timespec {
                sec: 1_700_000_001,
                nsec: 0
            }
        );
        c.advance(2_000_000_000);
        assert_eq!(
            c.peek(),
            Timespec {
                sec: 1_700_000_003,
                nsec: 1
            }
        );
    }

    #[test]
    fn fixed_clock_does_not_move() {
        let at = Timespec { sec: -5, nsec: 7 };
        let c = SimClock::fixed(at);
        assert_eq!(c.now(), at);
        assert_eq!(c.now(), at);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now().sec > 1_577_836_800);
    }
}
