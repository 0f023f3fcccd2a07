#!/usr/bin/env bash
# ordo through FUSE against the kernel's ext4 on the same loop device, one
# run each: create 10,000 empty files, write and read 1 GiB sequentially,
# stat 10,000 files, rm -rf the tree, and the rate of create + write 4 KiB
# + fsync + close. Prints seconds (or ops/s) and ordo / kernel ratios.
#
# Usage: scripts/bench-vs-kernel.sh [MODE...]    (ordo modes; default: async sync)
# Needs root, /dev/fuse and loop devices. Set TARGET_DIR if cargo's target
# directory is not ./target.
set -euo pipefail
cd "$(dirname "$0")/.."
modes=("$@")
[ "${#modes[@]}" -gt 0 ] || modes=(async sync)
[ "$(id -u)" = 0 ] || { echo "bench: must run as root" >&2; exit 1; }

cargo build --release -q -p ordo -p ordo-fuse --example fsync_rate
target=${TARGET_DIR:-${CARGO_TARGET_DIR:-target}}
ordo=$target/release/ordo
fsync_rate=$target/release/examples/fsync_rate

work=$(mktemp -d /var/tmp/ordo-bench.XXXXXX)
img=$work/disk.img
truncate -s 4G "$img"
loop=$(losetup -f --show "$img")
mnt=$work/mnt
mkdir "$mnt"
pid=
cleanup() {
  if [ -n "$pid" ]; then fusermount3 -u -z "$mnt" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  umount "$mnt" 2>/dev/null || true
  losetup -d "$loop" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
elapsed() { awk "BEGIN { printf \"%.3f\", $2 - $1 }"; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# Run the workload on whatever is mounted at $mnt; prints
# "create write read stat rm fsync_ops_per_s".
workload() {
  local t0 t1 create write read stat rm rate
  mkdir "$mnt/tree"
  t0=$(now); (cd "$mnt/tree" && for i in $(seq 1 10000); do : > "f$i"; done); sync -f "$mnt"; t1=$(now)
  create=$(elapsed "$t0" "$t1")
  t0=$(now); dd if=/dev/zero of="$mnt/big" bs=1M count=1024 conv=fsync status=none; t1=$(now)
  write=$(elapsed "$t0" "$t1")
  drop_caches
  t0=$(now); dd if="$mnt/big" of=/dev/null bs=1M status=none; t1=$(now)
  read=$(elapsed "$t0" "$t1")
  drop_caches
  t0=$(now); find "$mnt/tree" -type f -printf '%s\n' > /dev/null; t1=$(now)
  stat=$(elapsed "$t0" "$t1")
  t0=$(now); rm -rf "$mnt/tree" "$mnt/big"; sync -f "$mnt"; t1=$(now)
  rm=$(elapsed "$t0" "$t1")
  rate=$("$fsync_rate" "$mnt/fsync" 2000)
  echo "$create $write $read $stat $rm $rate"
}

echo "kernel ext4 (mkfs.ext4 defaults, data=ordered) on $loop ..." >&2
mkfs.ext4 -q -F "$loop"
mount "$loop" "$mnt"
kernel=$(workload)
umount "$mnt"

declare -A result
for mode in "${modes[@]}"; do
  echo "ordo mode=$mode on $loop ..." >&2
  "$ordo" mkfs "$loop" > /dev/null
  "$ordo" mount -f "$loop" "$mnt" -o "mode=$mode" 2> "$work/mount.log" &
  pid=$!
  for _ in $(seq 1 200); do grep -q " $mnt " /proc/mounts && break; sleep 0.05; done
  result[$mode]=$(workload)
  fusermount3 -u "$mnt"
  wait "$pid"
  pid=
done

names=("create 10,000 files (s)" "write 1 GiB + fsync (s)" "read 1 GiB, cold (s)" "stat 10,000 files, cold (s)" "rm -rf the tree (s)" "create+4 KiB+fsync+close (ops/s)")
read -r -a k <<< "$kernel"
printf '%-36s %12s' "" "kernel ext4"
for mode in "${modes[@]}"; do printf ' %12s %8s' "ordo $mode" "ratio"; done
echo
for i in "${!names[@]}"; do
  printf '%-36s %12s' "${names[$i]}" "${k[$i]}"
  for mode in "${modes[@]}"; do
    read -r -a o <<< "${result[$mode]}"
    printf ' %12s %8s' "${o[$i]}" "$(awk "BEGIN { printf \"%.2f\", ${o[$i]} / ${k[$i]} }")"
  done
  echo
done
echo "(ratio = ordo / kernel: above 1 is slower for times, faster for ops/s)"
