//! ccfs's `IGNORE_FSYNC` through a real FUSE mount, on every protocol,
//! reached without changing the programs: `ordo run --stream s
//! --ignore-fsync -- sh -c '... dd conv=fsync ...'` makes the fsyncs of
//! the shell and of everything it starts return at once, while a process
//! in another stream, and the same command without `--ignore-fsync`, still
//! gets a real fsync; `ordo streamsync` makes the stream durable. The
//! SETSTREAMFLAGS/GETSTREAMFLAGS ioctls (docs/API.md) are called from
//! Python: the flags read back, children inherit the stream, an unknown
//! flag is EINVAL and changes nothing.
//!
//! Durability is checked on a copy of the image taken while it is still
//! mounted (`commit=600` keeps the timer out); on `mode=journal` the
//! mount's statistics (`ordo info`: `commits`, `flushes_planned`) show
//! that an ignored fsync commits and flushes nothing.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use ordo_fs::{Fs, MountOptions, ProtocolKind, ROOT_INO};

/// The flag ioctls of docs/API.md, as a Python module prefix.
const PY_PRELUDE: &str = r#"
import errno, fcntl, os, struct, subprocess, sys
ORDO_IOC_SETSTREAMFLAGS = 0x41046f06
ORDO_IOC_GETSTREAMFLAGS = 0x81046f07
IGNORE_FSYNC = 1
def setstreamflags(fd, name, flags):
    fcntl.ioctl(fd, ORDO_IOC_SETSTREAMFLAGS, struct.pack("256sI", name, flags))
def getstreamflags(fd):
    name, flags = struct.unpack("256sI", fcntl.ioctl(fd, ORDO_IOC_GETSTREAMFLAGS, bytes(260)))
    return name.split(b"\0")[0].decode(), flags
"#;

/// Run by `ordo run --stream s --ignore-fsync` in the mount; one line per
/// step.
const PY_FLAGS: &str = r#"
fd = os.open(".", os.O_RDONLY)
print(*getstreamflags(fd))
child = subprocess.run([sys.executable, "-c", PRELUDE + "print(*getstreamflags(os.open('.', os.O_RDONLY)))"],
                       capture_output=True, text=True, check=True)
print("child", child.stdout.strip())
for bad in (2, 0x80000000, 0xFFFFFFFF):
    try:
        setstreamflags(fd, b"other", bad)
        print(hex(bad), "ok")
    except OSError as e:
        print(hex(bad), errno.errorcode[e.errno])
print("unchanged", *getstreamflags(fd))
setstreamflags(fd, b"", 0)
print("own stream", *getstreamflags(fd))
setstreamflags(fd, b"t", IGNORE_FSYNC)
print("moved", *getstreamflags(fd))
setstreamflags(fd, b"default", 0)
print("back", *getstreamflags(fd))
"#;

const PY_FLAGS_WANT: &str = "s 1\nchild s 1\n0x2 EINVAL\n0x80000000 EINVAL\n0xffffffff EINVAL\n\
                             unchanged s 1\nown stream s 0\nmoved t 1\nback default 0\n";

fn assert_ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ordo ARGS` in `dir`.
fn ordo_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(ordo_bin())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run ordo")
}

/// `ordo run --stream s [--ignore-fsync] -- sh -c SCRIPT` in `dir`.
fn run_in_stream(dir: &Path, stream: &str, ignore_fsync: bool, script: &str) {
    let mut args = vec!["run", "--stream", stream];
    if ignore_fsync {
        args.push("--ignore-fsync");
    }
    args.extend(["--", "sh", "-c", script]);
    assert_ok(&ordo_in(dir, &args), &format!("ordo {args:?}"));
}

/// A shell line writing `text` to `name` with dd, which fsyncs it
/// (`fdatasync`: fdatasyncs it) before it exits; dd is the shell's child.
fn dd(name: &str, conv: &str) -> String {
    format!("printf '{name}\\n' | dd of={name} conv={conv} status=none")
}

/// The files `names` of a copy of `image`, recovered (a read-only mount
/// replays the journal in memory) and read through the library.
fn files_of_copy(image: &Path, copy: &Path, names: &[&str]) -> Vec<Option<Vec<u8>>> {
    std::fs::copy(image, copy).unwrap();
    let dev = ordo_dev::FileDevice::open(copy, 4096, ordo_dev::OpenOptions::read_only())
        .expect("open the copy");
    let fs = Fs::mount(
        Arc::new(dev),
        MountOptions {
            mode: ProtocolKind::named("journal"),
            read_only: true,
            ..MountOptions::default()
        },
    )
    .expect("mount the copy");
    let got = names
        .iter()
        .map(|n| {
            let a = fs.lookup(ROOT_INO, n.as_bytes()).ok()?;
            Some(fs.read(a.ino, 0, a.size as u32).unwrap())
        })
        .collect();
    fs.unmount().unwrap();
    got
}

/// Which of `names` a copy of the image taken now holds, each with the
/// content `dd` wrote.
fn durable(image: &Path, copy: &Path, names: &[&str]) -> Vec<bool> {
    files_of_copy(image, copy, names)
        .into_iter()
        .zip(names)
        .map(|(got, n)| match got {
            None => false,
            Some(b) => {
                assert_eq!(b, format!("{n}\n").into_bytes(), "{n} on the copy");
                true
            }
        })
        .collect()
}

/// The number on the line of `text` that starts with `name`.
fn figure(text: &str, name: &str) -> u64 {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no '{name}' line in:\n{text}"));
    line[name.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number on '{line}'"))
}

/// (`commits`, `flushes_planned`) of the mount on `mp`, as `ordo info`
/// shows them (refreshed by the mount about once a second).
fn commits_and_flushes(mp: &Path) -> (u64, u64) {
    let text = assert_ok(&ordo(&["info", mp.to_str().unwrap()]), "ordo info");
    assert!(text.contains("live mount"), "{text}");
    (figure(&text, "commits"), figure(&text, "flushes_planned"))
}

/// Wait until the mount's figures are `want`, then long enough for two
/// more refreshes, and check they stayed: a commit made by a call that
/// returned before this one shows by then.
fn expect_commits_and_flushes(mp: &Path, want: (u64, u64), what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = commits_and_flushes(mp);
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline && got.0 <= want.0,
            "{what}: (commits, flushes_planned) = {got:?}, want {want:?}"
        );
        sleep(Duration::from_millis(100));
    }
    sleep(Duration::from_millis(2200));
    assert_eq!(commits_and_flushes(mp), want, "{what}: later");
}

#[test]
fn ignore_fsync_through_ordo_run_on_every_protocol() {
    require_mount_privileges();
    assert!(which("python3"), "python3 is needed to call the ioctls");
    let s = Scratch::new();
    // Every process of the test (ordo mount, ordo info) inherits this.
    std::env::set_var("ORDO_RUN_DIR", s.path("run"));
    let py = s.path("flags.py");
    std::fs::write(
        &py,
        format!("PRELUDE = {PY_PRELUDE:?}\n{PY_PRELUDE}\n{PY_FLAGS}"),
    )
    .unwrap();
    for mode in ProtocolKind::all() {
        let image = s.path(&format!("img-{}", mode.name()));
        let out = ordo(&[
            "mkfs",
            image.to_str().unwrap(),
            "--size",
            "64M",
            "-b",
            "4096",
            "-O",
            "has_journal,fast_commit",
        ]);
        assert_ok(&out, "ordo mkfs");
        let mp = s.mkdir(&format!("mnt-{}", mode.name()));
        let m = OrdoMount::start(&image, &mp, &format!("mode={},commit=600", mode.name()));
        // On `sync` every write is durable at once: nothing to ignore.
        let lazy = mode != ProtocolKind::named("sync");
        let journal = mode == ProtocolKind::named("journal");
        let copy = s.path("copy");
        let base = journal.then(|| {
            sleep(Duration::from_millis(1500));
            commits_and_flushes(&mp)
        });
        let expect = |n: u64, what: &str| {
            if let Some((c, f)) = base {
                expect_commits_and_flushes(&mp, (c + n, f + n), &format!("{mode:?}: {what}"));
            }
        };

        // fsync, fdatasync and a directory's fsync (coreutils' `sync
        // DIR`) in a stream with IGNORE_FSYNC, from the shell's children.
        let script = format!(
            "{} && {} && sync .",
            dd("a", "fsync"),
            dd("a2", "fdatasync")
        );
        run_in_stream(&mp, "s", true, &script);
        if lazy {
            assert_eq!(
                durable(&image, &copy, &["a", "a2"]),
                [false, false],
                "{mode:?}: ignored fsyncs"
            );
        }
        expect(0, "ignored fsyncs commit nothing");

        // The flag is the stream's: a process in the default stream
        // still gets a real fsync.
        sh(&mp, &dd("d", "fsync"));
        assert_eq!(durable(&image, &copy, &["d"]), [true], "{mode:?}");
        expect(1, "an fsync in the default stream");

        run_in_stream(&mp, "s", true, &dd("e", "fsync"));
        if lazy {
            assert_eq!(durable(&image, &copy, &["e"]), [false], "{mode:?}");
        }
        expect(1, "ignored again");

        // streamsync makes the stream durable.
        assert_ok(
            &ordo_in(&mp, &["streamsync", "--stream", "s", "."]),
            "ordo streamsync",
        );
        assert_eq!(
            durable(&image, &copy, &["a", "a2", "e"]),
            [true; 3],
            "{mode:?}: streamsync"
        );
        expect(2, "streamsync");

        // The same command without --ignore-fsync: ordo run clears the
        // flag, and the fsync is real.
        run_in_stream(&mp, "s", false, &dd("f", "fsync"));
        assert_eq!(durable(&image, &copy, &["f"]), [true], "{mode:?}");
        expect(3, "the same without --ignore-fsync");

        // The ioctls themselves.
        let out = ordo_in(
            &mp,
            &[
                "run",
                "--stream",
                "s",
                "--ignore-fsync",
                "--",
                "python3",
                py.to_str().unwrap(),
            ],
        );
        assert_eq!(assert_ok(&out, "flags.py"), PY_FLAGS_WANT, "{mode:?}");
        // The stream named with an unknown flag was never made.
        let out = ordo_in(&mp, &["streamsync", "--stream", "other", "."]);
        assert!(!out.status.success(), "{mode:?}: stream 'other' exists");
        // A process outside is in the default stream, without flags.
        let out = Command::new("python3")
            .arg("-c")
            .arg(format!(
                "{PY_PRELUDE}\nprint(*getstreamflags(os.open('.', os.O_RDONLY)))"
            ))
            .current_dir(&mp)
            .output()
            .unwrap();
        assert_eq!(assert_ok(&out, "python3"), "default 0\n", "{mode:?}");

        m.stop_ok();
        assert_e2fsck_clean(&image);
    }
}

#[test]
fn ordo_run_ignore_fsync_off_an_ordo_mount_says_so() {
    let s = Scratch::new();
    let out = ordo_in(
        s.dir.path(),
        &["run", "--stream", "a", "--ignore-fsync", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not on an ordo mount"), "{err}");
}
