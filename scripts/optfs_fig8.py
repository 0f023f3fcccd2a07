#!/usr/bin/env python3
"""OptFS Figure 8 from the bench JSON in docs/results/: each workload's
ops/s as a ratio to ordo's `journal` (JBD2 with flushes) in the same run,
on the loop device (optfs-W-loop.json) and on the HDD model in virtual time
(optfs-W-hdd.json), beside the paper's ratio to ext4 ordered with flushes.

    scripts/optfs_fig8.py docs/results > docs/results/optfs-fig8.txt
"""
import os
import sys

from benchjson import load

WORKLOADS = ["seqwrite", "overwrite", "randwrite", "createfiles", "fileserver",
             "webserver", "varmail", "oltp"]
# Figure 8 of the paper, normalised to ext4 ordered with flushes (OptFS
# column; the text gives these in words).
PAPER = {"seqwrite": "~1x", "overwrite": "0.5x", "randwrite": "3x", "createfiles": "2x",
         "fileserver": "~nobarrier", "webserver": "~nobarrier", "varmail": "7x",
         "oltp": "10x (MySQL)"}
LOOP = ["ext4:ordered", "ext4:nobarrier", "ordo:journal", "ordo:optimistic",
        "ordo:optimistic,fsync=osync"]
LABEL = {"ext4:ordered": "ext4 ordered", "ext4:nobarrier": "ext4 nobarrier",
         "ordo:journal": "journal", "ordo:optimistic": "optimistic dsync",
         "ordo:optimistic,fsync=osync": "optimistic osync"}
HDD = ["ordo-lib:journal", "ordo-lib:optimistic", "ordo-lib:optimistic,fsync=osync"]


def rows(path, case=None):
    d = load(path)
    if d is None:
        return None
    out = {}
    for r in d.get("results", []):
        if case and r.get("case") and r["case"] != case:
            continue
        if r.get("ops_per_sec"):
            out[r["target"]] = r
    return out


def fmt(x):
    return "-" if x is None else (f"{x:.2f}x" if x < 10 else f"{x:.0f}x")


def table(title, kind, targets, base, out_dir):
    print(title)
    print()
    head = ["workload"] + [LABEL[t.replace("ordo-lib:", "ordo:")] for t in targets] + [
        f"{base} ops/s", "paper (OptFS)"]
    widths = [12] + [max(16, len(h)) for h in head[1:]]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for w in WORKLOADS:
        r = rows(os.path.join(out_dir, f"optfs-{w}-{kind}.json"),
                 case="n=1000" if w == "randwrite" else None)
        if not r:
            cells = ["(not run)"] + [""] * (len(targets)) + [PAPER[w]]
        else:
            b = r.get(base, {}).get("ops_per_sec")
            cells = [fmt(r[t]["ops_per_sec"] / b) if b and t in r else "-" for t in targets]
            cells += [f"{b:,.0f}" if b else "-", PAPER[w]]
        print("  ".join(c.ljust(wd) for c, wd in zip([w] + cells, widths)))
    print()


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "docs/results"
    table("Figure 8 through FUSE on the loop device (real time), ops/s as a ratio to ordo:journal",
          "loop", LOOP, "ordo:journal", out_dir)
    table("Figure 8 on the HDD model (virtual time, in-process), ops/s as a ratio to journal",
          "hdd", HDD, "ordo-lib:journal", out_dir)
    print("randwrite: the n=1000 case (an fsync every 1,000 writes). oltp runs an external")
    print("program (sqlite3) and so needs a mount: it has no in-process HDD row.")
    print()
    print("reproduce with: WORKLOADS=optfs scripts/results.sh")


if __name__ == "__main__":
    main()
