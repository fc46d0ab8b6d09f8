"""Per-kernel GPU times of one backward call of a libsm80_tiles.so variant next to torch's FA2 (torch.profiler),
to see which of the kernels (preprocess, dQ zeroing, main, dQ convert) makes a difference.

    python3 profile_bwd.py LIB hdim causal seqlen [variant-name-substring]
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sm80_tiles import load

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from common import kernel_times  # noqa: E402  (bench/gpu/common.py)


def main():
    lib = load(sys.argv[1])
    d, causal, s = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    want = sys.argv[5] if len(sys.argv) > 5 else ""
    ids = [i for i in range(lib.v_count()) if lib.v_head_dim(i) == d and lib.v_causal(i) == causal]
    fwd = next(i for i in ids if not lib.v_backward(i))
    bwd = [i for i in ids if lib.v_backward(i) and want in lib.v_name(i).decode()][0]
    h, b = 2048 // d, 16384 // s
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    stream = torch.cuda.current_stream().cuda_stream
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    lib.v_fwd(fwd, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), b, s, h, d, stream)
    dsum = torch.empty(h * b * s, device="cuda", dtype=torch.float32)
    dq_acc = torch.empty(lib.v_dq_floats(bwd, b, s, h, d), device="cuda", dtype=torch.float32)
    g = [torch.empty_like(q) for _ in range(3)]
    ours = lambda: lib.v_bwd(bwd, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                             do.data_ptr(), g[0].data_ptr(), g[1].data_ptr(), g[2].data_ptr(), dsum.data_ptr(),
                             dq_acc.data_ptr(), b, s, h, d, stream)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
    dot = do.transpose(1, 2)
    fa2 = lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)
    for name, fn in ((lib.v_name(bwd).decode(), ours), ("flash2", fa2)):
        rows = kernel_times(fn)
        print(f"# {name} d{d} causal {causal} seqlen {s}: total {sum(t for _, t in rows):.1f} us")
        for key, t in rows:
            print(f"  {t:9.1f} us  {key[:90]}")


if __name__ == "__main__":
    main()
