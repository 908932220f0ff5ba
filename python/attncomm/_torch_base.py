"""What the attncomm.torch modules share: the communicators torch code uses
(by id, so custom ops can name them), SeqLayout, the argument checks, the
LSE conventions and the stream a call runs on.
"""
import math

import torch
import torch.distributed as dist

import attncomm as _ac
from attncomm import AttnError, INVALID_ARGUMENT

MODES = {"auto": _ac.MODE_AUTO, "pass_kv": _ac.MODE_PASS_KV, "pass_q": _ac.MODE_PASS_Q,
         "ship_q": _ac.MODE_SHIP_Q, "head_parallel": _ac.MODE_HEAD_PARALLEL,
         "all_gather_kv": _ac.MODE_ALL_GATHER_KV}
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
        # Rank and size are ctypes calls, which torch.compile cannot trace:
        # read them here once (outside a trace: init_from_group registers).
        comm._torch_rank, comm._torch_size = comm.rank, comm.size
        comm._torch_key = key
        _comms[key] = comm
    return key


def _rank_size(comm):
    _comm_id(comm)
    return comm._torch_rank, comm._torch_size


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
    comm = _ac.Comm.init_rank(world, _ac.UniqueId(box[0]), rank, device=device, **config)
    _comm_id(comm)  # known to the custom ops before any trace
    return comm

# ---- layouts --------------------------------------------------------------------


class SeqLayout:
    """This rank's shard of a batch as int32 tensors: cu_seqlens-style
    offsets [num_seqs + 1] of q and of kv rows, and the global position of
    every row. Lists are turned into tensors. The tensors are read when the
    call runs, so an engine may update them in place between steps. On a
    device communicator they may be CUDA (or pinned) tensors, read on the
    stream when the call runs: a captured CUDA graph then serves every
    decode step as the engine updates them before each replay."""

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


def _check_side(comm, t, name="q"):
    """t on the communicator's side (CPU for a host one, CUDA for a device
    one). Skipped inside a trace (the op checks it when it runs)."""
    if torch.compiler.is_compiling():
        return
    on_device = comm.device >= 0
    _require(t.is_cuda == on_device, f"{name}: on {t.device}, but the communicator is "
                                     f"{'on CUDA device %d' % comm.device if on_device else 'a host one'}")


def _check_rows(name, t, dtype=None, like=None):
    """t: a contiguous [rows, heads, head_dim] float tensor (of dtype, on
    like's device when given)."""
    _require(isinstance(t, torch.Tensor), f"{name}: a torch.Tensor is needed, got {type(t).__name__}")
    _require(t.dim() == 3, f"{name}: [rows, heads, head_dim] is needed, got shape {tuple(t.shape)}")
    _require(t.dtype in _DTYPES, f"{name}: dtype {t.dtype} is not float32, float16 or bfloat16")
    if dtype is not None:
        _require(t.dtype == dtype, f"{name}: dtype {t.dtype} differs from {dtype}")
    if like is not None:
        _require(t.device == like.device, f"{name}: on {t.device}, q on {like.device}")
    _require(t.is_contiguous(), f"{name}: not contiguous")


def _check_qkv(comm, q, k, v):
    _check_rows("q", q)
    for name, t in (("k", k), ("v", v)):
        _check_rows(name, t)
        _require(t.dtype == q.dtype, f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
        _require(t.device == q.device, f"{name}: on {t.device}, q on {q.device}")
    # v may have a head dim of its own (MLA: DeepSeek's 192 / 128), never other rows or heads.
    _require(k.shape[:2] == v.shape[:2], f"k {tuple(k.shape)} and v {tuple(v.shape)}: rows or heads differ")
    _require(q.shape[2] == k.shape[2], f"head_dim: q has {q.shape[2]}, k {k.shape[2]}")
    _require(k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0,
             f"q's {q.shape[1]} heads are not a multiple of k's {k.shape[1]}")
    _check_side(comm, q)


def _out_shape(q, dv=None):
    """[rows, Hq, Dv]: q's rows and heads, v's head dim (q's when None)."""
    return (q.shape[0], q.shape[1], q.shape[2] if dv is None else dv)


def _check_out(q, out, dv=None):
    _require(isinstance(out, torch.Tensor), "out: a torch.Tensor is needed")
    shape = _out_shape(q, dv)
    _require(tuple(out.shape) == shape, f"out: shape {tuple(out.shape)}, {shape} is needed")
    _require(out.dtype == q.dtype, f"out: dtype {out.dtype}, q is {q.dtype}")
    _require(out.device == q.device, f"out: on {out.device}, q on {q.device}")
    _require(out.is_contiguous(), "out: not contiguous")


def _lse_shape(rows, heads, lse_layout):
    if lse_layout == "th":
        return (rows, heads)
    if lse_layout == "ht":
        return (heads, rows)
    raise AttnError(INVALID_ARGUMENT, f"lse_layout: 'th' or 'ht', got {lse_layout!r}")


def _check_lse_of(name, lse, rows, heads, device, lse_layout):
    shape = _lse_shape(rows, heads, lse_layout)
    _require(isinstance(lse, torch.Tensor), f"{name}: a torch.Tensor is needed")
    _require(lse.dtype == torch.float32, f"{name}: float32 is needed, got {lse.dtype}")
    _require(tuple(lse.shape) == shape, f"{name}: shape {tuple(lse.shape)}, {shape} is needed (lse_layout "
                                        f"{lse_layout!r})")
    _require(lse.device == device, f"{name}: on {lse.device}, the other tensors on {device}")
    _require(lse.is_contiguous(), f"{name}: not contiguous")


def _check_lse(q, lse, lse_layout):
    _check_lse_of("lse", lse, q.shape[0], q.shape[1], q.device, lse_layout)


def _features(q, window_size, softcap, sinks):
    """The window, softcap and sinks of an attention call, checked:
    (window_left, window_right, softcap, sinks or None). window_size is
    FlashAttention's (left, right), -1 for no bound on that side; sinks a
    float32 [Hq] tensor on q's device (GPT-OSS attention sinks)."""
    _require(isinstance(window_size, (tuple, list)) and len(window_size) == 2,
             f"window_size: (left, right) in tokens, -1 for none, got {window_size!r}")
    left, right = (int(x) for x in window_size)
    _require(left >= -1 and right >= -1, f"window_size: each side >= -1, got {(left, right)}")
    softcap = float(softcap)
    _require(math.isfinite(softcap) and softcap >= 0.0, f"softcap: finite and >= 0 (0: none), got {softcap}")
    if sinks is not None:
        _check_vector("sinks", sinks, q.shape[1], "one per query head", "q", q.device)
    return left, right, softcap, sinks


def _check_vector(name, t, n, what, like_name, device):
    """t: a contiguous float32 tensor of n values (`what` says what they
    are) on `device`, where the tensor `like_name` lives."""
    _require(isinstance(t, torch.Tensor), f"{name}: a torch.Tensor is needed")
    _require(t.dtype == torch.float32, f"{name}: float32 is needed, got {t.dtype}")
    _require(tuple(t.shape) == (n,), f"{name}: shape {tuple(t.shape)}, ({n},) is needed ({what})")
    _require(t.device == device, f"{name}: on {t.device}, {like_name} on {device}")
    _require(t.is_contiguous(), f"{name}: not contiguous")


def _check_lse_base(lse_base):
    _require(lse_base in ("e", "2"), f"lse_base: 'e' or '2', got {lse_base!r}")


def _check_layout(comm, layout):
    _require(isinstance(layout, SeqLayout), f"layout: an attncomm.torch.SeqLayout is needed, got "
                                            f"{type(layout).__name__}")
    on_cuda = [t.is_cuda for t in layout.tensors()]
    for name, c in zip(("q_offsets", "q_pos", "kv_offsets", "kv_pos"), on_cuda):
        _require(not c or comm.device >= 0,
                 f"layout {name}: on CUDA, but a host communicator reads layouts on the host")
    _require(all(on_cuda) or not any(on_cuda), "layout: the four tensors live on one side (all CUDA or all host)")


def _int32_host(name, x, what="layout "):
    """x as a 1-D int32 tensor (lists are turned into one); host memory,
    since the library reads it on the host. Its values are not read here."""
    if not isinstance(x, torch.Tensor):
        x = torch.tensor([int(i) for i in x], dtype=torch.int32)
    _require(x.dtype == torch.int32, f"{what}{name}: int32 is needed, got {x.dtype}")
    _require(x.dim() == 1, f"{what}{name}: a 1-D tensor is needed, got {x.dim()}-D")
    _require(not x.is_cuda, f"{what}{name}: host memory is needed (the library reads it on the host)")
    return x.contiguous()

# ---- LSE conventions: the library reads and writes natural-log [rows, heads] ----------


def _raw_lse(rows, heads, device, lse, lse_base, lse_layout):
    """The natural-log [rows, heads] tensor the library writes: lse itself
    when it is given in that convention, else a new one."""
    if lse is not None and lse_base == "e" and lse_layout == "th":
        return lse
    return torch.empty((rows, heads), dtype=torch.float32, device=device)


def _lse_out(raw, lse, lse_base, lse_layout):
    """raw (natural log, [rows, heads]) in the caller's convention: copied
    into lse when given, else a new tensor."""
    direct = lse is not None and lse_base == "e" and lse_layout == "th"
    if direct:
        return lse
    converted = raw if lse_base == "e" else raw * _LOG2E
    if lse_layout == "ht":
        converted = converted.t()
    if lse is None:
        return converted.contiguous()
    lse.copy_(converted)
    return lse


def _lse_in(lse, lse_base, lse_layout):
    """A caller's LSE as natural-log [rows, heads], contiguous."""
    x = lse if lse_layout == "th" else lse.t()
    if lse_base == "2":
        x = x * math.log(2.0)
    return x.contiguous()


def _result(out, raw, lse, return_lse, lse_base, lse_layout):
    if not (return_lse or lse is not None):
        return out
    return out, _lse_out(raw, lse, lse_base, lse_layout)

# ---- running on a stream ---------------------------------------------------------------


def _stream_of(q, stream):
    if stream is not None:
        return int(_ac._stream(stream) or 0)
    if q.is_cuda:
        return int(torch.cuda.current_stream(q.device).cuda_stream)
    return 0


class _NoStream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _torch_on(t, stream):
    """Inside an op: torch's own work on `stream` (the library's), so the
    two stay ordered when the caller gave another stream than the current."""
    if t.is_cuda and stream:
        return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=t.device))
    return _NoStream()


def _check_op_side(comm, t):
    _require(t.is_cuda == (comm.device >= 0), f"q: on {t.device}, the communicator's device is {comm.device}")


def _prepare(q, out, lse, lse_base, lse_layout, dv=None):
    """Checks out (q's rows and heads, v's head dim dv) and lse against q;
    (out, the library's lse tensor)."""
    _check_lse_base(lse_base)
    if out is None:
        out = q.new_empty(_out_shape(q, dv))
    else:
        _check_out(q, out, dv)
    if lse is not None:
        _check_lse(q, lse, lse_layout)
    else:
        _lse_shape(0, 0, lse_layout)  # a bad lse_layout is an error also without lse
    return out, _raw_lse(q.shape[0], q.shape[1], q.device, lse, lse_base, lse_layout)
