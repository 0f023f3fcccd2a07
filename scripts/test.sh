#!/usr/bin/env bash
# Run ordo's whole test suite: formatting, clippy, and every test of every
# crate, including the ones that mount ordo through FUSE and the kernel's
# ext4 on loop devices.
#
# Installs every program the tests, benchmarks and demo drive
# (scripts/deps.sh: fuse3, e2fsprogs, sqlite3, git, postmark, fsmark, fio,
# dbench, ...) before cargo runs, then refuses loudly when the machine
# cannot mount: the mount tests must never pass by being skipped.
#
# With CI=true (or ORDO_TEST_FIRST_USE=1) it also proves that `ordo bench`'s
# install-on-first-use fallback cannot race: it removes postmark and fsmark,
# runs the benchmark smoke test (several workloads at once, each needing one
# of them), and checks they are back.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "scripts/test.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (the tests mount FUSE and loop file systems)"

# Every program any test, benchmark or the demo drives, installed up front
# (one list, scripts/deps.sh), before cargo runs anything.
bash scripts/deps.sh

# The devices the mount tests need.
[ -c /dev/fuse ] || modprobe fuse 2>/dev/null || true
[ -c /dev/fuse ] || die "/dev/fuse is missing: this machine cannot run FUSE mounts"
[ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
[ -e /dev/loop-control ] || die "/dev/loop-control is missing: this machine has no loop devices"
loopdev=$(losetup -f 2>/dev/null) || die "no free loop device (losetup -f failed)"
echo "scripts/test.sh: /dev/fuse and loop devices present (next free: $loopdev)"

command -v cargo >/dev/null || die "cargo is missing: install the Rust toolchain"
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt clippy || true

# The tests' images, mount points and crash states go in a directory of
# their own on tmpfs when /dev/shm has room (TMPDIR set by the caller wins):
# the suite flushes its image files thousands of times, which a disk makes
# a sixth slower and nothing more (durability is the recording device's,
# not the host's). Removed at the end, without crossing into a mount left
# behind.
if [ -z "${TMPDIR:-}" ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] \
   && [ "$(df -k --output=avail /dev/shm | tail -1)" -ge $((8 * 1024 * 1024)) ]; then
  TMPDIR=$(mktemp -d /dev/shm/ordo-test.XXXXXX)
  # As /tmp: the tests that run as another user walk through it.
  chmod 1777 "$TMPDIR"
  export TMPDIR
  trap 'rm -rf --one-file-system "$TMPDIR"' EXIT
  echo "scripts/test.sh: temporary files in $TMPDIR (tmpfs)"
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
# The tests the full run leaves out because they just passed on this build.
skip=()
if [ "${CI:-}" = true ] || [ "${ORDO_TEST_FIRST_USE:-}" = 1 ]; then
  echo "== ordo bench installs on first use, without racing (postmark, fsmark removed)"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 remove -y -qq postmark fsmark >/dev/null
  ! command -v postmark >/dev/null || die "postmark still installed after apt-get remove"
  # The smoke test drives the ordo binary (ordo:MODE targets mount it).
  cargo build -p ordo
  # Built as the whole workspace builds it, so that the run below can
  # leave out the very binary that passed here.
  cargo test --workspace --test smoke
  bash scripts/deps.sh --check || die "the smoke test did not reinstall what it removed"
  while IFS= read -r t; do
    skip+=(--skip "$t")
  done < <(cargo test -q --workspace --test smoke -- --list --format terse 2>/dev/null | sed -n 's/: test$//p')
  [ "${#skip[@]}" -gt 0 ] || die "cannot list the smoke test's cases"
fi
echo "== cargo test"
# --exact: a skipped name is that test alone (each smoke name is unique).
cargo test --workspace -- --exact "${skip[@]}"
echo "scripts/test.sh: all tests passed"
