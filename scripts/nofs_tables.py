#!/usr/bin/env python3
"""NoFS (Chidambaram et al., "Consistency Without Ordering", FAST '12):
Figures 4 and 5, the per-fsync device figures and the goals, from the
bench JSON that `WORKLOADS=nofs scripts/results.sh` leaves in
docs/results/nofs-runs/, each beside the paper's result.

    scripts/nofs_tables.py docs/results

writes docs/results/nofs-fig4.txt, nofs-fig5.txt, nofs-fsync.txt and
nofs-goals.txt (Figure 6, the scan, is `ordo bench nofs-scan`'s own
report, nofs-fig6.txt).

Configurations, as the paper names them:
  NoFS   ordo mode=backpointers
  ext3   ordo mode=journal (JBD2, data=ordered, with flushes): the paper's
         ext3 stand-in
  ext4   the kernel's ext4, data=ordered (loop device only: the HDD model
         runs ordo's library in-process, which the kernel cannot)
"""
import os
import sys

from benchjson import load

HDD = {"NoFS": "ordo-lib:backpointers", "ext3": "ordo-lib:journal"}
# The paper's configuration on the HDD model: no flush and no FUA on
# either side (`nobarrier`), as its ext3 (barrier=0) and NoFS (ext2) ran.
HDDNB = {"NoFS": "ordo-lib:backpointers,nobarrier", "ext3": "ordo-lib:journal,nobarrier"}
LOOP = {"NoFS": "ordo:backpointers", "ext3": "ordo:journal", "ext4": "ext4:ordered"}

FIG4 = [("seq-write", "~1x ext3 (ext3 slower: it journals)"),
        ("seq-read", "~1x"),
        ("rand-write", "~1x"),
        ("rand-read", "~1x"),
        ("create", "2x ext3"),
        ("delete", "1.7x ext3")]
FIG5 = [("sort", "~1x"), ("fileserver", "~1x"), ("webserver", "~1x"),
        ("varmail", "1.18x ext3")]
# The goals on the HDD model (the issue's): NoFS / ext3 at least this.
GOALS = [("nofs-micro", "create", 2.0), ("nofs-micro", "delete", 1.7),
         ("varmail", "", 1.18)]
# The HDD model with the platter's position (`--disk hdd,rot=on`).
HDDROT_TITLE = ("The same HDD model with rot=on (the platter's position and a 50 us command "
                "turnaround: a sequential write after a wait waits for its sector), virtual time, in-process")
HDDNB_TITLE = ("The same HDD model, both sides with nobarrier (no flush, no FUA: the paper's "
               "ext3 ran with barrier=0 and its NoFS on ext2; an fsync is then not durable), virtual time, in-process")
# The fsync-heavy workloads, for the per-fsync figures.
FSYNC_HEAVY = [("nofs-micro", "create"), ("nofs-micro", "delete"),
               ("nofs-micro", "rand-write"), ("varmail", "")]


def configs(env):
    """The targets standing for NoFS, ext3 (and ext4) in one environment."""
    return {"loop": LOOP, "hddnb": HDDNB}.get(env, HDD)


class Runs:
    """Rows of the JSON files of one environment (hdd or loop)."""

    def __init__(self, run_dir, env, names):
        self.rows = []
        self.commands = []
        for n in names:
            d = load(os.path.join(run_dir, f"{n}-{env}.json"))
            if d:
                self.rows += d.get("results", [])
                if d.get("command"):
                    self.commands.append(d["command"])

    def row(self, target, workload, case=""):
        for r in self.rows:
            if r.get("target") == target and r.get("workload") == workload \
                    and (r.get("case") or "") == case:
                return r
        return None


def ops(r):
    if not r or r.get("error"):
        return None
    return r.get("ops_per_sec")


def fmt_ops(x):
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def fmt_ratio(a, b):
    if a is None or b is None or b == 0:
        return "-"
    x = a / b
    return f"{x:.2f}x"


def failed(r):
    if r is None:
        return "(not run)"
    if r.get("error"):
        return "FAILED"
    return None


def figure_table(out, runs, env, items, workload_of, paper_of):
    """ops/s of each configuration and NoFS's ratios to the others."""
    p = lambda *a: print(*a, file=out)
    cfgs = configs(env)
    names = list(cfgs)
    head = f"{'benchmark':<12}" + "".join(f"{n + ' ops/s':>14}" for n in names)
    head += f"{'NoFS/ext3':>11}"
    if "ext4" in cfgs:
        head += f"{'NoFS/ext4':>11}"
    head += "  paper (NoFS)"
    p(head)
    p("-" * len(head))
    for case, paper in items:
        workload, c = workload_of(case)
        rs = {n: runs.row(t, workload, c) for n, t in cfgs.items()}
        cells = []
        for n in names:
            f = failed(rs[n])
            cells.append(f if f else fmt_ops(ops(rs[n])))
        line = f"{case:<12}" + "".join(f"{c:>14}" for c in cells)
        line += f"{fmt_ratio(ops(rs['NoFS']), ops(rs['ext3'])):>11}"
        if "ext4" in cfgs:
            line += f"{fmt_ratio(ops(rs['NoFS']), ops(rs['ext4'])):>11}"
        line += f"  {paper_of(case, paper)}"
        p(line)
    errors = []
    for case, _ in items:
        workload, c = workload_of(case)
        for n, t in cfgs.items():
            r = runs.row(t, workload, c)
            if r and r.get("error"):
                errors.append(f"  {case} on {t}: {r['error'][:300]}")
    if errors:
        p()
        p("failures:")
        for e in errors:
            p(e)


def each_env(run_dir, out, fig, envs):
    """(env, runs) for each environment that has runs of `fig`, each under
    its title; "(not run)" under the others."""
    for env, title in envs:
        runs = Runs(run_dir, env, [fig])
        print(file=out)
        print(title, file=out)
        print(file=out)
        if not runs.rows:
            print("(not run)", file=out)
            continue
        yield env, runs


def mib_s(r):
    x = (r or {}).get("extra", {}).get("mib_per_sec")
    return f"{x:.0f}" if x is not None else "-"


def fig4(run_dir, out):
    p = lambda *a: print(*a, file=out)
    p("NoFS Figure 4: micro-benchmarks, ops/s (a request of 64 KiB for seq-*, a 4 KiB")
    p("request for rand-*, a file for create and delete), NoFS = ordo backpointers, ext3 =")
    p("ordo journal, ext4 = the kernel's. Paper: NoFS about equal to ext2 and ext3 on the")
    p("read and write benchmarks (ext3 below on sequential writes, which it journals),")
    p("2x ext3 on creates, 1.7x (\"70% higher\") on deletes; absolute figures only in the")
    p("paper's bar chart.")
    for env, runs in each_env(run_dir, out, "fig4", [
            ("hdd", "On the HDD model (7200 rpm, 8.5 ms seek, 150 MB/s, write cache on), virtual time, in-process"),
            ("hddrot", HDDROT_TITLE),
            ("hddnb", HDDNB_TITLE),
            ("loop", "Through FUSE (ordo) and the kernel (ext4) on a loop device, real time"),
            ("ssd", "For reference, on the SSD model (30 us write, 1 ms flush, 500 MB/s), virtual time, in-process")]):
        params = {}
        for r in runs.rows:
            params.setdefault(r.get("case"), r.get("params", {}))
        figure_table(out, runs, env, FIG4, lambda c: ("nofs-micro", c), lambda c, x: x)
        cfgs = configs(env)
        seq = []
        for c in ("seq-write", "seq-read"):
            cells = [f"{n} {mib_s(runs.row(t, 'nofs-micro', c))}" for n, t in cfgs.items()]
            seq.append(f"{c} MiB/s: " + ", ".join(cells))
        p()
        p("; ".join(seq))
        sw, rw, cr = params.get("seq-write", {}), params.get("rand-write", {}), params.get("create", {})
        if sw:
            p(f"sizes: one file of {sw.get('file_bytes', 0) >> 20} MiB; {rw.get('ios', '-')} random "
              f"4 KiB writes and reads in it, an fsync every {rw.get('fsync_every', '-')} writes; "
              f"{cr.get('files', '-')} empty files in {cr.get('dirs', '-')} directories "
              f"(the paper: 1 GB, 10,000, 100,000 in 100)")
        for c in runs.commands:
            p(f"reproduce with: {c}")


def fig5(run_dir, out):
    p = lambda *a: print(*a, file=out)
    p("NoFS Figure 5: macro-benchmarks, ops/s (sort: records of 100 bytes; Filebench:")
    p("flowops). Paper: NoFS matches ext2 and ext3 on sort (500 MB), fileserver and")
    p("webserver, and is 18% above ext3 on varmail.")
    for env, runs in each_env(run_dir, out, "fig5", [
            ("hdd", "On the HDD model, virtual time, in-process (sort's CPU time is not modeled)"),
            ("hddrot", HDDROT_TITLE),
            ("hddnb", HDDNB_TITLE),
            ("loop", "Through FUSE (ordo) and the kernel (ext4) on a loop device, real time"),
            ("ssd", "For reference, on the SSD model, virtual time, in-process")]):
        figure_table(out, runs, env, FIG5, lambda c: (c, ""), lambda c, x: x)
        cfgs = configs(env)
        s = runs.row(cfgs["NoFS"], "sort")
        if s and not s.get("error"):
            mb = s.get("params", {}).get("input_bytes", 0) / 1e6
            cpu = []
            for n, t in cfgs.items():
                r = runs.row(t, "sort")
                if r and not r.get("error"):
                    cpu.append(f"{n} {r.get('cpu_us_per_op', 0) * r.get('ops', 0) / 1e6:.2f} s")
            p()
            p(f"sort: {mb:.0f} MB; CPU time (the harness's and the ordo process's): " + ", ".join(cpu))
        for c in runs.commands:
            p(f"reproduce with: {c}")


def per_fsync(r, ordo_own=False):
    """(writes, KiB, flushes) per fsync: the kernel's counters, or ordo's
    own (flushes + FUA writes) when `ordo_own`."""
    if not r or r.get("error") or not r.get("fsyncs"):
        return None
    n = r["fsyncs"]
    if ordo_own:
        o = r.get("ordo")
        if not o:
            return None
        c = o["counters"]
        w = sum(k["writes"] for k in c["by_class"])
        b = sum(k["write_bytes"] for k in c["by_class"])
        fua = sum(k["fua_writes"] for k in c["by_class"])
        return (w / n, b / 1024 / n, (c["flushes"] + fua) / n)
    if r.get("writes_per_fsync") is None:
        return None
    return (r["writes_per_fsync"], r["kib_per_fsync"], r["flushes_per_fsync"])


def num(x, small=2):
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.{small}f}"


def fmt3(t):
    if t is None:
        return "-"
    return f"{num(t[0])} / {num(t[1], 1)} / {num(t[2])}"


def by_class(r):
    o = (r or {}).get("ordo")
    if not o or not r.get("fsyncs"):
        return "-"
    n = r["fsyncs"]
    ops_ = r.get("ops", 0)
    parts = []
    for k, v in sorted(o.get("by_class_per_op", {}).items()):
        w = v["writes"] * ops_ / n
        if w >= 0.005:
            parts.append(f"{k} {w:.2f}")
    return ", ".join(parts)


def fsync_table(run_dir, out):
    p = lambda *a: print(*a, file=out)
    p("Per fsync: device writes / KiB written / flushes, over the measured window (the")
    p("unmount's write-back included) divided by the fsyncs the workload timed. On the")
    p("loop device the kernel's counters (/sys/block/loopN/stat) for every target alike (a")
    p("FUA write counts as a flush there, as the block layer issues one); on the HDD model")
    p("ordo's own (flushes + FUA writes).")
    loop = Runs(run_dir, "loop", ["fig4", "fig5"])
    hdd = Runs(run_dir, "hdd", ["fig4", "fig5"])
    p()
    head = f"{'workload':<12}{'NoFS (loop)':>20}{'ext3 (loop)':>20}{'ext4 (loop)':>20}{'NoFS (HDD)':>20}{'ext3 (HDD)':>20}"
    p(head)
    p("-" * len(head))
    verdict = []
    for w, c in FSYNC_HEAVY:
        label = c or w
        b = per_fsync(loop.row(LOOP["NoFS"], w, c))
        j = per_fsync(loop.row(LOOP["ext3"], w, c))
        k = per_fsync(loop.row(LOOP["ext4"], w, c))
        hb = per_fsync(hdd.row(HDD["NoFS"], w, c), True)
        hj = per_fsync(hdd.row(HDD["ext3"], w, c), True)
        p(f"{label:<12}{fmt3(b):>20}{fmt3(j):>20}{fmt3(k):>20}{fmt3(hb):>20}{fmt3(hj):>20}")
        if b and k:
            verdict.append(
                f"  {label}: NoFS {'fewer' if b[2] < k[2] else 'NOT fewer'} flushes per fsync than ext4 "
                f"({num(b[2])} vs {num(k[2])}), {'fewer' if b[0] < k[0] else 'NOT fewer'} writes "
                f"({num(b[0])} vs {num(k[0])}), {'fewer' if b[1] < k[1] else 'NOT fewer'} KiB "
                f"({num(b[1], 1)} vs {num(k[1], 1)})")
    p()
    p("NoFS against the kernel's ext4 (loop device, the kernel's counters):")
    for v in verdict:
        p(v)
    p()
    p("NoFS's writes per fsync by block class on the HDD model (ordo's counters):")
    for w, c in FSYNC_HEAVY:
        r = hdd.row(HDD["NoFS"], w, c)
        j = hdd.row(HDD["ext3"], w, c)
        p(f"  {c or w}: NoFS {by_class(r)}; ext3 {by_class(j)}")


def goals(run_dir, out):
    p = lambda *a: print(*a, file=out)
    hdd = Runs(run_dir, "hdd", ["fig4", "fig5"])
    rot = Runs(run_dir, "hddrot", ["fig4", "fig5"])
    loop = Runs(run_dir, "loop", ["fig4", "fig5"])
    ssd = Runs(run_dir, "ssd", ["fig4", "fig5"])
    nb = Runs(run_dir, "hddnb", ["fig4", "fig5"])
    p("The goals (the issue's, not tests): on the HDD model, in the same run, NoFS")
    p("(backpointers) against ext3 (journal) at least 2x on creates, 1.7x on deletes,")
    p("1.18x on varmail; on the model as it is (no rotational position: the block after")
    p("the last one written is always under the head) and with rot=on. Then the paper's")
    p("configuration on the model as it is: neither side flushes (`nobarrier`; its ext3")
    p("ran with barrier=0, its NoFS on ext2), so no fsync is durable. For reference")
    p("beside them: the loop device's ratios, and the SSD model's (where a flush, not a")
    p("seek, is what an fsync costs).")
    p()
    head = (f"{'goal':<22}{'HDD ratio':>11}{'verdict':>9}{'rot=on':>9}{'verdict':>9}"
            f"{'nobarrier':>11}{'verdict':>9}"
            f"{'loop /ext3':>12}{'loop /ext4':>12}{'SSD /ext3':>11}")
    p(head)
    p("-" * len(head))

    def verdict(b, j, want):
        if not b or not j:
            return "-"
        return "MET" if b / j >= want else "NOT MET"

    for w, c, want in GOALS:
        label = f"{c or w} >= {want:g}x ext3"
        b, j = ops(hdd.row(HDD["NoFS"], w, c)), ops(hdd.row(HDD["ext3"], w, c))
        rb, rj = ops(rot.row(HDD["NoFS"], w, c)), ops(rot.row(HDD["ext3"], w, c))
        lb, lj, lk = (ops(loop.row(LOOP[n], w, c)) for n in ("NoFS", "ext3", "ext4"))
        sb, sj = (ops(ssd.row(HDD[n], w, c)) for n in ("NoFS", "ext3"))
        nbb, nbj = (ops(nb.row(HDDNB[n], w, c)) for n in ("NoFS", "ext3"))
        p(f"{label:<22}{fmt_ratio(b, j):>11}{verdict(b, j, want):>9}{fmt_ratio(rb, rj):>9}"
          f"{verdict(rb, rj, want):>9}{fmt_ratio(nbb, nbj):>11}{verdict(nbb, nbj, want):>9}"
          f"{fmt_ratio(lb, lj):>12}{fmt_ratio(lb, lk):>12}{fmt_ratio(sb, sj):>11}")
    scan = load(os.path.join(run_dir, "fig6.json"))
    if scan:
        bp = [r for r in scan.get("runs", []) if r.get("mode") == "backpointers" and not r.get("error")]
        if bp:
            full = max(bp, key=lambda r: r["data_mib"])
            ok = full["total_s"] < 10
            p(f"{'1 GiB scan < 10 s':<22}{full['total_s']:>11.2f}s{'MET' if ok else 'NOT MET':>10}"
              f"   ({full['image_mib']} MiB image, {full['data_mib']} MiB of data, mount + scan, virtual)")
    p()
    p("Per fsync on the HDD model (ordo's counters: writes / KiB / flushes + FUA), and the")
    p("virtual time of an fsync (median; with rot=on after the slash); then the same with")
    p("nobarrier, and the mean virtual time per operation there (no flush: the disk's")
    p("cache takes the writes and destages them when it fills, in block order, a block")
    p("rewritten in it written once):")
    for w, c, _ in GOALS:
        for n, t in HDD.items():
            r = hdd.row(t, w, c)
            rr = rot.row(t, w, c)
            if r and not r.get("error"):
                on = (f" / {(rr.get('fsync_us_p50') or 0) / 1000:.2f} ms"
                      if rr and not rr.get("error") else "")
                p(f"  {c or w:<8} {n:<5} {fmt3(per_fsync(r, True)):>22}   fsync p50 "
                  f"{(r.get('fsync_us_p50') or 0) / 1000:.2f} ms{on}   [{by_class(r)}]")
    for w, c, _ in GOALS:
        for n, t in HDDNB.items():
            r = nb.row(t, w, c)
            if r and not r.get("error") and ops(r):
                p(f"  {c or w:<8} {n:<5} nobarrier {fmt3(per_fsync(r, True)):>22}   "
                  f"{1000 / ops(r):.2f} ms per operation   [{by_class(r)}]")


# Table 3: the paper's rows (blocks dropped, the error, ext2's and NoFS's
# action), keyed by the explorer's sequence names (workload nofs-table3).
TABLE3 = [
    ("mkdir-C-inode", "C-inode", "P-BD, C-OB", "-", "R, C-EI"),
    ("mkdir-C-dir", "C-dir", "C-BD", "C-ED", "C-ED"),
    ("mkdir-P-dir", "P-dir", "C-OI, C-OB", "-", "R"),
    ("mkdir-C-inode+C-dir", "C-inode, C-dir", "P-BD, C-BD", "-", "C-EI"),
    ("mkdir-C-inode+P-dir", "C-inode, P-dir", "C-OB", "-", "R"),
    ("mkdir-C-dir+P-dir", "C-dir, P-dir", "C-OI", "-", "R"),
    ("link-C-inode", "C-inode", "C-HL", "-", "C-EN"),
    ("link-P-dir", "P-dir", "C-OI", "-", "R"),
    ("unlink-C-inode", "C-inode", "C-HL", "-", "C-EO"),
    ("unlink-O-dir", "O-dir", "P-BD", "-", "C-EI"),
    ("rename-N-dir", "N-dir", "O-BD", "-", "C-EI"),
    ("rename-O-dir", "O-dir", "C-OI", "-", "R"),
    ("write-C-data", "C-data", "C-GD", "-", "C-EB"),
    ("write-C-ind", "C-ind", "C-GD", "-", "C-EB"),
    ("write-C-inode+C-data", "C-inode, C-data", "C-OB", "-", "R"),
    ("write-C-inode+C-ind", "C-inode, C-ind", "C-OB", "-", "R"),
    ("write-C-data+C-ind", "C-data, C-ind", "C-GD", "-", "C-EB"),
    ("delete-create", "O-dir", "O-BD", "-", "C-EO"),
    ("truncate-write", "O-inode", "O-TP", "-", "O-EB"),
    ("unlink-link", "O-dir", "O-BD", "-", "C-EO"),
]
# What async's failures say, in the paper's error key (first match wins).
ASYNC_FINDINGS = [
    ("unused inode", "BD"), ("names unused", "BD"), ('missing its "."', "BD"),
    ("rec_len", "BD"), ("checksum tail", "BD"), ("i_links_count", "HL"),
    ("not connected", "OI"), ("eh_magic", "GD"), ("holds bytes written by", "TP"),
    ("h_refcount", "xattr refcount"), ("i_size", "size"), ("i_blocks", "i_blocks"),
    ("ENOENT", "name lost"),
]
# What the scanners and the checks did, by the explorer's notes.
NOFS_ACTIONS = [
    ("nofs_scan_entry_removed", "entry removed"),
    ("nofs_lookup_refused", "lookup ENOENT/EIO"),
    ("nofs_orphan_relinked", "orphan relinked"),
    ("nofs_scan_inode_reclaimed", "inode reclaimed"),
    ("nofs_scan_link_fixed", "links fixed"),
    ("nofs_read_eio", "read EIO"),
    ("nofs_scan_conflict_cut", "shared block cut"),
    ("nofs_scan_map_rebuilt", "map rebuilt"),
    ("nofs_scan_bits_fixed", "bitmaps rebuilt (R)"),
]


def table3(run_dir, out):
    p = lambda *a: print(*a, file=out)
    a = load(os.path.join(run_dir, "table3-async.json"))
    b = load(os.path.join(run_dir, "table3-backpointers.json"))
    p("NoFS Table 3: the 20 dropped-write cases (`ordo crash --workload nofs-table3`).")
    p("Each case's operations end in a sync, so every write they make is in one")
    p("unflushed epoch; the explorer drops every subset of those writes (up to 256")
    p("per crash point), the paper's dropped blocks among them, recovers each state")
    p("and checks it: async (the paper's ext2) with ordo's fsck and the promises,")
    p("backpointers with the NoFS property (docs/CRASH.md section 4c: the scanners")
    p("run, every name, read and promise is checked, the disk is filled and every")
    p("file re-read).")
    p()
    if not a or not b:
        p("(no runs: WORKLOADS=nofs scripts/results.sh makes them)")
        return
    p(f"{'case':<21} {'dropped':<16} {'paper: error':<12} {'ext2':<5} {'NoFS':<8}"
      f" {'async: failing':>15}  {'what async left':<28} {'NoFS: failing':>14}  what backpointers did (states)")
    p("-" * 170)
    for name, dropped, err, ext2, nofs in TABLE3:
        key = f"nofs-table3/{name}"
        ta = a.get("by_sequence", {}).get(key, {})
        tb = b.get("by_sequence", {}).get(key, {})
        found = {}
        for f in a.get("failures", []):
            if f.get("sequence") != key:
                continue
            for det in f.get("details", []):
                for pat, code in ASYNC_FINDINGS:
                    if pat in det:
                        found[code] = found.get(code, 0) + 1
                        break
        left = ", ".join(sorted(found, key=lambda k: -found[k])) or "nothing wrong"
        did = ", ".join(f"{label} {tb['notes'][n]}" for n, label in NOFS_ACTIONS
                        if tb.get("notes", {}).get(n))
        p(f"{name:<21} {dropped:<16} {err:<12} {ext2:<5} {nofs:<8}"
          f" {ta.get('failing', 0):>6} of {ta.get('checked', 0):<6}  {left:<28}"
          f" {tb.get('failing', 0):>5} of {tb.get('checked', 0):<6}  {did}")
    p()
    p(f"Totals: async {a.get('failures_total', 0)} of {a.get('checked', 0)} states fail;"
      f" backpointers {b.get('failures_total', 0)} of {b.get('checked', 0)}"
      f" (every state's disk filled and re-read: {b.get('notes', {}).get('nofs_disk_filled', 0)}).")
    p("Paper key: C child, P parent, O/N old/new; BD bad directory entry, OB orphan block,")
    p("OI orphan inode, HL wrong link count, GD garbage data, TP two inodes share a block;")
    p("R reclaimed by the scan, EI/ED/EB error on inode/data/block access, EN/EO error on")
    p("the new/old path. async's findings use the same key where one applies (async has")
    p("no scan: orphan blocks and inodes are leaks its fsck repairs, not failures).")
    p("NoFS's actions are counts of states in which the scanners or the checks did it.")
    p()
    p("reproduce with: ordo crash --workload nofs-table3 --mode async --json A.json;")
    p("  ORDO_NOFS_FILL_EVERY=1 ordo crash --workload nofs-table3 --mode backpointers --json B.json")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "docs/results"
    run_dir = os.path.join(out_dir, "nofs-runs")
    for name, f in [("nofs-table3", table3), ("nofs-fig4", fig4), ("nofs-fig5", fig5), ("nofs-fsync", fsync_table),
                    ("nofs-goals", goals)]:
        with open(os.path.join(out_dir, f"{name}.txt"), "w") as out:
            f(run_dir, out)
            print(file=out)
            print("reproduce all with: WORKLOADS=nofs scripts/results.sh", file=out)


if __name__ == "__main__":
    main()
