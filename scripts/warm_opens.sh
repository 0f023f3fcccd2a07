#!/usr/bin/env bash
# Re-reading cached small files, one process: open, read 8 KiB, close,
# 5,000 files, after an untimed pass that caches them. Each target in
# turn, in one run, so the rows compare:
#
#   scripts/warm_opens.sh [ROUNDS] [TARGET...]
#     TARGET: ext4 (the kernel's, on a loop device), floor (`ordo
#     fuse-floor`), or an ordo mount's options (`mode=journal`,
#     `mode=journal,open_requests=off`, ...)
#     default: 3 rounds of ext4 floor mode=journal mode=journal,open_requests=off
#
# Prints, per target and round, files/s, the server's CPU per file (the
# mount's or the floor's, from /proc/PID/stat) and, when perf is installed,
# the FUSE requests the measured pass sent (`fuse:fuse_request_send`).
# Needs root (loop devices, mounts). DESIGN.md ("The FUSE path") has a run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(ext4 floor mode=journal mode=journal,open_requests=off)
N=5000
# shellcheck source=scripts/targets.sh
. scripts/targets.sh
targets_setup warm

one() {
    local target=$1
    target_up "$target"
    local pid=$SERVER_PID
    python3 - "$W/m/c" "$N" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
b = b"x" * 8192
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, b)
    os.close(fd)
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_RDONLY)
    os.read(fd, 8192)
    os.close(fd)
EOF
    local measure=(python3 -c "
import os, sys, time
d, n = '$W/m/c', $N
t = time.time()
for i in range(n):
    fd = os.open(f'{d}/f{i}', os.O_RDONLY); os.read(fd, 8192); os.close(fd)
print(f'{n / (time.time() - t):.0f}')
")
    local t0 rate t1 reqs=-
    t0=$(cpu_ticks "$pid")
    if command -v perf >/dev/null; then
        rate=$(perf record -q -e fuse:fuse_request_send -a -o "$W/perf.data" -- "${measure[@]}" 2>/dev/null)
        reqs=$(perf script -i "$W/perf.data" 2>/dev/null | { grep -o 'FUSE_[A-Z_]*' || true; } |
            sort | uniq -c | awk -v n=$N '{printf "%s %.2f  ", $2, $1 / n}')
        [ -n "$reqs" ] || reqs="none"
    else
        rate=$("${measure[@]}")
    fi
    t1=$(cpu_ticks "$pid")
    local cpu=-
    [ -z "$pid" ] || cpu=$(awk -v d=$((t1 - t0)) -v hz="$HZ" -v n=$N 'BEGIN { printf "%.0f", d * 1e6 / hz / n }')
    printf '%-40s %9s files/s  server CPU %4s us/file  requests/file: %s\n' "$target" "$rate" "$cpu" "$reqs"
    target_down
}

for r in $(seq 1 "$ROUNDS"); do
    echo "round $r"
    for t in "${TARGETS[@]}"; do one "$t"; done
done
echo "reproduce with: scripts/warm_opens.sh $ROUNDS ${TARGETS[*]}"
