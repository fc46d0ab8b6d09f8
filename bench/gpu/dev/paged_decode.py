"""Paged decode by page size: the harness's decode shapes (one query token, GQA 32/8, d128, bf16) through
flash_attn_with_kvcache with a contiguous cache and with paged caches of several page sizes (pages in a random
order; page sizes that do not divide the keys leave the last page partly used), beside cuDNN (SDPA) in the same
process. TB/s of the K+V bytes used (triton's do_bench, median); each paged output is compared with the contiguous
one (the kernels read the same keys in the same order, so they are equal bit for bit).

    PYTHONPATH=<package root> python3 bench/gpu/dev/paged_decode.py [--pages 256,16,17,15,1] [--csv FILE]
"""
import argparse
import csv

import torch
import torch.nn.functional as F
from decode_splits import HKV, SHAPES, D, decode_case
from triton.testing import do_bench

import flashattn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", default="256,64,32,16,17,15,8,1")
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    rows = []
    hkv, d = HKV, D
    print("batch\tkeys\tcache\tus\tTB/s\tvs_contiguous\tvs_cudnn\tequal", flush=True)
    for batch, keys in SHAPES:
        nbytes, q, kc, vc, cudnn = decode_case(batch, keys)
        t_cudnn = do_bench(cudnn, warmup=25, rep=200) * 1e3
        lens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
        kv = flashattn.flash_attn_with_kvcache
        ref = kv(q, kc, vc, cache_seqlens=lens)
        t_contig = do_bench(lambda: kv(q, kc, vc, cache_seqlens=lens), warmup=25, rep=200) * 1e3

        def row(cache, us, equal):
            r = dict(batch=batch, keys=keys, cache=cache, us=round(us, 2), tbps=round(nbytes / us / 1e6, 3),
                     vs_contiguous=round(t_contig / us, 3), vs_cudnn=round(t_cudnn / us, 3), equal=equal)
            rows.append(r)
            print("\t".join(str(v) for v in r.values()), flush=True)
        row("cudnn", t_cudnn, "")
        row("contiguous", t_contig, "")
        for page in (int(p) for p in a.pages.split(",")):
            pages = (keys + page - 1) // page
            perm = torch.randperm(batch * pages, device="cuda")
            table = perm.view(batch, pages).to(torch.int32)
            kp = torch.zeros(batch * pages, page, hkv, d, device="cuda", dtype=torch.bfloat16)
            vp = torch.zeros_like(kp)
            pad = pages * page - keys
            kfull = F.pad(kc, (0, 0, 0, 0, 0, pad)) if pad else kc
            vfull = F.pad(vc, (0, 0, 0, 0, 0, pad)) if pad else vc
            kp[perm] = kfull.reshape(batch * pages, page, hkv, d)
            vp[perm] = vfull.reshape(batch * pages, page, hkv, d)
            out = kv(q, kp, vp, cache_seqlens=lens, block_table=table)
            equal = bool(torch.equal(out, ref))
            us = do_bench(lambda: kv(q, kp, vp, cache_seqlens=lens, block_table=table), warmup=25, rep=200) * 1e3
            row(f"paged{page}", us, equal)
            kp = vp = kfull = vfull = None
        torch.cuda.empty_cache()
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
