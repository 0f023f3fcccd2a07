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

/// The ioctl "type" byte of every ordo call.
pub const MAGIC: u8 = b'o';

/// Size of the name buffer of SETSTREAM, GETSTREAM and STREAMSYNC: the
/// longest name ([`ordo_fs::stream::STREAM_NAME_MAX_BYTES`]) and its NUL.
pub const NAME_BUF_BYTES: usize = 256;

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
