#!/usr/bin/env python3
"""attncomm.torch on CPU tensors: ranks are processes in a gloo process
group; the communicator comes from the group (init_from_group); every mode's
ring_attention matches float64 attention over the whole batch, in every LSE
convention; torch.compile(fullgraph=True) traces a function that calls it;
bad tensors raise AttnError naming the argument; a layout that disagrees
with the tensors is refused on every rank. Exit 77 (skipped) without torch."""
import sys

import rank_threads  # noqa: F401 - first: the path to python/ and the test timeout

try:
    import torch
except ImportError:
    print("torch is not installed: skipped")
    sys.exit(77)

import numpy as np  # noqa: E402

import attncomm as ac  # noqa: E402
import attncomm.torch as act  # noqa: E402
import gloo_ranks  # noqa: E402
from attn_reference import attention_at_positions  # noqa: E402

NRANKS = 3
LENS = [37, 20]          # two sequences, tokens dealt round-robin to the ranks
HQ, HKV, D = 4, 2, 16


def whole_batch(dtype):
    g = torch.Generator().manual_seed(7)
    rows = sum(LENS)
    q = torch.randn(rows, HQ, D, generator=g)
    k = torch.randn(rows, HKV, D, generator=g)
    v = torch.randn(rows, HKV, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def my_rows(rank):
    """This rank's rows of the packed batch, its offsets and positions."""
    rows, offsets, pos, base = [], [0], [], 0
    for n in LENS:
        mine = [t for t in range(n) if t % NRANKS == rank]
        rows += [base + t for t in mine]
        pos += mine
        offsets.append(len(rows))
        base += n
    return rows, offsets, pos


def reference(q, k, v, rank):
    """float64 out and natural-log lse of this rank's rows over the whole batch."""
    rows, _, pos = my_rows(rank)
    outs, lses, base = [], [], 0
    for n in LENS:
        seq_rows = [r for r in rows if base <= r < base + n]
        o, s = attention_at_positions(q[seq_rows].double().numpy(), [r - base for r in seq_rows],
                                      k[base:base + n].double().numpy(), v[base:base + n].double().numpy(),
                                      list(range(n)))
        outs.append(o)
        lses.append(s)
        base += n
    return np.concatenate(outs), np.concatenate(lses)


def expect_error(fn, words):
    try:
        fn()
    except ac.AttnError as e:
        assert all(w in str(e) for w in words), f"AttnError {e!r} does not name {words}"
        return
    raise AssertionError(f"no AttnError (expected one naming {words})")


def run_checks(rank, comm):
    rows, offsets, pos = my_rows(rank)
    layout = act.SeqLayout(offsets, pos, offsets, pos)
    q, k, v = whole_batch(torch.float32)
    ref_out, ref_lse = reference(q, k, v, rank)
    mq, mk, mv = q[rows].contiguous(), k[rows].contiguous(), v[rows].contiguous()

    # Every mode, natural-log token-major LSE.
    for mode in act.MODES:
        out, lse = act.ring_attention(comm, mq, mk, mv, layout, mode=mode, return_lse=True)
        np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-4, atol=1e-4, err_msg=mode)
        np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-4, atol=1e-4, err_msg=mode)

    # Other LSE conventions, into tensors the caller gives.
    out = torch.empty_like(mq)
    lse2 = torch.empty(HQ, len(rows), dtype=torch.float32)
    act.ring_attention(comm, mq, mk, mv, layout, mode="pass_q", out=out, lse=lse2, lse_base="2", lse_layout="ht")
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lse2.numpy(), ref_lse.T / np.log(2.0), rtol=1e-4, atol=1e-4)

    # Layout tensors are read when the call runs: rewrite them in place.
    shifted = act.SeqLayout(torch.tensor(offsets, dtype=torch.int32), torch.zeros(len(pos), dtype=torch.int32),
                            torch.tensor(offsets, dtype=torch.int32), torch.zeros(len(pos), dtype=torch.int32))
    shifted.q_pos.copy_(torch.tensor(pos, dtype=torch.int32))
    shifted.kv_pos.copy_(torch.tensor(pos, dtype=torch.int32))
    out = act.ring_attention(comm, mq, mk, mv, shifted, mode="ship_q")
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-4, atol=1e-4)

    # bfloat16 in and out.
    qb, kb, vb = whole_batch(torch.bfloat16)
    ref_b, _ = reference(qb, kb, vb, rank)
    out = act.ring_attention(comm, qb[rows].contiguous(), kb[rows].contiguous(), vb[rows].contiguous(), layout)
    assert out.dtype == torch.bfloat16
    np.testing.assert_allclose(out.float().numpy(), ref_b, rtol=2e-2, atol=2e-2)

    # torch.compile traces it without a graph break (fake implementation).
    def model(a, b, c):
        o, s = act.ring_attention(comm, a * 1.0, b, c, layout, mode="pass_kv", return_lse=True, lse_layout="ht")
        return o * 2.0, s

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    o, s = compiled(mq, mk, mv)
    np.testing.assert_allclose(o.numpy(), 2 * ref_out, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s.numpy(), ref_lse.T, rtol=1e-4, atol=1e-4)

    # Bad tensors: a clear error naming the argument, nothing sent.
    expect_error(lambda: act.ring_attention(comm, mq, mk, mv, layout,
                                            lse=torch.empty(len(rows), HQ, dtype=torch.bfloat16)),
                 ["lse", "float32"])
    expect_error(lambda: act.ring_attention(comm, mq.transpose(0, 1), mk, mv, layout), ["q"])
    expect_error(lambda: act.ring_attention(comm, mq, mk[:, :, :8].contiguous(), mv, layout), ["head_dim", "k"])
    expect_error(lambda: act.ring_attention(comm, mq, mk, mv[:, :1].contiguous(), layout), ["k", "v", "heads"])
    expect_error(lambda: act.ring_attention(comm, mq, mk, mv, layout, out=torch.empty(1, HQ, D)), ["out", "shape"])
    expect_error(lambda: act.ring_attention(comm, mq, mk, mv, layout, mode="ring"), ["mode"])
    expect_error(lambda: act.ring_attention(comm, mq.double(), mk.double(), mv.double(), layout), ["dtype"])
    expect_error(lambda: act.ring_attention(comm, mq, mk, mv, [offsets, pos]), ["layout"])

    # The engine's own kernel inside the ring, in every mode.
    calls = [0]

    def counted(*args):
        calls[0] += 1
        return act.reference_kernel(*args)

    act.set_attn_kernel(comm, counted)
    for mode in ("pass_kv", "pass_q", "ship_q", "head_parallel", "all_gather_kv"):
        before = calls[0]
        out, lse = act.ring_attention(comm, mq, mk, mv, layout, mode=mode, return_lse=True)
        assert calls[0] > before, f"{mode}: the plugged kernel was not called"
        np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-4, atol=1e-4, err_msg=f"plugged {mode}")
        np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=1e-4, atol=1e-4, err_msg=f"plugged {mode}")
    act.set_attn_kernel(comm, None)

    # The same call still works after the refusals (nothing was sent).
    out = act.ring_attention(comm, mq, mk, mv, layout, mode="head_parallel")
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-4, atol=1e-4)

    # Decode context parallelism: the same query rows on every rank, each
    # over its own keys; the merge collectives give the exact attention.
    qd = q[sum(LENS) - 1:].repeat(3, 1, 1)  # 3 query rows, all at the last position
    qpos = [sum(LENS) - 1] * 3
    o_part, l_part = attention_at_positions(qd.numpy(), qpos, mk.numpy(), mv.numpy(),
                                            [r for r in rows])  # this rank's keys (global row = position)
    o_full, l_full = attention_at_positions(qd.numpy(), qpos, k.numpy(), v.numpy(), list(range(sum(LENS))))
    o_part = torch.from_numpy(o_part).float().contiguous()
    l_part = torch.from_numpy(l_part).float().contiguous()
    h0, h1 = rank * HQ // NRANKS, (rank + 1) * HQ // NRANKS
    out, lse = act.merge_attn_reduce_scatter(comm, o_part, l_part, return_lse=True)
    np.testing.assert_allclose(out.numpy(), o_full[:, h0:h1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), l_full[:, h0:h1], rtol=1e-5, atol=1e-5)
    out = act.merge_attn_all_gather(comm, o_part, l_part)
    np.testing.assert_allclose(out.numpy(), o_full, rtol=1e-5, atol=1e-5)
    merged, _ = act.merge_attn_states([o_part, o_part], [l_part, l_part])
    np.testing.assert_allclose(merged.numpy(), o_part.numpy(), rtol=1e-5, atol=1e-5)
    expect_error(lambda: act.merge_attn_all_gather(comm, o_part.double(), l_part), ["out_part", "dtype"])

    # A layout that disagrees with the rows on one rank fails on every rank.
    bad = layout
    if rank == 1:
        bad = act.SeqLayout(offsets[:-1] + [offsets[-1] + 1], pos + [0], offsets, pos)
    expect_error(lambda: act.ring_attention(comm, mq, mk, mv, bad, mode="pass_kv"),
                 ["layout"] if rank == 1 else ["rank 1"])


if __name__ == "__main__":
    sys.exit(gloo_ranks.run(NRANKS, run_checks,
                            f"attncomm.torch: {NRANKS} gloo ranks, every mode and LSE convention, torch.compile, bad input: ok"))
