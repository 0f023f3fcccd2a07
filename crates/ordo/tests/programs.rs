//! Real programs on an ordo mount, then the kernel's ext4 reading the
//! image ordo left: the tree, the contents and the attributes must be the
//! ones the programs made.

mod common;

use std::fs;
use std::path::Path;

use common::*;

/// Build a source tree of `dirs * files_per_dir` files of varied sizes,
/// with symlinks, hard links, odd modes and times.
fn make_source_tree(root: &Path, dirs: usize, files_per_dir: usize) {
    fs::create_dir_all(root).unwrap();
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for d in 0..dirs {
        let dir = root
            .join(format!("dir{d:03}"))
            .join(format!("sub{}", d % 7));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..files_per_dir {
            let size = match next() % 10 {
                0 => 0,
                1..=6 => (next() % 4096) as usize,
                7 | 8 => (next() % 65536) as usize,
                _ => (next() % (300 << 10)) as usize,
            };
            let byte = (next() & 0xff) as u8;
            let data: Vec<u8> = (0..size)
                .map(|i| byte.wrapping_add((i % 251) as u8))
                .collect();
            fs::write(dir.join(format!("f{f:04}.dat")), data).unwrap();
        }
    }
    sh(
        root,
        "ln -s dir000/sub0/f0000.dat link-to-file
         ln -s ../no/such/place dangling
         ln dir000/sub0/f0001.dat hardlink
         mkdir -p empty/deeper/deepest
         chmod 0750 dir001
         chmod 4755 dir000/sub0/f0002.dat
         chmod 2711 dir002
         chmod 1777 empty
         touch -h -d '1999-12-31 23:59:59.123456789' link-to-file
         touch -d '2038-01-19 03:14:08.5' dir000/sub0/f0003.dat
         touch -d '1969-07-20 20:17:40' dir000/sub0/f0004.dat
         printf 'x%.0s' $(seq 1 300) > long-name-$(printf 'n%.0s' $(seq 1 200))",
    );
}

/// A listing of a tree: path, type, mode, size, owner, links and mtime
/// with nanoseconds (atime is left out: reading changes it).
fn listing(root: &Path) -> String {
    sh(
        root,
        "find . -mindepth 1 -printf '%P %y %m %s %U %G %n %T@ %l\\n' | LC_ALL=C sort",
    )
}

#[test]
fn coreutils_tar_and_friends_then_the_kernel_reads_the_same_tree() {
    require_loop_devices();
    let s = Scratch::new();
    let src = s.path("src");
    make_source_tree(&src, 60, 50);
    let image = s.path("img");
    mkfs(&image, "512M");
    let mp = s.mkdir("mnt");
    let m = OrdoMount::start(&image, &mp, "");

    // cp -a of a few thousand files, then diff -r.
    sh(
        &mp,
        &format!(
            "cp -a {}/. copy && diff -r --no-dereference {} copy",
            src.display(),
            src.display()
        ),
    );
    let n = sh(&mp, "find copy -type f | wc -l");
    assert!(
        n.trim().parse::<usize>().unwrap() >= 3000,
        "only {n} files copied"
    );

    // tar create and extract, then compare.
    sh(&mp, &format!(
        "tar -C {} -cf tree.tar . && mkdir untar && tar -C untar -xpf tree.tar && diff -r --no-dereference {} untar",
        src.display(), src.display()
    ));

    // mv across directories (files and a whole directory), and back.
    sh(&mp, "mkdir -p moved/inner && mv untar/dir010 moved/inner/ && mv untar/dir011/sub4/f0000.dat moved/ \
             && test -d moved/inner/dir010/sub3 && test ! -e untar/dir010 \
             && mv moved/inner/dir010 untar/ && mv moved/f0000.dat untar/dir011/sub4/");
    sh(
        &mp,
        &format!("diff -r --no-dereference {} untar", src.display()),
    );

    // ln and ln -s.
    sh(&mp, "ln copy/dir005/sub5/f0001.dat hard && test $(stat -c %h hard) = 2 \
             && ln -s copy/dir005/sub5/f0001.dat soft && cmp soft hard \
             && test $(readlink soft) = copy/dir005/sub5/f0001.dat \
             && ln -s $(printf 'x%.0s' $(seq 1 500)) longtarget && test $(readlink longtarget | wc -c) = 501 \
             && mkfifo pipe && test -p pipe && mknod chr c 1 3 && test -c chr && test $(stat -c %t,%T chr) = 1,3");

    // chmod, chown, touch -d.
    sh(&mp, "touch attrs && chown 1234:5678 attrs && chmod 6741 attrs \
             && touch -m -d '2001-02-03 04:05:06.123456789' attrs \
             && test \"$(stat -c '%a %u %g %y' attrs)\" = '6741 1234 5678 2001-02-03 04:05:06.123456789 +0000' \
             || { stat attrs; false; }");

    // truncate: grow with a hole, shrink, to zero.
    sh(
        &mp,
        "head -c 10000 /dev/urandom > t && truncate -s 1M t && test $(stat -c %s t) = 1048576 \
             && test \"$(tail -c 1000 t | tr -d '\\0' | wc -c)\" = 0 \
             && truncate -s 100 t && test $(stat -c %s t) = 100 && truncate -s 0 t && test ! -s t",
    );

    // dd with conv=fsync, read back.
    sh(&mp, "head -c 4194304 /dev/urandom > /tmp/ordo-dd-$$ && dd if=/tmp/ordo-dd-$$ of=dd.out bs=64k conv=fsync status=none \
             && cmp /tmp/ordo-dd-$$ dd.out && dd if=/tmp/ordo-dd-$$ of=dd.out bs=4k seek=10 count=5 conv=notrunc,fsync status=none \
             && rm /tmp/ordo-dd-$$");

    // find and du.
    let found = sh(&mp, "find copy -name 'f00*.dat' | wc -l");
    assert!(found.trim().parse::<usize>().unwrap() >= 600);
    let du = sh(&mp, "du -sk copy | cut -f1");
    assert!(
        du.trim().parse::<u64>().unwrap() > 1000,
        "du -sk copy = {du}"
    );

    // rm -rf of a big tree.
    sh(&mp, "rm -rf untar tree.tar moved && test ! -e untar && test -z \"$(ls -A . | grep untar || true)\"");

    let ordo_listing = listing(&mp);
    let df = sh(&mp, "df -k . | tail -1");
    assert!(df.contains("ordo"), "df: {df}");
    m.stop_ok();

    assert_e2fsck_clean(&image);
    let kmp = s.mkdir("kernel");
    let k = KernelMount::start(&image, &kmp, "ro");
    sh(
        &kmp,
        &format!("diff -r --no-dereference {} copy", src.display()),
    );
    let kernel_listing = listing(&kmp);
    assert_eq!(
        ordo_listing, kernel_listing,
        "the kernel sees other attributes than ordo showed"
    );
    k.stop();
}

#[test]
fn git_and_sqlite_on_ordo() {
    require_loop_devices();
    let s = Scratch::new();
    let image = s.path("img");
    mkfs(&image, "128M");
    let mp = s.mkdir("mnt");
    let m = OrdoMount::start(&image, &mp, "");

    sh(&mp, "mkdir repo && cd repo && git init -q . \
             && git config user.email ordo@example.com && git config user.name ordo \
             && for i in $(seq 1 40); do mkdir -p d$((i % 5)); seq 1 $((i * 50)) > d$((i % 5))/file$i; done \
             && git add -A && git commit -q -m first \
             && sed -i 's/1/one/' d1/file1 && git rm -q d2/file2 && git mv d3/file3 d4/renamed \
             && git commit -q -am second && git gc -q && git fsck --full --strict \
             && test $(git rev-list --count HEAD) = 2");

    let out = sh(
        &mp,
        "sqlite3 db.sqlite \"PRAGMA journal_mode=WAL; \
             CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, b BLOB); \
             BEGIN; WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 5000) \
             INSERT INTO t SELECT x, 'row ' || x, randomblob(200) FROM c; COMMIT; \
             DELETE FROM t WHERE id % 3 = 0; VACUUM; \
             PRAGMA wal_checkpoint(TRUNCATE); \
             SELECT count(*) FROM t; PRAGMA integrity_check;\"",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"3334"), "sqlite count: {out}");
    assert_eq!(lines.last(), Some(&"ok"), "sqlite integrity_check: {out}");
    let out = sh(
        &mp,
        "sqlite3 rollback.sqlite 'PRAGMA journal_mode=DELETE; CREATE TABLE x(a); \
             INSERT INTO x VALUES (1),(2),(3); PRAGMA integrity_check;'",
    );
    assert_eq!(out.lines().last(), Some("ok"), "{out}");
    m.stop_ok();

    assert_e2fsck_clean(&image);
    let kmp = s.mkdir("kernel");
    let k = KernelMount::start(&image, &kmp, "ro");
    let out = sh(&kmp, "sqlite3 -readonly 'file:db.sqlite?immutable=1' 'SELECT count(*) FROM t; PRAGMA integrity_check;'");
    assert_eq!(out.lines().collect::<Vec<_>>(), vec!["3334", "ok"], "{out}");
    sh(&kmp, "cd repo && git -c safe.directory='*' fsck --full --no-dangling && test $(git -c safe.directory='*' rev-list --count HEAD) = 2");
    k.stop();
}

#[test]
fn every_mode_serves_programs_and_unmounts_clean() {
    require_loop_devices();
    let s = Scratch::new();
    let src = s.path("src");
    make_source_tree(&src, 4, 25);
    for (features, opts) in [
        ("", "mode=async"),
        ("", "mode=sync"),
        ("", "mode=journal"),
        ("", "mode=journal,data=writeback"),
        ("", "mode=journal,data=journal"),
        ("fast_commit", "mode=fast_commit"),
    ] {
        let image = s.path(&format!("img-{opts}"));
        let mut args = vec!["mkfs", image.to_str().unwrap(), "--size", "64M"];
        if !features.is_empty() {
            args.extend(["-O", features]);
        }
        let out = ordo(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mp = s.mkdir(&format!("mnt-{opts}"));
        let m = OrdoMount::start(&image, &mp, opts);
        sh(
            &mp,
            &format!(
                "cp -a {src}/. copy && tar -C copy -cf t.tar . && mkdir x && tar -C x -xf t.tar \
                 && diff -r --no-dereference {src} x && rm -rf x t.tar \
                 && sqlite3 db 'CREATE TABLE t(a); INSERT INTO t VALUES (1),(2),(3); PRAGMA integrity_check;' | grep -qx ok \
                 && dd if=/dev/urandom of=synced bs=4k count=8 conv=fsync status=none",
                src = src.display()
            ),
        );
        let listing_before = listing(&mp);
        m.stop_ok();
        assert_e2fsck_clean(&image);
        let kmp = s.mkdir(&format!("kernel-{opts}"));
        let k = KernelMount::start(&image, &kmp, "ro");
        sh(
            &kmp,
            &format!("diff -r --no-dereference {} copy", src.display()),
        );
        assert_eq!(
            listing_before,
            listing(&kmp),
            "-o {opts}: the kernel sees another tree"
        );
        k.stop();
    }
}
