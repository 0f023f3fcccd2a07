//! The `ordo` command's contract: refusals before anything is touched,
//! clear errors for missing images and busy mounts, `info`, and `fsck`'s
//! e2fsck-style exit codes.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use common::*;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn every_subcommand_has_help() {
    for sub in ["mkfs", "mount", "fsck", "info"] {
        let out = ordo(&[sub, "--help"]);
        assert!(out.status.success(), "ordo {sub} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage: ordo"), "ordo {sub} --help: {text}");
    }
    let out = ordo(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in ["mkfs", "mount", "fsck", "info", "crash"] {
        assert!(text.contains(sub), "ordo --help does not list {sub}");
    }
}

#[test]
fn bad_mount_options_are_refused_before_the_image_is_touched() {
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "32M");
    let before = fs::read(&image).unwrap();
    let mp = s.mkdir("mnt");
    for opts in [
        "bogus",
        "mode=nope",
        "ro,rw",
        "mode=sync,mode=async",
        "mode=async,data=journal",
        "commit=0",
        "cache=oops",
    ] {
        let out = ordo(&[
            "mount",
            image.to_str().unwrap(),
            mp.to_str().unwrap(),
            "-o",
            opts,
        ]);
        assert_eq!(out.status.code(), Some(1), "-o {opts}: {}", stderr(&out));
        assert!(!stderr(&out).is_empty(), "-o {opts}: no message");
        assert!(!is_mounted(&mp), "-o {opts} mounted anyway");
    }
    assert!(
        fs::read(&image).unwrap() == before,
        "a refused mount changed the image"
    );
    // Options are checked even when the paths are wrong too.
    let out = ordo(&[
        "mount",
        "/nonexistent/img",
        "/nonexistent/mnt",
        "-o",
        "bogus",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unknown mount option"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn missing_image_and_bad_mountpoints_are_clear_errors() {
    let s = Scratch::new();
    let mp = s.mkdir("mnt");
    let out = ordo(&[
        "mount",
        s.path("missing").to_str().unwrap(),
        mp.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(32));
    assert!(stderr(&out).contains("No such file"), "{}", stderr(&out));

    let image = s.path("img");
    mkfs(&image, "32M");
    let out = ordo(&[
        "mount",
        image.to_str().unwrap(),
        s.path("nomnt").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(32));
    assert!(stderr(&out).contains("mountpoint"), "{}", stderr(&out));

    let file = s.path("plainfile");
    fs::write(&file, b"x").unwrap();
    let out = ordo(&["mount", image.to_str().unwrap(), file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(32));
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));

    fs::write(mp.join("occupant"), b"x").unwrap();
    let out = ordo(&["mount", image.to_str().unwrap(), mp.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(32));
    assert!(stderr(&out).contains("not empty"), "{}", stderr(&out));
    assert!(!is_mounted(&mp));

    let junk = s.path("junk");
    fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    let mp2 = s.mkdir("mnt2");
    let out = ordo(&["mount", junk.to_str().unwrap(), mp2.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(32));
    assert!(stderr(&out).contains("not an ext4"), "{}", stderr(&out));
}

#[test]
fn an_image_cannot_be_mounted_twice() {
    require_mount_privileges();
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "32M");
    let mp1 = s.mkdir("a");
    let mp2 = s.mkdir("b");
    let m = OrdoMount::start(&image, &mp1, "");
    let out = ordo(&["mount", image.to_str().unwrap(), mp2.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(32), "{}", stderr(&out));
    assert!(stderr(&out).contains("in use"), "{}", stderr(&out));
    assert!(!is_mounted(&mp2));
    // Reading the superblock of a mounted image is fine, as with dumpe2fs.
    let out = ordo(&["info", image.to_str().unwrap()]);
    assert!(out.status.success(), "info while mounted: {}", stderr(&out));
    m.stop_ok();
    assert_e2fsck_clean(&image);
}

#[test]
fn sigterm_and_sigint_unmount_cleanly() {
    require_mount_privileges();
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "32M");
    let mp = s.mkdir("mnt");
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let m = OrdoMount::start(&image, &mp, "");
        fs::write(mp.join(format!("file{sig}")), b"kept across the signal").unwrap();
        let (status, err) = m.signal(sig);
        assert!(status.success(), "signal {sig}: exit {status}: {err}");
        assert!(!is_mounted(&mp), "signal {sig} left the mount behind");
        assert_e2fsck_clean(&image);
    }
    let m = OrdoMount::start(&image, &mp, "ro");
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let got = fs::read(mp.join(format!("file{sig}"))).unwrap();
        assert_eq!(got, b"kept across the signal");
    }
    let e = fs::write(mp.join("nope"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    m.stop_ok();
}

/// A signal to a mount that a program still uses (a file held open)
/// cannot unmount it at once: `ordo mount` tries again, then detaches it
/// as `umount -l` does, says so, and goes on serving the open file; it
/// finishes when the file is closed, and what was written through it,
/// after the signal too, is on the image.
#[test]
fn a_busy_mount_is_detached_on_a_signal() {
    require_mount_privileges();
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "32M");
    let mp = s.mkdir("mnt");
    let mut m = OrdoMount::start(&image, &mp, "");
    let mut held = fs::File::create(mp.join("held")).unwrap();
    held.write_all(b"before the signal\n").unwrap();
    m.send(libc::SIGTERM);
    // The retries last 5 s (ordo_fuse::unmount::BUSY_RETRY); the detach
    // follows them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while is_mounted(&mp) {
        assert!(
            Instant::now() < deadline,
            "SIGTERM left the busy mount in place"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(m.running(), "ordo mount ended with a file still open");
    held.write_all(b"after the signal\n").unwrap();
    held.sync_all().unwrap();
    drop(held);
    let (status, err) = m.wait();
    assert!(status.success(), "exit {status}: {err}");
    assert!(err.contains("detached it"), "{err}");
    assert_e2fsck_clean(&image);
    let out = run("debugfs", &["-R", "cat /held", image.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "before the signal\nafter the signal\n"
    );
}

#[test]
fn without_mode_the_protocol_comes_from_the_image() {
    require_mount_privileges();
    let s = Scratch::new();
    let mp = s.mkdir("mnt");
    for (features, want) in [
        (None, "mode=journal"),
        (Some("fast_commit"), "mode=fast_commit"),
        (Some("^has_journal"), "mode=async"),
    ] {
        let image = s.path(&format!("img-{want}"));
        let mut args = vec!["mkfs", image.to_str().unwrap(), "--size", "32M"];
        if let Some(f) = features {
            args.extend(["-O", f]);
        }
        let out = ordo(&args);
        assert!(
            out.status.success(),
            "mkfs -O {features:?}: {}",
            stderr(&out)
        );
        let m = OrdoMount::start(&image, &mp, "");
        fs::write(mp.join("f"), b"x").unwrap();
        let (status, err) = m.stop();
        assert!(status.success(), "{want}: exit {status}: {err}");
        assert!(
            err.contains(want),
            "-O {features:?}: expected {want} in: {err}"
        );
        assert_e2fsck_clean(&image);
    }
}

#[test]
fn info_shows_the_superblock() {
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "64M");
    let out = ordo(&["info", image.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for field in [
        "Filesystem UUID:",
        "Filesystem features:",
        "Filesystem state:",
        "Block count:",
        "Free blocks:",
        "Free inodes:",
        "Block size:",
        "Journal:",
    ] {
        assert!(text.contains(field), "info lacks {field}:\n{text}");
    }
    assert!(text.contains("clean"), "{text}");
    // The figures agree with dumpe2fs.
    let d = run("dumpe2fs", &["-h", image.to_str().unwrap()]);
    let dtext = String::from_utf8_lossy(&d.stdout);
    for key in [
        "Block count:",
        "Free blocks:",
        "Free inodes:",
        "Filesystem UUID:",
    ] {
        let pick = |t: &str| {
            t.lines()
                .find(|l| l.starts_with(key))
                .map(|l| l[key.len()..].trim().to_string())
        };
        assert_eq!(pick(&text), pick(&dtext), "{key} differs from dumpe2fs");
    }
    let out = ordo(&["info", s.path("missing").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn fsck_exit_codes_follow_e2fsck() {
    let s = Scratch::new();
    let image = s.path("img");
    // Without metadata checksums, so that the corruption below is a link
    // count too high (benign, repairable) and not also a bad checksum.
    let out = ordo(&[
        "mkfs",
        image.to_str().unwrap(),
        "--size",
        "32M",
        "-O",
        "^metadata_csum",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ordo(&["fsck", image.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "clean image: {}", stderr(&out));
    let out = ordo(&["fsck", "-n", image.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "clean image -n: {}",
        stderr(&out)
    );

    // Corrupt the root directory's link count (inode 2, the second slot of
    // group 0's inode table): a real inconsistency.
    corrupt_root_links(&image);
    let before = fs::read(&image).unwrap();
    let out = ordo(&["fsck", "-n", image.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "-n on a corrupted image: {}",
        stderr(&out)
    );
    assert!(
        !out.stdout.is_empty() || !out.stderr.is_empty(),
        "no problem printed"
    );
    assert!(
        fs::read(&image).unwrap() == before,
        "fsck -n wrote to the image"
    );
    let out = ordo(&["fsck", image.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "default is read-only: {}",
        stderr(&out)
    );
    let out = ordo(&["fsck", "-y", image.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "-y corrects: {}", stderr(&out));
    let out = ordo(&["fsck", "-n", image.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "clean after -y: {}",
        stderr(&out)
    );
    assert_e2fsck_clean(&image);

    // Garbage where the superblock should be: an operational error.
    let junk = s.path("junk");
    fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    let out = ordo(&["fsck", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    let out = ordo(&["fsck", "-n", "-y", image.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(16), "conflicting flags");
    let out = ordo(&["fsck"]);
    assert_eq!(out.status.code(), Some(16), "missing image argument");
}

/// Set the root inode's `i_links_count` to 7.
fn corrupt_root_links(image: &std::path::Path) {
    let d = run("dumpe2fs", &[image.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&d.stdout);
    let table_block: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Inode table at "))
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.trim().parse().ok())
        .expect("dumpe2fs names group 0's inode table");
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("dumpe2fs lacks {name}"))
    };
    let block_size = field("Block size:");
    let inode_size = field("Inode size:");
    let offset = table_block * block_size + inode_size + 0x1A;
    let f = fs::OpenOptions::new().write(true).open(image).unwrap();
    f.write_all_at(&7u16.to_le_bytes(), offset).unwrap();
}

#[test]
fn mkfs_makes_what_it_is_asked_and_refuses_the_rest() {
    let s = Scratch::new();
    let image = s.path("img");
    let out = ordo(&["mkfs", image.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "no --size for a new image");
    assert!(stderr(&out).contains("--size"), "{}", stderr(&out));
    assert!(!image.exists());
    let out = ordo(&[
        "mkfs",
        image.to_str().unwrap(),
        "--size",
        "32M",
        "-O",
        "no_such_feature",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no_such_feature"), "{}", stderr(&out));
    assert!(!image.exists(), "a refused mkfs left an image behind");
    let out = ordo(&["mkfs", image.to_str().unwrap(), "--size", "12Q"]);
    assert_ne!(out.status.code(), Some(0));

    let out = ordo(&[
        "mkfs",
        image.to_str().unwrap(),
        "--size",
        "48M",
        "-b",
        "1024",
        "-L",
        "ordo-label",
        "-N",
        "2048",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::metadata(&image).unwrap().len(), 48 << 20);
    let info =
        String::from_utf8_lossy(&ordo(&["info", image.to_str().unwrap()]).stdout).into_owned();
    let field = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(field("Filesystem volume name:"), "ordo-label");
    assert_eq!(field("Block size:"), "1024");
    assert!(
        field("Inode count:").parse::<u32>().unwrap() >= 2048,
        "{info}"
    );
    assert_e2fsck_clean(&image);
}

/// mount(8) integration, in a private mount namespace whose
/// `/usr/local/bin` holds nothing but `ordo` (mount.fuse3 runs helpers
/// with a fixed PATH): `mount -t fuse.ordo` and an fstab line (with
/// fstab-only and systemd options, which ordo must ignore) mount the image,
/// detached, listed as `fuse.ordo` with the image as source; `umount`
/// unmounts; the daemon then makes the image clean and lets it go; a bad
/// option is refused with mount(8)'s exit code before anything detaches.
#[test]
fn mount_t_fuse_ordo_fstab_and_umount() {
    require_mount_privileges();
    if !which("unshare") || !which("mount.fuse3") {
        panic!("unshare (util-linux) and mount.fuse3 (fuse3) are needed: scripts/deps.sh installs them");
    }
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "32M");
    let mp = s.mkdir("mnt");
    let fstab = s.path("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} fuse.ordo noauto,nofail,x-systemd.automount,mode=sync,commit=2 0 0\n",
            image.display(),
            mp.display()
        ),
    )
    .unwrap();
    let script = format!(
        r#"set -eu
img={img}; mp={mp}
mount -t tmpfs ordo-bin /usr/local/bin
ln -s {bin} /usr/local/bin/ordo
wait_gone() {{ for i in $(seq 300); do pgrep -f "ordo.*$img" >/dev/null || return 0; sleep 0.1; done; echo "daemon still running"; exit 1; }}
mount -t fuse.ordo "$img" "$mp" -o mode=journal
grep " $mp " /proc/mounts | grep -q "^$img $mp fuse.ordo " || {{ echo "not listed as fuse.ordo:"; grep " $mp " /proc/mounts; exit 1; }}
echo one > "$mp/one"
umount "$mp"
wait_gone
mount -T {fstab} "$mp"
grep -q " $mp fuse.ordo " /proc/mounts
echo two > "$mp/two"
umount "$mp"
wait_gone
rc=0; mount -t fuse.ordo "$img" "$mp" -o mode=nope 2>/dev/null || rc=$?
[ "$rc" = 1 ] || {{ echo "bad option: exit $rc, want 1"; exit 1; }}
! grep -q " $mp " /proc/mounts
echo ok
"#,
        img = image.display(),
        mp = mp.display(),
        bin = ordo_bin(),
        fstab = fstab.display()
    );
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    assert_e2fsck_clean(&image);
    for (name, want) in [("/one", "one\n"), ("/two", "two\n")] {
        let out = run(
            "debugfs",
            &["-R", &format!("cat {name}"), image.to_str().unwrap()],
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{name}");
    }
}
