"""Exact attention in float64 numpy, written apart from the library's own
reference, for the Python tests: packed THD rows, GQA, causal on global
positions, and the natural-log LSE of the scaled scores."""
import numpy as np


def batch_rows(new_lens, cached_lens):
    """Global rows of a batch: (new-token rows of each sequence in the packed
    new tokens, full rows of each sequence in the packed full sequences)."""
    new_base, full_base, seqs = 0, 0, []
    for t, p in zip(new_lens, cached_lens):
        seqs.append((new_base, full_base, t, p))
        new_base += t
        full_base += t + p
    return seqs


def exact_attention(q, k, v, new_lens, cached_lens, causal=True, scale=None):
    """q: [new rows, Hq, D]; k, v: [full rows, Hkv, D] (any float dtype).
    Returns out [new rows, Hq, D] and lse [new rows, Hq], float64."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    group = hq // hkv
    out = np.zeros_like(q)
    lse = np.full(q.shape[:2], -np.inf)
    for new_base, full_base, t, p in batch_rows(new_lens, cached_lens):
        if t == 0:
            continue
        qs = q[new_base:new_base + t]                          # [t, Hq, D]
        ks = np.repeat(k[full_base:full_base + t + p], group, axis=1)  # [t+p, Hq, D]
        vs = np.repeat(v[full_base:full_base + t + p], group, axis=1)
        s = np.einsum("qhd,khd->hqk", qs, ks) * scale          # [Hq, t, t+p]
        if causal:
            qpos = p + np.arange(t)
            kpos = np.arange(t + p)
            s = np.where(kpos[None, None, :] <= qpos[None, :, None], s, -np.inf)
        m = s.max(axis=2, keepdims=True)
        e = np.exp(s - m)
        z = e.sum(axis=2, keepdims=True)
        out[new_base:new_base + t] = np.einsum("hqk,khd->qhd", e / z, vs)
        lse[new_base:new_base + t] = (m + np.log(z))[:, :, 0].T
    return out, lse


def attention_at_positions(q, q_pos, k, v, k_pos, causal=True, scale=None):
    """Queries q [rows, Hq, D] at q_pos over keys k, v [keys, Hkv, D] at
    k_pos (any order): a key is seen when causal is off or its position is
    <= the query's. Returns float64 out [rows, Hq, D] and lse [rows, Hq]; a
    query that sees no key gets out = 0, lse = -inf."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    rows, hq, d = q.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    out = np.zeros_like(q)
    lse = np.full((rows, hq), -np.inf)
    if rows == 0 or k.shape[0] == 0:
        return out, lse
    group = hq // k.shape[1]
    ks, vs = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # [keys, Hq, D]
    s = np.einsum("qhd,khd->hqk", q, ks) * scale                       # [Hq, rows, keys]
    if causal:
        seen = np.asarray(k_pos)[None, None, :] <= np.asarray(q_pos)[None, :, None]
        s = np.where(seen, s, -np.inf)
    m = s.max(axis=2, keepdims=True)
    any_key = np.isfinite(m)
    e = np.exp(np.where(any_key, s - np.where(any_key, m, 0), -np.inf))
    z = e.sum(axis=2, keepdims=True)
    p = np.divide(e, z, out=np.zeros_like(e), where=z > 0)
    out[:] = np.einsum("hqk,khd->qhd", p, vs)
    lse[:] = np.where(any_key, m + np.log(np.where(z > 0, z, 1)), -np.inf)[:, :, 0].T
    return out, lse
