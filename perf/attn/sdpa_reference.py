#!/usr/bin/env python3
"""torch SDPA (flash backend) on the shapes of cuda_kernel_perf's attention
table: causal, bf16, head_dim 128, one sequence of T tokens, Hq query heads,
Hkv kv heads. Prints TFLOP/s with the same FLOP count (4 * T^2 * Hq * D / 2)
and median of -n iterations, so the two tables compare line by line.

    python3 perf/attn/sdpa_reference.py [-n 20] [-w 3] [-t 8192,16384,32768] [-q 32] [-k 8]

Run on the GPU machine (needs torch with CUDA). GQA uses enable_gqa when the
torch version has it, else K/V are expanded to Hq heads before timing (the
expansion is not timed).
"""
import argparse
import statistics
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("-w", type=int, default=3)
    ap.add_argument("-t", default="8192,16384,32768")
    ap.add_argument("-q", type=int, default=32)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("-d", type=int, default=128)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"sdpa_reference: torch not available ({e})")
        return 77
    if not torch.cuda.is_available():
        print("sdpa_reference: no CUDA device")
        return 77
    dev = torch.device("cuda")
    print(f"# device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"# torch SDPA flash: causal, bf16, head_dim {a.d}, Hq {a.q}, Hkv {a.k}, one sequence")
    print(f"{'tokens':>8} {'time(us)':>12} {'TFLOP/s':>10}")
    for t in [int(x) for x in a.t.split(",") if x]:
        q = torch.randn(1, a.q, t, a.d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, a.k, t, a.d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, a.k, t, a.d, device=dev, dtype=torch.bfloat16)
        kwargs = {}
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(q[:, :, :16], k[:, :, :16], v[:, :, :16],
                                               is_causal=True, enable_gqa=True)
            kwargs["enable_gqa"] = True
        except TypeError:
            rep = a.q // a.k
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        times = []
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for i in range(a.w + a.n):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                F.scaled_dot_product_attention(q, k, v, is_causal=True, **kwargs)
                e.record()
                e.synchronize()
                if i >= a.w:
                    times.append(s.elapsed_time(e) * 1e3)
        us = statistics.median(times)
        flops = 4.0 * t * t * a.q * a.d / 2.0
        print(f"{t:>8} {us:>12.1f} {flops / us / 1e6:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
