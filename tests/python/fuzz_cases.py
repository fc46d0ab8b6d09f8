"""Seeded generator of malformed and extreme flashattn.ops calls, one forked child per case (issue 16).

    python fuzz_cases.py SEED CASES

A case passes when the call raises ValueError / NotImplementedError whose message starts with
"<argument>: ", or returns outputs that match the float64 reference (cases whose inputs hold NaN only
need to return). Anything else (another exception, a crash, a hang) fails; the exit status is the number
of failed cases (capped at 100). This process never runs a kernel itself: every call is in a child.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import traceback

import numpy as np

from flashattn import ops

from fa_reference import Mask, assert_close, attention

NAMED = re.compile(r"^[a-z_.]+: \S")
TIMEOUT_S = 120


def _case(rng):
    """(kwargs for ops.forward or ops.backward, direction, checkable, description)."""
    dtype = rng.choice([np.float32, np.float16])
    b, sq, sk = (int(rng.choice(v)) for v in ([0, 1, 2], [0, 1, 7, 33, 65], [0, 1, 9, 64]))
    hkv = int(rng.choice([1, 2]))
    hq = hkv * int(rng.choice([1, 2]))
    d = int(rng.choice([8, 16, 32]))
    q = rng.standard_normal((b, sq, hq, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    causal = bool(rng.integers(2))
    window = (-1, -1)
    if rng.integers(3) == 0:
        window = (int(rng.choice([-1, 0, 3, 2**40, 2**63 - 1])), 0 if causal else int(rng.choice([-1, 2, 2**63 - 1])))
    kw = dict(causal=causal, window_size=window, num_threads=int(rng.choice([0, 1, 3, 100000])))
    backward = rng.integers(3) == 0
    what = "none"
    checkable = True
    nan = False
    if rng.integers(4) != 0:
        what = str(rng.choice(["dtype", "noncontiguous", "rank", "shape", "window", "softcap", "scale", "threads",
                               "nan", "alias", "readonly", "byteorder", "alibi", "varlen", "dropout"]))
        checkable = False
        if what == "dtype":
            q = q.astype(rng.choice([np.float64, np.int32, np.int64, np.bool_]))
        elif what == "noncontiguous":
            k = np.repeat(k, 2, axis=-1)[..., ::2]
        elif what == "rank":
            q = q.reshape((-1,) + q.shape[2:])
        elif what == "shape":
            v = v[..., : d // 2]
        elif what == "window":
            kw["window_size"] = (int(rng.choice([-2, -(2**63), 2**63, 5])), int(rng.choice([-1, -3, 2**64])))
        elif what == "softcap":
            kw["softcap"] = float(rng.choice([-1.0, np.nan, np.inf, 1e30, 2.0]))
            checkable = kw["softcap"] in (2.0,)
        elif what == "scale":
            kw["softmax_scale"] = float(rng.choice([0.0, -1.0, np.nan, np.inf, 0.25]))
        elif what == "threads":
            kw["num_threads"] = int(rng.choice([-1, 2**31, 2**40, 7]))
            checkable = kw["num_threads"] == 7
        elif what == "nan":
            if q.size:
                q.reshape(-1)[int(rng.integers(q.size))] = np.nan
            nan = True
        elif what == "alias" and not backward:
            kw["out"] = v if v.shape == q.shape else q
        elif what == "readonly" and not backward:
            out = np.empty_like(q)
            out.flags.writeable = False
            kw["out"] = out
        elif what == "byteorder":
            k = k.astype(k.dtype.newbyteorder())
        elif what == "alibi":
            kw["alibi_slopes"] = [np.ones(hq), np.ones(hq + 1, np.float32), np.ones((b, hq), np.int32)][rng.integers(3)]
        elif what == "varlen":
            cu = np.array([0, b * sq], dtype=rng.choice([np.int32, np.int64]))
            cuk = np.array([0, b * sk + int(rng.integers(2))], np.int32)
            q, k, v = (x.reshape((-1,) + x.shape[2:]) for x in (q, k, v))
            kw.update(cu_seqlens_q=cu, cu_seqlens_k=cuk)
        elif what == "dropout":
            kw["dropout_p"] = float(rng.choice([0.1, -0.5, 1.0, np.nan]))
    desc = f"{dtype.__name__} B{b} q{sq} k{sk} h{hq}:{hkv} d{d} causal={causal} window={window} " \
           f"{'bwd' if backward else 'fwd'} mutation={what}"
    return q, k, v, kw, backward, checkable and not nan, desc


def _run(seed):
    rng = np.random.default_rng(seed)
    q, k, v, kw, backward, checkable, desc = _case(rng)
    print(f"case {seed}: {desc}", flush=True)
    try:
        if backward:
            fwd_kw = {key: val for key, val in kw.items() if key != "out"}
            out, lse = ops.forward(q, k, v, **fwd_kw)
            dout = np.ones_like(out)
            lse_arg = None if rng.integers(10) == 0 else lse
            if lse_arg is None:
                checkable = False
            grads = ops.backward(dout, q, k, v, out, lse_arg, **fwd_kw)
        else:
            out, lse = ops.forward(q, k, v, **kw)
    except (ValueError, NotImplementedError) as e:
        if NAMED.match(str(e)):
            return 0
        print(f"unnamed error: {type(e).__name__}: {e}")
        return 1
    except Exception as e:  # noqa: BLE001 - any other exception is a failure of the case
        print(f"unexpected {type(e).__name__}: {e}")
        traceback.print_exc()
        return 1
    if not checkable:
        return 0
    left, right = kw["window_size"]
    mask = Mask(causal=kw["causal"], window=(left, right), softcap=kw.get("softcap", 0.0))
    dtype = q.dtype.type
    if backward:
        exact = attention(q, k, v, mask, dout=dout)
        plain = attention(q, k, v, mask, dout=dout, storage=dtype)
        for name, got, e, p in zip(("dq", "dk", "dv"), grads, exact[2:], plain[2:]):
            assert_close(name, got, e, p, dtype)
    else:
        exact_out, exact_lse = attention(q, k, v, mask)
        plain_out, plain_lse = attention(q, k, v, mask, storage=dtype)
        assert_close("out", out, exact_out, plain_out, dtype)
        assert_close("lse", lse, exact_lse, plain_lse, np.float32)
    return 0


def main():
    seed, cases = int(sys.argv[1]), int(sys.argv[2])
    failed = 0
    for i in range(cases):
        case_seed = seed * 1000003 + i
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            signal.alarm(TIMEOUT_S)
            code = 1
            try:
                code = _run(case_seed)
            except BaseException:  # noqa: BLE001 - a wrong value (assert_close) or anything else
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            print(f"FAIL case {case_seed}: " + ("hung" if sig == signal.SIGALRM else f"killed by signal {sig}"))
            failed += 1
        elif os.WEXITSTATUS(status) != 0:
            print(f"FAIL case {case_seed}: see above")
            failed += 1
    print(f"{cases - failed} of {cases} cases passed")
    sys.exit(min(failed, 100))


if __name__ == "__main__":
    main()
