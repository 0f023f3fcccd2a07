//! `setxattr(2)` and `getxattr(2)` on a path of a kernel mount, for the
//! tests that set attributes through the kernel and read them through
//! ordo, or the other way round.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c_strings(path: &Path, name: &str) -> (CString, CString) {
    (
        CString::new(path.as_os_str().as_bytes()).unwrap(),
        CString::new(name).unwrap(),
    )
}

/// Set attribute `name` of `path` to `value`, which must succeed.
pub fn set(path: &Path, name: &str, value: &[u8]) {
    let (p, n) = c_strings(path, name);
    // SAFETY: NUL-terminated strings and a live buffer of `value.len()` bytes.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "setxattr {name} on {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// The value of attribute `name` of `path` (at most 4 KiB), which must
/// exist.
#[allow(dead_code)] // not every test that sets attributes reads them back
pub fn get(path: &Path, name: &str) -> Vec<u8> {
    let (p, n) = c_strings(path, name);
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated strings and a buffer of `buf.len()` bytes.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        r >= 0,
        "getxattr {name} on {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    buf.truncate(r as usize);
    buf
}
