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
#              worker), floor-all (the same with every worker reading
#              requests, `--readers all`), libfuse (scripts/floor/libfuse_floor.c, one thread),
#              libfuse-mt (its multi-threaded loop: cloned descriptors, at
#              most 2 threads), libfuse-uring (the same program on a newer
#              libfuse, over FUSE's io_uring transport; needs LIBFUSE_SRC),
#              floor-uring (`ordo fuse-floor --io-uring`), or an ordo
#              mount's options (`mode=async`, `mode=async,io_uring`)
#     default: 3 rounds of ext4 floor floor1 libfuse libfuse-mt mode=async,
#              and libfuse-uring after libfuse when LIBFUSE_SRC is set
#
# LIBFUSE_SRC: a libfuse source tree of 3.18 or later (Debian 12 ships
# 3.14, which has no io_uring transport), built here with meson and
# ninja, liburing and libnuma (scripts/deps.sh installs them).
#
# The load (scripts/floor/createload.c) creates FILES files (default
# 20,000) of 16 KiB: open O_CREAT|O_EXCL, one write, close. Prints files/s
# and the server's CPU per file (from /proc/PID/stat; and of it, the time
# in user space: the server's own code) of each run, and the whole
# machine's (from /proc/stat: the load, the server, and the kernel's
# threads that carry the writes to the device); then,
# per target, the median files/s, server CPU and machine CPU, and the
# medians of its ratio to the kernel's ext4 and to the floor of the same
# round (an ordo mount over the ring to floor-uring's, when that ran).
# Needs root (loop devices, mounts), gcc and libfuse3-dev (scripts/deps.sh
# installs them).
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
N=${FILES:-20000}
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

# Per round and target: files/s and the server's CPU per file. A round runs
# the targets in turn, starting one further along the list each round, so
# that none is always first or last while the host's load drifts; ratios
# are taken within a round (a target against the kernel or the floor of the
# same round) and their medians printed, which the drift between rounds
# moves less than the ratio of two medians.
declare -A rate cpus users machines
# Busy ticks of all CPUs so far (user, nice, system, irq, softirq; not
# the time the hypervisor gave to other guests).
machine_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat; }
# Ticks $1 of CPU (the server's, or the machine's) over the N files of a
# run, in µs per file.
per_file() { awk -v d="$1" -v hz="$HZ" -v n="$N" 'BEGIN { printf "%.0f", d * 1e6 / hz / n }'; }
one() {
    local r=$1 target=$2
    target_up "$target" || exit 1
    local pid=$SERVER_PID
    local t0 t1 u0 u1 m0 m1 cpu=- user=-
    m0=$(machine_ticks)
    t0=$(cpu_ticks "$pid")
    u0=$(user_ticks "$pid")
    rate[$r,$target]=$("$W/createload" "$W/m/c" "$N" "$THREADS")
    t1=$(cpu_ticks "$pid")
    u1=$(user_ticks "$pid")
    m1=$(machine_ticks)
    [ -z "$pid" ] || cpu=$(per_file $((t1 - t0)))
    [ -z "$pid" ] || user=$(per_file $((u1 - u0)))
    cpus[$r,$target]=$cpu
    users[$r,$target]=$user
    machines[$r,$target]=$(per_file $((m1 - m0)))
    printf '%-24s %8s files/s  server CPU %4s us/file (user %s)  machine %s\n' "$target" "${rate[$r,$target]}" "$cpu" "$user" "${machines[$r,$target]}"
    target_down
}

median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "-" }'
}

# The median over rounds of target $1's rate divided by target $2's.
median_ratio() {
    local r
    for r in $(seq 1 "$ROUNDS"); do
        awk -v a="${rate[$r,$1]}" -v b="${rate[$r,$2]}" 'BEGIN { if (b > 0) printf "%.3f\n", a / b }'
    done | median
}

n=${#TARGETS[@]}
has() {
    local t
    for t in "${TARGETS[@]}"; do [ "$t" != "$1" ] || return 0; done
    return 1
}
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r"
    for k in $(seq 0 $((n - 1))); do one "$r" "${TARGETS[$(((k + r - 1) % n))]}"; done
done
echo "medians over $ROUNDS rounds (ratios taken within each round)"
printf '%-24s %8s  %10s  %9s  %s\n' target files/s "x kernel" "x floor" "server CPU us/file (user)  machine CPU us/file"
for t in "${TARGETS[@]}"; do
    xk=-
    xf=-
    ! has ext4 || [ "$t" = ext4 ] || xk=$(median_ratio "$t" ext4)
    # A target over the ring against the ring's floor, when it ran.
    fl=floor
    case ",$t," in
    *,io_uring,*) ! has floor-uring || fl=floor-uring ;;
    esac
    ! has "$fl" || [ "$t" = "$fl" ] || xf=$(median_ratio "$t" "$fl")
    med=$(for r in $(seq 1 "$ROUNDS"); do echo "${rate[$r,$t]}"; done | median)
    cpu=$(for r in $(seq 1 "$ROUNDS"); do echo "${cpus[$r,$t]}"; done | awk '$1 != "-"' | median)
    user=$(for r in $(seq 1 "$ROUNDS"); do echo "${users[$r,$t]}"; done | awk '$1 != "-"' | median)
    mach=$(for r in $(seq 1 "$ROUNDS"); do echo "${machines[$r,$t]}"; done | median)
    printf '%-24s %8s  %10s  %9s  %s (%s)  %s\n' "$t" "$med" "$xk" "$xf" "$cpu" "$user" "$mach"
done
echo "reproduce with: ${FILES:+FILES=$FILES }${LIBFUSE_SRC:+LIBFUSE_SRC=$LIBFUSE_SRC }scripts/floor_compare.sh $ROUNDS $THREADS ${TARGETS[*]}"
