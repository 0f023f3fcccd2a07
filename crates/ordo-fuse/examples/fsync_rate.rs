//! Operations per second of "create, write 4 KiB, fsync, close" in a
//! directory of any file system (ordo's mount or the kernel's ext4), for
//! `scripts/bench-vs-kernel.sh`. A benchmark, not a test.
//!
//! ```text
//! cargo run --release -p ordo-fuse --example fsync_rate -- DIR [COUNT]
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

const WRITE_BYTES: usize = 4096;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().expect("usage: fsync_rate DIR [COUNT]"));
    let count: usize = args
        .next()
        .map(|s| s.parse().expect("COUNT is a number"))
        .unwrap_or(1000);
    std::fs::create_dir_all(&dir).expect("create DIR");
    let data = vec![0xa5u8; WRITE_BYTES];
    let start = Instant::now();
    for i in 0..count {
        let mut f = std::fs::File::create(dir.join(format!("s{i}"))).expect("create");
        f.write_all(&data).expect("write");
        f.sync_all().expect("fsync");
    }
    let secs = start.elapsed().as_secs_f64();
    println!("{:.0}", count as f64 / secs);
}
