"""attncomm for PyTorch engines: communicators from torch.distributed groups,
attention on torch tensors, registered as torch custom ops so that
torch.compile(fullgraph=True) traces a model that calls them.

    import torch.distributed as dist
    import attncomm.torch as act
    dist.init_process_group("gloo")            # or "nccl", as the engine does
    comm = act.init_from_group()               # collective over the group
    layout = act.SeqLayout(q_offsets, q_pos, kv_offsets, kv_pos)   # int32 tensors
    out, lse = act.ring_attention(comm, q, k, v, layout, mode="pass_kv", return_lse=True)

Tensors: q [q rows, Hq, D], k and v [kv rows, Hkv, D], contiguous, one dtype
(float32, float16 or bfloat16), on the communicator's side (CPU for a host
communicator, CUDA for a device one). out is q's shape and dtype; lse is
float32, [q rows, Hq] (lse_layout="th") or [Hq, q rows] ("ht", as
FlashAttention returns it), in natural log (lse_base="e", FlashAttention and
PyTorch) or base 2 ("2", FlashInfer). Bad tensors raise attncomm.AttnError
naming the argument before anything runs; a layout that disagrees with the
tensors' rows is refused on every rank (the call fails everywhere).

Custom ops (torch.ops.attncomm.*, each with a fake implementation, so
torch.compile(fullgraph=True) traces the calls below without a graph
break): ring_attention, level_attention (CSPS level-aware sparse attention),
decode_attention (a context-parallel decode step), kv_attention (over a
distributed KV cache, KvPool), merge_attn_states, merge_attn_reduce_scatter
and merge_attn_all_gather. Every call takes out (and lse) to write into,
and runs on torch's current CUDA stream unless stream= is given. A
communicator that a traced function uses must have been seen by this module
outside the trace once (init_from_group does it; else any eager call).
"""
import ctypes
import math
from typing import Optional

import torch

import attncomm as _ac
from attncomm import AttnError, INVALID_ARGUMENT
from attncomm._torch_base import (  # noqa: F401
    _prepare,
    MODES,
    SeqLayout,
    _check_layout,
    _check_lse,
    _check_lse_base,
    _check_op_side,
    _check_out,
    _check_qkv,
    _check_vector,
    _comm_id,
    _comm_of,
    _features,
    _int32_host,
    _lse_shape,
    _raw_lse,
    _require,
    _result,
    _stream_of,
    _torch_on,
    init_from_group)
from attncomm._torch_kv import KvPool, kv_attention, kv_pool  # noqa: F401
from attncomm._torch_merge import merge_attn_all_gather, merge_attn_reduce_scatter, merge_attn_states  # noqa: F401

# ---- ring attention ------------------------------------------------------------------


def _last(t):
    """The last value of an offsets tensor, or None for CUDA memory (never
    read on the host here: a device communicator reads it when it runs)."""
    return None if t.is_cuda or t.numel() == 0 else int(t[-1])


def _rows_disagree(layout, q, k):
    """Why the layout does not describe q and k, or None."""
    qo, ko = layout.q_offsets, layout.kv_offsets
    q_end, kv_end = _last(qo), _last(ko)
    if (q_end is not None and q_end != q.shape[0]) or layout.q_pos.numel() != q.shape[0]:
        return (f"layout: q_offsets ends at {q_end} and q_pos has {layout.q_pos.numel()} entries, "
                f"q has {q.shape[0]} rows")
    if (kv_end is not None and kv_end != k.shape[0]) or layout.kv_pos.numel() != k.shape[0]:
        return (f"layout: kv_offsets ends at {kv_end} and kv_pos has {layout.kv_pos.numel()} entries, "
                f"k has {k.shape[0]} rows")
    return None


def _c_layout(q_offsets, q_pos, kv_offsets, kv_pos, wrong):
    c_layout = _ac.SeqLayout.from_buffers(q_offsets, q_pos, kv_offsets, kv_pos)
    if wrong:
        # Refused on every rank: the library sees an impossible layout and
        # fails the call on all of them (its refusal reaches the peers).
        c_layout._c.num_seqs = -1
    return c_layout


def _reraise(e, wrong):
    if wrong:
        raise AttnError(INVALID_ARGUMENT, wrong) from e
    raise e


@torch.library.custom_op("attncomm::ring_attention", mutates_args=("out", "lse"))
def _ring_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, q_offsets: torch.Tensor, q_pos: torch.Tensor,
                       kv_offsets: torch.Tensor, kv_pos: torch.Tensor, comm_id: int, attn_mode: int,
                       causal: bool, softmax_scale: float, window_left: int, window_right: int, softcap: float,
                       sinks: Optional[torch.Tensor], stream: int) -> None:
    comm = _comm_of(comm_id)
    _check_op_side(comm, q)
    layout = SeqLayout(q_offsets, q_pos, kv_offsets, kv_pos)
    wrong = _rows_disagree(layout, q, k)
    c_layout = _c_layout(*layout.tensors(), wrong)
    try:
        comm.ring_attention(q, k, v, out, c_layout, q.shape[1], k.shape[1], q.shape[2], lse=lse,
                            causal=causal, softmax_scale=softmax_scale, mode=attn_mode, stream=stream or None,
                            window_left=window_left, window_right=window_right, softcap=softcap, sinks=sinks,
                            head_dim_v=v.shape[2])
    except AttnError as e:
        _reraise(e, wrong)


@_ring_attention_op.register_fake
def _(q, k, v, out, lse, q_offsets, q_pos, kv_offsets, kv_pos, comm_id, attn_mode, causal, softmax_scale,
      window_left, window_right, softcap, sinks, stream):
    return None



def ring_attention(comm, q, k, v, layout, *, mode="auto", causal=True, softmax_scale=None, out=None,
                   lse=None, return_lse=False, lse_base="e", lse_layout="th", stream=None, window_size=(-1, -1),
                   softcap=0.0, sinks=None):
    """attnRingAttention on torch tensors: this rank's queries over every
    rank's keys, the algorithm by name (MODES). Returns out, or (out, lse)
    with return_lse (or when lse is given). Runs on torch's current CUDA
    stream for CUDA tensors unless `stream` is given. window_size:
    FlashAttention's (left, right) sliding window on global positions, -1
    for none on a side (blocks no query sees are not sent); softcap: Gemma
    2's logit soft-capping (0: none); sinks: float32 [Hq] attention sinks
    (GPT-OSS), added once to every row's softmax denominator (the LSE
    returned includes them). v may have a head dim of its own (MLA,
    DeepSeek's 192 / 128): out is then [rows, Hq, v.shape[2]]."""
    _require(mode in MODES, f"mode: one of {', '.join(MODES)}, got {mode!r}")
    _check_qkv(comm, q, k, v)
    _check_layout(comm, layout)
    left, right, softcap, sinks = _features(q, window_size, softcap, sinks)
    out, raw = _prepare(q, out, lse, lse_base, lse_layout, v.shape[2])
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    _ring_attention_op(q, k, v, out, raw, *layout.tensors(), _comm_id(comm), MODES[mode], bool(causal), scale,
                       left, right, softcap, sinks, _stream_of(q, stream))
    return _result(out, raw, lse, return_lse, lse_base, lse_layout)

# ---- level-aware sparse attention (CSPS) ------------------------------------------------


@torch.library.custom_op("attncomm::level_attention", mutates_args=("out", "lse"))
def _level_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        lse: torch.Tensor, q_offsets: torch.Tensor, q_pos: torch.Tensor,
                        kv_offsets: torch.Tensor, kv_pos: torch.Tensor, importance: Optional[torch.Tensor],
                        comm_id: int, keep: list[float], causal: bool, softmax_scale: float, window_left: int,
                        window_right: int, softcap: float, sinks: Optional[torch.Tensor], stream: int) -> None:
    comm = _comm_of(comm_id)
    _check_op_side(comm, q)
    layout = SeqLayout(q_offsets, q_pos, kv_offsets, kv_pos)
    wrong = _rows_disagree(layout, q, k)
    c_layout = _c_layout(*layout.tensors(), wrong)
    dtype = _ac._buffer(q)[2]
    cfg = _ac._AttnConfig(q.shape[1], k.shape[1], q.shape[2], dtype, softmax_scale, int(causal),
                          window_left=window_left, window_right=window_right, softcap=softcap,
                          sinks=sinks.data_ptr() if sinks is not None else None, head_dim_v=v.shape[2])
    drop = None
    if keep:
        imp = ctypes.cast(importance.data_ptr(), ctypes.POINTER(ctypes.c_float)) if importance is not None else None
        drop = _ac._LevelDrop((ctypes.c_float * 4)(*keep), imp)
    try:
        # The C call itself (Comm.level_attention has no stream).
        code = _ac._LevelAttention(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                                   ctypes.byref(c_layout._c), ctypes.byref(cfg),
                                   ctypes.byref(drop) if drop is not None else None, comm._h, stream or None)
        comm._queued(_ac._check(code, comm._h, "attnLevelAttention"), q, k, v, out, lse, c_layout, cfg, drop,
                     importance, sinks)
    except AttnError as e:
        _reraise(e, wrong)


@_level_attention_op.register_fake
def _(q, k, v, out, lse, q_offsets, q_pos, kv_offsets, kv_pos, importance, comm_id, keep, causal, softmax_scale,
      window_left, window_right, softcap, sinks, stream):
    return None


def level_attention(comm, q, k, v, layout, *, keep=None, importance=None, causal=True, softmax_scale=None,
                    out=None, lse=None, return_lse=False, lse_base="e", lse_layout="th", stream=None,
                    window_size=(-1, -1), softcap=0.0, sinks=None):
    """attnLevelAttention on torch tensors (CSPS level-aware sparse
    attention): this rank's queries over its own keys and, from each peer,
    the keys that peer keeps for the tier between the two ranks. keep: 4
    fractions in [0, 1] by tier (attncomm.TIER_DEVICE, TIER_HOST, TIER_RACK,
    TIER_CLUSTER; the same on every rank): per sequence a peer sends
    round(keep * n) of its n keys (at least one when keep > 0), those of
    highest importance; None keeps every key, which is exact attention (as
    ring_attention). importance: float32 [kv rows], a score per key of this
    rank's shard, on k's device; needed when a keep is below 1. q, k, v,
    layout, out, lse, the LSE conventions, window_size, softcap and sinks as
    ring_attention; returns out, or (out, lse) with return_lse (or when lse
    is given)."""
    _check_qkv(comm, q, k, v)
    _check_layout(comm, layout)
    left, right, softcap, sinks = _features(q, window_size, softcap, sinks)
    keep_list = []
    if keep is not None:
        _require(isinstance(keep, (list, tuple)) and len(keep) == 4,
                 "keep: 4 fractions (device, host, rack, cluster tiers) or None")
        keep_list = [float(x) for x in keep]
        _require(all(0.0 <= x <= 1.0 for x in keep_list), f"keep: fractions in [0, 1], got {keep_list}")
        if min(keep_list) < 1.0:
            _require(importance is not None, "importance: needed when a keep fraction is below 1")
    if importance is not None:
        _check_vector("importance", importance, k.shape[0], "one per k row", "k", k.device)
        if not keep_list:
            importance = None  # every key is kept: unused
    out, raw = _prepare(q, out, lse, lse_base, lse_layout, v.shape[2])
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    _level_attention_op(q, k, v, out, raw, *layout.tensors(), importance, _comm_id(comm), keep_list,
                        bool(causal), scale, left, right, softcap, sinks, _stream_of(q, stream))
    return _result(out, raw, lse, return_lse, lse_base, lse_layout)

# ---- context-parallel decode --------------------------------------------------------------


def _owned(num_seqs, rank, size):
    """The sequences whose query this rank holds (attnDecodePlacement's
    q_rank: s % nranks)."""
    return range(rank, num_seqs, size)


@torch.library.custom_op("attncomm::decode_attention", mutates_args=("out", "lse"))
def _decode_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor, kv_offsets: torch.Tensor, kv_pos: torch.Tensor, q_pos: torch.Tensor,
                         comm_id: int, attn_mode: int, causal: bool, softmax_scale: float, replicated: bool,
                         window_left: int, window_right: int, softcap: float, sinks: Optional[torch.Tensor],
                         stream: int) -> None:
    comm = _comm_of(comm_id)
    _check_op_side(comm, q)
    rank, size = comm.rank, comm.size
    seqs = kv_offsets.numel() - 1
    owned = _owned(max(seqs, 0), rank, size)
    rows = seqs if replicated else len(owned)
    kv_end = _last(kv_offsets)
    wrong = None
    if seqs < 0 or q.shape[0] != rows or q_pos.numel() != q.shape[0]:
        wrong = (f"kv_offsets: {seqs} sequences, so q needs {rows} rows "
                 f"({'one per sequence' if replicated else 'one per sequence this rank holds the query of'}), "
                 f"q has {q.shape[0]} and q_pos {q_pos.numel()}")
    elif (kv_end is not None and kv_end != k.shape[0]) or kv_pos.numel() != k.shape[0]:
        wrong = (f"kv_offsets: ends at {kv_end} and kv_pos has {kv_pos.numel()} entries, k has {k.shape[0]} rows")
    with _torch_on(q, stream):
        # Made where the layout lives, by torch ops (no host round trip:
        # capturable in a CUDA graph): one query row for each owned sequence.
        lay = kv_offsets.device
        mine = (torch.arange(max(seqs, 0), device=lay) % size == rank).to(torch.int32)
        q_offsets = torch.cat([torch.zeros(1, dtype=torch.int32, device=lay),
                               torch.cumsum(mine, 0, dtype=torch.int32)])
        # (Empty where this rank holds no query: fewer sequences than ranks.)
        index = torch.arange(rank, max(seqs, rank), size, device=q.device)
        if replicated and not wrong:
            q_own = q.index_select(0, index).contiguous()
            pos_own = q_pos.index_select(0, torch.arange(rank, max(seqs, rank), size, device=q_pos.device)).contiguous()
            out_own = q_own.new_empty(q_own.shape[0], q_own.shape[1], v.shape[2])
            lse_own = torch.empty((q_own.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
        else:
            q_own, pos_own, out_own, lse_own = q, q_pos, out, lse
    c_layout = _c_layout(q_offsets, pos_own, kv_offsets, kv_pos, wrong)
    try:
        comm.ring_attention(q_own, k, v, out_own, c_layout, q.shape[1], k.shape[1], q.shape[2], lse=lse_own,
                            causal=causal, softmax_scale=softmax_scale, mode=attn_mode, stream=stream or None,
                            window_left=window_left, window_right=window_right, softcap=softcap, sinks=sinks,
                            head_dim_v=v.shape[2])
    except AttnError as e:
        _reraise(e, wrong)
    if not replicated or wrong:
        return
    # Every rank's rows to every rank: a merge in which each row has one
    # partial that saw keys (its query rank's) and -inf elsewhere.
    with _torch_on(q, stream):
        out_part = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
        lse_part = torch.full((q.shape[0], q.shape[1]), -math.inf, dtype=torch.float32, device=q.device)
        out_part.index_copy_(0, index, out_own)
        lse_part.index_copy_(0, index, lse_own)
    comm.merge_attn_all_gather(out_part, lse_part, out, lse, q.shape[0], q.shape[1], v.shape[2],
                               stream=stream or None)


@_decode_attention_op.register_fake
def _(q, k, v, out, lse, kv_offsets, kv_pos, q_pos, comm_id, attn_mode, causal, softmax_scale, replicated,
      window_left, window_right, softcap, sinks, stream):
    return None


def decode_attention(comm, q, k, v, kv_offsets, kv_pos, q_pos, *, replicated=True, mode="ship_q", causal=True,
                     softmax_scale=None, out=None, lse=None, return_lse=False, lse_base="e", lse_layout="th",
                     stream=None, window_size=(-1, -1), softcap=0.0, sinks=None):
    """A context-parallel decode step (CP paper §3.6): one new query row per
    sequence, the keys and values of every sequence spread over the ranks
    (e.g. each step's new KV on attncomm.decode_placement's kv rank,
    (s + step) % nranks).

    k, v: this rank's KV shard [kv rows, Hkv, D], sequence by sequence;
    kv_offsets: int32 [num_seqs + 1] (cu_seqlens-style, the same num_seqs
    on every rank; a rank may hold no key of a sequence); kv_pos: int32
    [kv rows], the global position of each key.

    replicated=True (an engine that runs the other layers replicated): q is
    [num_seqs, Hq, D], every sequence's new query, the same on every rank,
    and q_pos int32 [num_seqs] their positions; every rank gets every
    sequence's output. Each query is attended once, by the rank that holds
    it by attnDecodePlacement (s % nranks), over every rank's keys (`mode`,
    by default ship_q: the query goes to each KV holder, partials come back
    and merge on arrival); the outputs then reach every rank in one merge
    all-gather. replicated=False: q holds only this rank's queries, the
    sequences s with s % nranks == rank in order, and q_pos theirs; out is
    theirs (one ring call, no gather).

    causal: a key is seen when its position <= the query's. out (q's shape
    and dtype), lse, the LSE conventions, window_size, softcap and sinks as
    ring_attention; returns out,
    or (out, lse) with return_lse (or when lse is given). Layout tensors are
    host memory, read when the call runs; a kv_offsets, kv_pos or q_pos that
    disagrees with the tensors' rows is refused on every rank."""
    _require(mode in MODES, f"mode: one of {', '.join(MODES)}, got {mode!r}")
    _check_qkv(comm, q, k, v)
    kv_offsets = _int32_host("kv_offsets", kv_offsets, "")
    kv_pos = _int32_host("kv_pos", kv_pos, "")
    q_pos = _int32_host("q_pos", q_pos, "")
    _require(kv_offsets.numel() >= 1, "kv_offsets: num_seqs + 1 entries are needed, got none")
    left, right, softcap, sinks = _features(q, window_size, softcap, sinks)
    out, raw = _prepare(q, out, lse, lse_base, lse_layout, v.shape[2])
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    _decode_attention_op(q, k, v, out, raw, kv_offsets, kv_pos, q_pos, _comm_id(comm), MODES[mode], bool(causal),
                         scale, bool(replicated), left, right, softcap, sinks, _stream_of(q, stream))
    return _result(out, raw, lse, return_lse, lse_base, lse_layout)

# ---- the engine's own kernel inside the ring -----------------------------------------


class _KernelArgs(ctypes.Structure):
    """attnAttnKernelArgs_t."""
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("num_seqs", ctypes.c_int),
                ("q_offsets", ctypes.c_void_p), ("q_pos", ctypes.c_void_p), ("kv_offsets", ctypes.c_void_p),
                ("kv_pos", ctypes.c_void_p), ("cfg", ctypes.POINTER(_ac._AttnConfig))]


_KERNEL_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_KernelArgs), ctypes.c_void_p, ctypes.c_void_p)
_SetAttnKernel = _ac._declare("attnCommSetAttnKernel", _ac._comm, _KERNEL_FN, ctypes.c_void_p)
_ATTN_KERNEL_MAGIC = 0xA77C4E1B


class _AttnKernel(ctypes.Structure):
    """attnAttnKernel_t (versioned like the config)."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("fn", _KERNEL_FN), ("user_data", ctypes.c_void_p), ("out_dtype", ctypes.c_int),
                ("lse_base", ctypes.c_int), ("lse_layout", ctypes.c_int)]


_SetAttnKernelEx = _ac._declare("attnCommSetAttnKernelEx", _ac._comm, ctypes.POINTER(_AttnKernel))
_TORCH_DTYPE = {_ac.FLOAT32: torch.float32, _ac.FLOAT16: torch.float16, _ac.BFLOAT16: torch.bfloat16}


def _host_tensor(ptr, shape, dtype):
    """A tensor over `shape` elements of host memory at ptr (no copy)."""
    n = math.prod(shape)
    if n == 0 or not ptr:
        return torch.empty(shape, dtype=dtype)
    raw = (ctypes.c_char * (n * torch.empty((), dtype=dtype).element_size())).from_address(ptr)
    return torch.frombuffer(raw, dtype=dtype).view(shape)


def set_attn_kernel(comm, fn, *, windows=False):
    """Plugs a torch function in as the partial-attention kernel of every
    ring mode on this communicator (attnCommSetAttnKernel); None restores
    the built-in one. fn(q, k, v, q_offsets, q_pos, kv_offsets, kv_pos,
    softmax_scale, causal) gets this step's rows as tensors (q [rows, Hq,
    D], k and v [keys, Hkv, D] in the call's dtype, int32 cu_seqlens-style
    offsets and global positions) and returns (out [rows, Hq, D], lse
    [rows, Hq] natural log): the normalised partial attention of each query
    over the keys it sees (sequence by sequence; causal on the positions);
    a query that sees no key gets out 0 and lse -inf. torch SDPA with a
    mask, FlashAttention's varlen call, FlashInfer: anything that says so.
    windows=True: fn also takes window_size=(left, right) and softcap=
    keywords (FlashAttention's) and applies them, so calls with a sliding
    window or a softcap may use it (attnCommSetAttnKernelEx, 0.4); without
    it such calls are refused on every rank. The same holds for MLA-shaped
    calls (v of its own head dim Dv: fn then gets v [keys, Hkv, Dv] and
    returns out [rows, Hq, Dv]). Sinks are the library's: fn never sees
    them. Host communicators (CPU tensors) for now."""
    if fn is None:
        _ac._check(_SetAttnKernel(comm._h, _KERNEL_FN(), None), comm._h, "attnCommSetAttnKernel")
        comm._attn_kernel = None
        return
    _require(comm.device < 0, "set_attn_kernel: device communicators take a C kernel for now "
                              "(attnCommSetAttnKernel)")

    def trampoline(args_p, user_data, stream):
        try:
            a = args_p.contents
            cfg = a.cfg.contents
            hq, hkv, d, dv = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim_v
            seqs = a.num_seqs
            q_offsets = _host_tensor(a.q_offsets, (seqs + 1,), torch.int32)
            kv_offsets = _host_tensor(a.kv_offsets, (seqs + 1,), torch.int32)
            rows = int(q_offsets[-1]) if seqs else 0
            keys = int(kv_offsets[-1]) if seqs else 0
            dt = _TORCH_DTYPE[cfg.dtype]
            q = _host_tensor(a.q, (rows, hq, d), dt)
            k = _host_tensor(a.k, (keys, hkv, d), dt)
            v = _host_tensor(a.v, (keys, hkv, dv), dt)
            q_pos = _host_tensor(a.q_pos, (rows,), torch.int32)
            kv_pos = _host_tensor(a.kv_pos, (keys,), torch.int32)
            scale = cfg.softmax_scale or 1.0 / math.sqrt(d)
            extra = dict(window_size=(cfg.window_left, cfg.window_right), softcap=cfg.softcap) if windows else {}
            out, lse = fn(q, k, v, q_offsets, q_pos, kv_offsets, kv_pos, scale, bool(cfg.causal), **extra)
            if rows:
                _host_tensor(a.out, (rows, hq, dv), torch.float32).copy_(out)
                _host_tensor(a.lse, (rows, hq), torch.float32).copy_(lse)
            return _ac.SUCCESS
        except Exception as e:  # noqa: BLE001 - the library reports the code; say why here
            comm._attn_kernel_error = e
            return _ac.INTERNAL_ERROR

    cb = _KERNEL_FN(trampoline)
    if windows:
        k = _AttnKernel(ctypes.sizeof(_AttnKernel), _ATTN_KERNEL_MAGIC, _ac._HEADER_VERSION, cb, None, _ac.FLOAT32, 0, 0)
        _ac._check(_SetAttnKernelEx(comm._h, ctypes.byref(k)), comm._h, "attnCommSetAttnKernelEx")
    else:
        _ac._check(_SetAttnKernel(comm._h, cb, None), comm._h, "attnCommSetAttnKernel")
    comm._attn_kernel = cb  # the library calls it for as long as it is set


def reference_kernel(q, k, v, q_offsets, q_pos, kv_offsets, kv_pos, softmax_scale, causal, *,
                     window_size=(-1, -1), softcap=0.0):
    """Partial attention in plain torch ops (fp32), set_attn_kernel's
    contract (windows=True's keywords too): the example and the test of the
    hook."""
    rows, hq, _ = q.shape
    out = torch.zeros(rows, hq, v.shape[2], dtype=torch.float32)
    lse = torch.full((rows, hq), -math.inf, dtype=torch.float32)
    group = hq // max(1, k.shape[1])
    for s in range(q_offsets.numel() - 1):
        q0, q1 = int(q_offsets[s]), int(q_offsets[s + 1])
        k0, k1 = int(kv_offsets[s]), int(kv_offsets[s + 1])
        if q1 == q0 or k1 == k0:
            continue
        qs = q[q0:q1].float()
        ks = k[k0:k1].float().repeat_interleave(group, dim=1)
        vs = v[k0:k1].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * softmax_scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        kp = kv_pos[k0:k1].long()[None, None, :]
        qp = q_pos[q0:q1].long()[None, :, None]
        seen = torch.ones_like(scores, dtype=torch.bool)
        left, right = window_size
        if causal:
            seen &= kp <= qp
        elif right >= 0:
            seen &= kp <= qp + right
        if left >= 0:
            seen &= kp >= qp - left
        scores = scores.masked_fill(~seen, -math.inf)
        m = torch.logsumexp(scores, dim=-1)                      # [H, q]
        p = torch.exp(scores - m[..., None]).nan_to_num(0.0)     # rows that see nothing: 0
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, vs)
        lse[q0:q1] = m.t()
    return out, lse

