#!/usr/bin/env bash
# How long each FUSE request of a create + write + close takes, from the
# kernel's sending it to the server's answer ending it, per operation, on
# the FUSE floor and on ordo: which requests ordo's gap to its floor is in.
#
#   scripts/request_times.sh [FILES] [THREADS] [TARGET...]
#     default: 10000 files, 1 thread, targets floor mode=async mode=journal
#     TARGET:  floor (`ordo fuse-floor`, ordo's worker count), floor1, or an
#              ordo mount's options (scripts/targets.sh)
#
# The load (scripts/floor/createload.c) creates FILES files of 4 KiB (open
# O_CREAT|O_EXCL, one write, close) from THREADS threads. The kernel's
# tracepoints `fuse:fuse_request_send` and `fuse:fuse_request_end`, recorded
# with `perf` over the load, pair each request's send with its end; the time
# between is the request's round trip as the kernel sees it: the queue, the
# server's wake-up and read, its work, and its reply. Printed per target
# and operation: requests per file, mean and median µs, and the mean's
# ratio to the floor's for the same operation; then each target's sum of
# the means weighted by requests per file (a RELEASE is sent in the
# background, so the sum is not the wall time of a file).
#
# Needs root (loop devices, mounts, tracepoints), gcc, perf and python3
# (scripts/deps.sh installs them). DESIGN.md ("The FUSE path") has a run.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-10000}
THREADS=${2:-1}
shift 2 || shift $# || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(floor mode=async mode=journal)
for tool in perf gcc python3; do
    command -v "$tool" >/dev/null || {
        echo "request_times.sh: $tool is missing (scripts/deps.sh installs it)" >&2
        exit 2
    }
done
for t in "${TARGETS[@]}"; do
    case $t in
    ext4 | libfuse* | *io_uring*)
        # The kernel's ext4 sends no FUSE requests; libfuse's floors and the
        # ring are not what this compares.
        echo "request_times.sh: $t is not a /dev/fuse server of ordo's this script can time" >&2
        exit 2
        ;;
    esac
done
# shellcheck source=scripts/targets.sh
. scripts/targets.sh
targets_setup request-times
gcc -O2 -pthread -o "$W/createload" scripts/floor/createload.c

# The tracepoints of the load on target $1, as `perf script` prints them.
trace() {
    target_up "$1"
    [ -n "$SERVER_PID" ] || { echo "request_times.sh: no server for $1" >&2; exit 1; }
    perf record -q -a -e fuse:fuse_request_send -e fuse:fuse_request_end \
        -o "$W/perf.data" -- "$W/createload" "$W/m/c" "$FILES" "$THREADS" 4096 >/dev/null
    target_down
    perf script -i "$W/perf.data" >"$W/trace.$2" 2>/dev/null
}

i=0
for t in "${TARGETS[@]}"; do
    trace "$t" "$i"
    i=$((i + 1))
done

python3 - "$FILES" "$W" "${TARGETS[@]}" <<'EOF'
import re, statistics, sys
files, w, targets = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
line_re = re.compile(
    r"\s(\d+\.\d+):\s+fuse:fuse_request_(send|end): connection (\d+) req (\d+)"
    r"(?: opcode \d+ \((FUSE_\w+)\))?")
times = {}
for k, t in enumerate(targets):
    sent, per_op = {}, {}
    for line in open(f"{w}/trace.{k}", errors="replace"):
        m = line_re.search(line)
        if not m:
            continue
        at, kind, key = float(m.group(1)), m.group(2), (m.group(3), m.group(4))
        if kind == "send":
            sent[key] = (at, m.group(5))
        elif key in sent:
            start, op = sent.pop(key)
            per_op.setdefault(op[5:], []).append((at - start) * 1e6)
    times[t] = per_op
floor = times.get("floor", {})
print(f"{'target':20s} {'request':10s} {'per file':>9s} {'mean us':>8s} {'p50 us':>7s} {'x floor':>8s}")
for t in targets:
    total = 0.0
    for op, v in sorted(times[t].items(), key=lambda kv: -len(kv[1])):
        per_file = len(v) / files
        if per_file < 0.01:
            continue
        mean = statistics.fmean(v)
        total += per_file * mean
        ratio = "-"
        if t != "floor" and floor.get(op):
            ratio = f"{mean / statistics.fmean(floor[op]):.2f}x"
        print(f"{t:20s} {op:10s} {per_file:9.2f} {mean:8.1f} {statistics.median(v):7.1f} {ratio:>8s}")
    print(f"{t:20s} {'per file':10s} {'':9s} {total:8.1f}")
EOF
echo "reproduce with: scripts/request_times.sh $FILES $THREADS ${TARGETS[*]}"
