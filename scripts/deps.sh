#!/usr/bin/env bash
# Every external program ordo's tests, demo and benchmarks drive, and the
# Debian package that provides it: the one list. scripts/test.sh and
# scripts/demo.sh run this before anything else, so no test or benchmark
# ever installs a package while another one runs (two apt-get processes
# racing for the dpkg lock is how a fresh machine used to fail).
#
# Usage: scripts/deps.sh            install what is missing (as root)
#        scripts/deps.sh --check    only report what is missing (exit 1 if any)
#        scripts/deps.sh --list     print "command package" lines
#
# `ordo bench` keeps a fallback (`ensure_program` in
# crates/ordo-bench/src/sys.rs) for interactive use on a machine where this
# script never ran; it waits for the dpkg lock and is serialised within the
# process, but tests never rely on it.
set -euo pipefail

# command -> Debian package providing it. Keep in step with the programs
# the code calls (grep for Command::new and ensure_program).
declare -A provider=(
  # mounting ordo and the kernel's ext4
  [fusermount3]=fuse3
  [losetup]=mount
  [mount]=mount
  [umount]=mount
  # the judges nobody here wrote
  [mkfs.ext4]=e2fsprogs
  [e2fsck]=e2fsprogs
  [dumpe2fs]=e2fsprogs
  [debugfs]=e2fsprogs
  # real programs the tests, the demo and the benchmarks run on a mount
  [sqlite3]=sqlite3
  [git]=git
  [tar]=tar
  [diff]=diffutils
  [find]=findutils
  [cc]=gcc
  [pkg-config]=pkg-config
  # building a newer libfuse for scripts/floor_compare.sh (LIBFUSE_SRC)
  [meson]=meson
  [ninja]=ninja-build
  # counting a FUSE server's instructions (scripts/fuse_instructions.sh)
  [valgrind]=valgrind
  # timing each FUSE request from the kernel's tracepoints
  # (scripts/request_times.sh)
  [perf]=linux-perf
  [mountpoint]=util-linux
  [python3]=python3
  [dd]=coreutils
  [truncate]=coreutils
  [mkfifo]=coreutils
  [mknod]=coreutils
  # extended attributes and POSIX ACLs (the differential test)
  [setfattr]=attr
  [getfattr]=attr
  [setfacl]=acl
  [getfacl]=acl
  # benchmark workloads (ordo bench postmark / fsmark / fio / dbench)
  [postmark]=postmark
  [fs_mark]=fsmark
  [fio]=fio
  [dbench]=dbench
)

# Python modules the application crash checker imports (run by the
# Debian interpreter, /usr/bin/python3) -> Debian package.
declare -A py_provider=(
  [plyvel]=python3-plyvel
)

# C headers the scripts compile against -> Debian package: libfuse's for
# scripts/floor/libfuse_floor.c (scripts/floor_compare.sh, tests/scripts.rs);
# liburing's and libnuma's for a newer libfuse that floor_compare.sh builds
# from LIBFUSE_SRC.
declare -A header_provider=(
  [fuse3/fuse_lowlevel.h]=libfuse3-dev
  [liburing.h]=liburing-dev
  [numa.h]=libnuma-dev
)

mode=install
case "${1:-}" in
  --check) mode=check ;;
  --list)
    { for cmd in "${!provider[@]}"; do echo "$cmd ${provider[$cmd]}"; done
      for mod in "${!py_provider[@]}"; do echo "python3:$mod ${py_provider[$mod]}"; done
      for h in "${!header_provider[@]}"; do echo "header:$h ${header_provider[$h]}"; done; } | LC_ALL=C sort
    exit 0
    ;;
  "") ;;
  *) echo "usage: scripts/deps.sh [--check|--list]" >&2; exit 2 ;;
esac

missing_pkgs() {
  local cmd mod
  {
    for cmd in "${!provider[@]}"; do
      command -v "$cmd" >/dev/null 2>&1 || echo "${provider[$cmd]}"
    done
    for mod in "${!py_provider[@]}"; do
      /usr/bin/python3 -c "import $mod" >/dev/null 2>&1 || echo "${py_provider[$mod]}"
    done
    for h in "${!header_provider[@]}"; do
      [ -e "/usr/include/$h" ] || echo "${header_provider[$h]}"
    done
  } | LC_ALL=C sort -u
}

pkgs=$(missing_pkgs | tr '\n' ' ')
if [ -z "${pkgs// /}" ]; then
  echo "scripts/deps.sh: every program ordo drives is installed"
  exit 0
fi
if [ "$mode" = check ]; then
  echo "scripts/deps.sh: missing packages: $pkgs" >&2
  exit 1
fi
[ "$(id -u)" = 0 ] || { echo "scripts/deps.sh: missing $pkgs; run as root to install them" >&2; exit 1; }

echo "scripts/deps.sh: installing $pkgs"
export DEBIAN_FRONTEND=noninteractive
# Wait for the dpkg lock rather than fail if something else holds it.
apt_opts=(-o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends)
apt-get -o DPkg::Lock::Timeout=600 update -qq
# shellcheck disable=SC2086
apt-get install "${apt_opts[@]}" $pkgs >/dev/null

still=$(missing_pkgs | tr '\n' ' ')
if [ -n "${still// /}" ]; then
  for cmd in "${!provider[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || echo "scripts/deps.sh: $cmd is still missing after installing ${provider[$cmd]}" >&2
  done
  for mod in "${!py_provider[@]}"; do
    /usr/bin/python3 -c "import $mod" >/dev/null 2>&1 || echo "scripts/deps.sh: python3 module $mod is still missing after installing ${py_provider[$mod]}" >&2
  done
  for h in "${!header_provider[@]}"; do
    [ -e "/usr/include/$h" ] || echo "scripts/deps.sh: /usr/include/$h is still missing after installing ${header_provider[$h]}" >&2
  done
  exit 1
fi
echo "scripts/deps.sh: installed"
