#!/usr/bin/env python3
"""attncomm.torch's other custom ops on CPU tensors, ranks as processes in a
gloo process group: level_attention (keeping every key: exact attention;
dropping: attention over the keys each peer keeps, and the C binding's
result), decode_attention (replicated and own queries, several modes),
kv_attention over a KvPool with lent blocks, and the merges
(merge_attn_states, merge_attn_reduce_scatter, merge_attn_all_gather) in
every LSE convention, all against float64 attention; torch.compile(
fullgraph=True) traces a function that calls each of them; bad out / lse
tensors raise AttnError naming the argument, with nothing sent; a layout
that disagrees with the tensors on one rank fails the call on every rank.
Exit 77 (skipped) without torch."""
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
HQ, HKV, D = 4, 2, 16
LENS = [37, 20]              # prefill: two sequences, tokens dealt round-robin
DEC_LENS = [13, 2, 25, 7]    # decode: keys of each sequence spread as decode_placement does
DEC_QPOS = [13, 2, 20, 7]    # the new queries' positions (sequence 2's last keys are after it)
LOG2E = 1.0 / np.log(2.0)
TOL = dict(rtol=1e-4, atol=1e-4)


def expect_error(fn, words):
    try:
        fn()
    except ac.AttnError as e:
        assert all(w in str(e) for w in words), f"AttnError {e!r} does not name {words}"
        return
    raise AssertionError(f"no AttnError (expected one naming {words})")


def randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

# ---- prefill shards ------------------------------------------------------------------


def prefill_rows(rank):
    """This rank's rows of the packed batch, its offsets and positions."""
    rows, offsets, pos, base = [], [0], [], 0
    for n in LENS:
        mine = [t for t in range(n) if t % NRANKS == rank]
        rows += [base + t for t in mine]
        pos += mine
        offsets.append(len(rows))
        base += n
    return rows, offsets, pos


def attention_over(q, k, v, q_rows, key_rows):
    """float64 out and lse of the batch rows q_rows over the batch rows
    key_rows (each query sees the keys of its own sequence among them)."""
    outs, lses, base = [], [], 0
    key_rows = set(key_rows)
    for n in LENS:
        qs = [r for r in q_rows if base <= r < base + n]
        ks = [r for r in range(base, base + n) if r in key_rows]
        o, s = attention_at_positions(q[qs].double().numpy(), [r - base for r in qs], k[ks].double().numpy(),
                                      v[ks].double().numpy(), [r - base for r in ks])
        outs.append(o)
        lses.append(s)
        base += n
    return np.concatenate(outs), np.concatenate(lses)


def kept_rows(peer, importance, keep):
    """The rows peer sends when it keeps `keep` of each sequence's keys: the
    most important round(keep * n), at least one (attnLevelDrop_t)."""
    rows, _, _ = prefill_rows(peer)
    kept, base = [], 0
    for n in LENS:
        seq = np.array([r for r in rows if base <= r < base + n], np.int64)
        count = min(len(seq), max(1, int(np.floor(keep * len(seq) + 0.5)))) if len(seq) else 0
        order = np.argsort(-importance[seq].numpy(), kind="stable")
        kept += seq[order[:count]].tolist()
        base += n
    return kept

# ---- decode shards ---------------------------------------------------------------------


def decode_shard(rank):
    """This rank's keys: key t of sequence s lives on (s + t) % nranks (the
    kv rank of attncomm.decode_placement at step t). Batch rows, int32
    kv_offsets and kv_pos."""
    rows, offsets, pos, base = [], [0], [], 0
    for s, n in enumerate(DEC_LENS):
        for t in range(n):
            if ac.decode_placement(len(DEC_LENS), t, NRANKS)[0][s] == rank:
                rows.append(base + t)
                pos.append(t)
        offsets.append(len(rows))
        base += n
    return rows, torch.tensor(offsets, dtype=torch.int32), torch.tensor(pos, dtype=torch.int32)


def decode_reference(q, k, v):
    outs, lses, base = [], [], 0
    for s, n in enumerate(DEC_LENS):
        o, l_ = attention_at_positions(q[s:s + 1].double().numpy(), [DEC_QPOS[s]], k[base:base + n].double().numpy(),
                                       v[base:base + n].double().numpy(), list(range(n)))
        outs.append(o)
        lses.append(l_)
        base += n
    return np.concatenate(outs), np.concatenate(lses)

# ---- the KV pool ---------------------------------------------------------------------------


BLOCK, CAPACITY = 4, 32
REQUESTS = {0: {100: 23}, 1: {101: 9}, 2: {102: 14, 200: 6}}   # rank -> {request: tokens}


def pool_tokens(rank):
    out = {}
    for i, (req, n) in enumerate(sorted(REQUESTS[rank].items())):
        k = randn(1000 + req, n, HKV, D)
        v = randn(2000 + req, n, HKV, D)
        pos = torch.arange(n, dtype=torch.int32) * 2 + 3 + rank + i
        out[req] = (k, v, pos)
    return out


def pool_reference(q, q_offsets, q_pos, reqs, tokens, causal=True):
    outs, lses = [], []
    for i, req in enumerate(reqs):
        k, v, pos = tokens[req]
        a, b = q_offsets[i], q_offsets[i + 1]
        o, s = attention_at_positions(q[a:b].double().numpy(), None if q_pos is None else q_pos[a:b].tolist(),
                                      k.double().numpy(), v.double().numpy(), pos.tolist(), causal=causal)
        outs.append(o)
        lses.append(s)
    return np.concatenate(outs), np.concatenate(lses)

# ---- the checks ------------------------------------------------------------------------------


def check_level(rank, comm):
    rows, offsets, pos = prefill_rows(rank)
    layout = act.SeqLayout(offsets, pos, offsets, pos)
    total = sum(LENS)
    q, k, v = randn(1, total, HQ, D), randn(2, total, HKV, D), randn(3, total, HKV, D)
    mq, mk, mv = q[rows].contiguous(), k[rows].contiguous(), v[rows].contiguous()
    ref_out, ref_lse = attention_over(q, k, v, rows, range(total))

    # Every key kept: exact attention, in two LSE conventions.
    out, lse = act.level_attention(comm, mq, mk, mv, layout, return_lse=True)
    np.testing.assert_allclose(out.numpy(), ref_out, **TOL)
    np.testing.assert_allclose(lse.numpy(), ref_lse, **TOL)
    out = torch.full_like(mq, float("nan"))
    lse2 = torch.full((HQ, len(rows)), float("nan"))
    got = act.level_attention(comm, mq, mk, mv, layout, out=out, lse=lse2, lse_base="2", lse_layout="ht")
    assert got[0] is out and got[1] is lse2
    np.testing.assert_allclose(out.numpy(), ref_out, **TOL)
    np.testing.assert_allclose(lse2.numpy(), ref_lse.T * LOG2E, **TOL)

    # Dropping: from each peer (the host tier: processes of one host) the
    # most important half of its keys of each sequence.
    importance = torch.rand(total, generator=torch.Generator().manual_seed(4))
    keep = (1.0, 0.5, 1.0, 1.0)
    keys = rows + [r for p in range(NRANKS) if p != rank for r in kept_rows(p, importance, 0.5)]
    want_out, want_lse = attention_over(q, k, v, rows, keys)
    assert np.abs(want_out - ref_out).max() > 1e-2, "the dropped keys make no difference: a weak test"
    my_imp = importance[rows].contiguous()
    out, lse = act.level_attention(comm, mq, mk, mv, layout, keep=keep, importance=my_imp, return_lse=True)
    np.testing.assert_allclose(out.numpy(), want_out, **TOL)
    np.testing.assert_allclose(lse.numpy(), want_lse, **TOL)
    # ... as the C binding computes it.
    c_out, c_lse = torch.empty_like(mq), torch.empty(len(rows), HQ)
    comm.level_attention(mq, mk, mv, c_out, ac.SeqLayout(offsets, pos, offsets, pos), HQ, HKV, D, keep=keep,
                         importance=my_imp, lse=c_lse)
    np.testing.assert_allclose(out.numpy(), c_out.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse.numpy(), c_lse.numpy(), rtol=1e-6, atol=1e-6)

    # bfloat16 in and out.
    out = act.level_attention(comm, mq.bfloat16(), mk.bfloat16(), mv.bfloat16(), layout)
    assert out.dtype == torch.bfloat16
    np.testing.assert_allclose(out.float().numpy(), ref_out, rtol=3e-2, atol=3e-2)
    return dict(layout=layout, mq=mq, mk=mk, mv=mv, ref_out=ref_out, ref_lse=ref_lse, rows=rows, offsets=offsets,
                pos=pos, q=q, k=k, v=v, importance=my_imp)


def check_decode(rank, comm):
    rows, kv_offsets, kv_pos = decode_shard(rank)
    seqs, total = len(DEC_LENS), sum(DEC_LENS)
    q, k, v = randn(11, seqs, HQ, D), randn(12, total, HKV, D), randn(13, total, HKV, D)
    mk, mv = k[rows].contiguous(), v[rows].contiguous()
    q_pos = torch.tensor(DEC_QPOS, dtype=torch.int32)
    ref_out, ref_lse = decode_reference(q, k, v)
    assert np.isfinite(ref_lse).all()
    # Sequence 1 (two keys) has none on rank 2: that rank only helps.
    for mode in ("ship_q", "auto", "pass_kv", "head_parallel"):
        out, lse = act.decode_attention(comm, q, mk, mv, kv_offsets, kv_pos, q_pos, mode=mode, return_lse=True)
        np.testing.assert_allclose(out.numpy(), ref_out, err_msg=mode, **TOL)
        np.testing.assert_allclose(lse.numpy(), ref_lse, err_msg=mode, **TOL)
    out = torch.full_like(q, float("nan"))
    lse2 = torch.full((HQ, seqs), float("nan"))
    act.decode_attention(comm, q, mk, mv, kv_offsets, kv_pos, q_pos, out=out, lse=lse2, lse_base="2", lse_layout="ht")
    np.testing.assert_allclose(out.numpy(), ref_out, **TOL)
    np.testing.assert_allclose(lse2.numpy(), ref_lse.T * LOG2E, **TOL)
    # Only this rank's queries (s % nranks == rank).
    own = list(range(rank, seqs, NRANKS))
    out, lse = act.decode_attention(comm, q[own].contiguous(), mk, mv, kv_offsets.tolist(), kv_pos,
                                    q_pos[own].contiguous(), replicated=False, return_lse=True)
    np.testing.assert_allclose(out.numpy(), ref_out[own], **TOL)
    np.testing.assert_allclose(lse.numpy(), ref_lse[own], **TOL)
    return dict(q=q, mk=mk, mv=mv, kv_offsets=kv_offsets, kv_pos=kv_pos, q_pos=q_pos, ref_out=ref_out,
                ref_lse=ref_lse)


def check_kv_pool(rank, comm, pool):
    tokens = pool_tokens(rank)
    for req, (k, v, pos) in tokens.items():
        pool.append(req, k, v, pos)
    # Rank 0 lends the 3 oldest full blocks of request 100 to rank 1.
    granted = pool.migrate([(0, 1, 0, 100, 3)] if rank == 0 else [])
    assert list(granted) == ([3] if rank == 0 else []), granted
    assert pool.stats()["lent_out_blocks" if rank == 0 else "lent_in_blocks"] == (3 if rank < 2 else 0)
    reqs = sorted(tokens)
    # Decode rows, one per request after its last key; on rank 0 also a
    # causal chunk between the keys.
    q_rows = [1] * len(reqs)
    q_pos = [int(tokens[r][2][-1]) + 1 for r in reqs]
    if rank == 0:
        kp = tokens[100][2]
        q_rows[0] += 3
        q_pos = [int(kp[2]), int(kp[9]) + 1, int(kp[15]), q_pos[0]]
    q_offsets = np.cumsum([0] + q_rows).tolist()
    q_pos = torch.tensor(q_pos, dtype=torch.int32)
    q = randn(50 + rank, q_offsets[-1], HQ, D)
    want_out, want_lse = pool_reference(q, q_offsets, q_pos, reqs, tokens)
    out, lse = act.kv_attention(pool, q, reqs, q_offsets, q_pos, return_lse=True)
    np.testing.assert_allclose(out.numpy(), want_out, **TOL)
    np.testing.assert_allclose(lse.numpy(), want_lse, **TOL)
    out = torch.full_like(q, float("nan"))
    lse2 = torch.full((HQ, q.shape[0]), float("nan"))
    pool.attention(q, torch.tensor(reqs), torch.tensor(q_offsets, dtype=torch.int32), q_pos, out=out, lse=lse2,
                   lse_base="2", lse_layout="ht")
    np.testing.assert_allclose(out.numpy(), want_out, **TOL)
    np.testing.assert_allclose(lse2.numpy(), want_lse.T * LOG2E, **TOL)
    # Not causal: every key, no positions.
    nc_out, _ = pool_reference(q, q_offsets, None, reqs, tokens, causal=False)
    out = act.kv_attention(pool, q, reqs, q_offsets, causal=False)
    np.testing.assert_allclose(out.numpy(), nc_out, **TOL)
    return dict(q=q, reqs=reqs, q_offsets=q_offsets, q_pos=q_pos, want_out=want_out, want_lse=want_lse)


def check_merges(rank, comm, lv):
    """Decode context parallelism by hand: the same query rows on every rank,
    each over its own keys; the merges give the attention over all of them."""
    total = sum(LENS)
    q, k, v, rows = lv["q"], lv["k"], lv["v"], lv["rows"]
    qd = q[total - 1:].repeat(3, 1, 1).contiguous()          # 3 rows at the last position
    qpos = [total - 1] * 3
    o_full, l_full = attention_at_positions(qd.numpy(), qpos, k.numpy(), v.numpy(), list(range(total)))
    o_part, l_part = attention_at_positions(qd.numpy(), qpos, lv["mk"].numpy(), lv["mv"].numpy(), rows)
    o_part = torch.from_numpy(o_part).float().contiguous()
    l_part = torch.from_numpy(l_part).float().contiguous()
    h0, h1 = rank * HQ // NRANKS, (rank + 1) * HQ // NRANKS

    out, lse = act.merge_attn_reduce_scatter(comm, o_part, l_part, return_lse=True)
    np.testing.assert_allclose(out.numpy(), o_full[:, h0:h1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), l_full[:, h0:h1], rtol=1e-5, atol=1e-5)
    # Base-2 head-major LSEs in and out.
    l_part2 = (l_part * LOG2E).t().contiguous()
    out, lse = act.merge_attn_reduce_scatter(comm, o_part, l_part2, return_lse=True, lse_base="2", lse_layout="ht")
    assert tuple(lse.shape) == (h1 - h0, 3)
    np.testing.assert_allclose(out.numpy(), o_full[:, h0:h1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), l_full[:, h0:h1].T * LOG2E, rtol=1e-5, atol=1e-5)
    out = torch.full((3, HQ, D), float("nan"))
    lse = torch.full((HQ, 3), float("nan"))
    act.merge_attn_all_gather(comm, o_part, l_part2, out=out, lse=lse, lse_base="2", lse_layout="ht")
    np.testing.assert_allclose(out.numpy(), o_full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), l_full.T * LOG2E, rtol=1e-5, atol=1e-5)
    out = act.merge_attn_all_gather(comm, o_part, l_part)
    np.testing.assert_allclose(out.numpy(), o_full, rtol=1e-5, atol=1e-5)

    # Local merge: this rank's keys in two halves.
    half = len(rows) // 2
    parts = [attention_at_positions(qd.numpy(), qpos, lv["mk"][a:b].numpy(), lv["mv"][a:b].numpy(), rows[a:b])
             for a, b in ((0, half), (half, len(rows)))]
    outs = [torch.from_numpy(o).float().contiguous() for o, _ in parts]
    lses = [torch.from_numpy(s).float().contiguous() for _, s in parts]
    merged, mlse = act.merge_attn_states(outs, lses)
    np.testing.assert_allclose(merged.numpy(), o_part.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mlse.numpy(), l_part.numpy(), rtol=1e-5, atol=1e-5)
    lses2 = [(s * LOG2E).t().contiguous() for s in lses]
    merged, mlse = act.merge_attn_states(outs, lses2, lse_base="2", lse_layout="ht")
    np.testing.assert_allclose(merged.numpy(), o_part.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mlse.numpy(), l_part.numpy().T * LOG2E, rtol=1e-5, atol=1e-5)
    return dict(o_part=o_part, l_part=l_part, outs=outs, lses=lses, o_full=o_full, l_full=l_full)


def check_compile(rank, comm, pool, lv, dc, kv, mg):
    """One function calling every op, traced whole (fullgraph: a graph break
    is an error)."""
    keep = (1.0, 0.5, 1.0, 1.0)
    layout = lv["layout"]

    def model(a, b, c, imp, dq, dk, dv, pq, po, pl, os_, ls_):
        o1, s1 = act.level_attention(comm, a * 1.0, b, c, layout, return_lse=True, lse_layout="ht")
        o2 = act.level_attention(comm, a, b, c, layout, keep=keep, importance=imp)
        o3, s3 = act.decode_attention(comm, dq + 0.0, dk, dv, dc["kv_offsets"], dc["kv_pos"], dc["q_pos"],
                                      return_lse=True, lse_base="2")
        o4, s4 = act.kv_attention(pool, pq * 1.0, kv["reqs"], kv["q_offsets"], kv["q_pos"], return_lse=True)
        o5, s5 = act.merge_attn_states([os_[0], os_[1]], [ls_[0], ls_[1]])
        o6, s6 = act.merge_attn_all_gather(comm, po, pl.t().contiguous(), return_lse=True, lse_layout="ht")
        o7 = act.merge_attn_reduce_scatter(comm, po, pl)
        return o1 * 2.0, s1, o2, o3, s3, o4, s4, o5, s5, o6, s6, o7

    args = (lv["mq"], lv["mk"], lv["mv"], lv["importance"], dc["q"], dc["mk"], dc["mv"], kv["q"], mg["o_part"],
            mg["l_part"], mg["outs"], mg["lses"])
    want_o2 = act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], layout, keep=keep, importance=lv["importance"])
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    o1, s1, o2, o3, s3, o4, s4, o5, s5, o6, s6, o7 = compiled(*args)
    np.testing.assert_allclose(o1.numpy(), 2 * lv["ref_out"], **TOL)
    np.testing.assert_allclose(s1.numpy(), lv["ref_lse"].T, **TOL)
    np.testing.assert_allclose(o2.numpy(), want_o2.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(o3.numpy(), dc["ref_out"], **TOL)
    np.testing.assert_allclose(s3.numpy(), dc["ref_lse"] * LOG2E, **TOL)
    np.testing.assert_allclose(o4.numpy(), kv["want_out"], **TOL)
    np.testing.assert_allclose(s4.numpy(), kv["want_lse"], **TOL)
    np.testing.assert_allclose(o5.numpy(), mg["o_part"].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s5.numpy(), mg["l_part"].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o6.numpy(), mg["o_full"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s6.numpy(), mg["l_full"].T, rtol=1e-5, atol=1e-5)
    h0, h1 = rank * HQ // NRANKS, (rank + 1) * HQ // NRANKS
    np.testing.assert_allclose(o7.numpy(), mg["o_full"][:, h0:h1], rtol=1e-5, atol=1e-5)


def bad_outs(shape, dtype=torch.float32):
    """(tensor, words its error names) for out of `shape`: wrong dtype, too
    small, not contiguous."""
    rows = shape[0]
    return [(torch.empty(shape, dtype=torch.float64 if dtype != torch.float64 else torch.float32), ["out", "dtype"]),
            (torch.empty((max(rows - 1, 0),) + tuple(shape[1:]), dtype=dtype), ["out", "shape"]),
            (torch.empty(tuple(shape[:-1]) + (2 * shape[-1],), dtype=dtype)[..., ::2], ["out", "contiguous"])]


def bad_lses(rows, heads):
    return [(torch.empty(rows, heads, dtype=torch.bfloat16), ["lse", "float32"]),
            (torch.empty(max(rows - 1, 0), heads), ["lse", "shape"]),
            (torch.empty(rows, 2 * heads)[:, ::2], ["lse", "contiguous"])]


def check_bad_tensors(rank, comm, pool, lv, dc, kv, mg):
    """Refused here, before anything is sent, on every rank alike; the
    communicator then still works."""
    calls = {
        "level_attention": (lambda **kw: act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], lv["layout"], **kw),
                            lv["mq"].shape),
        "decode_attention": (lambda **kw: act.decode_attention(comm, dc["q"], dc["mk"], dc["mv"], dc["kv_offsets"],
                                                               dc["kv_pos"], dc["q_pos"], **kw), dc["q"].shape),
        "kv_attention": (lambda **kw: act.kv_attention(pool, kv["q"], kv["reqs"], kv["q_offsets"], kv["q_pos"], **kw),
                         kv["q"].shape),
        "merge_attn_states": (lambda **kw: act.merge_attn_states(mg["outs"], mg["lses"], **kw), mg["o_part"].shape),
        "merge_attn_all_gather": (lambda **kw: act.merge_attn_all_gather(comm, mg["o_part"], mg["l_part"], **kw),
                                  mg["o_part"].shape),
        "merge_attn_reduce_scatter": (lambda **kw: act.merge_attn_reduce_scatter(comm, mg["o_part"], mg["l_part"],
                                                                                 **kw),
                                      (3, (rank + 1) * HQ // NRANKS - rank * HQ // NRANKS, D)),
    }
    for name, (call, shape) in calls.items():
        for t, words in bad_outs(shape):
            expect_error(lambda: call(out=t), words)
        for t, words in bad_lses(shape[0], shape[1]):
            expect_error(lambda: call(lse=t), words)
    # Inputs of the ops.
    expect_error(lambda: act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], lv["layout"], keep=(1, 0.5, 1, 1),
                                             importance=lv["importance"].double()), ["importance", "float32"])
    expect_error(lambda: act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], lv["layout"], keep=(1, 0.5, 1, 1)),
                 ["importance"])
    expect_error(lambda: act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], lv["layout"], keep=(1, 0.5)),
                 ["keep"])
    expect_error(lambda: act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], lv["layout"], keep=(1, 2, 1, 1),
                                             importance=lv["importance"]), ["keep"])
    expect_error(lambda: act.decode_attention(comm, dc["q"], dc["mk"], dc["mv"], dc["kv_offsets"].long(),
                                              dc["kv_pos"], dc["q_pos"]), ["kv_offsets", "int32"])
    expect_error(lambda: act.decode_attention(comm, dc["q"].double(), dc["mk"].double(), dc["mv"].double(),
                                              dc["kv_offsets"], dc["kv_pos"], dc["q_pos"]), ["dtype"])
    expect_error(lambda: act.kv_attention(pool, kv["q"].bfloat16(), kv["reqs"], kv["q_offsets"], kv["q_pos"]),
                 ["q", "dtype"])
    expect_error(lambda: act.kv_attention(pool, kv["q"], kv["reqs"], kv["q_offsets"], kv["q_pos"].long()),
                 ["q_pos", "int32"])
    half = torch.zeros(2, HKV, D, dtype=torch.float16)
    expect_error(lambda: pool.append(999, half, torch.zeros(2, HKV, D), [0, 1]), ["k", "dtype"])
    expect_error(lambda: act.merge_attn_states(mg["outs"], [mg["lses"][0].t(), mg["lses"][1]]), ["lses[0]"])
    expect_error(lambda: act.merge_attn_all_gather(comm, mg["o_part"], mg["l_part"], lse_layout="ht"), ["lse_part"])
    expect_error(lambda: act.merge_attn_all_gather(comm, mg["o_part"].double(), mg["l_part"]), ["out_part", "dtype"])
    # Nothing was sent: the same calls still work.
    out = act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], lv["layout"])
    np.testing.assert_allclose(out.numpy(), lv["ref_out"], **TOL)
    out = act.decode_attention(comm, dc["q"], dc["mk"], dc["mv"], dc["kv_offsets"], dc["kv_pos"], dc["q_pos"])
    np.testing.assert_allclose(out.numpy(), dc["ref_out"], **TOL)


def check_disagreeing_layouts(rank, comm, pool, lv, dc, kv):
    """A layout that disagrees with the rows on rank 1 fails on every rank
    (rank 1 names its argument, the others rank 1); then all is well."""
    rows, offsets, pos = lv["rows"], lv["offsets"], lv["pos"]
    others = ["rank 1"]
    bad = lv["layout"]
    if rank == 1:
        bad = act.SeqLayout(offsets[:-1] + [offsets[-1] + 1], pos + [0], offsets, pos)
    expect_error(lambda: act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], bad),
                 ["layout"] if rank == 1 else others)
    expect_error(lambda: act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], bad, keep=(1, 0.5, 1, 1),
                                             importance=lv["importance"]), ["layout"] if rank == 1 else others)

    kv_pos = dc["kv_pos"]
    if rank == 1:
        kv_pos = torch.cat([kv_pos, torch.zeros(1, dtype=torch.int32)])
    expect_error(lambda: act.decode_attention(comm, dc["q"], dc["mk"], dc["mv"], dc["kv_offsets"], kv_pos,
                                              dc["q_pos"]), ["kv_pos"] if rank == 1 else others)
    q_pos = dc["q_pos"][:-1].contiguous() if rank == 1 else dc["q_pos"]
    expect_error(lambda: act.decode_attention(comm, dc["q"], dc["mk"], dc["mv"], dc["kv_offsets"], dc["kv_pos"],
                                              q_pos), ["q_pos"] if rank == 1 else others)
    own = list(range(rank, len(DEC_LENS), NRANKS))
    q_own = dc["q"][own + ([0] if rank == 1 else [])].contiguous()   # a row too many on rank 1
    pos_own = dc["q_pos"][own + ([0] if rank == 1 else [])].contiguous()
    expect_error(lambda: act.decode_attention(comm, q_own, dc["mk"], dc["mv"], dc["kv_offsets"], dc["kv_pos"],
                                              pos_own, replicated=False), ["q"] if rank == 1 else others)

    q_offsets = list(kv["q_offsets"])
    if rank == 1:
        q_offsets[-1] += 1
    expect_error(lambda: act.kv_attention(pool, kv["q"], kv["reqs"], q_offsets, kv["q_pos"]),
                 ["q_offsets"] if rank == 1 else others)

    # All usable afterwards.
    out = act.level_attention(comm, lv["mq"], lv["mk"], lv["mv"], lv["layout"])
    np.testing.assert_allclose(out.numpy(), lv["ref_out"], **TOL)
    out = act.decode_attention(comm, dc["q"], dc["mk"], dc["mv"], dc["kv_offsets"], dc["kv_pos"], dc["q_pos"])
    np.testing.assert_allclose(out.numpy(), dc["ref_out"], **TOL)
    out = act.kv_attention(pool, kv["q"], kv["reqs"], kv["q_offsets"], kv["q_pos"])
    np.testing.assert_allclose(out.numpy(), kv["want_out"], **TOL)


def run_checks(rank, comm):
    lv = check_level(rank, comm)
    dc = check_decode(rank, comm)
    with act.KvPool(comm, BLOCK, HKV, D, torch.float32, CAPACITY) as pool:
        kv = check_kv_pool(rank, comm, pool)
        mg = check_merges(rank, comm, lv)
        check_compile(rank, comm, pool, lv, dc, kv, mg)
        check_bad_tensors(rank, comm, pool, lv, dc, kv, mg)
        check_disagreeing_layouts(rank, comm, pool, lv, dc, kv)


if __name__ == "__main__":
    sys.exit(gloo_ranks.run(NRANKS, run_checks,
                            f"attncomm.torch ops: {NRANKS} gloo ranks, level, decode, KV pool and merge ops against "
                            "float64, every LSE convention, torch.compile, bad out/lse, disagreeing layouts: ok"))
