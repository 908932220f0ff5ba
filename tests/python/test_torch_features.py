#!/usr/bin/env python3
"""attncomm.torch with sliding windows, softcap, attention sinks and
MLA-shaped heads (v of its own head dim) (issue 48) on CPU tensors, ranks as processes in a gloo process group, against
float64 attention written from the definition here: ring_attention in every
mode, decode_attention, kv_attention over a KvPool and level_attention;
torch.compile(fullgraph=True) traces a call with all three; the engine's
torch kernel (set_attn_kernel(windows=True)) gets the window and cap; bad window /
softcap / sinks arguments raise AttnError naming the argument before
anything is sent. Exit 77 (skipped) without torch."""
import math
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

NRANKS = 3
HQ, HKV, D = 4, 2, 16
LEN = 60                      # one sequence: tokens round robin, or in contiguous shards
TOL = dict(rtol=1e-4, atol=1e-4)
MODES = ("pass_kv", "pass_q", "ship_q", "head_parallel", "all_gather_kv", "auto")


def reference(q, q_pos, k, v, kv_pos, causal, window, softcap, sinks):
    """float64 out [rows, HQ, v's head dim] and natural lse [rows, HQ], from the
    definition: scaled scores, softcap, the window and causal mask, exp(sink)
    in the denominator."""
    q, k, v = q.double(), k.double(), v.double()
    group = HQ // HKV
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    qp = torch.as_tensor(q_pos, dtype=torch.int64)[:, None]
    kp = torch.as_tensor(kv_pos, dtype=torch.int64)[None, :]
    seen = torch.ones(qp.shape[0], kp.shape[1], dtype=torch.bool)
    left, right = window
    if causal:
        seen &= kp <= qp
    if left >= 0:
        seen &= kp >= qp - left
    if right >= 0 and not causal:
        seen &= kp <= qp + right
    s = s.masked_fill(~seen[None], -math.inf)
    if sinks is not None:  # one more column per head: the sink's logit, no value
        sink = sinks.double()[:, None, None].expand(HQ, s.shape[1], 1)
        s = torch.cat([s, sink], dim=2)
        v = torch.cat([v, torch.zeros(1, HQ, v.shape[2], dtype=torch.float64)], dim=0)
    lse = torch.logsumexp(s, dim=2)                                   # [H, q]
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", p, v)
    return out.numpy(), lse.t().numpy()


def rows_of(rank, contiguous):
    if contiguous:
        per = LEN // NRANKS
        return list(range(rank * per, (rank + 1) * per))
    return [t for t in range(LEN) if t % NRANKS == rank]


def check_ring(rank, comm):
    q, k, v = (torch.randn(LEN, h, D, generator=torch.Generator().manual_seed(s)) for s, h in
               ((1, HQ), (2, HKV), (3, HKV)))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    cases = [
        dict(causal=True, window=(7, -1), softcap=0.0, sinks=None),
        dict(causal=False, window=(4, 3), softcap=0.0, sinks=None),
        dict(causal=True, window=(-1, -1), softcap=1.5, sinks=None),
        dict(causal=True, window=(-1, -1), softcap=0.0, sinks=sinks),
        dict(causal=True, window=(5, -1), softcap=3.0, sinks=sinks),
    ]
    for contiguous in (False, True):
        rows = rows_of(rank, contiguous)
        layout = act.SeqLayout(torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32),
                               torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32))
        mq, mk, mv = q[rows].contiguous(), k[rows].contiguous(), v[rows].contiguous()
        for c in cases:
            want_out, want_lse = reference(q[rows], rows, k, v, list(range(LEN)), c["causal"], c["window"],
                                           c["softcap"], c["sinks"])
            for mode in MODES:
                what = f"{mode} {c} contiguous={contiguous}"
                out, lse = act.ring_attention(comm, mq, mk, mv, layout, mode=mode, causal=c["causal"],
                                              window_size=c["window"], softcap=c["softcap"], sinks=c["sinks"],
                                              return_lse=True)
                np.testing.assert_allclose(out.numpy(), want_out, err_msg=what, **TOL)
                np.testing.assert_allclose(lse.numpy(), want_lse, err_msg=what, **TOL)
            # Level attention keeping every key is exact too.
            out, lse = act.level_attention(comm, mq, mk, mv, layout, causal=c["causal"], window_size=c["window"],
                                           softcap=c["softcap"], sinks=c["sinks"], return_lse=True)
            np.testing.assert_allclose(out.numpy(), want_out, err_msg=f"level {c}", **TOL)
            np.testing.assert_allclose(lse.numpy(), want_lse, err_msg=f"level {c}", **TOL)
    return q, k, v, sinks


def check_decode(rank, comm, q, k, v, sinks):
    # One sequence; its keys dealt round robin; the new query at LEN - 1.
    rows = [t for t in range(LEN) if t % NRANKS == rank]
    qd = q[LEN - 1:LEN].contiguous()
    kv_offsets = torch.tensor([0, len(rows)], dtype=torch.int32)
    kv_pos = torch.tensor(rows, dtype=torch.int32)
    q_pos = torch.tensor([LEN - 1], dtype=torch.int32)
    want_out, want_lse = reference(qd, [LEN - 1], k, v, list(range(LEN)), True, (9, -1), 2.0, sinks)
    for mode in ("ship_q", "pass_kv", "auto"):
        out, lse = act.decode_attention(comm, qd, k[rows].contiguous(), v[rows].contiguous(), kv_offsets, kv_pos,
                                        q_pos, mode=mode, window_size=(9, -1), softcap=2.0, sinks=sinks,
                                        return_lse=True)
        np.testing.assert_allclose(out.numpy(), want_out, err_msg=f"decode {mode}", **TOL)
        np.testing.assert_allclose(lse.numpy(), want_lse, err_msg=f"decode {mode}", **TOL)


def check_kv_pool(rank, comm, q, k, v, sinks):
    # Every rank appends request 10 + rank: the whole sequence's keys, and
    # asks for the last 4 queries of it.
    with act.KvPool(comm, 8, HKV, D, torch.float32, 32) as pool:
        req = 10 + rank
        pos = torch.arange(LEN, dtype=torch.int32)
        pool.append(req, k.contiguous(), v.contiguous(), pos)
        qs = q[LEN - 4:].contiguous()
        q_pos = torch.arange(LEN - 4, LEN, dtype=torch.int32)
        want_out, want_lse = reference(qs, q_pos.tolist(), k, v, list(range(LEN)), True, (6, -1), 0.0, sinks)
        out, lse = act.kv_attention(pool, qs, [req], [0, 4], q_pos, window_size=(6, -1), sinks=sinks,
                                    return_lse=True)
        np.testing.assert_allclose(out.numpy(), want_out, err_msg="kv pool", **TOL)
        np.testing.assert_allclose(lse.numpy(), want_lse, err_msg="kv pool", **TOL)


def check_compile(rank, comm, q, k, v, sinks):
    rows = rows_of(rank, False)
    layout = act.SeqLayout(torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32),
                           torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32))
    mq, mk, mv = q[rows].contiguous(), k[rows].contiguous(), v[rows].contiguous()

    def layer(x):
        return act.ring_attention(comm, x * 1.0, mk, mv, layout, mode="pass_kv", window_size=(5, -1), softcap=3.0,
                                  sinks=sinks) + 0.0

    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    want_out, _ = reference(q[rows], rows, k, v, list(range(LEN)), True, (5, -1), 3.0, sinks)
    np.testing.assert_allclose(compiled(mq).numpy(), want_out, err_msg="compiled", **TOL)


def check_engine_kernel(rank, comm, q, k, v, sinks):
    """The engine's torch kernel inside the ring: registered with
    windows=True it gets window_size and softcap and the result is exact;
    registered without, a windowed call is refused on every rank."""
    rows = rows_of(rank, True)
    layout = act.SeqLayout(torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32),
                           torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32))
    mq, mk, mv = q[rows].contiguous(), k[rows].contiguous(), v[rows].contiguous()
    seen = []

    def kernel(*args, **kwargs):
        seen.append(kwargs)
        return act.reference_kernel(*args, **kwargs)

    want_out, want_lse = reference(q[rows], rows, k, v, list(range(LEN)), True, (6, -1), 2.5, sinks)
    act.set_attn_kernel(comm, kernel, windows=True)
    try:
        for mode in ("pass_kv", "pass_q", "ship_q", "head_parallel"):
            out, lse = act.ring_attention(comm, mq, mk, mv, layout, mode=mode, window_size=(6, -1), softcap=2.5,
                                          sinks=sinks, return_lse=True)
            np.testing.assert_allclose(out.numpy(), want_out, err_msg=f"engine kernel {mode}", **TOL)
            np.testing.assert_allclose(lse.numpy(), want_lse, err_msg=f"engine kernel {mode}", **TOL)
        assert seen and all(s == {"window_size": (6, -1), "softcap": 2.5} for s in seen), seen[:3]
        act.set_attn_kernel(comm, act.reference_kernel)  # no windows=True: refused everywhere
        try:
            act.ring_attention(comm, mq, mk, mv, layout, mode="pass_kv", window_size=(6, -1))
        except ac.AttnError as e:
            assert "attnCommSetAttnKernelEx" in str(e), e
        else:
            raise AssertionError("a windowed call ran on a kernel that cannot apply the window")
    finally:
        act.set_attn_kernel(comm, None)


def check_bad_args(rank, comm, q, k, v):
    rows = rows_of(rank, False)
    layout = act.SeqLayout(torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32),
                           torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32))
    mq, mk, mv = q[rows].contiguous(), k[rows].contiguous(), v[rows].contiguous()
    bad = [
        (dict(window_size=(-2, 0)), ["window_size"]),
        (dict(window_size=(3,)), ["window_size"]),
        (dict(softcap=float("nan")), ["softcap"]),
        (dict(softcap=-1.0), ["softcap"]),
        (dict(sinks=torch.zeros(HQ + 1)), ["sinks", "shape"]),
        (dict(sinks=torch.zeros(HQ, dtype=torch.float64)), ["sinks", "float32"]),
    ]
    for kwargs, words in bad:
        try:
            act.ring_attention(comm, mq, mk, mv, layout, **kwargs)
        except ac.AttnError as e:
            assert all(w in str(e) for w in words), f"{kwargs}: AttnError {e!r} does not name {words}"
            continue
        raise AssertionError(f"{kwargs}: no AttnError")
    # Nothing was sent: the next call works on every rank.
    act.ring_attention(comm, mq, mk, mv, layout, window_size=(4, -1))


def check_mla(rank, comm, q, k):
    """v with a head dim of its own (DV < D, DeepSeek's shape scaled down):
    every mode, level attention, decode, torch.compile, the engine's torch
    kernel; an out of q's head dim is refused naming out."""
    dv = 8
    v = torch.randn(LEN, HKV, dv, generator=torch.Generator().manual_seed(9))
    rows = rows_of(rank, False)
    layout = act.SeqLayout(torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32),
                           torch.tensor([0, len(rows)], dtype=torch.int32), torch.tensor(rows, dtype=torch.int32))
    mq, mk, mv = q[rows].contiguous(), k[rows].contiguous(), v[rows].contiguous()
    want_out, want_lse = reference(q[rows], rows, k, v, list(range(LEN)), True, (7, -1), 0.0, None)
    for mode in MODES:
        out, lse = act.ring_attention(comm, mq, mk, mv, layout, mode=mode, window_size=(7, -1), return_lse=True)
        assert tuple(out.shape) == (len(rows), HQ, dv), out.shape
        np.testing.assert_allclose(out.numpy(), want_out, err_msg=f"mla {mode}", **TOL)
        np.testing.assert_allclose(lse.numpy(), want_lse, err_msg=f"mla {mode}", **TOL)
    out = act.level_attention(comm, mq, mk, mv, layout, window_size=(7, -1))
    np.testing.assert_allclose(out.numpy(), want_out, err_msg="mla level", **TOL)
    compiled = torch.compile(lambda x: act.ring_attention(comm, x * 1.0, mk, mv, layout, mode="ship_q",
                                                          window_size=(7, -1)) + 0.0, fullgraph=True, backend="eager")
    np.testing.assert_allclose(compiled(mq).numpy(), want_out, err_msg="mla compiled", **TOL)
    act.set_attn_kernel(comm, act.reference_kernel, windows=True)
    try:
        out = act.ring_attention(comm, mq, mk, mv, layout, mode="pass_q", window_size=(7, -1))
        np.testing.assert_allclose(out.numpy(), want_out, err_msg="mla engine kernel", **TOL)
    finally:
        act.set_attn_kernel(comm, None)
    # Decode: the last token's query over keys dealt round robin.
    qd = q[LEN - 1:LEN].contiguous()
    want_d, _ = reference(qd, [LEN - 1], k, v, list(range(LEN)), True, (-1, -1), 0.0, None)
    out = act.decode_attention(comm, qd, mk, mv, torch.tensor([0, len(rows)], dtype=torch.int32),
                               torch.tensor(rows, dtype=torch.int32), torch.tensor([LEN - 1], dtype=torch.int32))
    np.testing.assert_allclose(out.numpy(), want_d, err_msg="mla decode", **TOL)
    try:
        act.ring_attention(comm, mq, mk, mv, layout, out=torch.empty_like(mq))
    except ac.AttnError as e:
        assert "out" in str(e) and str(dv) in str(e), e
    else:
        raise AssertionError("an out of q's head dim was taken for an MLA call")


def run_checks(rank, comm):
    q, k, v, sinks = check_ring(rank, comm)
    check_decode(rank, comm, q, k, v, sinks)
    check_kv_pool(rank, comm, q, k, v, sinks)
    check_compile(rank, comm, q, k, v, sinks)
    check_engine_kernel(rank, comm, q, k, v, sinks)
    check_bad_args(rank, comm, q, k, v)
    check_mla(rank, comm, q, k)


if __name__ == "__main__":
    sys.exit(gloo_ranks.run(NRANKS, run_checks, f"attncomm.torch with windows, softcap, sinks and MLA: {NRANKS} gloo ranks, "
                            "every mode, decode, KV pool, level attention, torch.compile and bad arguments against "
                            "float64: ok"))
