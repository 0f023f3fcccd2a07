//! The stream of each process that uses the mount.
//!
//! A FUSE request carries the id of the process that made it (of its
//! thread group: the threads of one process share a stream). The
//! library keeps a stream per thread of *its* caller, which here is the
//! worker thread serving the request, so the adapter keeps its own map
//! from process to stream and sets the worker's stream before each
//! request ([`ordo_fs::Fs::set_thread_stream`]).
//!
//! A process that never set a stream is in the stream of its nearest
//! ancestor that did (found through `/proc/PID/stat`), so `ordo run
//! --stream NAME -- CMD` puts CMD and everything it starts in NAME; with
//! no such ancestor it is in the default stream. Processes are not told
//! to the adapter when they exit: an entry is recorded with the process's
//! start time, and one whose process is gone (or whose pid now names
//! another process) is forgotten when next met, and on every SETSTREAM.

use std::collections::HashMap;
use std::sync::Mutex;

use ordo_fs::StreamId;

/// Most processes with a stream at once (ENOSPC past it, once the entries
/// of dead processes are forgotten).
pub const PID_STREAMS_MAX: usize = 65_536;

/// Most ancestors visited looking for a stream (deeper than any real
/// process tree; bounds a walk through a /proc that changes under it).
pub const ANCESTORS_MAX: usize = 4096;

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The process's start time (`/proc/PID/stat` field 22), which tells
    /// a reused pid from the process that set the stream.
    start_ticks: u64,
    stream: StreamId,
}

/// What `/proc/PID/stat` says of a process: its parent and start time.
fn proc_stat(pid: u32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses,
    // so the fields are counted from the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): ppid is field 4, starttime field 22.
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

/// The process (thread group) of thread `tid`, from `/proc/TID/status`.
fn tgid_of(tid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Streams by process.
#[derive(Debug, Default)]
pub struct PidStreams {
    map: Mutex<HashMap<u32, Entry>>,
}

impl PidStreams {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Entry>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Put the process of thread `tid` in `stream`; an errno when the
    /// process is gone or the table is full.
    pub fn set(&self, tid: u32, stream: StreamId) -> Result<(), i32> {
        let pid = tgid_of(tid).unwrap_or(tid);
        let (_, start_ticks) = proc_stat(pid).ok_or(libc::ESRCH)?;
        let mut map = self.lock();
        map.retain(|&p, e| proc_stat(p).is_some_and(|(_, s)| s == e.start_ticks));
        if !map.contains_key(&pid) && map.len() >= PID_STREAMS_MAX {
            return Err(libc::ENOSPC);
        }
        map.insert(
            pid,
            Entry {
                start_ticks,
                stream,
            },
        );
        Ok(())
    }

    /// The stream of the process of thread `tid`: its own, else its
    /// nearest ancestor's, else the default stream.
    pub fn stream_of(&self, tid: u32) -> StreamId {
        let mut map = self.lock();
        if map.is_empty() {
            return StreamId::DEFAULT;
        }
        let mut pid = tgid_of(tid).unwrap_or(tid);
        for _ in 0..ANCESTORS_MAX {
            if pid == 0 {
                break;
            }
            let Some((ppid, start)) = proc_stat(pid) else {
                map.remove(&pid);
                break;
            };
            match map.get(&pid) {
                Some(e) if e.start_ticks == start => return e.stream,
                Some(_) => {
                    map.remove(&pid);
                }
                None => {}
            }
            pid = ppid;
        }
        StreamId::DEFAULT
    }

    /// Processes with a recorded stream (dead ones included until met).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no process has a recorded stream.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_inherit_and_dead_processes_are_forgotten() {
        let t = PidStreams::default();
        let me = std::process::id();
        assert_eq!(t.stream_of(me), StreamId::DEFAULT);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        t.set(me, StreamId(3)).unwrap();
        assert_eq!(t.stream_of(me), StreamId(3));
        assert_eq!(t.stream_of(child.id()), StreamId(3), "inherited");
        t.set(child.id(), StreamId(4)).unwrap();
        assert_eq!(t.stream_of(child.id()), StreamId(4), "its own");
        assert_eq!(t.stream_of(me), StreamId(3));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(t.len(), 2);
        t.set(me, StreamId(5)).unwrap();
        assert_eq!(t.len(), 1, "the dead child's entry is gone");
        // A thread's requests are its process's.
        let of_thread = std::thread::scope(|sc| {
            // SAFETY: gettid has no preconditions.
            sc.spawn(|| t.stream_of(unsafe { libc::gettid() } as u32))
                .join()
                .unwrap()
        });
        assert_eq!(of_thread, StreamId(5));
    }
}
