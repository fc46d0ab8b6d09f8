"""One forward call of a libsm80_tiles.so variant and one of torch's FA2 on the same inputs (for ncu):
    python3 one_fwd.py LIB hdim causal seqlen variant-name-substring
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sm80_tiles import load


def main():
    lib = load(sys.argv[1])
    d, causal, s, want = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    i = next(i for i in range(lib.v_count()) if not lib.v_backward(i) and lib.v_head_dim(i) == d
             and lib.v_causal(i) == causal and want in lib.v_name(i).decode())
    h, b = 2048 // d, 16384 // s
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    lib.v_fwd(i, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), b, s, h, d, stream)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=bool(causal))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
