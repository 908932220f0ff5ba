#!/usr/bin/env python3
"""On a GPU machine with PyTorch: attncomm's attention and collectives on
device communicators, called through python/attncomm with torch CUDA
tensors and streams, against torch's flash attention (its output and its
log-sum-exp) on the same tensors. Ranks are Python threads sharing GPU 0.
Exit 77 (skipped) without torch or a CUDA device."""
import sys
import unittest

import rank_threads  # first: the path to python/ and the test timeout

try:
    import torch
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)
if not torch.cuda.is_available():
    print("no CUDA device: skipped")
    sys.exit(77)

import attncomm as ac  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def on_ranks(comms, body):
    """body(rank, comm, stream) on one thread per rank, each with its own
    CUDA stream on GPU 0."""

    def with_stream(r, comm):
        torch.cuda.set_device(0)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            body(r, comm, stream)

    rank_threads.on_ranks(comms, with_stream)


def settle(comm, stream):
    """Waits for the stream; a device operation that failed after its enqueue
    reports through the communicator's asynchronous error."""
    stream.synchronize()
    err = comm.async_error()
    if err != ac.SUCCESS:
        raise ac.AttnError(err, comm.last_error())


def flash_reference(q, k, v, causal):
    """torch's flash attention on one sequence: q [T, Hq, D], k/v [T, Hkv, D]
    -> out [T, Hq, D] and lse [T, Hq] (float32, natural log, scaled)."""
    group = q.shape[1] // k.shape[1]
    qb = q.transpose(0, 1).unsqueeze(0)
    kb = k.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
    vb = v.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
    res = torch.ops.aten._scaled_dot_product_flash_attention(qb, kb, vb, 0.0, causal, False)
    out, lse = res[0], res[1]
    return out[0].transpose(0, 1).contiguous(), lse[0].transpose(0, 1).float().contiguous()


def errors(out, lse, ref_out, ref_lse):
    scale = ref_out.float().abs().max().clamp_min(1e-30)
    o = ((out.float() - ref_out.float()).abs().max() / scale).item()
    finite = torch.isfinite(ref_lse)
    le = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    return o, le


class PartialAttention(unittest.TestCase):
    def test_one_rank_equals_flash_attention_and_its_lse(self):
        comms = ac.Comm.init_all(1, devices=[0])
        try:
            for T, hq, hkv, d in [(1000, 8, 2, 64), (4096, 16, 4, 128), (777, 8, 8, 128)]:
                for name, dt in DTYPES.items():
                    for causal in (True, False):
                        g = torch.Generator(device="cuda").manual_seed(T + d)
                        q = torch.rand(T, hq, d, device="cuda", dtype=dt, generator=g) * 2 - 1
                        k = torch.rand(T, hkv, d, device="cuda", dtype=dt, generator=g) * 2 - 1
                        v = torch.rand(T, hkv, d, device="cuda", dtype=dt, generator=g) * 2 - 1
                        ref_out, ref_lse = flash_reference(q, k, v, causal)
                        out = torch.full_like(q, float("nan"))
                        lse = torch.full((T, hq), float("nan"), device="cuda")
                        pos = list(range(T))
                        layout = ac.SeqLayout([0, T], pos, [0, T], pos)
                        stream = torch.cuda.current_stream()
                        comms[0].ring_attention(q, k, v, out, layout, hq, hkv, d, lse=lse, causal=causal,
                                                mode=ac.MODE_PASS_KV, stream=stream)
                        settle(comms[0], stream)
                        o, le = errors(out, lse, ref_out, ref_lse)
                        what = f"T {T} heads {hq}/{hkv} D {d} {name} causal {causal}"
                        self.assertLess(o, 2e-2, what + ": out")
                        self.assertLess(le, 1e-2, what + ": lse")
        finally:
            comms[0].destroy()


class RingAttentionOnOneGpu(unittest.TestCase):
    def test_every_mode_on_shared_gpu_equals_flash_attention(self):
        T, hq, hkv, d = 3000, 8, 2, 128
        for n in (2, 3, 4):
            for name, dt in DTYPES.items():
                g = torch.Generator(device="cuda").manual_seed(n)
                q = torch.rand(T, hq, d, device="cuda", dtype=dt, generator=g) * 2 - 1
                k = torch.rand(T, hkv, d, device="cuda", dtype=dt, generator=g) * 2 - 1
                v = torch.rand(T, hkv, d, device="cuda", dtype=dt, generator=g) * 2 - 1
                ref_out, ref_lse = flash_reference(q, k, v, True)
                torch.cuda.synchronize()
                shards = ac.plan_prefill([T], n)
                comms = ac.Comm.init_all(n, devices=[0] * n)

                def body(r, c, stream):
                    s = shards[r]
                    qi = torch.tensor(s.q_index, device="cuda", dtype=torch.long)
                    ki = torch.tensor(s.kv_index, device="cuda", dtype=torch.long)
                    mq, mk, mv = q[qi].contiguous(), k[ki].contiguous(), v[ki].contiguous()
                    for mode in (ac.MODE_PASS_KV, ac.MODE_PASS_Q, ac.MODE_SHIP_Q, ac.MODE_AUTO):
                        out = torch.full_like(mq, float("nan"))
                        lse = torch.full((len(s.q_index), hq), float("nan"), device="cuda")
                        c.ring_attention(mq, mk, mv, out, s.layout, hq, hkv, d, lse=lse, mode=mode,
                                         stream=stream)
                        settle(c, stream)
                        o, le = errors(out, lse, ref_out[qi], ref_lse[qi])
                        what = f"rank {r} of {n}, {name}, mode {mode}"
                        self.assertLess(o, 2e-2, what + ": out")
                        self.assertLess(le, 1e-2, what + ": lse")

                try:
                    on_ranks(comms, body)
                finally:
                    for c in comms:
                        c.destroy()


class CudaGraphDecode(unittest.TestCase):
    def test_one_captured_graph_serves_every_decode_step(self):
        """attncomm.torch.ring_attention captured once by torch.cuda.graph,
        its layout in CUDA tensors: each replay, after the engine appended a
        key and advanced the query, equals flash attention over that step's
        keys (a layout read at the capture would replay step 0's)."""
        import attncomm.torch as act
        n, hq, hkv, d, cap, start, steps = 2, 8, 2, 128, 256, 200, 4
        dt = torch.bfloat16
        g = torch.Generator(device="cuda").manual_seed(5)
        total = start + steps
        q_all = torch.rand(total, hq, d, device="cuda", dtype=dt, generator=g) * 2 - 1
        k_all = torch.rand(total, hkv, d, device="cuda", dtype=dt, generator=g) * 2 - 1
        v_all = torch.rand(total, hkv, d, device="cuda", dtype=dt, generator=g) * 2 - 1
        torch.cuda.synchronize()
        comms = ac.Comm.init_all(n, devices=[0] * n)

        def body(r, c, stream):
            # Keys round-robin (position p on rank p % n); rank 0 holds the query.
            k = torch.zeros(cap, hkv, d, dtype=dt, device="cuda")
            v = torch.zeros(cap, hkv, d, dtype=dt, device="cuda")
            kv_pos = torch.zeros(cap, dtype=torch.int32, device="cuda")
            kv_off = torch.zeros(2, dtype=torch.int32, device="cuda")
            q_rows = 1 if r == 0 else 0
            q = torch.zeros(q_rows, hq, d, dtype=dt, device="cuda")
            q_pos = torch.zeros(q_rows, dtype=torch.int32, device="cuda")
            q_off = torch.tensor([0, q_rows], dtype=torch.int32, device="cuda")
            out = torch.zeros_like(q)
            lse = torch.zeros(q_rows, hq, device="cuda")
            layout = act.SeqLayout(q_off, q_pos, kv_off, kv_pos)

            def fill(step):
                mine = torch.arange(r, start + step + 1, n, device="cuda")
                k[:len(mine)] = k_all[mine]
                v[:len(mine)] = v_all[mine]
                kv_pos[:len(mine)] = mine.int()
                kv_off[1] = len(mine)
                if r == 0:
                    q.copy_(q_all[start + step:start + step + 1])
                    q_pos.fill_(start + step)

            fill(0)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                act.ring_attention(c, q, k, v, layout, mode="ship_q", out=out, lse=lse)
            for step in range(steps):
                fill(step)
                graph.replay()
                settle(c, stream)
                if r != 0:
                    continue
                keys = start + step + 1
                ref_out, ref_lse = flash_reference(q_all[keys - 1:keys], k_all[:keys], v_all[:keys], False)
                o, le = errors(out, lse, ref_out, ref_lse)
                self.assertLess(o, 2e-2, f"step {step}: out")
                self.assertLess(le, 1e-2, f"step {step}: lse")

        try:
            on_ranks(comms, body)
        finally:
            for c in comms:
                c.destroy()


class DeviceCollectives(unittest.TestCase):
    def test_collectives_on_cuda_tensors(self):
        n = 3
        comms = ac.Comm.init_all(n, devices=[0] * n)

        def body(r, c, stream):
            for dt in (torch.float32, torch.bfloat16):
                x = torch.full((1000,), float(r + 1), device="cuda", dtype=dt)
                y = torch.empty(1000 * n, device="cuda", dtype=dt)
                c.all_gather(x, y, stream=stream)
                s = torch.empty(1000, device="cuda", dtype=dt)
                c.all_reduce(x, s, op=ac.SUM, stream=stream)
                settle(c, stream)
                want = torch.arange(1, n + 1, device="cuda", dtype=dt).repeat_interleave(1000)
                self.assertTrue(torch.equal(y, want), f"rank {r}: all_gather {dt}")
                self.assertTrue(torch.equal(s, torch.full_like(s, n * (n + 1) / 2)), f"rank {r}: all_reduce {dt}")

        try:
            on_ranks(comms, body)
        finally:
            for c in comms:
                c.destroy()


if __name__ == "__main__":
    unittest.main()
