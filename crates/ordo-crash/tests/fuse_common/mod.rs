//! Whether a test can mount through FUSE here.

/// `/dev/fuse` and `fusermount3` are there. Outside CI a machine without
/// them skips the test (this says so); in CI (`CI=true`) a missing piece
/// fails it.
pub fn fuse_available() -> bool {
    let ok = std::path::Path::new("/dev/fuse").exists()
        && std::process::Command::new("fusermount3")
            .arg("-V")
            .output()
            .is_ok();
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "CI: /dev/fuse or fusermount3 is missing"
        );
        eprintln!("skipped: no /dev/fuse or fusermount3");
    }
    ok
}
