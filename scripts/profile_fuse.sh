#!/usr/bin/env bash
# Profiles an ordo FUSE mount (mode=async) while it serves two request
# mixes, and draws each as a flame graph:
#   create: create + write 4 KiB + close of 20,000 files (LOOKUP, CREATE,
#           WRITE, RELEASE per file);
#   stat:   stat of 10,000 files three times with attr_timeout=0, so every
#           stat reaches ordo (LOOKUP, GETATTR).
#
#   scripts/profile_fuse.sh [OUTDIR]        (default docs/profile)
#
# Needs root (loop device, mount), perf (Debian: linux-perf) and inferno
# (`cargo install inferno`: inferno-collapse-perf, inferno-flamegraph).
# The release binary has no frame pointers, so stacks are taken with DWARF.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/profile}
for tool in perf inferno-collapse-perf inferno-flamegraph; do
    command -v "$tool" >/dev/null || {
        echo "profile_fuse.sh: $tool is missing (perf: apt-get install linux-perf; inferno: cargo install inferno)" >&2
        exit 2
    }
done
cargo build --release -q -p ordo
B=$PWD/target/release/ordo
W=$(mktemp -d /var/tmp/ordo-profile.XXXXXX)
mkdir -p "$OUT" "$W/m"
truncate -s 2G "$W/img"
L=$(losetup -f --show "$W/img")
cleanup() {
    umount "$W/m" 2>/dev/null || true
    sleep 1
    losetup -d "$L" 2>/dev/null || true
    rm -rf "$W"
}
trap cleanup EXIT
"$B" mkfs "$L" >/dev/null
"$B" mount "$L" "$W/m" -o mode=async,attr_timeout=0 >/dev/null 2>&1
P=$(pgrep -f "ordo mount $L" | tail -1)
record() {
    perf record -q -F 999 --call-graph dwarf,16384 -p "$P" -o "$W/$1.data" -- python3 -c "$2"
    perf script -i "$W/$1.data" 2>/dev/null | inferno-collapse-perf >"$W/$1.folded"
    inferno-flamegraph --title "ordo mount (mode=async) serving: $3" --width 1400 --minwidth 2 \
        <"$W/$1.folded" >"$OUT/fuse-$1.svg"
    echo "profile_fuse.sh: wrote $OUT/fuse-$1.svg" >&2
}
record create "
import os
d='$W/m/c'; os.mkdir(d)
for i in range(20000):
    fd = os.open(f'{d}/f{i}', os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, b'x' * 4096)
    os.close(fd)
" "create + write 4 KiB + close, 20,000 files"
record stat "
import os
for r in range(3):
    for i in range(10000):
        os.stat(f'$W/m/c/f{i}')
" "stat of 10,000 files, attr_timeout=0"
