#!/usr/bin/env python3
"""Read an Nsight Compute source page (`ncu -i R.ncu-rep --page source --csv --print-source sass`, as
bwd_peers_ncu.sh and sm90_bwd_loop.sh write it, gzipped or not) without the GUI.

  ncu_source.py FILE                      every kernel: samples, executed warp instructions, stall reasons, opcodes
  ncu_source.py FILE --kernel K --top N   kernel K's N instructions with the most samples (or --by stall_wait, ...)
  ncu_source.py FILE --kernel K --flow LO-HI
                                          SASS lines LO..HI condensed: GEMM, barrier, branch, fence and shared
                                          store lines shown, the runs between them summed (count, samples, opcodes)
  ncu_source.py FILE --kernel K --regions LO-HI [LO-HI ...]
                                          samples and stall reasons summed over each line range
  ncu_source.py FILE --kernel K --counts N
                                          the N largest groups of lines by execution count: a count is a role and a
                                          frequency (once per step of every consumer warp, once per consumer warp of
                                          a CTA, once per CTA, ...), so the groups split a kernel into its loop, its
                                          prologue/epilogue and its producer; their SASS lines, instructions,
                                          samples and stall reasons

Samples are warp-state samples: a warp waiting is sampled as often as one issuing, so the share of a region is the
share of warp time spent there (idle producer warps included). Lines are numbered from 0 within each kernel.
"""

import argparse
import collections
import csv
import gzip
import re

MARK = re.compile(r"HGMMA|DEPBAR|BAR\.|SYNCS|BRA|FENCE|ARRIVE|UBLKRED|STSM|LDL|STL|EXIT")


def kernels(path):
    opener = gzip.open if path.endswith(".gz") else open
    out, cur = [], None
    for row in csv.reader(opener(path, "rt")):
        if not row:
            continue
        if row[0] == "Kernel Name":
            cur = {"name": row[1], "rows": []}
            out.append(cur)
        elif row[0] == "Address" and cur is not None:
            cur["ix"] = {k: i for i, k in enumerate(row)}
            cur["stalls"] = [k for k in row if k.startswith("stall_") and "Not Issued" not in k]
        elif cur is not None:
            cur["rows"].append(row)
    return out


def num(row, ix, key):
    v = row[ix[key]] if key in ix else ""
    return int(v) if v.strip().lstrip("-").isdigit() else 0


def opcode(src):
    words = [w for w in src.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def samples_and_stalls(rows, k):
    """The rows' samples and their stall reasons (names without the stall_ prefix), summed."""
    stalls, n = collections.Counter(), 0
    for r in rows:
        n += num(r, k["ix"], "# Samples")
        for s in k["stalls"]:
            stalls[s[6:]] += num(r, k["ix"], s)
    return n, stalls


def stall_str(row, k, total, n=3):
    top = sorted(((num(row, k["ix"], s), s[6:]) for s in k["stalls"]), reverse=True)[:n]
    return " ".join(f"{name}:{v / total * 100:.2f}" for v, name in top if v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--kernel", type=int)
    ap.add_argument("--top", type=int)
    ap.add_argument("--by", default="# Samples", help="column to rank --top by (e.g. stall_wait)")
    ap.add_argument("--flow")
    ap.add_argument("--regions", nargs="+")
    ap.add_argument("--counts", type=int)
    a = ap.parse_args()
    ks = kernels(a.file)
    if a.kernel is None:
        for i, k in enumerate(ks):
            ix = k["ix"]
            total, stalls = samples_and_stalls(k["rows"], k)
            total = total or 1
            ops = collections.Counter()
            for r in k["rows"]:
                ops[opcode(r[ix["Source"]])] += num(r, ix, "Instructions Executed")
            inst = sum(ops.values())
            print(f"[{i}] {k['name'][:150]}")
            print(f"    samples {total}, warp instructions {inst / 1e6:.1f} M, {len(k['rows'])} SASS lines")
            print("    stalls: " + ", ".join(f"{s} {v / total * 100:.1f} %" for s, v in stalls.most_common(10)))
            print("    opcodes: " + ", ".join(f"{o} {v / 1e6:.1f} M" for o, v in ops.most_common(20)))
        return
    k = ks[a.kernel]
    ix = k["ix"]
    rows = k["rows"]
    total = sum(num(r, ix, "# Samples") for r in rows) or 1
    if a.top:
        ranked = sorted(range(len(rows)), key=lambda i: -num(rows[i], ix, a.by))[: a.top]
        for i in sorted(ranked):
            r = rows[i]
            n = num(r, ix, "# Samples")
            ex = num(r, ix, "Instructions Executed")
            print(
                f"{i:5d} {n / total * 100:5.2f}% ex={ex / 1e3:7.0f}k  {r[ix['Source']].strip()[:70]:70s} "
                f"{stall_str(r, k, total)}"
            )
    if a.flow:
        lo, hi = map(int, a.flow.split("-"))
        acc, cnt, ops = 0, 0, collections.Counter()

        def run_between():  # the instructions since the last marked line, summed
            if cnt:
                print(
                    f"      .. {cnt:3d} instructions {acc / total * 100:5.2f}%  "
                    + " ".join(f"{o}{c}" for o, c in ops.most_common(6))
                )

        for i in range(lo, min(hi + 1, len(rows))):
            r = rows[i]
            src = r[ix["Source"]].strip()
            n = num(r, ix, "# Samples")
            if MARK.search(src):
                run_between()
                acc, cnt, ops = 0, 0, collections.Counter()
                ex = num(r, ix, "Instructions Executed")
                print(f"{i:5d} {n / total * 100:5.2f}% ex={ex / 1e3:6.0f}k {src[:90]}")
            else:
                acc += n
                cnt += 1
                ops[opcode(src)] += 1
        run_between()
    if a.counts:
        groups = collections.defaultdict(list)
        for r in rows:
            groups[num(r, ix, "Instructions Executed")].append(r)
        ranked = sorted(groups.items(), key=lambda g: -samples_and_stalls(g[1], k)[0])[: a.counts]
        for ex, rs in ranked:
            n, stalls = samples_and_stalls(rs, k)
            print(
                f"count {ex:8d}: {len(rs):4d} lines, {ex * len(rs) / 1e6:6.2f} M instructions, "
                f"{n / total * 100:5.1f} % of samples  " + " ".join(f"{st}:{v}" for st, v in stalls.most_common(5))
            )
    for rg in a.regions or []:
        lo, hi = map(int, rg.split("-"))
        n, stalls = samples_and_stalls(rows[lo : hi + 1], k)
        print(f"{rg}: {n} samples ({n / total * 100:.1f} %) " + " ".join(f"{s}:{v}" for s, v in stalls.most_common(8)))


if __name__ == "__main__":
    main()
