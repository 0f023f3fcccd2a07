#!/usr/bin/env bash
# Creating files on the kernel's ext4, on two FUSE floors (servers that
# answer and store nothing) and on ordo, each in turn, in one run: is the
# FUSE floor `ordo bench` measures against (`ordo fuse-floor`, on fuser)
# the transport's cost, or fuser's?
#
#   scripts/floor_compare.sh [ROUNDS] [THREADS] [TARGET...]
#     THREADS: threads of the creating program (default 16, as the
#              createfiles benchmark)
#     TARGET:  ext4 (the kernel's, on a loop device), floor (`ordo
#              fuse-floor`, ordo's worker count), floor1 (the same with one
#              worker), libfuse (scripts/floor/libfuse_floor.c, one thread),
#              libfuse-mt (its multi-threaded loop: cloned descriptors, at
#              most 2 threads), libfuse-uring (the same program on a newer
#              libfuse, over FUSE's io_uring transport; needs LIBFUSE_SRC),
#              or an ordo mount's options (`mode=async`)
#     default: 3 rounds of ext4 floor floor1 libfuse libfuse-mt mode=async,
#              and libfuse-uring after libfuse when LIBFUSE_SRC is set
#
# LIBFUSE_SRC: a libfuse source tree of 3.18 or later (Debian 12 ships
# 3.14, which has no io_uring transport), built here with meson and
# ninja, liburing and libnuma (scripts/deps.sh installs them).
#
# The load (scripts/floor/createload.c) creates 20,000 files of 16 KiB:
# open O_CREAT|O_EXCL, one write, close. Prints files/s, the ratio to the
# kernel's ext4 of the same round, and the server's CPU per file (from
# /proc/PID/stat); then each target's median. Needs root (loop devices,
# mounts), gcc and libfuse3-dev (scripts/deps.sh installs them).
# DESIGN.md ("The FUSE path") has a run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
THREADS=${2:-16}
shift 2 || shift $# || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    TARGETS=(ext4 floor floor1 libfuse)
    [ -z "${LIBFUSE_SRC:-}" ] || TARGETS+=(libfuse-uring)
    TARGETS+=(libfuse-mt mode=async)
fi
N=20000
# shellcheck source=scripts/targets.sh
. scripts/targets.sh
targets_setup floors
LIBFUSE_FLOOR=$W/libfuse_floor
# shellcheck disable=SC2046
gcc -O2 -o "$LIBFUSE_FLOOR" scripts/floor/libfuse_floor.c $(pkg-config --cflags --libs fuse3)
gcc -O2 -pthread -o "$W/createload" scripts/floor/createload.c
LIBFUSE_URING_FLOOR=$W/libfuse_uring_floor
if [ -n "${LIBFUSE_SRC:-}" ]; then
    meson setup "$W/libfuse-build" "$LIBFUSE_SRC" -Dexamples=false -Dutils=false -Dtests=false \
        -Ddefault_library=static -Denable-io-uring=true >"$W/meson.log" 2>&1 ||
        { cat "$W/meson.log" >&2; exit 1; }
    grep -q "io_uring support *: True" "$W/meson.log" ||
        { echo "floor_compare.sh: $LIBFUSE_SRC builds without io_uring" >&2; exit 1; }
    ninja -C "$W/libfuse-build" >/dev/null
    gcc -O2 -DFUSE_USE_VERSION=312 -o "$LIBFUSE_URING_FLOOR" scripts/floor/libfuse_floor.c \
        -I"$LIBFUSE_SRC/include" -I"$W/libfuse-build" "$W/libfuse-build/lib/libfuse3.a" \
        -luring -lnuma -lpthread -ldl
fi

declare -A rates
kernel=
one() {
    local target=$1
    target_up "$target" || exit 1
    local pid=$SERVER_PID
    local t0 t1 rate cpu=- ratio=-
    t0=$(cpu_ticks "$pid")
    rate=$("$W/createload" "$W/m/c" "$N" "$THREADS")
    t1=$(cpu_ticks "$pid")
    [ -z "$pid" ] || cpu=$(awk -v d=$((t1 - t0)) -v hz="$HZ" -v n=$N 'BEGIN { printf "%.0f", d * 1e6 / hz / n }')
    [ "$target" != ext4 ] || kernel=$rate
    [ -z "$kernel" ] || ratio=$(awk -v r="$rate" -v k="$kernel" 'BEGIN { printf "%.2fx", r / k }')
    rates[$target]="${rates[$target]:-} $rate"
    printf '%-24s %8s files/s  %6s the kernel'"'"'s  server CPU %4s us/file\n' "$target" "$rate" "$ratio" "$cpu"
    target_down
}

for r in $(seq 1 "$ROUNDS"); do
    echo "round $r"
    kernel=
    for t in "${TARGETS[@]}"; do one "$t"; done
done
echo "medians"
for t in "${TARGETS[@]}"; do
    # shellcheck disable=SC2086
    printf '%-24s %8s files/s\n' "$t" "$(printf '%s\n' ${rates[$t]} | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')"
done
echo "reproduce with: ${LIBFUSE_SRC:+LIBFUSE_SRC=$LIBFUSE_SRC }scripts/floor_compare.sh $ROUNDS $THREADS ${TARGETS[*]}"
