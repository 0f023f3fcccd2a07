#!/usr/bin/env bash
# Run ordo's whole test suite: formatting, clippy, and every test of every
# crate, including the ones that mount ordo through FUSE and the kernel's
# ext4 on loop devices.
#
# Installs the Debian packages the tests drive when their commands are
# missing (fuse3, e2fsprogs, sqlite3, git, ...), then refuses loudly when
# the machine cannot mount: the mount tests must never pass by being
# skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "scripts/test.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (the tests mount FUSE and loop file systems)"

# command -> Debian package providing it
declare -A provider=(
  [fusermount3]=fuse3
  [mkfs.ext4]=e2fsprogs
  [e2fsck]=e2fsprogs
  [dumpe2fs]=e2fsprogs
  [sqlite3]=sqlite3
  [git]=git
  [losetup]=mount
  [mount]=mount
  [tar]=tar
  [diff]=diffutils
  [find]=findutils
  [cc]=gcc
)
missing=()
for cmd in "${!provider[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${provider[$cmd]}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  echo "scripts/test.sh: installing $pkgs"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi
for cmd in "${!provider[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd is still missing after installing ${provider[$cmd]}"
done

# The devices the mount tests need.
[ -c /dev/fuse ] || modprobe fuse 2>/dev/null || true
[ -c /dev/fuse ] || die "/dev/fuse is missing: this machine cannot run FUSE mounts"
[ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
[ -e /dev/loop-control ] || die "/dev/loop-control is missing: this machine has no loop devices"
loopdev=$(losetup -f 2>/dev/null) || die "no free loop device (losetup -f failed)"
echo "scripts/test.sh: /dev/fuse and loop devices present (next free: $loopdev)"

command -v cargo >/dev/null || die "cargo is missing: install the Rust toolchain"
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt clippy || true

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
echo "scripts/test.sh: all tests passed"
