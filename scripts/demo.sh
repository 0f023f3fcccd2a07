#!/usr/bin/env bash
# ordo end to end: build, make an image, mount it through FUSE, run real
# programs on it (a source tree copied and archived, a git repository, a
# SQLite database), unmount, and check the image with ordo's fsck and with
# e2fsck. Prints what happened, with counts.
#
# Usage: scripts/demo.sh [MODE]     (MODE: async (default) or sync)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
mode=${1:-async}

die() { echo "demo: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (FUSE mounts with allow_other)"
# Every program ordo drives, installed up front (the same list the tests use).
bash scripts/deps.sh
[ -c /dev/fuse ] || die "/dev/fuse is missing"

echo "== building ordo"
cargo build -q -p ordo
ordo=$repo/target/debug/ordo
[ -n "${CARGO_TARGET_DIR:-}" ] && ordo=$CARGO_TARGET_DIR/debug/ordo

work=$(mktemp -d /var/tmp/ordo-demo.XXXXXX)
img=$work/ordo.img
mnt=$work/mnt
mkdir "$mnt"
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    fusermount3 -u -z "$mnt" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== ordo mkfs $img --size 512M"
"$ordo" mkfs "$img" --size 512M -L demo

echo "== ordo mount $img $mnt -o mode=$mode"
"$ordo" mount -f "$img" "$mnt" -o "mode=$mode" 2>"$work/mount.log" &
pid=$!
for _ in $(seq 1 300); do
  grep -q " $mnt " /proc/mounts && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/mount.log"; die "ordo mount exited"; }
  sleep 0.05
done
grep -q " $mnt " /proc/mounts || die "mount did not appear"

t0=$(date +%s.%N)
echo "== workload"
# 1. A source tree: ordo's own sources, copied, archived and extracted.
cp -a "$repo/crates" "$repo/docs" "$mnt/"
[ -d /usr/include ] && cp -a /usr/include "$mnt/include"
tar -C "$mnt" -cf "$mnt/tree.tar" crates docs
mkdir "$mnt/extracted" && tar -C "$mnt/extracted" -xf "$mnt/tree.tar"
diff -r "$repo/crates" "$mnt/extracted/crates" >/dev/null
files=$(find "$mnt" -type f | wc -l)
dirs=$(find "$mnt" -type d | wc -l)
# 2. git: a repository of the copied tree, two commits, fsck.
(
  cd "$mnt/extracted"
  git init -q . && git config user.email demo@ordo && git config user.name demo
  git add -A && git commit -q -m "ordo sources"
  echo "// changed on ordo" >> crates/ordo/src/main.rs
  git commit -q -am "a change" && git fsck --full --no-progress --no-dangling
)
commits=$(git -C "$mnt/extracted" rev-list --count HEAD)
# 3. SQLite: 20,000 rows in 20 transactions, then an integrity check.
sql="PRAGMA journal_mode=WAL; CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT);"
for b in $(seq 0 19); do
  sql+="BEGIN; WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 1000)
        INSERT INTO kv SELECT $b*1000 + x, hex(randomblob(32)) FROM c; COMMIT;"
done
sqlite3 "$mnt/demo.db" "$sql" >/dev/null
rows=$(sqlite3 "$mnt/demo.db" "SELECT count(*) FROM kv;")
integrity=$(sqlite3 "$mnt/demo.db" "PRAGMA integrity_check;")
# 4. Removal.
rm -rf "$mnt/include"
used_kib=$(du -sk "$mnt" | cut -f1)
t1=$(date +%s.%N)

echo "== unmount (fusermount3 -u)"
fusermount3 -u "$mnt"
if wait "$pid"; then status=0; else status=$?; fi
pid=
[ "$status" = 0 ] || die "ordo mount exited with $status"

echo "== ordo fsck -n"
set +e
"$ordo" fsck -n "$img"; ordo_fsck=$?
echo "== e2fsck -fn"
e2fsck -fn "$img"; e2fsck_rc=$?
set -e

echo
echo "demo summary (mode=$mode)"
printf '  %-34s %s\n' "files on ordo after the workload" "$files (in $dirs directories)"
printf '  %-34s %s\n' "git commits, git fsck" "$commits, clean"
printf '  %-34s %s\n' "SQLite rows, integrity_check" "$rows, $integrity"
printf '  %-34s %s KiB\n' "space used after rm -rf" "$used_kib"
printf '  %-34s %s s\n' "workload time" "$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")"
printf '  %-34s %s\n' "ordo fsck -n exit code" "$ordo_fsck"
printf '  %-34s %s\n' "e2fsck -fn exit code" "$e2fsck_rc"
"$ordo" info "$img" | grep -E "^(Filesystem state|Free blocks|Free inodes|Block count|Inode count):" | sed 's/^/  /'
[ "$ordo_fsck" = 0 ] && [ "$e2fsck_rc" = 0 ] || die "the image is not clean"
echo "demo: OK"
