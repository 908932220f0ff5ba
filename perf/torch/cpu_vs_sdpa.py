#!/usr/bin/env python3
"""attncomm's CPU attention kernel against torch's
scaled_dot_product_attention on CPU, in one run: causal prefill (one
sequence of T tokens) and a decode step (one query over K keys), fp32 and
bf16, one thread and all threads, GQA (Hq query heads over Hkv kv heads).
Our kernel runs through attnRingAttention on a one-rank host communicator
(the call's planning included); SDPA with enable_gqa. Interleaved, medians.

    python3 perf/torch/cpu_vs_sdpa.py [-T 4096] [-K 32768] [--hq 32] [--hkv 8] [-d 128] [-n 3]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def timed(fn, n, w):
    for _ in range(w):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def case(comm, act, threads, dtype, q_rows, keys, a):
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(q_rows, a.hq, a.d, generator=g).to(dtype)
    k = torch.randn(keys, a.hkv, a.d, generator=g).to(dtype)
    v = torch.randn(keys, a.hkv, a.d, generator=g).to(dtype)
    qpos = list(range(keys - q_rows, keys))
    layout = act.SeqLayout([0, q_rows], qpos, [0, keys], list(range(keys)))
    out = torch.empty_like(q)
    qs, ks, vs = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))  # [1, H, T, D]
    causal = q_rows == keys  # a decode query sees every key

    def ours():
        act.ring_attention(comm, q, k, v, layout, mode="pass_kv", out=out)

    def sdpa():
        F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=True)

    t_ours, t_sdpa = [], []
    for _ in range(a.n):  # interleaved
        t_ours += timed(ours, 1, 0 if t_ours else a.w)
        t_sdpa += timed(sdpa, 1, 0 if t_sdpa else a.w)
    return statistics.median(t_ours), statistics.median(t_sdpa)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-T", type=int, default=4096, help="prefill tokens")
    ap.add_argument("-K", type=int, default=32768, help="decode keys")
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("-d", type=int, default=128)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("-w", type=int, default=1)
    ap.add_argument("-J")
    a = ap.parse_args()
    all_threads = os.cpu_count() or 1
    rows = []
    print(f"# attncomm CPU kernel vs torch {torch.__version__} SDPA on CPU; Hq={a.hq} Hkv={a.hkv} D={a.d}; "
          f"medians of {a.n}, interleaved")
    print(f"{'case':>22} {'dtype':>9} {'threads':>7} {'attncomm ms':>12} {'sdpa ms':>10} {'sdpa/ours':>10}")
    for threads in sorted({1, all_threads}):
        os.environ["ATTN_KERNEL_THREADS"] = str(threads)  # read when the communicator is made
        import attncomm as ac
        import attncomm.torch as act
        comm = ac.Comm.init_all(1)[0]
        for dtype in (torch.float32, torch.bfloat16):
            for name, q_rows, keys in ((f"prefill T={a.T}", a.T, a.T), (f"decode K={a.K}", 1, a.K)):
                ours, sdpa = case(comm, act, threads, dtype, q_rows, keys, a)
                dt = str(dtype).replace("torch.", "")
                print(f"{name:>22} {dt:>9} {threads:>7} {ours * 1e3:12.2f} {sdpa * 1e3:10.2f} {sdpa / ours:10.2f}",
                      flush=True)
                rows.append({"case": name, "dtype": dt, "threads": threads, "attncomm_s": ours, "sdpa_s": sdpa})
        comm.destroy()
    if a.J:
        with open(a.J, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
