#!/usr/bin/env bash
# Peak memory of an ordo mount while it creates N files (100 directories)
# and, after a remount, while `find` walks them all: what the mount's
# memory bound (`cache=`, and the directory indexes' bound derived from
# it) holds. Prints VmHWM (peak resident set) of the mount process.
#
#   scripts/memwalk.sh                      # N=300000 MODE=journal CACHE=32M
#   N=1000000 MODE=async CACHE=64M scripts/memwalk.sh
#   OPTS=open_requests=off scripts/memwalk.sh     # more -o options
#
# Needs root (loop device, mount).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-300000}
MODE=${MODE:-journal}
CACHE=${CACHE:-32M}
cargo build --release -q -p ordo
B=$PWD/target/release/ordo
W=$(mktemp -d /var/tmp/ordo-memwalk.XXXXXX)
mkdir -p "$W/m"
# One inode per 16 KiB: 8 GiB holds 524,288 files; more files, a larger image.
SIZE=$(((N / 500000 + 1) * 8))G
truncate -s "$SIZE" "$W/img"
L=$(losetup -f --show "$W/img")
cleanup() {
    umount "$W/m" 2>/dev/null || true
    sleep 1
    losetup -d "$L" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
"$B" mkfs "$L" >/dev/null
mnt() {
    "$B" mount "$L" "$W/m" -o "mode=$MODE,cache=$CACHE${OPTS:+,$OPTS}" >/dev/null 2>&1
    pgrep -f "ordo mount $L" | tail -1
}
P=$(mnt)
python3 - "$W/m" "$N" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per = n // 100
for d in range(100):
    p = f"{root}/d{d}"
    os.mkdir(p)
    for f in range(per):
        os.close(os.open(f"{p}/file-with-a-longer-name-{f:07d}", os.O_CREAT | os.O_WRONLY, 0o644))
PY
echo "memwalk: mode=$MODE cache=$CACHE${OPTS:+ $OPTS}, $N files: create: $(awk '/VmHWM/ {print $2, $3}' /proc/"$P"/status) peak"
umount "$W/m"
sleep 1
P=$(mnt)
found=$(find "$W/m" -type f | wc -l)
echo "memwalk: walk of $found files after a remount: $(awk '/VmHWM/ {print $2, $3}' /proc/"$P"/status) peak"
