//! Reading a recovered file system through ordo's API, bounded against a
//! corrupted image: the whole of a file in chunks, and the entries of a
//! directory. Shared by the judge, the oracle and the application
//! explorer.

use ordo_fs::{DirEntry, Fs, Ino};

/// The first `size` bytes of file `ino`, in one read when the file is
/// under 64 MiB and a MiB at a time past that. A read that
/// returns nothing before `size` (a size the extents do not back) is an
/// error, not a short file.
pub fn whole_file(fs: &Fs, ino: Ino, size: u64) -> Result<Vec<u8>, String> {
    // The first request asks for up to 64 MiB and its reply becomes the
    // buffer (the explorer's files are smaller than that: one request, no
    // copy); a short reply is continued 1 MiB at a time.
    let mut data = Vec::new();
    while (data.len() as u64) < size {
        let limit = if data.is_empty() { 64 << 20 } else { 1 << 20 };
        let want = (size - data.len() as u64).min(limit) as u32;
        let chunk = fs
            .read(ino, data.len() as u64, want)
            .map_err(|e| format!("read at {}: {e}", data.len()))?;
        if chunk.is_empty() {
            return Err(format!("read returned nothing at {} of {size}", data.len()));
        }
        if data.is_empty() {
            data = chunk;
        } else {
            data.extend_from_slice(&chunk);
        }
    }
    Ok(data)
}

/// Every entry of directory `ino` but `.` and `..`, in readdir order; a
/// readdir that does not advance, or more than `max` entries, is an error.
pub fn dir_entries(fs: &Fs, ino: Ino, max: usize) -> Result<Vec<DirEntry>, String> {
    let mut out = Vec::new();
    let mut cookie = 0;
    let mut seen = 0usize;
    loop {
        let batch = fs
            .readdir(ino, cookie, 256)
            .map_err(|e| format!("readdir: {e}"))?;
        if batch.is_empty() {
            return Ok(out);
        }
        let before = cookie;
        seen += batch.len();
        for e in batch {
            cookie = e.next_offset;
            if e.name != b"." && e.name != b".." {
                out.push(e);
            }
        }
        if cookie == before {
            return Err("readdir does not advance".into());
        }
        if seen > max {
            return Err(format!("more than {max} entries"));
        }
    }
}
