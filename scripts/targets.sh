# Sourced, not run: mounting the targets the comparison scripts
# (warm_opens.sh, floor_compare.sh, fuse_instructions.sh) measure, one at a
# time, on "$W/m".
#
# The caller runs `targets_setup NAME` from the repository's root: it builds
# ordo (or takes $ORDO_BIN) and sets B (the binary), W (a scratch directory
# /var/tmp/ordo-NAME.* holding the mount point m, removed on exit) and HZ
# (clock ticks). `target_up
# TARGET` mounts one and sets SERVER_PID (the FUSE server's, empty for the
# kernel's ext4); `target_down` unmounts it and frees its loop device.
#
#   ext4           the kernel's ext4 on a loop device over a 2 GiB file
#   floor          `ordo fuse-floor` with ordo's worker count
#   floor1         `ordo fuse-floor --threads 1`
#   floor-all      `ordo fuse-floor --readers all`: every worker reads
#                  requests (ordo's `-o readers=all`)
#   floor-uring    `ordo fuse-floor --io-uring`: the floor over FUSE's
#                  io_uring transport, which is switched on
#                  (/sys/module/fuse/parameters/enable_uring) while it runs
#   libfuse        $LIBFUSE_FLOOR (scripts/floor/libfuse_floor.c), one thread
#   libfuse-mt     the same, its multi-threaded loop
#   libfuse-uring  $LIBFUSE_URING_FLOOR (the same program built against a
#                  libfuse with FUSE over io_uring, 3.18 or later) with
#                  `-o io_uring`; the kernel's transport is switched on
#                  (/sys/module/fuse/parameters/enable_uring) while it runs
#   anything else  an ordo mount of a fresh image with those options (with
#                  `io_uring` among them, the transport is switched on as
#                  for floor-uring)
#
# SERVER_WRAP, an array the caller may set after sourcing, is a command the
# FUSE servers of `floor`, `floor1`, `floor-all` and ordo mounts are started under
# (fuse_instructions.sh: cachegrind).
LOOP_DEV=
SERVER_PID=
SERVER_WRAP=()
URING_PARAM=/sys/module/fuse/parameters/enable_uring
URING_WAS=

targets_setup() {
    if [ -n "${ORDO_BIN:-}" ]; then
        B=$ORDO_BIN
    else
        cargo build --release -q -p ordo
        B=$PWD/target/release/ordo
    fi
    W=$(mktemp -d "/var/tmp/ordo-$1.XXXXXX")
    mkdir -p "$W/m"
    HZ=$(getconf CLK_TCK)
    trap targets_cleanup EXIT
}

target_up() {
    local target=$1
    SERVER_PID=
    case $target in
    floor | floor1 | floor-all)
        local threads=()
        case $target in
        floor1) threads=(--threads 1) ;;
        floor-all) threads=(--readers all) ;;
        esac
        setsid "${SERVER_WRAP[@]}" "$B" fuse-floor "${threads[@]}" "$W/m" >/dev/null 2>&1 &
        wait_mounted
        SERVER_PID=$(pgrep -f "$B fuse-floor.* $W/m" | tail -1)
        ;;
    floor-uring)
        uring_on || return 1
        setsid "${SERVER_WRAP[@]}" "$B" fuse-floor --io-uring "$W/m" >/dev/null 2>&1 &
        wait_mounted
        SERVER_PID=$(pgrep -f "$B fuse-floor.* $W/m" | tail -1)
        uring_served || return 1
        ;;
    libfuse | libfuse-mt)
        if [ "$target" = libfuse ]; then
            env -u MT setsid "$LIBFUSE_FLOOR" -o default_permissions "$W/m" >/dev/null 2>&1 &
        else
            MT=1 setsid "$LIBFUSE_FLOOR" -o default_permissions "$W/m" >/dev/null 2>&1 &
        fi
        wait_mounted
        SERVER_PID=$(pgrep -f "$LIBFUSE_FLOOR" | tail -1)
        ;;
    libfuse-uring)
        uring_on || return 1
        env -u MT setsid "$LIBFUSE_URING_FLOOR" -o default_permissions,io_uring "$W/m" >/dev/null 2>&1 &
        sleep 1
        SERVER_PID=$(pgrep -f "$LIBFUSE_URING_FLOOR" | tail -1)
        uring_served || return 1
        ;;
    ext4)
        truncate -s 2G "$W/img"
        LOOP_DEV=$(losetup -f --show "$W/img")
        mkfs.ext4 -q -F "$LOOP_DEV"
        mount "$LOOP_DEV" "$W/m"
        ;;
    *)
        truncate -s 2G "$W/img"
        LOOP_DEV=$(losetup -f --show "$W/img")
        # Formatted for the target's protocol (`ordo mkfs --mode`: a
        # journal, a fast-commit area), its variant left out.
        local mode
        mode=$(printf ',%s,' "$target" | sed -n 's/.*,mode=\([^,:]*\)[^,]*,.*/\1/p')
        "$B" mkfs ${mode:+--mode "$mode"} "$LOOP_DEV" >/dev/null
        case ",$target," in
        *,io_uring,*) uring_on || return 1 ;;
        esac
        "${SERVER_WRAP[@]}" "$B" mount "$LOOP_DEV" "$W/m" -o "$target" >/dev/null 2>&1
        wait_mounted
        SERVER_PID=$(pgrep -f "$B mount $LOOP_DEV" | tail -1)
        [ -z "$URING_WAS" ] || uring_served || return 1
        ;;
    esac
}

target_down() {
    umount "$W/m"
    sleep 0.5
    if [ -n "$URING_WAS" ]; then
        echo "$URING_WAS" >"$URING_PARAM"
        URING_WAS=
    fi
    if [ -n "$LOOP_DEV" ]; then
        losetup -d "$LOOP_DEV"
        LOOP_DEV=
        rm -f "$W/img"
    fi
}

targets_cleanup() {
    umount "$W/m" 2>/dev/null || true
    sleep 0.5
    [ -z "$URING_WAS" ] || echo "$URING_WAS" >"$URING_PARAM"
    [ -z "$LOOP_DEV" ] || losetup -d "$LOOP_DEV" 2>/dev/null || true
    rm -rf "$W"
}

# Switch the kernel's FUSE over io_uring on until target_down.
uring_on() {
    [ -w "$URING_PARAM" ] || { echo "targets.sh: this kernel has no FUSE over io_uring ($URING_PARAM)" >&2; return 1; }
    [ -n "$URING_WAS" ] || URING_WAS=$(cat "$URING_PARAM")
    echo Y >"$URING_PARAM"
}

# Whether the server SERVER_PID holds an io_uring: a server falls back to
# /dev/fuse when the ring cannot start, so say so rather than time the
# wrong transport.
uring_served() {
    if ! ls -l "/proc/$SERVER_PID/fd" 2>/dev/null | grep -q io_uring; then
        echo "targets.sh: the server of $W/m runs without an io_uring" >&2
        return 1
    fi
}

# Wait (up to 30 s) until "$W/m" is a mount point: a server started under
# SERVER_WRAP takes seconds to answer its first request.
wait_mounted() {
    local i
    for i in $(seq 300); do
        mountpoint -q "$W/m" && return 0
        sleep 0.1
    done
    echo "targets.sh: nothing mounted on $W/m" >&2
    return 1
}

# The CPU time (user + system, in ticks) of process $1 so far; 0 if none.
cpu_ticks() { [ -z "$1" ] && echo 0 || awk '{print $14 + $15}' "/proc/$1/stat"; }

# The same, user time alone.
user_ticks() { [ -z "$1" ] && echo 0 || awk '{print $14}' "/proc/$1/stat"; }
