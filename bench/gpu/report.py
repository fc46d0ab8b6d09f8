"""Writes results.md (side-by-side forward and backward tables, the sm90 ablation table when the run has one,
correctness, sanitizer, environment) and plots.png (TFLOP/s vs seqlen, one panel per direction x mask x head
dim) from what run.sh collected. Reads CSVs of older runs too (no ours_sm80 column, no ablation rows).

  python3 report.py --out OUTDIR --work WORKDIR
Reads OUTDIR/results.csv and, when present, WORKDIR/{env,check,ctest,sanitizer,build}.json.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
from collections import defaultdict

BACKENDS = ("ours", "ours_sm80", "cudnn", "flash2", "fa4")
LABEL = {"ours": "ours", "ours_sm80": "ours sm80", "cudnn": "cuDNN", "flash2": "FA2", "fa4": "FA4"}


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_rows(path):
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def attention_table(rows):
    """{(kind, dtype, hdim, causal, seqlen, batch, heads): {backend: row}}"""
    t = defaultdict(dict)
    for r in rows:
        if r["kind"] in ("fwd", "bwd"):
            key = (r["kind"], r["dtype"], int(r["hdim"]), int(r["causal"]), int(r["seqlen"]), r["batch"], r["heads"])
            t[key][r["backend"]] = r
    return t


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "–"


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def tflops(cell):
    """{backend: TFLOP/s or None} of one table cell."""
    return {b: num(cell[b]["tflops"]) if b in cell else None for b in BACKENDS}


def fmt(r):
    v = num(r.get("tflops")) if r else None
    return f"{v:.1f}" if v is not None else "n/a"


def markdown(out_dir, work, rows):
    env = load_json(os.path.join(work, "env.json")) or {}
    check = load_json(os.path.join(work, "check.json"))
    ctest = load_json(os.path.join(work, "ctest.json"))
    san = load_json(os.path.join(work, "sanitizer.json"))
    build = load_json(os.path.join(work, "build.json")) or {}
    mock = build.get("python", "").startswith("MOCK")
    ours_col = "ours (MOCK: not our kernels)" if mock else "ours"
    L = [f"# flashattn on {env.get('device', '?')} — {env.get('date', '?')}", ""]
    L.append(f"Mode: **{env.get('mode', '?')}**. torch {env.get('torch', '?')} (CUDA {env.get('cuda', '?')}), "
             f"cuDNN {env.get('cudnn', '?')}, triton {env.get('triton', '?')}, Python {env.get('python', '?')}, "
             f"driver {env.get('driver', '?')}, nvcc {env.get('nvcc', '?')}. Commit {env.get('commit', '?')}.")
    L.append("")
    L.append(f"Build: {build.get('summary', 'n/a')}  ")
    L.append(f"Python package: {build.get('python', 'n/a')}")
    L += ["", "## Correctness", ""]
    L.append(f"- C++ GPU suite: {ctest.get('gpu', 'n/a') if ctest else 'n/a'}")
    L.append(f"- C++ CPU suite (`ctest -LE gpu`): {ctest.get('cpu', 'n/a') if ctest else 'n/a'}")
    L.append(f"- Python package tests (`pytest tests/python`, torch + CUDA cases): "
             f"{ctest.get('pytest', 'n/a') if ctest else 'n/a'}")
    if check:
        L.append(f"- Python GPU suite (check.py, {check.get('mode')}, seed {check.get('seed')}): "
                 f"**{check['summary']}**; {check.get('ours', '')}")
        if check.get("failures"):
            L.append("  - failed: " + "; ".join(check["failures"][:15]))
    else:
        L.append("- Python GPU suite: did not run (see check.log)")
    L += ["", "## Sanitizer", ""]
    if san:
        for item in san.get("runs", []):
            L.append(f"- {item['tool']} on {item['target']}: {item['result']}")
        if san.get("note") or not san.get("runs"):
            L.append(f"- {san.get('note') or 'nothing ran'}")
        if san.get("localised"):
            L.append("- check.py --tiny was not clean; each tiny case rerun alone (check.py --tiny --cases):")
            for item in san["localised"]:
                L.append(f"  - {item['tool']}, `{item['case']}`: {item['result']}")
            for tool in dict.fromkeys(i["tool"] for i in san["localised"]):
                if all(i["clean"] is True for i in san["localised"] if i["tool"] == tool):
                    L.append(f"  - {tool}: every case is clean alone: the failure needs the cases in one process "
                             "(or is intermittent)")
            for item in san["localised"]:
                if item.get("tail"):
                    L += ["", f"{item['tool']}, `{item['case']}` alone, end of its log:", "", "```",
                          item["tail"], "```"]
    else:
        L.append("- did not run (see sanitizer.log)")

    L += ["", "## Throughput (TFLOP/s, higher is better)", ""]
    L.append("16k tokens per batch, model dim 2048 (heads = 2048/d), (B,S,H,D) storage; triton do_bench median; "
             "FLOPs 4·B·H·S²·D (/2 causal), bwd ×2.5. cuDNN and FA2 are torch SDPA backends in the same process; FA4, "
             "where present, is FlashAttention-4 (PyPI flash-attn-4) in the same process.")
    L.append("")
    table = attention_table(rows)
    # The cuda-sm80 forward (ours_sm80) gets its own column where the run measured it (not in older CSVs).
    sm80 = any("ours_sm80" in cell for cell in table.values())
    # FlashAttention-4 gets a column and a ratio where the run had it as a live peer (bench.py: fa4_rows).
    fa4 = any("fa4" in cell for cell in table.values())
    for kind, title in (("fwd", "Forward"), ("bwd", "Backward")):
        keys = sorted((k for k in table if k[0] == kind), key=lambda k: k[1:5])
        if not keys:
            continue
        extra = kind == "fwd" and sm80
        L += ["", f"### {title}", ""]
        if kind == "fwd":
            L.append("ours = `flash_attn_func` (backend AUTO)" +
                     ("; ours sm80 = `flashattn.ops.forward(..., backend=\"cuda-sm80\")` into caller-owned "
                      "out/lse." if extra else "."))
            L.append("")
        L.append(f"| dir | dtype | d | causal | seqlen | B×H | {ours_col} | " + ("ours sm80 | " if extra else "") +
                 "cuDNN | FA2 | " + ("FA4 | " if fa4 else "") + "ours/cuDNN | ours/FA2 | " +
                 ("ours/FA4 | " if fa4 else "") + ("sm80/FA2 | " if extra else "") + "note |")
        L.append("|---" * (12 + 2 * extra + 2 * fa4) + "|")
        for key in keys:
            _, dt, d, causal, s, batch, heads = key
            cell = table[key]
            t = tflops(cell)
            note = (cell.get("ours") or {}).get("note", "")
            if extra and (cell.get("ours_sm80") or {}).get("note"):
                note = (note + "; " if note else "") + "sm80: " + cell["ours_sm80"]["note"]
            L.append(f"| {kind} | {dt} | {d} | {'yes' if causal else 'no'} | {s} | {batch}×{heads} | "
                     f"{fmt(cell.get('ours'))} | " + (f"{fmt(cell.get('ours_sm80'))} | " if extra else "") +
                     f"{fmt(cell.get('cudnn'))} | {fmt(cell.get('flash2'))} | " +
                     (f"{fmt(cell.get('fa4'))} | " if fa4 else "") +
                     f"{ratio(t['ours'], t['cudnn'])} | {ratio(t['ours'], t['flash2'])} | " +
                     (f"{ratio(t['ours'], t['fa4'])} | " if fa4 else "") +
                     (f"{ratio(t['ours_sm80'], t['flash2'])} | " if extra else "") + f"{note} |")
        pairs = [("ours/cuDNN", "ours", "cudnn"), ("ours/FA2", "ours", "flash2")]
        pairs += [("ours/FA4", "ours", "fa4")] if fa4 else []
        pairs += [("sm80/FA2", "ours_sm80", "flash2")] if extra else []
        means = [(label, geomean([t[a] / t[b] for t in (tflops(table[k]) for k in keys) if t[a] and t[b]]))
                 for label, a, b in pairs]
        L += ["", f"Geometric means ({kind}, over the shapes measured): " +
              "; ".join(f"{label} {m:.2f}" if m else f"{label} –" for label, m in means) + "."]
    L += ablation_table(rows)
    L += decode_table(rows)
    L += feature_table(rows, "sink", "Learnable sinks")
    L += feature_table(rows, "dropout", "Dropout p = 0.1")
    L += fp8_table(rows)
    mem = [r for r in rows if r["kind"] == "memory"]
    if mem:
        L += ["", "## Peak extra memory (MiB above the inputs; bf16, 1×16k×16 heads, d128, causal)", "",
              "| backend | fwd | fwd+bwd |", "|---|---|---|"]
        per = defaultdict(dict)
        for r in mem:
            direction = r["note"].split()[1].rstrip(":") if r["note"].startswith("peak_extra_MiB") else "fwd"
            value = r["tflops"] if num(r["tflops"]) is not None else "n/a (" + r["note"].partition(": ")[2] + ")"
            per[r["backend"]][direction] = value
        for name, v in per.items():
            label = ours_col if name == "ours" else LABEL.get(name, name)
            L.append(f"| {label} | {v.get('fwd', 'n/a')} | {v.get('fwd+bwd', 'n/a')} |")
    ceil = [r for r in rows if r["kind"] == "ceiling"]
    if ceil:
        L += ["", "## Ceilings measured in this run", ""]
        for r in ceil:
            L.append(f"- {r['backend']}: {r['ms']} ms, {r['tflops']} {r['note']}")
    L += ["", "Logs: build.log, check.log, sanitizer.log, bench.log; raw numbers: results.csv; plots: plots.png.", ""]
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(L))


def feature_kind(feature):
    """The results.csv kind prefix of a feature's cost rows ('sinks' predates the others)."""
    return "sinks" if feature == "sink" else feature


def feature_table(rows, feature, title):
    """Markdown lines: ours with and without a feature (bench.py feature_rows), forward and backward, its cost."""
    prefix = feature_kind(feature)
    sk = [r for r in rows if r["kind"] in (f"{prefix}_fwd", f"{prefix}_bwd")]
    if not sk:
        return []
    per = defaultdict(dict)
    for r in sk:
        per[(r["kind"], int(r["causal"]))][r["backend"]] = num(r["ms"])
    L = ["", f"## {title} ({sk[0]['dtype']} d{sk[0]['hdim']}, {sk[0]['batch']}×{sk[0]['seqlen']}, "
         f"{sk[0]['heads']} heads; ms)", "", f"| pass | causal | without | with {feature} | cost |",
         "|---|---|---|---|---|"]
    for (kind, causal), v in sorted(per.items()):
        a, w = v.get("ours"), v.get(f"ours_{feature}")
        cost = f"{(w / a - 1) * 100:+.1f}%" if a and w else "–"
        L.append(f"| {kind.split('_')[1]} | {'yes' if causal else 'no'} | {a if a else 'n/a'} | "
                 f"{w if w else 'n/a'} | {cost} |")
    return L


# FlashAttention-3's FP8 forward, non-causal 16k tokens (../shared/anchors/fa3_fp8_h200_2026-11-30.tsv): the bar.
FA3_FP8_16K = {64: 641.0, 128: 894.0, 256: 1149.0}


def fp8_table(rows):
    """Markdown lines: the FP8 forward (bench.py fp8_rows) beside our bf16 and cuDNN's, and the accuracy rows."""
    fwd = [r for r in rows if r["kind"] == "fp8_fwd"]
    acc = [r for r in rows if r["kind"] == "fp8_rmse"]
    L = []
    if fwd:
        per = defaultdict(dict)
        for r in fwd:
            per[(int(r["hdim"]), int(r["causal"]), int(r["seqlen"]))][r["backend"]] = r
        L += ["", "## FP8 forward (e4m3 q/k/v, per-(batch, head) factors, bf16 out; TFLOP/s; bf16 rows: the same "
              "values in bf16)", "", "| d | causal | seqlen | ours FP8 | ours bf16 | cuDNN bf16 | FP8 / ours bf16 | "
              "FP8 / FA3 FP8 (16k, non-causal) | note |", "|---|---|---|---|---|---|---|---|---|"]
        for (d, causal, s), got in sorted(per.items()):
            t = {k: num(v["tflops"]) for k, v in got.items()}
            fa3 = FA3_FP8_16K.get(d) if s == 16384 and not causal else None
            note = (got.get("ours_fp8") or {}).get("note", "")
            L.append(f"| {d} | {'yes' if causal else 'no'} | {s} | {fmt(got.get('ours_fp8'))} | "
                     f"{fmt(got.get('ours'))} | {fmt(got.get('cudnn'))} | {ratio(t.get('ours_fp8'), t.get('ours'))} | "
                     f"{ratio(t.get('ours_fp8'), fa3) if fa3 else '–'} | {note} |")
    if acc:
        L += ["", "## FP8 accuracy (d128, 2k, outlier inputs N(0,1) + N(0,100)·Bernoulli(0.001); RMSE vs float64)",
              "", "| inputs | RMSE |", "|---|---|"]
        L += [f"| {r['backend']} | {r['tflops']} |" for r in acc]
    return L


def decode_table(rows):
    """Markdown lines: decode TB/s (K+V read) of cuDNN and ours (contiguous and paged caches), ours / cuDNN."""
    dec = [r for r in rows if r["kind"].startswith("decode")]
    if not dec:
        return []
    shapes = sorted({(int(r["batch"]), int(r["seqlen"])) for r in dec}, key=lambda x: (x[1] * x[0], x[0]))
    per = defaultdict(dict)
    for r in dec:
        per[(int(r["batch"]), int(r["seqlen"]))][(r["kind"], r["backend"])] = r
    cols = [("decode", "cudnn", "cuDNN"), ("decode", "ours", "ours"), ("decode_paged16", "ours", "ours paged 16"),
            ("decode_paged256", "ours", "ours paged 256"), ("decode_paged1", "ours", "ours paged 1"),
            ("decode", "ours_nosplit", "ours, no split-KV")]
    L = ["", f"## Decode ({dec[0]['dtype']}, one query token, GQA {dec[0]['heads']}, d{dec[0]['hdim']}; TB/s of K+V)",
         "", "| B × keys | " + " | ".join(c[2] for c in cols) + " | ours / cuDNN | paged 16 / ours | note |",
         "|---" * (len(cols) + 4) + "|"]
    for shape in shapes:
        got = per[shape]
        vals = [num(got[(k, b)]["tflops"]) if (k, b) in got else None for k, b, _ in cols]
        ratio = f"{vals[1] / vals[0]:.2f}" if vals[0] and vals[1] else "–"
        paged = f"{vals[2] / vals[1]:.2f}" if vals[1] and vals[2] else "–"
        notes = "; ".join(sorted({r["note"] for r in got.values() if r["note"]}))[:120]
        L.append(f"| {shape[0]} × {shape[1]} | " + " | ".join(f"{v:.2f}" if v else "n/a" for v in vals) +
                 f" | {ratio} | {paged} | {notes} |")
    return L


def ablation_table(rows):
    """Markdown lines: TFLOP/s of each sm90 forward variant per shape, with its ratio to the default; one table per
    head dim (bench.py times a _d64 / _d256 variant at that head dim)."""
    L = []
    for d in sorted({int(r["hdim"]) for r in rows if r["kind"] == "ablation"}):
        L += ablation_table_at(rows, d)
    return L


def ablation_table_at(rows, hdim):
    abl = [r for r in rows if r["kind"] == "ablation" and int(r["hdim"]) == hdim]
    if not abl:
        return []
    shapes = sorted({(int(r["causal"]), int(r["seqlen"])) for r in abl})
    per = defaultdict(dict)  # backend -> shape -> row
    for r in abl:
        per[r["backend"]][(int(r["causal"]), int(r["seqlen"]))] = r
    # The run's order (bench.py's variant list), the default first and cuDNN last.
    names = sorted(per, key=lambda n: (n != "default", n == "cudnn"))
    d, dt = abl[0]["hdim"], abl[0]["dtype"]
    L = ["", f"## Ablation (sm90 forward, {dt} d{d})", "",
         "TFLOP/s per FLASHATTN_SM90_MECHANISMS variant (ratio to the default kernel); 16k tokens, model dim 2048; "
         "cuDNN for reference. A build without the variants runs the default kernel for every name.", "",
         "| variant | " + " | ".join(f"{'causal' if c else 'non-causal'} {s}" for c, s in shapes) +
         " | geomean vs default | note |",
         "|---" * (len(shapes) + 3) + "|"]
    default = per.get("default", {})
    for name in names:
        cells, ratios, notes = [], [], set()
        for shape in shapes:
            r = per[name].get(shape)
            v = num(r["tflops"]) if r else None
            ref = num(default[shape]["tflops"]) if shape in default else None
            ratio = f" ({v / ref:.2f})" if v is not None and ref and name != "default" else ""
            cells.append("n/a" if v is None else f"{v:.1f}{ratio}")
            if v is not None and ref:
                ratios.append(v / ref)
            if r and r.get("note") and (v is None or "NONFINITE" in r["note"]):
                notes.add(r["note"][:70])
        worst = max((float(r["note"].split("maxdiff_vs_cudnn=")[1].split()[0]) for r in per[name].values()
                     if "maxdiff_vs_cudnn=" in (r.get("note") or "")), default=None)
        if worst is not None:
            notes.add(f"max diff vs cuDNN {worst:.1e}")
        g = geomean(ratios) if name != "default" else None
        L.append(f"| {name} | " + " | ".join(cells) + f" | {f'{g:.2f}' if g else '–'} | {'; '.join(sorted(notes))} |")
    return L


def plots(out_dir, rows, mock=False):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    table = attention_table(rows)
    if not table:
        return
    kinds = sorted({k[0] for k in table}, key=lambda k: k != "fwd")
    causals = sorted({k[3] for k in table})
    hdims = sorted({k[2] for k in table})
    dtypes = sorted({k[1] for k in table})
    panels = [(kind, c) for kind in kinds for c in causals]
    fig, axes = plt.subplots(len(panels), len(hdims), figsize=(4.2 * len(hdims), 3.2 * len(panels)), squeeze=False)
    style = {"ours": ("tab:red", "o"), "ours_sm80": ("tab:orange", "v"), "cudnn": ("tab:blue", "s"),
             "flash2": ("tab:green", "^"), "fa4": ("tab:purple", "D")}
    for pi, (kind, c) in enumerate(panels):
        for hi, d in enumerate(hdims):
            ax = axes[pi][hi]
            for dt in dtypes:
                for b in BACKENDS:
                    pts = sorted((k[4], num(v[b]["tflops"])) for k, v in table.items()
                                 if k[0] == kind and k[1] == dt and k[2] == d and k[3] == c and b in v
                                 and num(v[b]["tflops"]) is not None)
                    if pts:
                        color, marker = style[b]
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker,
                                linestyle="-" if dt == "bf16" else "--",
                                label=f"{LABEL[b]}{' (MOCK)' if mock and b.startswith('ours') else ''} {dt}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{kind} d{d} {'causal' if c else 'non-causal'}", fontsize=10)
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=max(1, len(labels)), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(os.path.join(out_dir, "plots.png"), dpi=90)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    rows = load_rows(os.path.join(a.out, "results.csv"))
    markdown(a.out, a.work, rows)
    try:
        build = load_json(os.path.join(a.work, "build.json")) or {}
        plots(a.out, rows, build.get("python", "").startswith("MOCK"))
    except Exception as e:  # a missing matplotlib must not cost the table
        print(f"report: no plots ({type(e).__name__}: {e})")


if __name__ == "__main__":
    main()
