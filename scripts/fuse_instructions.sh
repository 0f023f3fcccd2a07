#!/usr/bin/env bash
# What a FUSE server spends of its own per created file, counted rather
# than timed: each server runs under cachegrind while
# scripts/floor/createload.c creates FILES files of 16 KiB (open
# O_CREAT|O_EXCL, one write, close) from THREADS threads into one
# directory, and again with no files; the difference over FILES is the
# user-space instructions per file (the kernel's side of FUSE is not
# counted). A count does not move with the machine's load, so it shows a
# change to ordo's request path that the timed benchmarks cannot resolve.
#
#   scripts/fuse_instructions.sh [FILES] [THREADS] [TARGET...]
#     default: 5000 files, 4 threads, targets floor mode=async mode=journal
#     BYTES:   each file's size (environment; default 16384)
#     PROFILE_DIR: (environment) count under callgrind instead and keep
#              each server's profile there as TARGET.FILES (read it with
#              `callgrind_annotate --inclusive=yes`; the difference
#              between the two runs of a target is its cost of FILES files)
#     TARGET:  floor, floor1 (`ordo fuse-floor`, ordo's worker count or
#              one worker), or an ordo mount's options (`mode=softdep`)
#
# Needs root (loop devices, mounts), gcc and valgrind (scripts/deps.sh
# installs them). DESIGN.md ("The core, inside") has a run.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-5000}
THREADS=${2:-4}
BYTES=${BYTES:-16384}
shift 2 || shift $# || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(floor mode=async mode=journal)
for tool in valgrind gcc; do
    command -v "$tool" >/dev/null || {
        echo "fuse_instructions.sh: $tool is missing (scripts/deps.sh installs it)" >&2
        exit 2
    }
done
for t in "${TARGETS[@]}"; do
    case $t in
    ext4 | libfuse*)
        echo "fuse_instructions.sh: $t is not a server this script can count" >&2
        exit 2
        ;;
    esac
done
# shellcheck source=scripts/targets.sh
. scripts/targets.sh
targets_setup instructions
[ -z "${PROFILE_DIR:-}" ] || mkdir -p "$PROFILE_DIR"
gcc -O2 -pthread -o "$W/createload" scripts/floor/createload.c

# Instructions the server of target $1 runs from its start to its exit,
# with $2 files created while it serves.
count() {
    local out="$W/cg.$2"
    rm -f "$out".*
    if [ -n "${PROFILE_DIR:-}" ]; then
        SERVER_WRAP=(valgrind --tool=callgrind "--callgrind-out-file=$out.%p")
    else
        SERVER_WRAP=(valgrind --tool=cachegrind --cache-sim=no "--cachegrind-out-file=$out.%p")
    fi
    target_up "$1"
    local pid=$SERVER_PID
    [ -n "$pid" ] || { echo "fuse_instructions.sh: no server for $1" >&2; exit 1; }
    [ "$2" -eq 0 ] || "$W/createload" "$W/m/c" "$2" "$THREADS" "$BYTES" >/dev/null
    target_down
    local i
    for i in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -s "$out.$pid" ] || { echo "fuse_instructions.sh: $1 left no count ($out.$pid)" >&2; exit 1; }
    if [ -n "${PROFILE_DIR:-}" ]; then
        cp "$out.$pid" "$PROFILE_DIR/$(echo "$1" | tr '=,/' '___').$2"
    fi
    # cachegrind's total is its `summary:` line, callgrind's `totals:`.
    awk '/^(summary|totals):/ { print $2; exit }' "$out.$pid"
}

floor=
printf '%-20s %14s %14s %12s %10s\n' target "with $FILES" "with none" "per file" "x floor"
for t in "${TARGETS[@]}"; do
    full=$(count "$t" "$FILES")
    none=$(count "$t" 0)
    per=$(( (full - none) / FILES ))
    [ "$t" != floor ] || floor=$per
    ratio=-
    [ -z "$floor" ] || ratio=$(awk -v p="$per" -v f="$floor" 'BEGIN { printf "%.1fx", p / f }')
    printf '%-20s %14s %14s %12s %10s\n' "$t" "$full" "$none" "$per" "$ratio"
done
echo "reproduce with: BYTES=$BYTES scripts/fuse_instructions.sh $FILES $THREADS ${TARGETS[*]}"
