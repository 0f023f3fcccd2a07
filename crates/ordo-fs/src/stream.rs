//! Streams (ccfs): named groups of operations within which ordering holds.
//!
//! Every operation handle belongs to its caller's stream
//! ([`HandleInfo::stream`](crate::update::HandleInfo::stream)). A protocol
//! that implements streams keeps the order of a stream's changes and may
//! reorder changes of different streams; `streamsync` makes one stream
//! durable. The protocols ordo has today order everything, so for them a
//! stream is a label that `streamsync` answers with a full sync.
//!
//! A stream is named by bytes (any but NUL, at most
//! [`STREAM_NAME_MAX_BYTES`]) and known inside one mount by a small integer,
//! its [`StreamId`], handed out on first use and never reused while the
//! file system is mounted: 0 is the stream every caller starts in, named
//! `default`.
//!
//! Who "the caller" is depends on the user of the library: by default the
//! calling thread ([`Caller::current_thread`]); a server acting for other
//! processes (the FUSE adapter) keeps its own map from requester to stream
//! and tells the file system which stream a request runs in by setting
//! the stream of the thread that serves it.

use std::collections::HashMap;
use std::thread::ThreadId;

use rustc_hash::FxHashMap;

use crate::error::{errno, Result};

/// Longest stream name in bytes (as `NAME_MAX`): a name fits a fixed
/// 256-byte ioctl buffer with its terminating NUL.
pub const STREAM_NAME_MAX_BYTES: usize = 255;

/// Most streams one mount knows (names are never forgotten while mounted,
/// so the table is bounded rather than grown without limit).
pub const STREAMS_MAX: usize = 4096;

/// Most callers with a stream other than the default (threads are not
/// told when they exit; the bound keeps a program that spawns threads
/// forever from growing the table without limit).
pub const CALLERS_MAX: usize = 65_536;

/// Stream flag (ccfs's `IGNORE_FSYNC`): fsync and fdatasync from the
/// stream return at once, without making anything durable. The stream's
/// order still holds, so a program that fsyncs only to order its writes
/// keeps its guarantees; `streamsync` is what makes the stream durable.
pub const IGNORE_FSYNC: u32 = 1;

/// Every flag a stream may carry.
pub const STREAM_FLAGS: u32 = IGNORE_FSYNC;

/// Name of stream 0, the one every caller starts in.
pub const DEFAULT_STREAM_NAME: &[u8] = b"default";

/// A stream, as a small integer valid for one mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

impl StreamId {
    /// The default stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

/// Who called: the key under which a caller's stream is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Caller {
    /// A thread of the library's user.
    Thread(ThreadId),
}

impl Caller {
    /// The calling thread.
    pub fn current_thread() -> Caller {
        Caller::Thread(std::thread::current().id())
    }
}

/// Check a stream name: not empty, no NUL, at most
/// [`STREAM_NAME_MAX_BYTES`] bytes.
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > STREAM_NAME_MAX_BYTES {
        return Err(errno(libc::ENAMETOOLONG));
    }
    if name.is_empty() || name.contains(&0) {
        return Err(errno(libc::EINVAL));
    }
    Ok(())
}

/// The streams of one mount and the stream of each caller.
#[derive(Debug)]
pub(crate) struct Streams {
    /// Names by id (index = id); `names[0]` is the default stream's.
    names: Vec<Vec<u8>>,
    ids: HashMap<Vec<u8>, StreamId>,
    /// Callers not in the default stream. Looked up for every operation
    /// handle; its keys are thread ids, not names a user chooses, so a
    /// fast hash without a random key is safe here.
    callers: FxHashMap<Caller, StreamId>,
    /// Operation handles run in each stream (index = id).
    handles: Vec<u64>,
    /// Flags of each stream (index = id): [`IGNORE_FSYNC`].
    flags: Vec<u32>,
}

impl Default for Streams {
    fn default() -> Self {
        let mut ids = HashMap::new();
        ids.insert(DEFAULT_STREAM_NAME.to_vec(), StreamId::DEFAULT);
        Streams {
            names: vec![DEFAULT_STREAM_NAME.to_vec()],
            ids,
            callers: FxHashMap::default(),
            handles: vec![0],
            flags: vec![0],
        }
    }
}

impl Streams {
    /// The id of stream `name`, made on first use.
    pub fn intern(&mut self, name: &[u8]) -> Result<StreamId> {
        check_name(name)?;
        if let Some(&id) = self.ids.get(name) {
            return Ok(id);
        }
        if self.names.len() >= STREAMS_MAX {
            return Err(errno(libc::ENOSPC));
        }
        let id = StreamId(u32::try_from(self.names.len()).expect("bounded by STREAMS_MAX"));
        self.names.push(name.to_vec());
        self.handles.push(0);
        self.flags.push(0);
        self.ids.insert(name.to_vec(), id);
        debug_assert_eq!(self.names.len(), self.ids.len());
        debug_assert_eq!(self.names.len(), self.handles.len());
        Ok(id)
    }

    /// The id of an existing stream `name`.
    pub fn find(&self, name: &[u8]) -> Option<StreamId> {
        self.ids.get(name).copied()
    }

    /// The name of stream `id`, if it exists.
    pub fn name(&self, id: StreamId) -> Option<&[u8]> {
        self.names.get(id.0 as usize).map(Vec::as_slice)
    }

    /// Whether stream `id` exists.
    pub fn exists(&self, id: StreamId) -> bool {
        (id.0 as usize) < self.names.len()
    }

    /// Put `caller` in stream `id` (which must exist).
    pub fn set(&mut self, caller: Caller, id: StreamId) -> Result<()> {
        if !self.exists(id) {
            return Err(errno(libc::EINVAL));
        }
        if id == StreamId::DEFAULT {
            self.callers.remove(&caller);
            return Ok(());
        }
        if !self.callers.contains_key(&caller) && self.callers.len() >= CALLERS_MAX {
            return Err(errno(libc::ENOSPC));
        }
        self.callers.insert(caller, id);
        Ok(())
    }

    /// Count one operation handle run in stream `id` (which exists: ids
    /// are only handed out by [`Streams::intern`]).
    pub fn note_handle(&mut self, id: StreamId) {
        let n = self
            .handles
            .get_mut(id.0 as usize)
            .expect("a handle's stream is a known stream");
        *n += 1;
    }

    /// Set the flags of stream `id` (EINVAL for an unknown stream or an
    /// unknown flag).
    pub fn set_flags(&mut self, id: StreamId, flags: u32) -> Result<()> {
        if flags & !STREAM_FLAGS != 0 {
            return Err(errno(libc::EINVAL));
        }
        let f = self
            .flags
            .get_mut(id.0 as usize)
            .ok_or_else(|| errno(libc::EINVAL))?;
        *f = flags;
        Ok(())
    }

    /// The flags of stream `id` (0 for an unknown stream).
    pub fn flags(&self, id: StreamId) -> u32 {
        self.flags.get(id.0 as usize).copied().unwrap_or(0)
    }

    /// Operation handles run in stream `id` so far.
    pub fn handles(&self, id: StreamId) -> Option<u64> {
        self.handles.get(id.0 as usize).copied()
    }

    /// The stream of `caller` (the default one unless set).
    pub fn of(&self, caller: Caller) -> StreamId {
        self.callers
            .get(&caller)
            .copied()
            .unwrap_or(StreamId::DEFAULT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_small_ids_and_back() {
        let mut s = Streams::default();
        assert_eq!(s.intern(b"default").unwrap(), StreamId::DEFAULT);
        let a = s.intern(b"a").unwrap();
        let b = s.intern(b"\xffb c").unwrap();
        assert_eq!((a, b), (StreamId(1), StreamId(2)));
        assert_eq!(s.intern(b"a").unwrap(), a);
        assert_eq!(s.name(b), Some(&b"\xffb c"[..]));
        assert_eq!(s.name(StreamId(3)), None);
        assert_eq!(s.find(b"zzz"), None);
    }

    #[test]
    fn bad_names_are_refused() {
        let mut s = Streams::default();
        let long = vec![b'x'; STREAM_NAME_MAX_BYTES + 1];
        assert_eq!(s.intern(&long).unwrap_err().errno(), libc::ENAMETOOLONG);
        assert!(s.intern(&long[..STREAM_NAME_MAX_BYTES]).is_ok());
        assert_eq!(s.intern(b"a\0b").unwrap_err().errno(), libc::EINVAL);
        assert_eq!(s.intern(b"").unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn callers_start_in_the_default_stream() {
        let mut s = Streams::default();
        let me = Caller::current_thread();
        assert_eq!(s.of(me), StreamId::DEFAULT);
        let a = s.intern(b"a").unwrap();
        s.set(me, a).unwrap();
        assert_eq!(s.of(me), a);
        assert_eq!(s.set(me, StreamId(99)).unwrap_err().errno(), libc::EINVAL);
        s.set(me, StreamId::DEFAULT).unwrap();
        assert!(s.callers.is_empty(), "the default stream is not stored");
    }

    #[test]
    fn flags_belong_to_a_stream() {
        let mut s = Streams::default();
        let a = s.intern(b"a").unwrap();
        assert_eq!(s.flags(a), 0);
        s.set_flags(a, IGNORE_FSYNC).unwrap();
        assert_eq!(s.flags(a), IGNORE_FSYNC);
        assert_eq!(s.flags(StreamId::DEFAULT), 0);
        assert_eq!(s.set_flags(a, 2).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(
            s.set_flags(StreamId(7), 0).unwrap_err().errno(),
            libc::EINVAL
        );
        s.set_flags(a, 0).unwrap();
        assert_eq!(s.flags(a), 0);
    }
}
