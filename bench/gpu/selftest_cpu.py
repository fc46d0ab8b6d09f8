"""The harness's own test on a machine without a GPU (torch CPU, no triton, no compute-sanitizer).

  python3 bench/gpu/selftest_cpu.py [--keep DIR]

1. bench.py's row logic on tiny shapes with bench/gpu/mock standing in for ours (on the CPU): peers that
   refuse (cuDNN has no CPU kernel), ours fwd/bwd, ours_sm80 through flashattn.ops.forward, a package without
   ops, the deadline stop, and --ablations (the variable set per variant and restored, a variant that raises
   keeps its own NA row), --dtypes's table. triton's do_bench is replaced by a few timed calls.
2. report.py on that CSV and on the recorded 2026-11-30 H200 CSV (no ours_sm80, no ablation rows); plots
   only where matplotlib is installed.
3. run.sh's sanitizer step (its Python, taken from run.sh) with a fake compute-sanitizer that reports an
   internal sanitizer error for the varlen tiny case: the per-case reruns must name that case alone.
Exit status 0 when every assertion holds.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def stub_triton():
    """triton.testing.do_bench: the median of a few timed calls (bench.py imports it at module level), divided
    by 1e5 so that the tiny CPU shapes show TFLOP/s with digits (report.py's ratios need nonzero rates)."""
    def do_bench(fn, warmup=0, rep=0, return_mode="median"):
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts) / 1e5

    triton = types.ModuleType("triton")
    triton.__version__ = "stub"
    triton.testing = types.ModuleType("triton.testing")
    triton.testing.do_bench = do_bench
    sys.modules["triton"], sys.modules["triton.testing"] = triton, triton.testing


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_bench(tmp):
    stub_triton()
    sys.path[:0] = [HERE, os.path.join(HERE, "mock")]
    os.environ["FLASHATTN_BENCH_PACKAGE"] = "flashattn_mock"
    import bench  # noqa: PLC0415
    import common  # noqa: PLC0415

    # --dtypes narrows the training table (run.sh --training): bf16 alone is the 36 shapes of the bars.
    saved = bench.TRAINING_DTYPES
    bench.TRAINING_DTYPES = ("bf16",)
    table = list(bench.shapes(False))
    bench.TRAINING_DTYPES = saved
    assert len(table) == 36 and {s[0] for s in table} == {"bf16"}, table
    assert len(list(bench.shapes(False))) == 72

    bench.DEV = "cpu"
    bench.TOKENS, bench.MODEL_DIM = 256, 256
    bench.ABLATION_SEQLENS = (64, 128)
    bench.shapes = lambda quick: iter([("bf16", 64, False, 64), ("bf16", 128, True, 128)])
    ours = common.load_ours("cpu")
    assert ours.ok, ours.reason

    # Every ops.forward call records the variable it saw; one variant raises (an unknown name, say).
    seen = []
    real = ours.module.ops.forward

    def forward(*a, **kw):
        v = os.environ.get(bench.MECHANISMS_ENV)
        seen.append((kw.get("backend"), v))
        if v == "stages1":
            raise ValueError("FLASHATTN_SM90_MECHANISMS: unknown variant (test)")
        return real(*a, **kw)

    ours.module.ops.forward = forward
    os.environ[bench.MECHANISMS_ENV] = "before"
    path = os.path.join(tmp, "results.csv")
    b = bench.Bench(path, 1, 1)
    assert bench.attention_rows(b, ours, True, float("inf"))
    bench.ablation_rows(b, ours, float("inf"))
    assert os.environ[bench.MECHANISMS_ENV] == "before", "the variable was not restored"
    b.f.close()
    # Out of time: one 'not measured' row each, nothing else (a CSV of its own: the report reads the first).
    late = os.path.join(tmp, "late.csv")
    b = bench.Bench(late, 1, 1)
    assert not bench.attention_rows(b, ours, True, time.time())
    bench.ablation_rows(b, ours, time.time())
    b.f.close()
    ours.module.ops.forward = real
    rows, late_rows = read(path), read(late)
    assert len(late_rows) == 2 and all("budget ran out" in r["note"] for r in late_rows), late_rows

    fwd = {(r["backend"], r["seqlen"]) for r in rows if r["kind"] == "fwd" and r["ms"] != "NA"}
    assert {("ours", "64"), ("ours_sm80", "64"), ("flash2", "64")} <= fwd, fwd
    sm80 = [r for r in rows if r["backend"] == "ours_sm80" and r["ms"] != "NA"]
    assert all("maxdiff_vs_fa2=" in r["note"] for r in sm80), sm80
    assert all(r["note"].startswith("RuntimeError") for r in rows if r["backend"] == "cudnn" and r["kind"] == "fwd")
    abl = [r for r in rows if r["kind"] == "ablation"]
    timed = {r["backend"] for r in abl if r["ms"] != "NA"}
    assert timed == set(bench.ABLATION_VARIANTS) - {"stages1"}, timed
    assert all("ValueError" in r["note"] for r in abl if r["backend"] == "stages1"), "a raising variant"
    want = {(b_, "" if v == "default" else v) for v in bench.ABLATION_VARIANTS for b_ in ("cuda-sm90",)}
    assert want <= set(seen), set(seen)
    assert ("cuda-sm80", "before") in seen, "ours_sm80 runs with the caller's variable untouched"

    # A package without flashattn.ops: an NA row for ours_sm80, ours still timed.
    ops = ours.module.ops
    del ours.module.ops
    try:
        path2 = os.path.join(tmp, "noops.csv")
        b = bench.Bench(path2, 1, 1)
        bench.attention_rows(b, ours, True, float("inf"))
        b.f.close()
    finally:
        ours.module.ops = ops
    rows2 = read(path2)
    assert all(r["ms"] == "NA" and "AttributeError" in r["note"] for r in rows2 if r["backend"] == "ours_sm80")
    assert [r for r in rows2 if r["backend"] == "ours" and r["kind"] == "fwd" and r["ms"] != "NA"]
    print(f"bench.py: {len(rows)} rows, ablation variants timed {len(timed)}, the deadline and raising paths hold")
    return path


def test_report(tmp, csv_path, localised):
    out, work = os.path.join(tmp, "out"), os.path.join(tmp, "work")
    os.makedirs(out, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    shutil.copy(csv_path, os.path.join(out, "results.csv"))
    shutil.copy(localised, os.path.join(work, "sanitizer.json"))
    json.dump({"summary": "self-test", "python": "MOCK (self-test)"}, open(os.path.join(work, "build.json"), "w"))
    subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--out", out, "--work", work], check=True)
    md = open(os.path.join(out, "results.md")).read()
    for want in ("| ours sm80 |", "| sm80/FA2 |", "## Ablation (sm90 forward, bf16 d128)", "| no_pingpong |",
                 "| cudnn |", "geomean vs default", "FAILS alone", "end of its log"):
        assert want in md, want
    # The ablation table: one row per variant, one cell per shape (2 seqlens x 2 masks), ratios to default.
    abl = md.split("## Ablation")[1].split("\n## ")[0]
    default = [l for l in abl.splitlines() if l.startswith("| default |")][0]
    assert default.count("|") == 2 + 4 + 2, default
    assert re.search(r"\| no_overlap \| [0-9.]+ \([0-9.]+\)", abl), abl

    old = os.path.join(REPO, "bench", "results", "2026-11-30_h200", "results.csv")
    out_old = os.path.join(tmp, "old")
    os.makedirs(out_old, exist_ok=True)
    shutil.copy(old, os.path.join(out_old, "results.csv"))
    subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--out", out_old, "--work", work], check=True)
    md_old = open(os.path.join(out_old, "results.md")).read()
    assert "ours sm80" not in md_old and "## Ablation" not in md_old
    fwd_rows = [l for l in md_old.splitlines() if l.startswith("| fwd ")]
    assert len(fwd_rows) == 72 and all(l.count("|") == 13 for l in fwd_rows), len(fwd_rows)
    print(f"report.py: new CSV ({out}/results.md) and the 2026-11-30 H200 CSV ({len(fwd_rows)} fwd rows) render")


FAKE_SANITIZER = r"""#!/usr/bin/env bash
# compute-sanitizer stand-in: runs the program; the varlen tiny case ends in an internal sanitizer error.
[[ $1 == --version ]] && { echo "fake compute-sanitizer"; exit 0; }
while [[ $# -gt 1 && $1 == --* ]]; do shift 2; done
out=$("$@" 2>&1); rc=$?
echo "$out"
if grep -q "varlen" <<<"$out" && grep -q PASS <<<"$out"; then
  echo "========= Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception"
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 6
fi
echo "========= ERROR SUMMARY: 0 errors"; exit $rc
"""


def test_sanitizer_step(tmp):
    """run.sh's sanitizer Python against a fake compute-sanitizer, check.py --tiny on the CPU with the mock."""
    text = open(os.path.join(HERE, "run.sh")).read()
    code = re.search(r'"\$LOCALISE_S" <<\'EOF\'[^\n]*\n(.*?)\nEOF\n', text, re.S).group(1)
    script = os.path.join(tmp, "sanitize.py")
    open(script, "w").write(code)
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir, exist_ok=True)
    fake = os.path.join(bindir, "compute-sanitizer")
    open(fake, "w").write(FAKE_SANITIZER)
    os.chmod(fake, 0o755)
    work = os.path.join(tmp, "san")
    os.makedirs(work, exist_ok=True)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"], "FLASHATTN_CHECK_DEVICE": "cpu",
           "PYTHONPATH": os.path.join(HERE, "mock"), "FLASHATTN_BENCH_PACKAGE": "flashattn_mock"}
    p = subprocess.run([sys.executable, script, work, os.path.join(tmp, "nobuild"), HERE,
                        os.path.join(work, "sanitizer.log"), "120", "0", str(time.time() + 400), "60"],
                       env=env, capture_output=True, text=True, timeout=600)
    print(p.stdout, end="")
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    san = json.load(open(os.path.join(work, "sanitizer.json")))
    loc = {(i["tool"], i["case"].split()[2]): i for i in san["localised"]}
    assert all(i["result"].startswith("PROBLEM") and "Internal Sanitizer Error" in i["result"] for i in san["runs"])
    for tool in ("memcheck", "racecheck"):
        assert loc[(tool, "d64")]["clean"] is False and "Internal Sanitizer Error" in loc[(tool, "d64")]["tail"]
        assert loc[(tool, "d128")]["clean"] is True, loc
    print("sanitizer step: the failing tiny case is named alone, for both tools")
    return os.path.join(work, "sanitizer.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", help="write everything here instead of a temporary folder")
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="flashattn-selftest.")
    os.makedirs(tmp, exist_ok=True)
    csv_path = test_bench(tmp)
    san = test_sanitizer_step(tmp)
    test_report(tmp, csv_path, san)
    print(f"selftest: all passed ({tmp})")


if __name__ == "__main__":
    main()
