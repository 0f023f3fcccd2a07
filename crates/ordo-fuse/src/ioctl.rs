//! The ioctl ABI of an ordo mount: the durability calls beyond
//! fsync/sync (OptFS's osync and dsync) and ccfs's streams, for programs
//! that run on the mount. Documented for C and Python in `docs/API.md`.
//!
//! The numbers use Linux's `_IO`/`_IOW`/`_IOR` encoding with the magic
//! `'o'`, and every call that carries a name carries it in a fixed
//! [`NAME_BUF_BYTES`]-byte buffer (NUL-terminated, NUL-padded). A FUSE
//! file system gets only *restricted* ioctls: the kernel copies in and
//! out exactly the size the command number encodes, so a fixed size is
//! what lets one request do the whole call, with no retry.
//!
//! | call                | number       | argument                          |
//! |---------------------|--------------|-----------------------------------|
//! | `ORDO_IOC_OSYNC`    | `_IO('o', 1)`  | none: an ordering point on the file |
//! | `ORDO_IOC_DSYNC`    | `_IO('o', 2)`  | none: the file made durable       |
//! | `ORDO_IOC_SETSTREAM`| `_IOW('o', 3, char[256])` | in: the stream's name  |
//! | `ORDO_IOC_GETSTREAM`| `_IOR('o', 4, char[256])` | out: the caller's stream's name |
//! | `ORDO_IOC_STREAMSYNC`| `_IOW('o', 5, char[256])` | in: a stream's name; empty: the caller's |
//! | `ORDO_IOC_SETSTREAMFLAGS`| `_IOW('o', 6, struct ordo_stream_flags)` | in: a stream's name (empty: the caller's) and its flags |
//! | `ORDO_IOC_GETSTREAMFLAGS`| `_IOR('o', 7, struct ordo_stream_flags)` | out: the caller's stream's name and flags |
//! | `ORDO_IOC_SYNC`     | `_IO('o', 8)`  | none: the whole file system made durable (sync) |
//!
//! `struct ordo_stream_flags { char name[256]; uint32_t flags; }` is
//! [`STREAM_FLAGS_BUF_BYTES`] bytes (no padding), the flags in the host's
//! byte order; the flags are [`ordo_fs::stream::IGNORE_FSYNC`] and no
//! other ([`ordo_fs::stream::STREAM_FLAGS`]).

/// The ioctl "type" byte of every ordo call.
pub const MAGIC: u8 = b'o';

/// Size of the name buffer of SETSTREAM, GETSTREAM and STREAMSYNC: the
/// longest name ([`ordo_fs::stream::STREAM_NAME_MAX_BYTES`]) and its NUL.
pub const NAME_BUF_BYTES: usize = 256;

/// Size of `struct ordo_stream_flags { char name[256]; uint32_t flags; }`,
/// the argument of SETSTREAMFLAGS and GETSTREAMFLAGS: the name buffer,
/// then the flags (host byte order); 256 is a multiple of 4, so there is
/// no padding.
pub const STREAM_FLAGS_BUF_BYTES: usize = NAME_BUF_BYTES + 4;

/// ccfs's `IGNORE_FSYNC` (fsync and fdatasync in the stream return at
/// once; `streamsync` makes the stream durable), as the ioctls carry it.
pub const IGNORE_FSYNC: u32 = ordo_fs::stream::IGNORE_FSYNC;

const IOC_NONE: u32 = 0;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// Linux's `_IOC(dir, type, nr, size)` (asm-generic layout: 8 bits of
/// number, 8 of type, 14 of size, 2 of direction).
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    assert!(size < (1 << 14));
    (dir << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32
}

/// `_IO('o', 1)`: an ordering point on the file (osync).
pub const ORDO_IOC_OSYNC: u32 = ioc(IOC_NONE, MAGIC, 1, 0);
/// `_IO('o', 2)`: make the file durable (dsync).
pub const ORDO_IOC_DSYNC: u32 = ioc(IOC_NONE, MAGIC, 2, 0);
/// `_IOW('o', 3, char[256])`: put the calling process (and the children
/// it starts afterwards) in the named stream.
pub const ORDO_IOC_SETSTREAM: u32 = ioc(IOC_WRITE, MAGIC, 3, NAME_BUF_BYTES);
/// `_IOR('o', 4, char[256])`: the name of the calling process's stream.
pub const ORDO_IOC_GETSTREAM: u32 = ioc(IOC_READ, MAGIC, 4, NAME_BUF_BYTES);
/// `_IOW('o', 5, char[256])`: make a stream durable (an empty name: the
/// caller's).
pub const ORDO_IOC_STREAMSYNC: u32 = ioc(IOC_WRITE, MAGIC, 5, NAME_BUF_BYTES);
/// `_IOW('o', 6, struct ordo_stream_flags)`: put the calling process in
/// the named stream (an empty name: keep its stream) and set that
/// stream's flags. The flags belong to the stream, so they apply to every
/// process in it. EINVAL, with nothing changed, for an unknown flag.
pub const ORDO_IOC_SETSTREAMFLAGS: u32 = ioc(IOC_WRITE, MAGIC, 6, STREAM_FLAGS_BUF_BYTES);
/// `_IOR('o', 7, struct ordo_stream_flags)`: the name and flags of the
/// calling process's stream.
pub const ORDO_IOC_GETSTREAMFLAGS: u32 = ioc(IOC_READ, MAGIC, 7, STREAM_FLAGS_BUF_BYTES);

/// `_IO('o', 8)`: make the whole file system durable, as `sync` does on
/// a kernel file system. sync(1) and syncfs(2) do not reach a FUSE
/// server (the kernel sends FUSE_SYNCFS only to virtiofs), so this is
/// how a program asks an ordo mount for it.
pub const ORDO_IOC_SYNC: u32 = ioc(IOC_NONE, MAGIC, 8, 0);

/// A name in its ioctl buffer; ENAMETOOLONG when it does not fit with its
/// NUL, EINVAL when it holds a NUL.
pub fn name_buffer(name: &[u8]) -> Result<[u8; NAME_BUF_BYTES], i32> {
    if name.len() >= NAME_BUF_BYTES {
        return Err(libc::ENAMETOOLONG);
    }
    if name.contains(&0) {
        return Err(libc::EINVAL);
    }
    let mut buf = [0u8; NAME_BUF_BYTES];
    buf[..name.len()].copy_from_slice(name);
    Ok(buf)
}

/// A `struct ordo_stream_flags` holding `name` and `flags` (the name's
/// errors as [`name_buffer`]).
pub fn stream_flags_buffer(name: &[u8], flags: u32) -> Result<[u8; STREAM_FLAGS_BUF_BYTES], i32> {
    let mut buf = [0u8; STREAM_FLAGS_BUF_BYTES];
    buf[..NAME_BUF_BYTES].copy_from_slice(&name_buffer(name)?);
    buf[NAME_BUF_BYTES..].copy_from_slice(&flags.to_ne_bytes());
    Ok(buf)
}

/// The name and flags in a `struct ordo_stream_flags`; EINVAL for a
/// buffer of another size.
pub fn stream_flags_of_buffer(buf: &[u8]) -> Result<(&[u8], u32), i32> {
    if buf.len() != STREAM_FLAGS_BUF_BYTES {
        return Err(libc::EINVAL);
    }
    let (name, flags) = buf.split_at(NAME_BUF_BYTES);
    let flags = u32::from_ne_bytes(flags.try_into().expect("4 bytes"));
    Ok((name_of_buffer(name), flags))
}

/// Call ordo's ioctl `cmd` on `file`, a file or directory of an ordo
/// mount (the caller's side of the ABI): `buf` is `None` for a call
/// without an argument, else exactly the bytes the command number encodes
/// (EINVAL, without a call, otherwise). ENOTTY or ENOSYS: not an ordo
/// mount.
pub fn call(file: &std::fs::File, cmd: u32, buf: Option<&mut [u8]>) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let size = ((cmd >> 16) & 0x3fff) as usize;
    let arg = match buf {
        None if size == 0 => std::ptr::null_mut(),
        Some(b) if size > 0 && b.len() == size => b.as_mut_ptr(),
        _ => return Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
    };
    // SAFETY: `file` is open; `arg` is null for a call without an
    // argument, and otherwise points to a buffer of exactly the size the
    // command number encodes, which is all the kernel copies in or out.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), cmd as libc::c_ulong, arg) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The name in an ioctl buffer: the bytes before the first NUL (all of
/// them when there is none).
pub fn name_of_buffer(buf: &[u8]) -> &[u8] {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    &buf[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_the_linux_encoding() {
        // As the C macros compute them (asm-generic/ioctl.h).
        assert_eq!(ORDO_IOC_OSYNC, 0x0000_6f01);
        assert_eq!(ORDO_IOC_DSYNC, 0x0000_6f02);
        assert_eq!(ORDO_IOC_SETSTREAM, 0x4100_6f03);
        assert_eq!(ORDO_IOC_GETSTREAM, 0x8100_6f04);
        assert_eq!(ORDO_IOC_STREAMSYNC, 0x4100_6f05);
        // sizeof(struct ordo_stream_flags) = 260 = 0x104.
        assert_eq!(STREAM_FLAGS_BUF_BYTES, 260);
        assert_eq!(ORDO_IOC_SETSTREAMFLAGS, 0x4104_6f06);
        assert_eq!(ORDO_IOC_GETSTREAMFLAGS, 0x8104_6f07);
        assert_eq!(ORDO_IOC_SYNC, 0x0000_6f08);
        assert_eq!(IGNORE_FSYNC, 1);
    }

    #[test]
    fn a_call_with_the_wrong_argument_size_is_refused_before_the_kernel() {
        // /dev/null would answer any ioctl with ENOTTY: EINVAL here means
        // the size check refused the call before it was made.
        let f = std::fs::File::open("/dev/null").unwrap();
        let einval = Some(libc::EINVAL);
        let mut short = [0u8; NAME_BUF_BYTES - 1];
        let err = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
        assert_eq!(err(call(&f, ORDO_IOC_SETSTREAM, Some(&mut short))), einval);
        assert_eq!(err(call(&f, ORDO_IOC_SETSTREAM, None)), einval);
        let mut some = [0u8; 4];
        assert_eq!(err(call(&f, ORDO_IOC_OSYNC, Some(&mut some))), einval);
        let mut name = name_buffer(b"s1").unwrap();
        let enotty = Some(libc::ENOTTY);
        assert_eq!(err(call(&f, ORDO_IOC_SETSTREAM, Some(&mut name))), enotty);
        assert_eq!(err(call(&f, ORDO_IOC_OSYNC, None)), enotty);
        assert_eq!(err(call(&f, ORDO_IOC_SYNC, None)), enotty);
    }

    #[test]
    fn stream_flags_round_trip_through_their_buffer() {
        let b = stream_flags_buffer(b"s1", IGNORE_FSYNC).unwrap();
        assert_eq!(stream_flags_of_buffer(&b), Ok((&b"s1"[..], IGNORE_FSYNC)));
        assert_eq!(&b[NAME_BUF_BYTES..], &IGNORE_FSYNC.to_ne_bytes());
        let b = stream_flags_buffer(b"", 0).unwrap();
        assert_eq!(stream_flags_of_buffer(&b), Ok((&b""[..], 0)));
        assert_eq!(
            stream_flags_buffer(&[b'x'; NAME_BUF_BYTES], 0),
            Err(libc::ENAMETOOLONG)
        );
        assert_eq!(
            stream_flags_of_buffer(&[0u8; NAME_BUF_BYTES]),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn names_round_trip_through_their_buffer() {
        let b = name_buffer(b"s1").unwrap();
        assert_eq!(name_of_buffer(&b), b"s1");
        assert_eq!(name_of_buffer(&[b'x'; 3]), b"xxx");
        assert!(name_buffer(&[b'x'; NAME_BUF_BYTES - 1]).is_ok());
        assert_eq!(
            name_buffer(&[b'x'; NAME_BUF_BYTES]),
            Err(libc::ENAMETOOLONG)
        );
        assert_eq!(name_buffer(b"a\0"), Err(libc::EINVAL));
        assert_eq!(
            NAME_BUF_BYTES,
            ordo_fs::stream::STREAM_NAME_MAX_BYTES + 1,
            "the longest name fits with its NUL"
        );
    }
}
