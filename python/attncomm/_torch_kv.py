"""attncomm.torch's distributed KV cache: KvPool on torch tensors and the
kv_attention custom op (attnKvAttention).
"""
from typing import Optional

import torch

import attncomm as _ac
from attncomm import AttnError, INVALID_ARGUMENT
from attncomm._torch_base import (  # noqa: F401
    _prepare,
    _DTYPES,
    _check_op_side,
    _check_rows,
    _check_side,
    _comm_id,
    _features,
    _int32_host,
    _require,
    _result,
    _stream_of)


# ---- the distributed KV cache -----------------------------------------------------------

_pools = {}


def _pool_id(pool):
    key = getattr(pool, "_torch_key", None)
    if key is None:
        key = id(pool)
        pool._torch_key = key
        _pools[key] = pool
    return key


def _pool_of(key):
    pool = _pools.get(key)
    if pool is None:
        raise AttnError(INVALID_ARGUMENT, "attncomm.torch: the KV pool of this call is gone")
    return pool


class KvPool:
    """attncomm.KvPool (attnKvPool_t, a distributed KV cache) for torch
    tensors: made collectively over comm's ranks; fixed-size blocks of
    block_tokens tokens, [num_kv_heads, head_dim] each, of dtype (a torch
    dtype); capacity_blocks per rank. append takes torch tensors;
    attention is kv_attention (a custom op); migrate, release, rebalance,
    stats, placement and shrink are attncomm.KvPool's. Close it (close() or
    a with block) before destroying comm."""

    def __init__(self, comm, block_tokens, num_kv_heads, head_dim, dtype=torch.float32, capacity_blocks=0):
        _require(dtype in _DTYPES, f"dtype: float32, float16 or bfloat16, got {dtype}")
        self.comm = comm
        self.dtype = dtype
        self.block_tokens, self.num_kv_heads, self.head_dim = int(block_tokens), int(num_kv_heads), int(head_dim)
        self.pool = comm.kv_pool(block_tokens, num_kv_heads, head_dim, _ac._kv_dtype(dtype), capacity_blocks)
        _comm_id(comm)
        _pool_id(self)

    def append(self, req, k, v, pos, stream=None):
        """attnKvAppend: tokens k, v [n, num_kv_heads, head_dim] (the pool's
        dtype, on the communicator's side) at global positions pos (int32
        host tensor or ints, increasing) to request req of this rank. On torch's
        current CUDA stream for CUDA tensors unless `stream` is given."""
        for name, t in (("k", k), ("v", v)):
            _check_rows(name, t, self.dtype, k)
            _require(tuple(t.shape[1:]) == (self.num_kv_heads, self.head_dim),
                     f"{name}: shape {tuple(t.shape)}, (tokens, {self.num_kv_heads}, {self.head_dim}) is needed")
        _require(k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
        _check_side(self.comm, k, "k")
        pos = _int32_host("pos", pos, "")
        _require(pos.numel() == k.shape[0], f"pos: {pos.numel()} positions for {k.shape[0]} tokens")
        self.pool.append(req, k, v, pos, stream=_stream_of(k, stream) or None)

    def attention(self, q, reqs, q_offsets, q_pos=None, **kwargs):
        """kv_attention(self, ...)."""
        return kv_attention(self, q, reqs, q_offsets, q_pos, **kwargs)

    def migrate(self, moves, stream=None):
        return self.pool.migrate(moves, stream=stream)

    def release(self, req, stream=None):
        self.pool.release(req, stream=stream)

    def rebalance(self, model, pending_requests=0, pending_blocks=0, stream=None):
        return self.pool.rebalance(model, pending_requests, pending_blocks, stream=stream)

    def stats(self):
        return self.pool.stats()

    def placement(self, req):
        return self.pool.placement(req)

    def shrink(self, newcomm):
        lost = self.pool.shrink(newcomm)
        self.comm = newcomm
        _comm_id(newcomm)
        return lost

    def close(self):
        _pools.pop(getattr(self, "_torch_key", None), None)
        self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def kv_pool(comm, block_tokens, num_kv_heads, head_dim, dtype=torch.float32, capacity_blocks=0):
    """attnKvPoolCreate (collective) for torch tensors: a KvPool."""
    return KvPool(comm, block_tokens, num_kv_heads, head_dim, dtype, capacity_blocks)


@torch.library.custom_op("attncomm::kv_attention", mutates_args=("out", "lse"))
def _kv_attention_op(q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, reqs: torch.Tensor,
                     q_offsets: torch.Tensor, q_pos: Optional[torch.Tensor], pool_id: int, causal: bool,
                     softmax_scale: float, window_left: int, window_right: int, softcap: float,
                     sinks: Optional[torch.Tensor], stream: int) -> None:
    pool = _pool_of(pool_id)
    _check_op_side(pool.comm, q)
    # attncomm.KvPool.attention refuses offsets or positions that disagree
    # with q on every rank (it tells the peers), then raises here.
    pool.pool.attention(reqs, q_offsets, q, q_pos=q_pos, num_q_heads=q.shape[1], causal=causal,
                        scale=softmax_scale, want_lse=True, out=out, lse=lse, stream=stream or None,
                        window_left=window_left, window_right=window_right, softcap=softcap, sinks=sinks)


@_kv_attention_op.register_fake
def _(q, out, lse, reqs, q_offsets, q_pos, pool_id, causal, softmax_scale, window_left, window_right, softcap,
      sinks, stream):
    return None


def kv_attention(pool, q, reqs, q_offsets, q_pos=None, *, causal=True, softmax_scale=None, out=None, lse=None,
                 return_lse=False, lse_base="e", lse_layout="th", stream=None, window_size=(-1, -1), softcap=0.0,
                 sinks=None):
    """attnKvAttention on torch tensors (collective over the pool's ranks):
    this rank's queries over all the tokens of its requests, wherever their
    blocks are. pool: a KvPool of this module. q: [rows, Hq, D] of the
    pool's dtype (Hq a multiple of its num_kv_heads, D its head_dim);
    reqs: this rank's request ids (distinct; int64 host tensor or ints);
    q_offsets: int32 [len(reqs) + 1] rows of q per request, from 0 to q's
    rows; q_pos: int32 [rows], the queries' global positions (needed with
    causal: a key is seen when its position <= the query's). Index and
    position tensors are host memory, read when the call runs (also at
    each CUDA graph launch, for q_pos). out, lse, the LSE conventions,
    window_size, softcap and sinks as ring_attention; returns out, or (out, lse) with return_lse (or when lse
    is given). Offsets or positions that disagree with q are refused on
    every rank."""
    _require(isinstance(pool, KvPool), f"pool: an attncomm.torch.KvPool is needed, got {type(pool).__name__}")
    _check_rows("q", q, pool.dtype)
    _require(q.shape[2] == pool.head_dim, f"q: head_dim {q.shape[2]}, the pool's is {pool.head_dim}")
    _require(q.shape[1] % pool.num_kv_heads == 0,
             f"q: {q.shape[1]} heads are not a multiple of the pool's {pool.num_kv_heads}")
    _check_side(pool.comm, q)
    if not isinstance(reqs, torch.Tensor):
        reqs = torch.tensor([int(r) for r in reqs], dtype=torch.int64)
    _require(reqs.dtype == torch.int64 and reqs.dim() == 1 and not reqs.is_cuda,
             f"reqs: a 1-D int64 host tensor is needed, got {reqs.dtype} {tuple(reqs.shape)} on {reqs.device}")
    reqs = reqs.contiguous()
    q_offsets = _int32_host("q_offsets", q_offsets, "")
    if q_pos is not None:
        q_pos = _int32_host("q_pos", q_pos, "")
    left, right, softcap, sinks = _features(q, window_size, softcap, sinks)
    out, raw = _prepare(q, out, lse, lse_base, lse_layout)
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    _kv_attention_op(q, out, raw, reqs, q_offsets, q_pos, _pool_id(pool), bool(causal), scale,
                     left, right, softcap, sinks, _stream_of(q, stream))
    return _result(out, raw, lse, return_lse, lse_base, lse_layout)

