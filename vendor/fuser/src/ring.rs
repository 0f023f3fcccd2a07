//! FUSE over io_uring (Linux 6.14 and later).
//!
//! With `Config::io_uring` set and the kernel offering `FUSE_OVER_IO_URING`
//! in INIT (root turns it on with `/sys/module/fuse/parameters/enable_uring`),
//! the session registers one queue per possible CPU after the handshake. Each
//! queue is an io_uring of its own, served by one thread (pinned to the
//! queue's CPU when it can be), holding `depth` entries: a header buffer
//! (`struct fuse_uring_req_header`) and a payload buffer each. The kernel puts
//! a request from a process running on CPU `n` into an entry of queue `n` and
//! completes the entry's pending `URING_CMD`; the thread serves it and
//! answers with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which carries the reply
//! and hands the entry back for the next request, in one submission.
//!
//! Until every queue has registered its entries the kernel keeps sending
//! requests through `/dev/fuse`, and FORGET, INTERRUPT and notifications
//! always go that way, so the `/dev/fuse` workers keep running beside the
//! rings.
//!
//! A request is copied out of its entry into the thread's own buffer in the
//! layout a `/dev/fuse` read gives (`fuse_in_header`, the operation's header,
//! the rest), so the same parser and dispatcher serve both transports; a
//! reply is copied into the entry and committed by whichever thread sends it
//! (an fsync answered later from another thread submits its commit itself).

use std::cell::Cell;
use std::cell::UnsafeCell;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::error;
use log::warn;
use zerocopy::IntoBytes;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll;
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;
use crate::session::TransportStats;

/// `FUSE_IO_URING_CMD_REGISTER`: hand an entry's buffers to the kernel and
/// fetch the first request into them.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: commit the reply in an entry and
/// fetch the next request into it.
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: `in_out` (the in or out header), `op_in`
/// (the operation's own header), `ring_ent_in_out`.
const HEADER_BYTES: usize = 128 + 128 + 32;
const OP_IN_OFFSET: usize = 128;
const OP_IN_BYTES: usize = 128;
/// `fuse_uring_ent_in_out`: `flags` u64, `commit_id` u64, `payload_sz` u32.
const COMMIT_ID_OFFSET: usize = 256 + 8;
const PAYLOAD_SZ_OFFSET: usize = 256 + 16;
const IN_HEADER_BYTES: usize = size_of::<ll::fuse_abi::fuse_in_header>();
const OUT_HEADER_BYTES: usize = size_of::<ll::fuse_abi::fuse_out_header>();

/// `user_data` of the no-op that tells a queue's thread to stop.
const STOP: u64 = u64::MAX;

/// A page-aligned, zeroed buffer the kernel reads and writes: an anonymous
/// mapping, so that only the pages a request touches take memory (an entry's
/// payload must hold the kernel's largest request, `max_write`, however
/// small most are).
#[derive(Debug)]
struct KernelBuf {
    ptr: *mut u8,
    len: usize,
}

impl KernelBuf {
    fn new(len: usize) -> io::Result<KernelBuf> {
        let len = len.max(1);
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(KernelBuf {
            ptr: ptr.cast(),
            len,
        })
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for KernelBuf {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length, and no longer used.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

#[derive(Debug)]
struct RingEntry {
    header: KernelBuf,
    payload: KernelBuf,
    /// The iovecs given with REGISTER; the kernel reads them then.
    iov: UnsafeCell<[libc::iovec; 2]>,
    /// The commit id of the request the entry holds (0: none yet).
    commit_id: AtomicU64,
}

/// One queue: its io_uring, its entries and the lock its submission side
/// is pushed under.
pub(crate) struct RingQueue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    sq_lock: Mutex<()>,
    entries: Box<[RingEntry]>,
    dev: ChannelSender,
    dev_fd: i32,
}

impl std::fmt::Debug for RingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingQueue")
            .field("qid", &self.qid)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: an entry's buffers are written by the kernel while the entry is
// fetched, read by the queue's thread when its completion arrives, and
// written by the one reply of that request until the commit hands them back
// to the kernel; the protocol gives each of those phases one owner. The
// io_uring's submission side is only pushed to under `sq_lock`, its
// completion side only read by the queue's thread.
unsafe impl Sync for RingQueue {}
// SAFETY: as above; the raw buffers are owned by the queue.
unsafe impl Send for RingQueue {}

thread_local! {
    /// The queue the current thread serves, if it is a ring thread: its
    /// commits are submitted by its own next wait, not one by one.
    static SERVING: Cell<usize> = const { Cell::new(0) };
}

/// The reply side of a request served from a ring entry.
#[derive(Clone, Debug)]
pub(crate) struct RingSender {
    queue: Arc<RingQueue>,
    idx: u16,
}

impl RingSender {
    pub(crate) fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let entry = &self.queue.entries[self.idx as usize];
        let Some((out, rest)) = data.split_first() else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        if out.len() != OUT_HEADER_BYTES {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let total: usize = rest.iter().map(|s| s.len()).sum();
        // SAFETY: the entry belongs to this request's reply until the commit
        // below (see `RingQueue`); the copies stay inside both buffers.
        unsafe {
            std::ptr::copy_nonoverlapping(out.as_ptr(), entry.header.ptr, OUT_HEADER_BYTES);
            if total > entry.payload.len() {
                // Too large for the entry: answer EIO rather than leave the
                // request without an answer.
                error!(
                    "FUSE reply of {total} bytes exceeds the ring entry's {}",
                    entry.payload.len()
                );
                self.set_error(ll::Errno::EIO);
            } else {
                let mut at = 0;
                for slice in rest {
                    std::ptr::copy_nonoverlapping(
                        slice.as_ptr(),
                        entry.payload.ptr.add(at),
                        slice.len(),
                    );
                    at += slice.len();
                }
                self.set_payload_sz(total as u32);
            }
        }
        self.queue.commit(self.idx)
    }

    /// Reply to request `unique` with the bytes `fill` writes straight into
    /// the entry's payload buffer (at most `max`), which the kernel copies
    /// from: no copy of the data in between ([`crate::ReplyData::data_with`]).
    pub(crate) fn send_filled(
        &self,
        unique: ll::RequestId,
        max: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, ll::Errno>,
    ) -> io::Result<()> {
        let entry = &self.queue.entries[self.idx as usize];
        let result = if max > entry.payload.len() {
            error!(
                "FUSE reply of up to {max} bytes exceeds the ring entry's {}",
                entry.payload.len()
            );
            Err(ll::Errno::EIO)
        } else {
            // SAFETY: the entry belongs to this request's reply until the
            // commit below (see `RingQueue`), and its request was copied out
            // when it was served, so the payload buffer is free to write.
            let payload = unsafe { std::slice::from_raw_parts_mut(entry.payload.ptr, max) };
            match fill(payload) {
                Ok(n) if n <= max => Ok(n),
                Ok(n) => {
                    error!("FUSE reply of {n} bytes filled a buffer of {max}");
                    Err(ll::Errno::EIO)
                }
                Err(err) => Err(err),
            }
        };
        let n = *result.as_ref().unwrap_or(&0);
        let header = ll::fuse_abi::fuse_out_header {
            len: (OUT_HEADER_BYTES + n) as u32,
            error: result.err().map_or(0, |e| -e.code()),
            unique: unique.0,
        };
        let header = header.as_bytes();
        // SAFETY: as above; the header buffer holds an out header.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), entry.header.ptr, header.len());
        }
        self.set_payload_sz(n as u32);
        self.queue.commit(self.idx)
    }

    /// Turn the out header already in the entry into an error reply with no
    /// payload.
    fn set_error(&self, err: ll::Errno) {
        let entry = &self.queue.entries[self.idx as usize];
        let error = -err.code();
        // SAFETY: the entry is this reply's (see `send`); bytes 4..8 of the
        // out header are its `error`, and 0..4 its `len`.
        unsafe {
            std::ptr::copy_nonoverlapping(error.to_ne_bytes().as_ptr(), entry.header.ptr.add(4), 4);
            std::ptr::copy_nonoverlapping(
                (OUT_HEADER_BYTES as u32).to_ne_bytes().as_ptr(),
                entry.header.ptr,
                4,
            );
        }
        self.set_payload_sz(0);
    }

    /// The payload size the commit tells the kernel.
    fn set_payload_sz(&self, n: u32) {
        let entry = &self.queue.entries[self.idx as usize];
        // SAFETY: the entry is this reply's (see `send`); the field is inside
        // the header buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                n.to_ne_bytes().as_ptr(),
                entry.header.ptr.add(PAYLOAD_SZ_OFFSET),
                4,
            );
        }
    }

    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.queue.dev
    }
}

impl RingQueue {
    fn new(qid: u16, depth: usize, payload_bytes: usize, ch: &Channel) -> io::Result<RingQueue> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(2 * (depth as u32 + 1))
            .build(depth as u32 + 1)?;
        let mut entries = Vec::with_capacity(depth);
        for _ in 0..depth {
            let header = KernelBuf::new(4096)?;
            let payload = KernelBuf::new(payload_bytes)?;
            let iov = [
                libc::iovec {
                    iov_base: header.ptr.cast(),
                    iov_len: HEADER_BYTES,
                },
                libc::iovec {
                    iov_base: payload.ptr.cast(),
                    iov_len: payload.len(),
                },
            ];
            entries.push(RingEntry {
                header,
                payload,
                iov: UnsafeCell::new(iov),
                commit_id: AtomicU64::new(0),
            });
        }
        Ok(RingQueue {
            qid,
            ring,
            sq_lock: Mutex::new(()),
            entries: entries.into_boxed_slice(),
            dev: ch.sender(),
            dev_fd: ch.as_fd().as_raw_fd(),
        })
    }

    pub(crate) fn qid(&self) -> u16 {
        self.qid
    }

    /// The 80 bytes of `struct fuse_uring_cmd_req`: flags, commit id, qid.
    fn cmd(&self, commit_id: u64) -> [u8; 80] {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        cmd
    }

    fn register_sqe(&self, idx: u16) -> squeue::Entry128 {
        let entry = &self.entries[idx as usize];
        let sqe = opcode::UringCmd80::new(types::Fd(self.dev_fd), CMD_REGISTER)
            .cmd(self.cmd(0))
            .addr(Some(entry.iov.get() as u64))
            .build()
            .user_data(u64::from(idx));
        // The kernel reads the number of iovecs from the SQE's `len`, which
        // the builder does not set. `len` is the u32 at byte 24 of an SQE.
        // SAFETY: `Entry128` is `repr(C)`, 128 bytes of plain data.
        let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        bytes[24..28].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: as above; any bytes are a valid SQE.
        unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
    }

    fn push(&self, sqe: &squeue::Entry128) -> io::Result<()> {
        let _guard = self.sq_lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the submission side is only pushed to under `sq_lock`.
        let mut sq = unsafe { self.ring.submission_shared() };
        // SAFETY: the SQE refers to buffers the queue owns for its lifetime.
        unsafe { sq.push(sqe) }.map_err(|_| io::Error::from_raw_os_error(libc::EBUSY))?;
        drop(sq);
        if SERVING.with(Cell::get) != self as *const RingQueue as usize {
            self.ring.submit()?;
        }
        Ok(())
    }

    fn commit(&self, idx: u16) -> io::Result<()> {
        let commit_id = self.entries[idx as usize].commit_id.load(Ordering::Acquire);
        let sqe = opcode::UringCmd80::new(types::Fd(self.dev_fd), CMD_COMMIT_AND_FETCH)
            .cmd(self.cmd(commit_id))
            .build()
            .user_data(u64::from(idx));
        self.push(&sqe)
    }

    /// Ask the queue's thread to stop (after the session's end).
    pub(crate) fn stop(&self) {
        let sqe: squeue::Entry128 = opcode::Nop::new().build().user_data(STOP).into();
        if let Err(err) = self.push(&sqe) {
            warn!("FUSE ring queue {}: stop: {err}", self.qid);
        }
    }
}

/// The queues of a session, created after a handshake that negotiated
/// `FUSE_OVER_IO_URING`.
#[derive(Debug)]
pub(crate) struct Rings {
    pub(crate) queues: Vec<Arc<RingQueue>>,
}

impl Rings {
    /// One queue per possible CPU (the kernel's `nr_cpu_ids`), `depth`
    /// entries each, with payload buffers of `payload_bytes`.
    pub(crate) fn new(depth: usize, payload_bytes: usize, ch: &Channel) -> io::Result<Rings> {
        let queues = (0..possible_cpus())
            .map(|qid| {
                let qid = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
                RingQueue::new(qid, depth.max(1), payload_bytes, ch).map(Arc::new)
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Rings { queues })
    }
}

/// The kernel's `nr_cpu_ids`: one more than the highest CPU in
/// `/sys/devices/system/cpu/possible` ("0-3", "0,2-5"). The ring is not used
/// until every one of those queues has registered, so counting present or
/// online CPUs instead would leave it unused on a machine with fewer of them.
pub(crate) fn possible_cpus() -> usize {
    let parsed = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse_cpu_list_end(s.trim()));
    parsed.unwrap_or_else(|| {
        // SAFETY: sysconf has no preconditions.
        unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize
    })
}

/// One more than the highest CPU of a kernel CPU list.
fn parse_cpu_list_end(list: &str) -> Option<usize> {
    list.split(',')
        .map(|part| part.rsplit('-').next()?.trim().parse::<usize>().ok())
        .try_fold(0usize, |end, last| Some(end.max(last? + 1)))
        .filter(|&n| n > 0)
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// Serve one queue until the session ends: register its entries, then
/// serve every request the kernel completes into them.
pub(crate) fn serve<FS: Filesystem>(
    queue: Arc<RingQueue>,
    se: &SessionEventLoop<FS>,
    stats: &TransportStats,
) -> io::Result<()> {
    SERVING.with(|s| s.set(Arc::as_ptr(&queue) as usize));
    pin_to_cpu(queue.qid);
    for idx in 0..queue.entries.len() {
        queue.push(&queue.register_sqe(idx as u16))?;
    }
    let mut live = queue.entries.len();
    let mut registered = false;
    let mut request = Vec::new();
    let mut done = Vec::with_capacity(queue.entries.len() + 1);
    while live > 0 {
        match queue.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::EINTR) => continue,
            Err(err) => return Err(err),
        }
        done.clear();
        // SAFETY: only this thread reads the completion side.
        done.extend(unsafe { queue.ring.completion_shared() }.map(|c| (c.user_data(), c.result())));
        for &(user_data, result) in &done {
            if user_data == STOP {
                return Ok(());
            }
            let idx = user_data as u16;
            if result < 0 {
                match -result {
                    libc::EAGAIN | libc::EINTR => {
                        let entry = &queue.entries[idx as usize];
                        if entry.commit_id.load(Ordering::Acquire) == 0 {
                            queue.push(&queue.register_sqe(idx))?;
                        } else {
                            queue.commit(idx)?;
                        }
                    }
                    libc::ENOTCONN | libc::ENODEV | libc::ECANCELED => live -= 1,
                    errno => {
                        error!(
                            "FUSE ring queue {} entry {idx}: {}",
                            queue.qid,
                            io::Error::from_raw_os_error(errno)
                        );
                        live -= 1;
                    }
                }
                continue;
            }
            if !registered {
                registered = true;
                stats.ring_queues.fetch_add(1, Ordering::Relaxed);
            }
            stats.ring_requests.fetch_add(1, Ordering::Relaxed);
            serve_entry(&queue, idx, se, &mut request);
        }
    }
    Ok(())
}

/// Serve the request in entry `idx`: rebuild it as `/dev/fuse` would have
/// given it, and dispatch it.
fn serve_entry<FS: Filesystem>(
    queue: &Arc<RingQueue>,
    idx: u16,
    se: &SessionEventLoop<FS>,
    request: &mut Vec<u8>,
) {
    let entry = &queue.entries[idx as usize];
    // SAFETY: the kernel completed the entry's fetch: it is this thread's
    // until the reply's commit.
    let header = unsafe { std::slice::from_raw_parts(entry.header.ptr, HEADER_BYTES) };
    let commit_id = read_u64(header, COMMIT_ID_OFFSET);
    entry.commit_id.store(commit_id, Ordering::Release);
    let len = read_u32(header, 0) as usize;
    let payload_sz = read_u32(header, PAYLOAD_SZ_OFFSET) as usize;
    let unique = read_u64(header, 8);
    // `len` counts every argument; the first one (the operation's header)
    // is in `op_in`, the rest in the payload.
    let op_in = len
        .checked_sub(IN_HEADER_BYTES + payload_sz)
        .filter(|&n| n <= OP_IN_BYTES && payload_sz <= entry.payload.len());
    let sender = RingSender {
        queue: queue.clone(),
        idx,
    };
    let Some(op_in) = op_in else {
        error!("FUSE ring request {unique}: length {len} does not fit its payload of {payload_sz}");
        answer_error(ReplySender::Ring(sender), unique, ll::Errno::EIO);
        return;
    };
    request.clear();
    request.extend_from_slice(&header[..IN_HEADER_BYTES]);
    request.extend_from_slice(&header[OP_IN_OFFSET..OP_IN_OFFSET + op_in]);
    // SAFETY: as above; the kernel wrote `payload_sz` bytes.
    request.extend_from_slice(unsafe { std::slice::from_raw_parts(entry.payload.ptr, payload_sz) });
    dispatch(request, ReplySender::Ring(sender), unique, se);
}

/// Dispatch one request in `/dev/fuse` layout, answered through `sender`,
/// and make sure it is answered.
fn dispatch<FS: Filesystem>(
    request: &[u8],
    sender: ReplySender,
    unique: u64,
    se: &SessionEventLoop<FS>,
) {
    let Some(req) = RequestWithSender::new(sender.duplicate(), request) else {
        answer_error(sender, unique, ll::Errno::EIO);
        return;
    };
    match req.request.operation() {
        Ok(Operation::Destroy(_)) => req.reply::<ReplyEmpty>().ok(),
        // No reply of their own, and the kernel sends them through
        // `/dev/fuse`; should one arrive here, its entry still needs a
        // commit to be used again.
        Ok(Operation::Forget(_) | Operation::BatchForget(_) | Operation::Interrupt(_)) => {
            req.dispatch(se);
            answer_error(sender, unique, ll::Errno::ENOSYS);
        }
        _ => req.dispatch(se),
    }
}

fn answer_error(sender: ReplySender, unique: u64, errno: ll::Errno) {
    use crate::reply::Reply;
    crate::reply::ReplyRaw::new(ll::RequestId(unique), sender).error(errno);
}

fn pin_to_cpu(qid: u16) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(usize::from(qid), &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            // An offline CPU: its queue is served from wherever the thread
            // runs.
            log::debug!(
                "FUSE ring queue {qid}: not pinned: {}",
                io::Error::last_os_error()
            );
        }
    }
}
