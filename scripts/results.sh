#!/usr/bin/env bash
# Regenerates docs/RESULTS.md: every workload of docs/BENCH.md on ordo's
# protocols and on the kernel's ext4, with the machine and the date, plus the
# JSON rows and one SVG chart per workload in docs/results/.
#
#   scripts/results.sh                       # every workload, --scale small
#   SCALE=medium scripts/results.sh
#   WORKLOADS="fcmicro varmail" scripts/results.sh
#   WORKLOADS=fastcommit FC_SCALE=paper scripts/results.sh   # issue 7's sweep
#   WORKLOADS=ganger scripts/results.sh      # Ganger & Patt's tables (GANGER_SCALE=small|paper)
#   WORKLOADS=ganger-paper scripts/results.sh  # the same at the paper's sizes (about 45 min)
#   WORKLOADS=optfs scripts/results.sh       # OptFS: fcmicro and Figure 8 (HDD model and loop; F8_SCALE=medium)
#   WORKLOADS=apps scripts/results.sh        # application crash checking: SQLite, git, LevelDB, editor
#   WORKLOADS=ccfs scripts/results.sh        # ccfs: Tables 3 and 4, Figures 7 and 8, Table 5 (CCFS_SCALE=medium, CCFS_RUNS=3)
#   WORKLOADS=nofs scripts/results.sh        # NoFS: Table 3, Figures 4, 5, 6(a) and 6(b), HDD model and loop (NOFS_SCALE=small|medium|paper)
#   WORKLOADS=protocols scripts/results.sh   # every protocol beside the kernel's ext4, fsync-bound (PROTO_REPEAT=5 runs a row)
#   WORKLOADS=fuse scripts/results.sh        # the FUSE path: ordo beside fuse-floor and ext4 (FUSE_SCALE=medium, FUSE_REPEAT=5 runs a row)
#   WORKLOADS=fuse-uring scripts/results.sh  # FUSE over io_uring: the floor and ordo through the ring beside /dev/fuse and ext4 (FUSE_SCALE, FUSE_REPEAT as for fuse)
#   WORKLOADS=page scripts/results.sh        # only rewrite RESULTS.md from docs/results/
#
# Needs root (loop devices, mounts), e2fsprogs, fuse3, sqlite3, git; postmark
# and fsmark are installed from Debian on demand. A target that fails (a mode
# ordo does not implement yet) shows as FAILED in its table; the others run.
set -euo pipefail

cd "$(dirname "$0")/.."
SCALE=${SCALE:-small}
SEED=${SEED:-42}
WORKLOADS=${WORKLOADS:-"fcmicro fastcommit varmail fileserver webserver createfiles randwrite seqwrite copy remove smallfiles twofile sqlite git postmark fsmark"}
KERNEL="ext4:ordered,ext4:fast_commit,ext4:journal,ext4:nobarrier,tmpfs"
ORDO="ordo:async,ordo:sync,ordo:journal,ordo:fast_commit"
LIB="ordo-lib:async,ordo-lib:sync,ordo-lib:journal"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}

if [ "$(id -u)" != 0 ]; then
    echo "results.sh: run as root (loop devices and mounts)" >&2
    exit 2
fi

# ORDO_BIN: an ordo binary built already (a copy that a rebuild during a
# long run leaves alone); otherwise build one.
if [ -n "${ORDO_BIN:-}" ]; then
    BIN=$ORDO_BIN
else
    cargo build --release -q -p ordo
    BIN="$CARGO_TARGET_DIR/release/ordo"
fi
OUT=docs/results
mkdir -p "$OUT"

# bench NAME ARGS...: one `ordo bench` run, its table kept for the page.
bench() {
    local name=$1
    shift
    echo "results.sh: $name" >&2
    "$BIN" bench "$@" --scale "$SCALE" --seed "$SEED" -q \
        --json "$OUT/$name.json" --chart "$OUT/$name.svg" >"$OUT/$name.txt" || true
}

for w in $WORKLOADS; do
    case $w in
    fcmicro)
        bench fcmicro fcmicro --targets "$KERNEL,$ORDO,$LIB"
        bench fcmicro-sweep fcmicro --fsync-every sweep \
            --targets "ext4:ordered,ext4:fast_commit,ext4:journal,ordo:sync,ordo:journal,ordo:fast_commit"
        bench fcmicro-hdd fcmicro --targets "$LIB" --disk hdd
        ;;
    fastcommit)
        # The fast-commit paper's figures: the sweep through FUSE on a loop
        # device, and varmail for the share of fast and single-block
        # commits (columns fc/fsync, fast %, 1-blk %, blk/fc).
        SCALE=${FC_SCALE:-$SCALE} bench fastcommit-sweep fcmicro --fsync-every sweep \
            --targets "ordo:fast_commit,ordo:journal,ext4:fast_commit,ext4:ordered"
        SCALE=${FC_SCALE:-$SCALE} bench fastcommit-varmail varmail \
            --targets "ordo:fast_commit,ext4:fast_commit"
        # Metadata-only fsyncs (create + fsync, no data): the case where
        # selective flushing writes one FUA block and no flush.
        SCALE=${FC_SCALE:-$SCALE} bench fastcommit-metadata fcmicro --fsync-every 1 \
            --append-bytes 0 --targets "ordo:fast_commit,ext4:fast_commit,ordo:journal,ext4:ordered"
        ;;
    ganger)
        # Ganger & Patt's tables in virtual time (deterministic, in-process),
        # and the same workloads on the kernel's ext4 and ordo through FUSE
        # on a real device, as a modern reference (real time).
        "$BIN" bench ganger --scale "${GANGER_SCALE:-small}" --seed "$SEED" -q \
            --json "$OUT/ganger.json" --chart "$OUT/ganger.svg" >"$OUT/ganger.txt" || true
        bench ganger-modern copy,remove,smallfiles --users 4 \
            --targets "ext4:ordered,ordo:async,ordo:sync,ordo:sched-flag,ordo:sched-chain,ordo:softdep,ordo:journal"
        ;;
    optfs)
        # OptFS (Chidambaram et al., SOSP '13): fcmicro through FUSE against
        # the kernel's fast commit (flushes per fsync, ops/s as a ratio in
        # one run), and Figure 8's workloads on the HDD model in virtual
        # time, ordo's journal with flushes beside optimistic with fsync as
        # dsync and as osync; varmail also through FUSE on a loop device
        # against the kernel's ext4 with and without barriers.
        O="ordo:optimistic,ordo:optimistic,fsync=osync"
        L="ordo-lib:journal,ordo-lib:optimistic,ordo-lib:optimistic,fsync=osync"
        bench optfs-fcmicro fcmicro \
            --targets "ext4:fast_commit,ext4:ordered,ext4:nobarrier,ordo:journal,ordo:fast_commit,$O"
        # Figure 8: every workload on the HDD model in virtual time
        # (in-process; oltp runs sqlite3 and needs a mount, so it has no
        # HDD row), and through FUSE on the loop device against the
        # kernel's ext4 with and without barriers, all in this one run;
        # scripts/optfs_fig8.py puts the ratios to ordo:journal in one table.
        for f8 in varmail fileserver webserver createfiles randwrite seqwrite overwrite; do
            bench "optfs-$f8-hdd" "$f8" --targets "$L" --disk hdd
        done
        for f8 in varmail fileserver webserver createfiles randwrite seqwrite overwrite oltp; do
            extra=()
            [ "$f8" = randwrite ] && extra=(--fsync-every 1000)
            # Medium scale by default: at small scale a loop run lasts a
            # fraction of a second and the machine's noise decides it.
            SCALE=${F8_SCALE:-medium} bench "optfs-$f8-loop" "$f8" "${extra[@]}" \
                --targets "ext4:ordered,ext4:nobarrier,ordo:journal,$O"
        done
        /usr/bin/python3 scripts/optfs_fig8.py "$OUT" >"$OUT/optfs-fig8.txt"
        # Table 1: every crash state of the delayed-block scenarios (data,
        # journal blocks and commit delayed by every reordering the
        # explorer allows), recovered and checked.
        {
            printf '%-22s %-26s %8s %13s %16s %13s %15s\n' scenario protocol states inconsistent \
                "broken promises" "foreign data" "prefix (hook)"
            for sc in append overwrite checkpoint; do
                for m in "journal --fault drop-flushes" "journal" "optimistic"; do
                    # shellcheck disable=SC2086
                    r=$("$BIN" crash --mode $m -w "crates/ordo-crash/scenarios/optfs-$sc.scenario" \
                        -q --no-judge 2>&1 || true)
                    field() { echo "$r" | awk -v k="$1" '$1 == k { print $2; exit }'; }
                    label=${m/ --fault drop-flushes/ without flushes}
                    printf '%-22s %-26s %8s %13s %16s %13s %15s\n' "optfs-$sc" "$label" \
                        "$(field checked)" "$(field inconsistent)" "$(field broken_promises)" \
                        "$(field foreign_data)" "$(field hook_failures)"
                done
            done
            echo
            echo "reproduce with: ordo crash --mode optimistic -w crates/ordo-crash/scenarios/optfs-SCENARIO.scenario"
        } >"$OUT/optfs-table1.txt"
        ;;
    ganger-paper)
        # The same tables at the paper's sizes (535 files and 14.3 MB per
        # user, 10,000 small files): about 45 minutes of one core.
        "$BIN" bench ganger --scale paper --seed "$SEED" -q \
            --json "$OUT/ganger-paper.json" --chart "$OUT/ganger-paper.svg" >"$OUT/ganger-paper.txt" || true
        ;;
    apps)
        # Issue 18's table: real SQLite, git, LevelDB and an editor's save on
        # every protocol and on the kernel's ext4, every crash state of each
        # (a seeded sample of 400 per cell) judged by the application.
        echo "results.sh: apps" >&2
        {
            "$BIN" crash --app all --mode all -q --states 400 --seed "$SEED" --show 0 \
                --json "$OUT/apps.json" --table "$OUT/apps.table.md" |
                grep -v -e '^  ' -e '^|' -e '^Each cell' -e '^$'
            echo
            echo "reproduce with: ordo crash --app all --mode all --states 400 --seed $SEED --table apps.md"
        } >"$OUT/apps.txt" || true
        ;;
    fuse)
        # The FUSE path (issue 20): ordo through FUSE beside a FUSE server
        # that does nothing (the floor any FUSE file system pays) and the
        # kernel's ext4, on request-bound workloads (no fsync), the
        # fsync-bound one, reads, cold and warm, and stat.
        # Each row is the median of FUSE_REPEAT runs (the targets taking
        # turns going first): single runs of these moved by more than the
        # gaps the issue's goals are about.
        FT="ext4:ordered,fuse-floor,ordo:async,ordo:journal"
        FR=${FUSE_REPEAT:-5}
        SCALE=${FUSE_SCALE:-medium} bench fuse-create fcmicro --fsync-every 1024 --targets "$FT" --repeat "$FR"
        SCALE=${FUSE_SCALE:-medium} bench fuse-createfiles createfiles --targets "$FT" --repeat "$FR"
        SCALE=${FUSE_SCALE:-medium} bench fuse-fsync fcmicro \
            --targets "ext4:fast_commit,ordo:fast_commit,ordo:optimistic" --repeat "$FR"
        # Reads also with opens that are not requests and a longer entry
        # lifetime (DESIGN.md "The FUSE path"): what a mount for reading
        # can ask for. Each beside its floor (lengths checked, not bytes).
        SCALE=${FUSE_SCALE:-medium} bench fuse-read read \
            --targets "ext4:ordered,fuse-floor,ordo:journal,fuse-floor,open_requests=off,ordo:journal,open_requests=off,attr_timeout=10" --repeat "$FR"
        SCALE=${FUSE_SCALE:-medium} bench fuse-stat stat --targets "$FT" --repeat "$FR"
        ;;
    fuse-uring)
        # FUSE over io_uring (`-o io_uring`, `fuse-floor,io_uring`): the
        # floor and ordo served through the kernel's per-CPU rings beside
        # the same over /dev/fuse and the kernel's ext4; the harness turns
        # the kernel's enable_uring on for the run and back after.
        UT="ext4:ordered,fuse-floor,fuse-floor,io_uring,ordo:async,ordo:async,io_uring,ordo:journal,ordo:journal,io_uring"
        FR=${FUSE_REPEAT:-5}
        SCALE=${FUSE_SCALE:-medium} bench fuse-uring-create fcmicro --fsync-every 1024 --targets "$UT" --repeat "$FR"
        SCALE=${FUSE_SCALE:-medium} bench fuse-uring-createfiles createfiles --targets "$UT" --repeat "$FR"
        SCALE=${FUSE_SCALE:-medium} bench fuse-uring-stat stat --targets "$UT" --repeat "$FR"
        SCALE=${FUSE_SCALE:-medium} bench fuse-uring-fsync fcmicro \
            --targets "ext4:fast_commit,ordo:fast_commit,ordo:fast_commit,io_uring,ordo:optimistic,ordo:optimistic,io_uring" --repeat "$FR"
        SCALE=${FUSE_SCALE:-medium} bench fuse-uring-read read \
            --targets "ext4:ordered,ordo:journal,ordo:journal,io_uring" --repeat "$FR"
        ;;
    protocols)
        # Every protocol of the registry side by side (`ordo:all`) through
        # FUSE on a loop device, beside the kernel's ext4 with and without
        # fast commits, on the fsync-bound workloads: fcmicro at one fsync
        # per file (per-fsync writes, KiB and flushes) and varmail. Each row
        # the median of PROTO_REPEAT runs.
        PT="ext4:ordered,ext4:fast_commit,ordo:all"
        PR=${PROTO_REPEAT:-5}
        SCALE=${PROTO_SCALE:-small} bench protocols-fsync fcmicro --targets "$PT" --repeat "$PR"
        SCALE=${PROTO_SCALE:-small} bench protocols-varmail varmail --targets "$PT" --repeat "$PR"
        ;;
    ccfs)
        # ccfs (Pillai et al., FAST '17 / TOS '17) for mode=streams: the raw
        # runs go to docs/results/ccfs-runs/ (not sections of the page);
        # scripts/ccfs_tables.py makes the four tables, the paper's figures
        # beside ordo's, as docs/results/ccfs-*.txt. See docs/BENCH.md, "ccfs".
        RUNS_DIR="$OUT/ccfs-runs"
        mkdir -p "$RUNS_DIR"
        CS=${CCFS_SCALE:-medium}
        # ccfs_bench NAME SCALE ARGS...: one run, JSON and table kept.
        ccfs_bench() {
            local name=$1 scale=$2
            shift 2
            echo "results.sh: ccfs-runs/$name" >&2
            "$BIN" bench "$@" --scale "$scale" --seed "$SEED" -q \
                --json "$RUNS_DIR/$name.json" >"$RUNS_DIR/$name.txt" 2>&1 || true
        }
        # Table 4: one fsync of B after 100 MB to A; ccfs-2 beside the
        # kernel in the same run, ccfs-1 alone; the HDD model once.
        for r in $(seq 1 "${CCFS_RUNS:-3}"); do
            ccfs_bench "table4-loop-2-r$r" "$CS" twofile --streams 2 \
                --targets ext4:ordered,ordo:journal,ordo:streams
            ccfs_bench "table4-loop-1-r$r" "$CS" twofile --streams 1 --targets ordo:streams
        done
        ccfs_bench table4-hdd-2 "$CS" twofile --streams 2 \
            --targets ordo-lib:journal,ordo-lib:streams --disk hdd
        ccfs_bench table4-hdd-1 "$CS" twofile --streams 1 --targets ordo-lib:streams --disk hdd
        # Figure 7: B's fsyncs beside a 20 MB/s writer to A.
        ccfs_bench fig7-loop-2 "${F7_SCALE:-medium}" twofile-repeat --streams 2 --size 4G \
            --targets ext4:ordered,ordo:journal,ordo:streams
        ccfs_bench fig7-loop-1 "${F7_SCALE:-medium}" twofile-repeat --streams 1 --size 4G \
            --targets ordo:streams
        ccfs_bench fig7-hdd-2 "${F7_HDD_SCALE:-paper}" twofile-repeat --streams 2 --size 4G \
            --targets ordo-lib:journal,ordo-lib:streams --disk hdd
        ccfs_bench fig7-hdd-1 "${F7_HDD_SCALE:-paper}" twofile-repeat --streams 1 --size 4G \
            --targets ordo-lib:streams --disk hdd
        # Figure 8: standard workloads in one stream, normalised to data=journal.
        for f8 in varmail randwrite webserver createfiles seqwrite fileserver; do
            extra=()
            [ "$f8" = randwrite ] && extra=(--fsync-every 100)
            ccfs_bench "fig8-$f8-hdd" "${F8_HDD_SCALE:-$SCALE}" "$f8" "${extra[@]}" --disk hdd \
                --targets ordo-lib:journal,data=journal,ordo-lib:journal,ordo-lib:streams
            ccfs_bench "fig8-$f8-loop" "${F8_SCALE:-medium}" "$f8" "${extra[@]}" \
                --targets ext4:journal,ext4:ordered,ordo:journal,data=journal,ordo:journal,ordo:streams
        done
        # Table 5: SQLite, git, LevelDB with fsync and with IGNORE_FSYNC +
        # streamsync, on the HDD model (served through FUSE by the harness)
        # and on loop devices.
        ccfs_bench table5-hdd "$CS" streams-sqlite,streams-git,streams-leveldb --disk hdd \
            --targets ordo-lib:journal,fuse,ordo-lib:streams,fuse
        ccfs_bench table5-loop "$CS" streams-sqlite,streams-git,streams-leveldb \
            --targets ext4:ordered,ordo:journal,ordo:streams
        /usr/bin/python3 scripts/ccfs_tables.py "$OUT"
        # Table 3: the applications' crash states under the kernel's ext4,
        # ordo's journal and streams (the application crash checker).
        echo "results.sh: ccfs-table3" >&2
        {
            echo "ccfs Table 3: application crash consistency. Each cell: crash states the"
            echo "application recovers from / states checked (distinct vulnerabilities),"
            echo "by \`ordo crash --app\` (docs/CRASH.md, application crash checking)."
            echo "Paper (ALICE vulnerabilities, ext4 / ccfs): LevelDB 1 / 0, SQLite-rollback"
            echo "0 / 0, Git 2 / 0; BoB consistent images: LevelDB 158/465 / 427/427, Git"
            echo "84/112 / 96/96."
            echo
            "$BIN" crash --app sqlite-rollback,leveldb,git --mode kernel,journal,streams \
                --table "$OUT/ccfs-table3.md" >/dev/null 2>&1
            cat "$OUT/ccfs-table3.md"
            rm -f "$OUT/ccfs-table3.md"
            echo
            echo "reproduce with: ordo crash --app sqlite-rollback,leveldb,git --mode kernel,journal,streams"
        } >"$OUT/ccfs-table3.txt" || true
        ;;
    nofs)
        # NoFS (Chidambaram et al., FAST '12) for mode=backpointers: the
        # raw runs go to docs/results/nofs-runs/ (not sections of the
        # page); scripts/nofs_tables.py makes Figures 4 and 5, the
        # per-fsync figures and the goals, the paper's results beside
        # ordo's, as docs/results/nofs-*.txt. See docs/BENCH.md, "NoFS".
        RUNS_DIR="$OUT/nofs-runs"
        mkdir -p "$RUNS_DIR"
        NS=${NOFS_SCALE:-small}
        # nofs_bench NAME ARGS...: one run at $NS, JSON and table kept.
        nofs_bench() {
            local name=$1
            shift
            echo "results.sh: nofs-runs/$name" >&2
            "$BIN" bench "$@" --scale "$NS" --seed "$SEED" -q \
                --json "$RUNS_DIR/$name.json" >"$RUNS_DIR/$name.txt" 2>&1 || true
        }
        # Table 3: the 20 dropped-write cases, async (the paper's ext2)
        # beside backpointers, every state's disk filled and re-read.
        echo "results.sh: nofs-runs/table3" >&2
        "$BIN" crash --workload nofs-table3 --mode async -q \
            --json "$RUNS_DIR/table3-async.json" >"$RUNS_DIR/table3-async.txt" 2>&1 || true
        ORDO_NOFS_FILL_EVERY=1 "$BIN" crash --workload nofs-table3 --mode backpointers -q \
            --json "$RUNS_DIR/table3-backpointers.json" >"$RUNS_DIR/table3-backpointers.txt" 2>&1 || true
        # Figure 4 and Figure 5: NoFS (backpointers) and ext3 (ordo's
        # journal) on the HDD model in virtual time; the same and the
        # kernel's ext4 through FUSE on loop devices.
        nofs_bench fig4-hdd nofs-micro --targets ordo-lib:backpointers,ordo-lib:journal --disk hdd
        nofs_bench fig4-loop nofs-micro --targets ordo:backpointers,ordo:journal,ext4:ordered
        nofs_bench fig5-hdd sort,fileserver,webserver,varmail \
            --targets ordo-lib:backpointers,ordo-lib:journal --disk hdd
        # The same HDD with the platter's position modeled (rot=on): a log
        # write after a flush waits for its sector, as on a disk. Figure 4
        # and varmail (the goals' rows).
        nofs_bench fig4-hddrot nofs-micro --targets ordo-lib:backpointers,ordo-lib:journal --disk hdd,rot=on
        nofs_bench fig5-hddrot varmail --targets ordo-lib:backpointers,ordo-lib:journal --disk hdd,rot=on
        # The paper's configuration: neither side flushes (its ext3 ran
        # with barrier=0, its NoFS on ext2, which never flushed), the
        # disk's write cache on: `nobarrier` on both. On the image file,
        # not a loop device: with no flush, what the kernel counts on
        # /dev/loopN is what its page cache happened to write out.
        nofs_bench fig4-hddnb nofs-micro \
            --targets ordo-lib:backpointers,nobarrier,ordo-lib:journal,nobarrier --disk hdd --device file
        nofs_bench fig5-hddnb varmail \
            --targets ordo-lib:backpointers,nobarrier,ordo-lib:journal,nobarrier --disk hdd --device file
        nofs_bench fig5-loop sort,fileserver,webserver,varmail \
            --targets ordo:backpointers,ordo:journal,ext4:ordered
        # For reference: the same in-process runs on the SSD model, where an
        # fsync costs its flushes rather than its seeks.
        nofs_bench fig4-ssd nofs-micro --targets ordo-lib:backpointers,ordo-lib:journal --disk ssd
        nofs_bench fig5-ssd sort,fileserver,webserver,varmail \
            --targets ordo-lib:backpointers,ordo-lib:journal --disk ssd
        # Figures 6(a) and 6(b): the scan after a crash (and the mount after a crash,
        # beside journal's replay), a 1 GiB image, in-process.
        echo "results.sh: nofs-fig6" >&2
        "$BIN" bench nofs-scan --scale "$NS" --seed "$SEED" -q \
            --json "$RUNS_DIR/fig6.json" >"$OUT/nofs-fig6.txt" 2>&1 || true
        /usr/bin/python3 scripts/nofs_tables.py "$OUT"
        ;;
    page)
        # Only rewrite docs/RESULTS.md from what docs/results/ holds.
        ;;
    optfs-table3)
        # OptFS Table 3: gedit's atomic save and a SQLite transaction on the
        # kernel's ext4 without and with flushes and on ordo optimistic with
        # fsync=osync (the paper's modified applications), every crash
        # state judged by the application.
        echo "results.sh: optfs-table3" >&2
        "$BIN" crash --app editor,sqlite-rollback --mode kernel+nobarrier,kernel,optimistic+osync \
            -q --states 1000 --seed "$SEED" --json "$OUT/optfs-table3.json" >/dev/null || true
        /usr/bin/python3 - "$OUT/optfs-table3.json" "$SEED" >"$OUT/optfs-table3.txt" <<'PY'
import json, sys
cells = {(c["app"], c["target"]): c["report"] for c in json.load(open(sys.argv[1]))}
cols = ["kernel+nobarrier", "kernel", "optimistic+osync"]
paper = {
    "editor": {"total": [50, 50, 50], "inconsistent": [7, 0, 0], "old": [26, 21, 36], "new": [17, 29, 14]},
    "sqlite-rollback": {"total": [100, 100, 100], "inconsistent": [73, 0, 0], "old": [8, 50, 76], "new": [19, 50, 24]},
}
print("OptFS Table 3: crash states of an application update, ordo / paper")
print("columns: ext4 without flushes (kernel, -o nobarrier) | ext4 with flushes (kernel) | OptFS (ordo optimistic, fsync=osync)")
for app, name in [("editor", "gedit (the editor's atomic save)"), ("sqlite-rollback", "SQLite (rollback journal)")]:
    print()
    print(name)
    print(f"{'':<26}" + "".join(f"{c:>24}" for c in cols))
    rows = [
        ("crash states checked", "total", lambda r: r["checked"]),
        ("inconsistent", "inconsistent", lambda r: r["checked"] - r["consistent"]),
        ("old state", "old", lambda r: r["old_state"]),
        ("new state", "new", lambda r: r["new_state"]),
    ]
    for label, key, f in rows:
        line = f"{label:<26}"
        for i, c in enumerate(cols):
            r = cells.get((app, c))
            v = f(r) if r else "-"
            line += f"{f'{v} / {paper[app][key][i]}':>24}"
        print(line)
    line = f"{'flushes per update':<26}"
    for c in cols:
        r = cells.get((app, c))
        line += f"{(r['flushes'] / max(r['marks'], 1)) if r else 0:>24.2f}"
    print(line)
print()
print(f"reproduce with: ordo crash --app editor,sqlite-rollback --mode kernel+nobarrier,kernel,optimistic+osync --states 1000 --seed {sys.argv[2]}")
PY
        ;;
    sqlite | git | postmark | fsmark)
        # Programs need a mounted file system: no in-process targets.
        bench "$w" "$w" --targets "$KERNEL,$ORDO"
        ;;
    *)
        bench "$w" "$w" --targets "$KERNEL,$ORDO,$LIB"
        ;;
    esac
done

page=docs/RESULTS.md
{
    echo "# ordo: results"
    echo
    echo "Regenerated by \`scripts/results.sh\` (\`SCALE=$SCALE\`, seed $SEED); do not edit by hand."
    echo "Workloads, targets, parameters and the meaning of every column: [BENCH.md](BENCH.md)."
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, $(($(grep MemTotal /proc/meminfo | awk '{print $2}') / 1024)) MiB, kernel $(uname -r)"
    echo "- devices: a fresh image per case on /dev/loopN (backing file on $(df --output=fstype "$PWD" | tail -1)), written whole before mkfs (\`--image written\`, BENCH.md \"Images\"; tables run before that option, and those whose command says \`--image sparse\`, had sparse images); ordo through FUSE unless the target is ordo-lib, with the protocol's default worker threads (8 where fsyncs share a commit, 4 otherwise; it was 4 for all before, and the \`ordo:\` rows of the tables made then, all but \`protocols-varmail\`, ran 4: add \`,threads=4\` to a target to reproduce one)"
    echo
    echo "Throughput on this shared two-core machine varies from run to run; the per-operation"
    echo "device figures (writes, KiB, flushes) do not."
    for f in "$OUT"/*.txt; do
        name=$(basename "$f" .txt)
        echo
        echo "## $name"
        echo
        echo '```'
        cat "$f"
        echo '```'
        echo
        if [ -f "$OUT/$name.table.md" ]; then
            cat "$OUT/$name.table.md"
            echo
        fi
        if [ -f "$OUT/$name.svg" ]; then
            echo "![$name](results/$name.svg)"
        fi
        if [ -f "docs/results/$name.notes.md" ]; then
            echo
            cat "docs/results/$name.notes.md"
        fi
    done
} >"$page"
echo "results.sh: wrote $page" >&2
