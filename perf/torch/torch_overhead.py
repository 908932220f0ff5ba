#!/usr/bin/env python3
"""What attncomm.torch adds over the C call: a ring prefill on gloo process
ranks, timed through attncomm.torch.ring_attention and through the plain
ctypes binding (attncomm.Comm.ring_attention, the C call with a prepared
layout) on the same tensors, interleaved, medians.

    python3 perf/torch/torch_overhead.py [-p 4] [-T 8192] [-n 7] [--mode pass_kv]

Prints one line per variant and the ratio; -J FILE writes them as JSON.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import attncomm as ac  # noqa: E402
import attncomm.torch as act  # noqa: E402


def rank_main(rank, a, store_path, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, a.p), rank=rank, world_size=a.p)
    comm = act.init_from_group()
    rows = a.T // a.p
    g = torch.Generator().manual_seed(rank)
    q = torch.randn(rows, a.hq, a.d, generator=g)
    k = torch.randn(rows, a.hkv, a.d, generator=g)
    v = torch.randn(rows, a.hkv, a.d, generator=g)
    out = torch.empty_like(q)
    lse = torch.empty(rows, a.hq)
    pos = list(range(rank * rows, (rank + 1) * rows))
    tlayout = act.SeqLayout([0, rows], pos, [0, rows], pos)
    clayout = ac.SeqLayout([0, rows], pos, [0, rows], pos)
    mode = act.MODES[a.mode]

    def c_call():
        comm.ring_attention(q, k, v, out, clayout, a.hq, a.hkv, a.d, lse=lse, mode=mode)

    def torch_call():
        act.ring_attention(comm, q, k, v, tlayout, mode=a.mode, out=out, lse=lse)

    times = {"c": [], "torch": []}
    for i in range(a.w + a.n):
        for name, fn in (("c", c_call), ("torch", torch_call)) if i % 2 == 0 else (("torch", torch_call), ("c", c_call)):
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if i >= a.w:
                times[name].append(dt)
    # The slowest rank's time is the call's.
    t = torch.tensor([times["c"], times["torch"]], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        results.put({"c": statistics.median(t[0].tolist()), "torch": statistics.median(t[1].tolist())})
    comm.destroy()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-p", type=int, default=4, help="ranks (processes)")
    ap.add_argument("-T", type=int, default=8192, help="tokens of the one sequence, dealt in contiguous shards")
    ap.add_argument("--hq", type=int, default=8)
    ap.add_argument("--hkv", type=int, default=2)
    ap.add_argument("-d", type=int, default=64)
    ap.add_argument("-n", type=int, default=7, help="timed iterations of each variant")
    ap.add_argument("-w", type=int, default=1, help="warm-up iterations")
    ap.add_argument("--mode", default="pass_kv", choices=list(act.MODES))
    ap.add_argument("-J", help="write JSON here")
    a = ap.parse_args()
    results = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(rank_main, args=(a, os.path.join(d, "store"), results), nprocs=a.p)
    r = results.get()
    print(f"# ring {a.mode}, {a.p} gloo ranks, T={a.T}, Hq={a.hq}, Hkv={a.hkv}, D={a.d}, fp32, causal; "
          f"median of {a.n}, slowest rank")
    print(f"C call (ctypes binding)      {r['c'] * 1e3:9.2f} ms")
    print(f"attncomm.torch.ring_attention {r['torch'] * 1e3:9.2f} ms")
    print(f"torch / C                    {r['torch'] / r['c']:9.3f}")
    if a.J:
        with open(a.J, "w") as f:
            json.dump({"args": vars(a), "c_s": r["c"], "torch_s": r["torch"], "ratio": r["torch"] / r["c"]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
