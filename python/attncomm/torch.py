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
"""
import ctypes
import math

import torch
import torch.distributed as dist

import attncomm as _ac
from attncomm import AttnError, INVALID_ARGUMENT

MODES = {"auto": _ac.MODE_AUTO, "pass_kv": _ac.MODE_PASS_KV, "pass_q": _ac.MODE_PASS_Q,
         "ship_q": _ac.MODE_SHIP_Q, "head_parallel": _ac.MODE_HEAD_PARALLEL}
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LOG2E = 1.0 / math.log(2.0)

# Communicators travel through traced graphs as ints: the custom ops look
# them up here (a dict insert or lookup is atomic under the GIL, and
# torch.compile traces it).
_comms = {}


def _comm_id(comm):
    key = getattr(comm, "_torch_key", None)
    if key is None:
        key = id(comm)
        comm._torch_key = key
        _comms[key] = comm
    return key


def _comm_of(key):
    comm = _comms.get(key)
    if comm is None:
        raise AttnError(INVALID_ARGUMENT, "attncomm.torch: the communicator of this call is gone")
    return comm

# ---- communicators ---------------------------------------------------------------


def init_from_group(group=None, device=None, **config):
    """A communicator over the ranks of a torch.distributed process group
    (collective over it; any backend). The unique id is made on the group's
    first rank and broadcast through the group. device: a CUDA ordinal, or
    attncomm.DEVICE_HOST; default the current CUDA device when the group's
    backend is NCCL, else host memory. config: as attncomm.Comm.init_rank
    (timeout_ms, transports, blocking, name)."""
    if not dist.is_available() or not dist.is_initialized():
        raise AttnError(INVALID_ARGUMENT, "init_from_group: torch.distributed is not initialised "
                                          "(dist.init_process_group first)")
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    if rank < 0:
        raise AttnError(INVALID_ARGUMENT, "init_from_group: this process is not in the group")
    backend = str(dist.get_backend(group)).lower()
    if device is None:
        device = torch.cuda.current_device() if "nccl" in backend and torch.cuda.is_available() \
            else _ac.DEVICE_HOST
    src = 0 if group is None else dist.get_global_rank(group, 0)
    box = [_ac.UniqueId().bytes() if rank == 0 else None]
    # NCCL groups move objects through CUDA tensors on the current device.
    bdev = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else None
    dist.broadcast_object_list(box, src=src, group=group, device=bdev)
    return _ac.Comm.init_rank(world, _ac.UniqueId(box[0]), rank, device=device, **config)

# ---- layouts --------------------------------------------------------------------


class SeqLayout:
    """This rank's shard of a batch as int32 tensors: cu_seqlens-style
    offsets [num_seqs + 1] of q and of kv rows, and the global position of
    every row. Lists are turned into tensors. The tensors are read when the
    call runs, so an engine may update them in place between steps; on a
    device communicator they must be in host (ideally pinned) memory."""

    def __init__(self, q_offsets, q_pos, kv_offsets, kv_pos):
        def as_int32(name, x):
            if not isinstance(x, torch.Tensor):
                x = torch.tensor(list(x), dtype=torch.int32)
            if x.dtype != torch.int32:
                raise AttnError(INVALID_ARGUMENT, f"layout {name}: int32 is needed, got {x.dtype}")
            if x.dim() != 1:
                raise AttnError(INVALID_ARGUMENT, f"layout {name}: a 1-D tensor is needed, got {x.dim()}-D")
            return x.contiguous()
        self.q_offsets = as_int32("q_offsets", q_offsets)
        self.q_pos = as_int32("q_pos", q_pos)
        self.kv_offsets = as_int32("kv_offsets", kv_offsets)
        self.kv_pos = as_int32("kv_pos", kv_pos)
        if self.q_offsets.numel() < 1 or self.q_offsets.numel() != self.kv_offsets.numel():
            raise AttnError(INVALID_ARGUMENT, f"layout: q_offsets has {self.q_offsets.numel()} entries and "
                                              f"kv_offsets {self.kv_offsets.numel()}: both need num_seqs + 1")

    def tensors(self):
        return self.q_offsets, self.q_pos, self.kv_offsets, self.kv_pos

# ---- argument checks --------------------------------------------------------------


def _require(cond, what):
    if not cond:
        raise AttnError(INVALID_ARGUMENT, what)


def _check_qkv(comm, q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require(isinstance(t, torch.Tensor), f"{name}: a torch.Tensor is needed, got {type(t).__name__}")
        _require(t.dim() == 3, f"{name}: [rows, heads, head_dim] is needed, got shape {tuple(t.shape)}")
        _require(t.dtype in _DTYPES, f"{name}: dtype {t.dtype} is not float32, float16 or bfloat16")
        _require(t.dtype == q.dtype, f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
        _require(t.device == q.device, f"{name}: on {t.device}, q on {q.device}")
        _require(t.is_contiguous(), f"{name}: not contiguous")
    _require(k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    _require(q.shape[2] == k.shape[2], f"head_dim: q has {q.shape[2]}, k {k.shape[2]}")
    _require(k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0,
             f"q's {q.shape[1]} heads are not a multiple of k's {k.shape[1]}")
    if torch.compiler.is_compiling():
        return  # the communicator's side is checked when the op runs
    on_device = comm.device >= 0
    _require(q.is_cuda == on_device, f"q: on {q.device}, but the communicator is "
                                     f"{'on CUDA device %d' % comm.device if on_device else 'a host one'}")


def _check_out(q, out):
    _require(isinstance(out, torch.Tensor), "out: a torch.Tensor is needed")
    _require(out.shape == q.shape, f"out: shape {tuple(out.shape)}, q is {tuple(q.shape)}")
    _require(out.dtype == q.dtype, f"out: dtype {out.dtype}, q is {q.dtype}")
    _require(out.device == q.device, f"out: on {out.device}, q on {q.device}")
    _require(out.is_contiguous(), "out: not contiguous")


def _lse_shape(q, lse_layout):
    rows, heads = q.shape[0], q.shape[1]
    if lse_layout == "th":
        return (rows, heads)
    if lse_layout == "ht":
        return (heads, rows)
    raise AttnError(INVALID_ARGUMENT, f"lse_layout: 'th' or 'ht', got {lse_layout!r}")


def _check_lse(q, lse, lse_layout):
    shape = _lse_shape(q, lse_layout)
    _require(isinstance(lse, torch.Tensor), "lse: a torch.Tensor is needed")
    _require(lse.dtype == torch.float32, f"lse: float32 is needed, got {lse.dtype}")
    _require(tuple(lse.shape) == shape, f"lse: shape {tuple(lse.shape)}, {shape} is needed (lse_layout "
                                        f"{lse_layout!r})")
    _require(lse.device == q.device, f"lse: on {lse.device}, q on {q.device}")
    _require(lse.is_contiguous(), "lse: not contiguous")


def _check_layout(comm, layout):
    _require(isinstance(layout, SeqLayout), f"layout: an attncomm.torch.SeqLayout is needed, got "
                                            f"{type(layout).__name__}")
    for name, t in zip(("q_offsets", "q_pos", "kv_offsets", "kv_pos"), layout.tensors()):
        _require(not t.is_cuda, f"layout {name}: host memory is needed (the library reads it on the host)")

# ---- the custom op ----------------------------------------------------------------


def _rows_disagree(layout, q, k):
    """Why the layout does not describe q and k, or None."""
    qo, ko = layout.q_offsets, layout.kv_offsets
    if int(qo[-1]) != q.shape[0] or layout.q_pos.numel() != q.shape[0]:
        return (f"layout: q_offsets ends at {int(qo[-1])} and q_pos has {layout.q_pos.numel()} entries, "
                f"q has {q.shape[0]} rows")
    if int(ko[-1]) != k.shape[0] or layout.kv_pos.numel() != k.shape[0]:
        return (f"layout: kv_offsets ends at {int(ko[-1])} and kv_pos has {layout.kv_pos.numel()} entries, "
                f"k has {k.shape[0]} rows")
    return None


@torch.library.custom_op("attncomm::ring_attention", mutates_args=("out", "lse"))
def _ring_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, q_offsets: torch.Tensor, q_pos: torch.Tensor,
                       kv_offsets: torch.Tensor, kv_pos: torch.Tensor, comm_id: int, attn_mode: int,
                       causal: bool, softmax_scale: float, stream: int) -> None:
    comm = _comm_of(comm_id)
    _require(q.is_cuda == (comm.device >= 0), f"q: on {q.device}, the communicator's device is {comm.device}")
    layout = SeqLayout(q_offsets, q_pos, kv_offsets, kv_pos)
    c_layout = _ac.SeqLayout.from_buffers(*layout.tensors())
    wrong = _rows_disagree(layout, q, k)
    if wrong:
        # Refused on every rank: the library sees an impossible layout and
        # fails the call on all of them (its refusal reaches the peers).
        c_layout._c.num_seqs = -1
    try:
        comm.ring_attention(q, k, v, out, c_layout, q.shape[1], k.shape[1], q.shape[2], lse=lse,
                            causal=causal, softmax_scale=softmax_scale, mode=attn_mode, stream=stream or None)
    except AttnError as e:
        if wrong:
            raise AttnError(INVALID_ARGUMENT, wrong) from e
        raise


@_ring_attention_op.register_fake
def _(q, k, v, out, lse, q_offsets, q_pos, kv_offsets, kv_pos, comm_id, attn_mode, causal, softmax_scale,
      stream):
    return None

# ---- the public calls ---------------------------------------------------------------


def _stream_of(q, stream):
    if stream is not None:
        return int(_ac._stream(stream) or 0)
    if q.is_cuda:
        return int(torch.cuda.current_stream(q.device).cuda_stream)
    return 0


def ring_attention(comm, q, k, v, layout, *, mode="auto", causal=True, softmax_scale=None, out=None,
                   lse=None, return_lse=False, lse_base="e", lse_layout="th", stream=None):
    """attnRingAttention on torch tensors: this rank's queries over every
    rank's keys, the algorithm by name (MODES). Returns out, or (out, lse)
    with return_lse (or when lse is given). Runs on torch's current CUDA
    stream for CUDA tensors unless `stream` is given."""
    _require(mode in MODES, f"mode: one of {', '.join(MODES)}, got {mode!r}")
    _require(lse_base in ("e", "2"), f"lse_base: 'e' or '2', got {lse_base!r}")
    _check_qkv(comm, q, k, v)
    _check_layout(comm, layout)
    if out is None:
        out = torch.empty_like(q)
    else:
        _check_out(q, out)
    if lse is not None:
        _check_lse(q, lse, lse_layout)
    # The library writes natural-log [rows, Hq]; other conventions are a
    # transpose and a scale of that.
    direct = lse is not None and lse_base == "e" and lse_layout == "th"
    raw = lse if direct else torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    _ring_attention_op(q, k, v, out, raw, *layout.tensors(), _comm_id(comm), MODES[mode], bool(causal), scale,
                       _stream_of(q, stream))
    if not (return_lse or lse is not None):
        return out
    converted = raw if lse_base == "e" else raw * _LOG2E
    if lse_layout == "ht":
        converted = converted.t()
    if lse is None:
        return out, converted.contiguous()
    if not direct:
        lse.copy_(converted)
    return out, lse


def merge_attn_states(outs, lses, out=None, lse=None, stream=None):
    """attnMergeAttnStates on torch tensors: partial outputs outs[j] [rows,
    H, D] (float32, float16 or bfloat16) and their natural-log lses[j]
    [rows, H] float32 merged into one (out, lse). CUDA tensors merge on the
    GPU, on torch's current stream unless `stream` is given."""
    _require(len(outs) == len(lses) and len(outs) > 0, "outs and lses: the same number of partials, at least one")
    first = outs[0]
    _require(isinstance(first, torch.Tensor) and first.dim() == 3, "outs[0]: a [rows, heads, head_dim] tensor")
    rows, heads, dim = first.shape
    for j, (o, s) in enumerate(zip(outs, lses)):
        _require(o.dtype == first.dtype and o.shape == first.shape and o.is_contiguous() and o.device == first.device,
                 f"outs[{j}]: contiguous {first.dtype} {tuple(first.shape)} on {first.device} is needed")
        _require(s.dtype == torch.float32 and tuple(s.shape) == (rows, heads) and s.is_contiguous()
                 and s.device == first.device, f"lses[{j}]: contiguous float32 {(rows, heads)} on {first.device}")
    out = torch.empty_like(first) if out is None else out
    _check_out(first, out)
    lse = torch.empty((rows, heads), dtype=torch.float32, device=first.device) if lse is None else lse
    _check_lse(first, lse, "th")
    _ac.merge_attn_states(list(outs), list(lses), out, lse, rows, heads, dim,
                          stream=_stream_of(first, stream) or None)
    return out, lse


def _merge_collective(comm, out_part, lse_part, out, lse, return_lse, stream, all_gather):
    _require(isinstance(out_part, torch.Tensor) and out_part.dim() == 3,
             "out_part: a [rows, heads, head_dim] tensor is needed")
    _require(out_part.dtype in _DTYPES, f"out_part: dtype {out_part.dtype} is not float32, float16 or bfloat16")
    _require(out_part.is_contiguous(), "out_part: not contiguous")
    rows, heads, dim = out_part.shape
    _require(isinstance(lse_part, torch.Tensor) and lse_part.dtype == torch.float32
             and tuple(lse_part.shape) == (rows, heads) and lse_part.is_contiguous(),
             f"lse_part: contiguous float32 {(rows, heads)} is needed")
    n, r = comm.size, comm.rank
    share = heads if all_gather else (r + 1) * heads // n - r * heads // n
    want = (rows, share, dim)
    out = torch.empty(want, dtype=out_part.dtype, device=out_part.device) if out is None else out
    _require(tuple(out.shape) == want and out.dtype == out_part.dtype and out.is_contiguous()
             and out.device == out_part.device, f"out: contiguous {out_part.dtype} {want} is needed")
    if lse is None and return_lse:
        lse = torch.empty((rows, share), dtype=torch.float32, device=out_part.device)
    if lse is not None:
        _require(lse.dtype == torch.float32 and tuple(lse.shape) == (rows, share) and lse.is_contiguous(),
                 f"lse: contiguous float32 {(rows, share)} is needed")
    call = comm.merge_attn_all_gather if all_gather else comm.merge_attn_reduce_scatter
    call(out_part, lse_part, out, lse, rows, heads, dim, stream=_stream_of(out_part, stream) or None)
    return (out, lse) if (return_lse or lse is not None) else out


def merge_attn_reduce_scatter(comm, out_part, lse_part, *, out=None, lse=None, return_lse=False, stream=None):
    """attnMergeAttnReduceScatter: every rank's partial (out_part [rows,
    heads, D], natural-log lse_part [rows, heads] float32) for the same
    query rows over its own keys, merged; this rank gets its share of the
    heads ([rank * heads // n, (rank + 1) * heads // n)) as out [rows,
    share, D] (and lse). The decode-context-parallel merge as one call."""
    return _merge_collective(comm, out_part, lse_part, out, lse, return_lse, stream, False)


def merge_attn_all_gather(comm, out_part, lse_part, *, out=None, lse=None, return_lse=False, stream=None):
    """As merge_attn_reduce_scatter, with every head on every rank."""
    return _merge_collective(comm, out_part, lse_part, out, lse, return_lse, stream, True)


# ---- the engine's own kernel inside the ring -----------------------------------------


class _KernelArgs(ctypes.Structure):
    """attnAttnKernelArgs_t."""
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("num_seqs", ctypes.c_int),
                ("q_offsets", ctypes.c_void_p), ("q_pos", ctypes.c_void_p), ("kv_offsets", ctypes.c_void_p),
                ("kv_pos", ctypes.c_void_p), ("cfg", ctypes.POINTER(_ac._AttnConfig))]


_KERNEL_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_KernelArgs), ctypes.c_void_p, ctypes.c_void_p)
_SetAttnKernel = _ac._declare("attnCommSetAttnKernel", _ac._comm, _KERNEL_FN, ctypes.c_void_p)
_TORCH_DTYPE = {_ac.FLOAT32: torch.float32, _ac.FLOAT16: torch.float16, _ac.BFLOAT16: torch.bfloat16}


def _host_tensor(ptr, shape, dtype):
    """A tensor over `shape` elements of host memory at ptr (no copy)."""
    n = math.prod(shape)
    if n == 0 or not ptr:
        return torch.empty(shape, dtype=dtype)
    raw = (ctypes.c_char * (n * torch.empty((), dtype=dtype).element_size())).from_address(ptr)
    return torch.frombuffer(raw, dtype=dtype).view(shape)


def set_attn_kernel(comm, fn):
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
    Host communicators (CPU tensors) for now."""
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
            hq, hkv, d = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
            seqs = a.num_seqs
            q_offsets = _host_tensor(a.q_offsets, (seqs + 1,), torch.int32)
            kv_offsets = _host_tensor(a.kv_offsets, (seqs + 1,), torch.int32)
            rows = int(q_offsets[-1]) if seqs else 0
            keys = int(kv_offsets[-1]) if seqs else 0
            dt = _TORCH_DTYPE[cfg.dtype]
            q = _host_tensor(a.q, (rows, hq, d), dt)
            k = _host_tensor(a.k, (keys, hkv, d), dt)
            v = _host_tensor(a.v, (keys, hkv, d), dt)
            q_pos = _host_tensor(a.q_pos, (rows,), torch.int32)
            kv_pos = _host_tensor(a.kv_pos, (keys,), torch.int32)
            scale = cfg.softmax_scale or 1.0 / math.sqrt(d)
            out, lse = fn(q, k, v, q_offsets, q_pos, kv_offsets, kv_pos, scale, bool(cfg.causal))
            if rows:
                _host_tensor(a.out, (rows, hq, d), torch.float32).copy_(out)
                _host_tensor(a.lse, (rows, hq), torch.float32).copy_(lse)
            return _ac.SUCCESS
        except Exception as e:  # noqa: BLE001 - the library reports the code; say why here
            comm._attn_kernel_error = e
            return _ac.INTERNAL_ERROR

    cb = _KERNEL_FN(trampoline)
    _ac._check(_SetAttnKernel(comm._h, cb, None), comm._h, "attnCommSetAttnKernel")
    comm._attn_kernel = cb  # the library calls it for as long as it is set


def reference_kernel(q, k, v, q_offsets, q_pos, kv_offsets, kv_pos, softmax_scale, causal):
    """Partial attention in plain torch ops (fp32), set_attn_kernel's
    contract: the example and the test of the hook."""
    rows, hq, d = q.shape
    out = torch.zeros(rows, hq, d, dtype=torch.float32)
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
        if causal:
            seen = kv_pos[k0:k1][None, None, :] <= q_pos[q0:q1][None, :, None]
            scores = scores.masked_fill(~seen, -math.inf)
        m = torch.logsumexp(scores, dim=-1)                      # [H, q]
        p = torch.exp(scores - m[..., None]).nan_to_num(0.0)     # rows that see nothing: 0
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, vs)
        lse[q0:q1] = m.t()
    return out, lse
