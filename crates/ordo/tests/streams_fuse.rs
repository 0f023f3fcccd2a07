//! ordo's ioctls through a real FUSE mount, on every protocol: a Python
//! program (`fcntl.ioctl`, as docs/API.md shows) sets and reads its
//! stream, osyncs, dsyncs and streamsyncs a file and the mount's root;
//! `ordo run --stream` puts a program and its children in a stream;
//! `ordo osync|dsync|streamsync` succeed on the mount and say clearly when
//! a path is not on one.
//!
//! Durability is checked on a copy of the image taken while it is still
//! mounted, right after the calls (`commit=600` keeps the timer out):
//! recovered and read through the library, it holds what was synced.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::*;
use ordo_fs::{Fs, MountOptions, ProtocolKind, ROOT_INO};

/// The ioctl calls of docs/API.md, as a Python module prefix.
const PY_PRELUDE: &str = r#"
import errno, fcntl, os, subprocess, sys
ORDO_IOC_OSYNC = 0x6f01
ORDO_IOC_DSYNC = 0x6f02
ORDO_IOC_SETSTREAM = 0x41006f03
ORDO_IOC_GETSTREAM = 0x81006f04
ORDO_IOC_STREAMSYNC = 0x41006f05
def name_buf(name):
    return name.ljust(256, b"\0")
def getstream(fd):
    return fcntl.ioctl(fd, ORDO_IOC_GETSTREAM, bytes(256)).split(b"\0")[0].decode()
"#;

/// Writes a file and leaves it to the timer (which `commit=600` keeps
/// away): the copy of the image does not have it, which shows that the
/// copies below see only what the calls wrote.
const PY_UNSYNCED: &str = r#"
fd = os.open("u", os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"never synced\n")
"#;

/// osync and dsync of a file, in a stream set by the program.
const PY_DSYNC: &str = r#"
fd = os.open("f", os.O_CREAT | os.O_RDWR, 0o644)
print("start", getstream(fd))
fcntl.ioctl(fd, ORDO_IOC_SETSTREAM, name_buf(b"s1"))
print("set", getstream(fd))
os.write(fd, b"before osync\n")
fcntl.ioctl(fd, ORDO_IOC_OSYNC)
os.write(fd, b"before dsync\n")
fcntl.ioctl(fd, ORDO_IOC_DSYNC)
"#;

/// streamsync of the caller's stream.
const PY_STREAMSYNC: &str = r#"
fd = os.open("g", os.O_CREAT | os.O_RDWR, 0o644)
fcntl.ioctl(fd, ORDO_IOC_SETSTREAM, name_buf(b"s1"))
os.write(fd, b"in stream s1\n")
fcntl.ioctl(fd, ORDO_IOC_STREAMSYNC, name_buf(b""))
"#;

/// The rest of the ABI; prints one line per step.
const PY_REST: &str = r#"
fd = os.open("f", os.O_RDWR)
fcntl.ioctl(fd, ORDO_IOC_SETSTREAM, name_buf(b"s1"))
root = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
print("root", getstream(root))
fcntl.ioctl(root, ORDO_IOC_DSYNC)
fcntl.ioctl(root, ORDO_IOC_OSYNC)
fcntl.ioctl(fd, ORDO_IOC_STREAMSYNC, name_buf(b"s1"))
fcntl.ioctl(fd, ORDO_IOC_STREAMSYNC, name_buf(b"default"))
try:
    fcntl.ioctl(fd, ORDO_IOC_STREAMSYNC, name_buf(b"no-such-stream"))
    print("streamsync no-such-stream ok")
except OSError as e:
    print("streamsync no-such-stream", errno.errorcode[e.errno])
try:
    fcntl.ioctl(fd, ORDO_IOC_SETSTREAM, name_buf(b""))
    print("setstream empty ok")
except OSError as e:
    print("setstream empty", errno.errorcode[e.errno])
try:
    fcntl.ioctl(fd, 0x6f63)
    print("unknown ok")
except OSError as e:
    print("unknown", errno.errorcode[e.errno])
child = subprocess.run([sys.executable, "-c", PRELUDE + "print(getstream(os.open('f', os.O_RDONLY)))"],
                       capture_output=True, text=True, check=True)
print("child", child.stdout.strip())
# A request carries the process's id, not its thread's: a stream set by
# one thread is the whole process's.
import threading
t = threading.Thread(target=lambda: fcntl.ioctl(fd, ORDO_IOC_SETSTREAM, name_buf(b"s2")))
t.start()
t.join()
print("thread", getstream(fd))
fcntl.ioctl(fd, ORDO_IOC_SETSTREAM, name_buf(b"default"))
print("back", getstream(fd))
"#;

fn python(dir: &Path, program: &str) -> String {
    let script = format!("PRELUDE = {PY_PRELUDE:?}\n{PY_PRELUDE}\n{program}");
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python3 failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ordo ARGS` in `dir`.
fn ordo_in(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(ordo_bin())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run ordo")
}

fn assert_ok(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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

#[test]
fn ioctls_and_ordo_run_on_every_protocol() {
    require_mount_privileges();
    assert!(which("python3"), "python3 is needed to call the ioctls");
    for mode in ProtocolKind::all() {
        let s = Scratch::new();
        std::env::set_var("ORDO_RUN_DIR", s.path("run"));
        let image = s.path("img");
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
        let mp = s.mkdir("mnt");
        let m = OrdoMount::start(&image, &mp, &format!("mode={},commit=600", mode.name()));

        python(&mp, PY_UNSYNCED);
        let unsynced = files_of_copy(&image, &s.path("copy0"), &["u"]);
        if mode != ProtocolKind::named("sync") {
            assert_eq!(unsynced[0], None, "{mode:?}: nothing asked for u");
        }
        let text = python(&mp, PY_DSYNC);
        assert_eq!(text, "start default\nset s1\n", "{mode:?}");
        let got = files_of_copy(&image, &s.path("copy1"), &["f"]);
        assert_eq!(
            got[0].as_deref(),
            Some(&b"before osync\nbefore dsync\n"[..]),
            "{mode:?}: dsync"
        );
        python(&mp, PY_STREAMSYNC);
        let got = files_of_copy(&image, &s.path("copy2"), &["g"]);
        assert_eq!(
            got[0].as_deref(),
            Some(&b"in stream s1\n"[..]),
            "{mode:?}: streamsync"
        );
        let text = python(&mp, PY_REST);
        let want = "root s1\nstreamsync no-such-stream EINVAL\nsetstream empty EINVAL\n\
                    unknown ENOTTY\nchild s1\nthread s2\nback default\n";
        assert_eq!(text, want, "{mode:?}");

        // ordo run: the program and its children are in the stream.
        let get = s.path("getstream.py");
        std::fs::write(
            &get,
            format!("{PY_PRELUDE}\nprint(getstream(os.open('.', os.O_RDONLY)))\n"),
        )
        .unwrap();
        let get = get.to_str().unwrap();
        let out = ordo_in(&mp, &["run", "--stream", "s2", "--", "python3", get]);
        assert_eq!(assert_ok(&out, "ordo run"), "s2\n", "{mode:?}");
        let out = ordo_in(
            s.dir.path(),
            &[
                "run",
                "--stream",
                "s3",
                "--mount",
                mp.to_str().unwrap(),
                "--",
                "sh",
                "-c",
                &format!("cd '{}' && python3 '{get}'", mp.display()),
            ],
        );
        assert_eq!(
            assert_ok(&out, "ordo run sh"),
            "s3\n",
            "{mode:?}: inherited"
        );
        // A process outside is still in the default stream.
        let out = Command::new("python3")
            .arg(get)
            .current_dir(&mp)
            .output()
            .unwrap();
        assert_eq!(assert_ok(&out, "python3"), "default\n", "{mode:?}");

        // The other commands.
        std::fs::write(mp.join("h"), b"by the cli\n").unwrap();
        assert_ok(&ordo_in(&mp, &["osync", "h"]), "ordo osync");
        assert_ok(&ordo_in(&mp, &["dsync", "h"]), "ordo dsync");
        assert_ok(
            &ordo_in(&mp, &["streamsync", "--stream", "s2", "."]),
            "ordo streamsync --stream s2",
        );
        assert_ok(&ordo_in(&mp, &["streamsync", "."]), "ordo streamsync");
        let got = files_of_copy(&image, &s.path("copy3"), &["h"]);
        assert_eq!(got[0].as_deref(), Some(&b"by the cli\n"[..]), "{mode:?}");
        // ordo sync: everything written so far, in every stream and file,
        // without an fsync of any of them.
        std::fs::write(mp.join("k1"), b"synced by ordo sync\n").unwrap();
        std::fs::write(mp.join("k2"), b"and this one\n").unwrap();
        let before = files_of_copy(&image, &s.path("copy4"), &["k1", "k2"]);
        if mode != ProtocolKind::named("sync") {
            assert_eq!(
                before,
                vec![None, None],
                "{mode:?}: nothing synced k1, k2 yet"
            );
        }
        assert_ok(&ordo_in(&mp, &["sync", "."]), "ordo sync");
        let got = files_of_copy(&image, &s.path("copy5"), &["k1", "k2"]);
        assert_eq!(
            got,
            vec![
                Some(b"synced by ordo sync\n".to_vec()),
                Some(b"and this one\n".to_vec())
            ],
            "{mode:?}: ordo sync"
        );
        let out = ordo_in(&mp, &["streamsync", "--stream", "nope", "."]);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no stream named 'nope'"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // ordo info says what the calls are on this protocol.
        let info = assert_ok(&ordo(&["info", mp.to_str().unwrap()]), "ordo info");
        // The protocols with the prefix property (OptFS) have osync and
        // dsync of their own; those that keep streams apart (ccfs) have
        // streamsync.
        let caps = mode.caps();
        let want = format!(
            "durability calls: {}, streamsync={}",
            if caps.prefix_after_crash {
                "osync=native, dsync=native"
            } else {
                "osync=fsync, dsync=fsync"
            },
            if caps.stream_prefix_after_crash {
                "native"
            } else {
                "sync"
            }
        );
        assert!(info.contains(&want), "{mode:?}: {info}");
        m.stop_ok();
        assert_e2fsck_clean(&image);
    }
}

#[test]
fn commands_off_an_ordo_mount_say_so() {
    let s = Scratch::new();
    let f = s.path("plain");
    std::fs::write(&f, b"x").unwrap();
    for args in [
        vec!["osync", f.to_str().unwrap()],
        vec!["dsync", f.to_str().unwrap()],
        vec!["streamsync", f.to_str().unwrap()],
        vec!["sync", f.to_str().unwrap()],
        vec!["run", "--stream", "a", "--", "true"],
    ] {
        let out = ordo_in(s.dir.path(), &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not on an ordo mount"), "{args:?}: {err}");
    }
}
