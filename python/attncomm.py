"""attncomm from Python: the C API through ctypes, nothing compiled.

Buffers are numpy arrays (host memory) or torch tensors (host or CUDA);
they must be contiguous, and their dtype picks the attncomm type. On a
device communicator a call returns once enqueued on its stream, so its
buffers must live until the stream has run it (as with NCCL). A failed
call raises AttnError with the code and the communicator's last-error text
(which names the rank, the peer and the cause).

    import attncomm as ac
    comms = ac.Comm.init_all(4)                # 4 ranks as threads of this process
    # ... one Python thread per rank (ctypes releases the GIL in every call):
    comms[r].all_reduce(x, x, op=ac.SUM)

The library is ATTN_LIBRARY when set, else libattncomm.so from a build
directory beside this file (build/, build-*/), else the system's.
"""
import ctypes
import ctypes.util
import glob
import os
import threading

# ---- the library ---------------------------------------------------------


def _find_library():
    env = os.environ.get("ATTN_LIBRARY")
    if env:
        return env
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for d in ["build"] + sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "build-*"))):
        path = os.path.join(root, d, "libattncomm.so")
        if os.path.exists(path):
            return path
    found = ctypes.util.find_library("attncomm")
    if not found:
        raise OSError("libattncomm.so not found: build it or set ATTN_LIBRARY to its path")
    return found


_lib = ctypes.CDLL(_find_library())

# ---- constants (include/attncomm.h) ---------------------------------------

SUCCESS, UNHANDLED_CUDA_ERROR, SYSTEM_ERROR, INTERNAL_ERROR, INVALID_ARGUMENT, INVALID_USAGE, \
    REMOTE_ERROR, IN_PROGRESS, TIMEOUT, NOT_SUPPORTED = range(10)
INT8, UINT8, INT32, INT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(8)
SUM, PROD, MAX, MIN, AVG = range(5)
MODE_AUTO, MODE_PASS_KV, MODE_PASS_Q, MODE_SHIP_Q = range(4)
TIER_DEVICE, TIER_HOST, TIER_RACK, TIER_CLUSTER = range(4)  # attnTier_t: indices of level_attention keep
DEVICE_HOST = -1
_CONFIG_MAGIC = 0xA7C0F16
_HEADER_VERSION = 100  # ATTN_VERSION_CODE of the header these declarations follow (0.1.0)
_UNDEF_INT = -2147483648
_UNIQUE_ID_BYTES = 128

_TYPE_SIZE = {INT8: 1, UINT8: 1, INT32: 4, INT64: 8, FLOAT16: 2, FLOAT32: 4, FLOAT64: 8, BFLOAT16: 2}
_TYPE_BY_NAME = {"int8": INT8, "uint8": UINT8, "int32": INT32, "int64": INT64, "float16": FLOAT16,
                 "half": FLOAT16, "float32": FLOAT32, "float": FLOAT32, "float64": FLOAT64,
                 "double": FLOAT64, "bfloat16": BFLOAT16}

# ---- C types --------------------------------------------------------------

_p = ctypes.c_void_p
_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * _UNIQUE_ID_BYTES)]


class _Config(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("timeout_ms", ctypes.c_int), ("transports", ctypes.c_char_p),
                ("device", ctypes.c_int), ("comm_name", ctypes.c_char_p)]


class _AttnConfig(ctypes.Structure):
    _fields_ = [("num_q_heads", ctypes.c_int), ("num_kv_heads", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("dtype", ctypes.c_int), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int)]


class _SeqLayout(ctypes.Structure):
    _fields_ = [("num_seqs", ctypes.c_int), ("q_offsets", _i32p), ("q_pos", _i32p),
                ("kv_offsets", _i32p), ("kv_pos", _i32p)]


class _LevelDrop(ctypes.Structure):
    _fields_ = [("keep", ctypes.c_float * 4), ("importance", ctypes.POINTER(ctypes.c_float))]


class _BatchSpec(ctypes.Structure):
    _fields_ = [("num_seqs", ctypes.c_int), ("new_lens", _i32p), ("cached_lens", _i32p)]


class _Shard(ctypes.Structure):
    _fields_ = [("layout", _SeqLayout), ("q_rows", ctypes.c_int64), ("kv_rows", ctypes.c_int64),
                ("q_index", _i64p), ("kv_index", _i64p)]


def _declare(name, *args):
    f = getattr(_lib, name)
    f.restype = ctypes.c_int
    f.argtypes = list(args)
    return f


_comm = _p  # attnComm_t
_GetVersion = _declare("attnGetVersion", ctypes.POINTER(ctypes.c_int))
_lib.attnGetErrorString.restype = ctypes.c_char_p
_lib.attnGetErrorString.argtypes = [ctypes.c_int]
_lib.attnGetLastError.restype = ctypes.c_char_p
_lib.attnGetLastError.argtypes = [_comm]
_GetUniqueId = _declare("attnGetUniqueId", ctypes.POINTER(_UniqueId))
_InitRankConfig = _declare("attnCommInitRankConfig", ctypes.POINTER(_comm), ctypes.c_int, _UniqueId,
                           ctypes.c_int, ctypes.POINTER(_Config))
_InitAll = _declare("attnCommInitAll", ctypes.POINTER(_comm), ctypes.c_int, _i32p)
_InitFromEnv = _declare("attnCommInitFromEnv", ctypes.POINTER(_comm), ctypes.POINTER(_Config))
_Split = _declare("attnCommSplit", _comm, ctypes.c_int, ctypes.c_int, ctypes.POINTER(_comm),
                  ctypes.POINTER(_Config))
_Destroy = _declare("attnCommDestroy", _comm)
_Abort = _declare("attnCommAbort", _comm)
_AsyncError = _declare("attnCommGetAsyncError", _comm, ctypes.POINTER(ctypes.c_int))
_Count = _declare("attnCommCount", _comm, ctypes.POINTER(ctypes.c_int))
_UserRank = _declare("attnCommUserRank", _comm, ctypes.POINTER(ctypes.c_int))
_Send = _declare("attnSend", _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_Recv = _declare("attnRecv", _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_GroupStart = _declare("attnGroupStart")
_GroupEnd = _declare("attnGroupEnd")
_AllGather = _declare("attnAllGather", _p, _p, ctypes.c_size_t, ctypes.c_int, _comm, _p)
_ReduceScatter = _declare("attnReduceScatter", _p, _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_AllReduce = _declare("attnAllReduce", _p, _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_Broadcast = _declare("attnBroadcast", _p, _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_AllToAll = _declare("attnAllToAll", _p, _p, ctypes.c_size_t, ctypes.c_int, _comm, _p)
_szp = ctypes.POINTER(ctypes.c_size_t)
_AllToAllv = _declare("attnAllToAllv", _p, _szp, _szp, _p, _szp, _szp, ctypes.c_int, _comm, _p)
_Barrier = _declare("attnBarrier", _comm, _p)
_RingAttention = _declare("attnRingAttention", _p, _p, _p, _p, _p, ctypes.POINTER(_SeqLayout),
                          ctypes.POINTER(_AttnConfig), ctypes.c_int, _comm, _p)
_LevelAttention = _declare("attnLevelAttention", _p, _p, _p, _p, _p, ctypes.POINTER(_SeqLayout),
                           ctypes.POINTER(_AttnConfig), ctypes.POINTER(_LevelDrop), _comm, _p)
_MergeAttnStates = _declare("attnMergeAttnStates", ctypes.c_int, ctypes.POINTER(_p), ctypes.POINTER(_p), _p,
                            _p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, _p)
_PlanPrefill = _declare("attnPlanPrefill", ctypes.POINTER(_BatchSpec), ctypes.c_int, ctypes.POINTER(_p))
_PlanGetShard = _declare("attnPlanGetShard", _p, ctypes.c_int, ctypes.POINTER(_Shard))
_PlanDestroy = _declare("attnPlanDestroy", _p)

# ---- errors -----------------------------------------------------------------


class AttnError(RuntimeError):
    """A failed attncomm call: .code is the attnResult_t, str() the message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def error_string(code):
    return _lib.attnGetErrorString(code).decode()


def _check(code, comm=None, what=""):
    if code == SUCCESS:
        return
    text = _lib.attnGetLastError(comm).decode(errors="replace")
    raise AttnError(code, f"{what}: {error_string(code)}: {text}")


def version():
    v = ctypes.c_int()
    _check(_GetVersion(ctypes.byref(v)), None, "attnGetVersion")
    return v.value // 10000, v.value // 100 % 100, v.value % 100

# ---- buffers ----------------------------------------------------------------


def _buffer(x):
    """(address, element count, attncomm type) of a contiguous numpy array or
    torch tensor."""
    if hasattr(x, "data_ptr") and hasattr(x, "is_contiguous"):  # torch.Tensor
        if not x.is_contiguous():
            raise AttnError(INVALID_ARGUMENT, "tensor is not contiguous")
        name = str(x.dtype).replace("torch.", "")
        ptr, n = x.data_ptr(), x.numel()
    elif hasattr(x, "__array_interface__"):  # numpy.ndarray
        if not x.flags["C_CONTIGUOUS"]:
            raise AttnError(INVALID_ARGUMENT, "array is not C-contiguous")
        name = x.dtype.name
        ptr, n = x.__array_interface__["data"][0], x.size
    else:
        raise AttnError(INVALID_ARGUMENT, f"not a numpy array or torch tensor: {type(x).__name__}")
    if name not in _TYPE_BY_NAME:
        raise AttnError(INVALID_ARGUMENT, f"no attncomm type for dtype {name}")
    return ptr, n, _TYPE_BY_NAME[name]


def _optional_buffer(x):
    return _buffer(x)[0] if x is not None else None


def _stream(s):
    """A CUDA stream as attnStream_t: None, an int, or anything with a
    .cuda_stream (torch.cuda.Stream) or .ptr (cupy)."""
    if s is None:
        return None
    for attr in ("cuda_stream", "ptr"):
        if hasattr(s, attr):
            return getattr(s, attr)
    return int(s)


def _int32_array(values):
    values = [int(v) for v in values]
    return (ctypes.c_int32 * max(1, len(values)))(*values), len(values)

# ---- communicators -------------------------------------------------------------


class UniqueId:
    """attnUniqueId: made on one rank, handed to the others as bytes."""

    def __init__(self, raw=None):
        self._id = _UniqueId()
        if raw is None:
            _check(_GetUniqueId(ctypes.byref(self._id)), None, "attnGetUniqueId")
        else:
            if len(raw) != _UNIQUE_ID_BYTES:
                raise AttnError(INVALID_ARGUMENT, f"a unique id is {_UNIQUE_ID_BYTES} bytes, not {len(raw)}")
            ctypes.memmove(ctypes.byref(self._id), raw, _UNIQUE_ID_BYTES)

    def bytes(self):
        return ctypes.string_at(ctypes.byref(self._id), _UNIQUE_ID_BYTES)


def _config(device=None, timeout_ms=None, transports=None, blocking=None, name=None):
    c = _Config(ctypes.sizeof(_Config), _CONFIG_MAGIC, _HEADER_VERSION, _UNDEF_INT, _UNDEF_INT, None, _UNDEF_INT,
                None)
    if blocking is not None:
        c.blocking = int(blocking)
    if timeout_ms is not None:
        c.timeout_ms = int(timeout_ms)
    if transports is not None:
        c.transports = transports.encode()
    if device is not None:
        c.device = int(device)
    if name is not None:
        c.comm_name = name.encode()
    return c


class Comm:
    """A communicator (attnComm_t). Destroy it with destroy(), or use it as a
    context manager."""

    def __init__(self, handle):
        self._h = _p(handle)

    # -- creation --
    @classmethod
    def init_rank(cls, nranks, uid, rank, **config):
        """attnCommInitRankConfig; config: device, timeout_ms, transports,
        blocking, name."""
        h = _p()
        cfg = _config(**config)
        _check(_InitRankConfig(ctypes.byref(h), nranks, uid._id, rank, ctypes.byref(cfg)), None,
               "attnCommInitRankConfig")
        return cls(h.value)

    @classmethod
    def init_all(cls, nranks, devices=None):
        """attnCommInitAll: nranks ranks as threads of this process; devices
        (one CUDA ordinal per rank, ranks may share one) or None for host."""
        hs = (_p * nranks)()
        devs = None
        if devices is not None:
            if len(devices) != nranks:
                raise AttnError(INVALID_ARGUMENT, f"{len(devices)} devices for {nranks} ranks")
            devs, _ = _int32_array(devices)
        _check(_InitAll(hs, nranks, devs), None, "attnCommInitAll")
        return [cls(h) for h in hs]

    @classmethod
    def from_env(cls, **config):
        """attnCommInitFromEnv (ATTN_RANK/ATTN_NRANKS/ATTN_ROOT, torchrun's or
        Open MPI's variables)."""
        h = _p()
        cfg = _config(**config)
        _check(_InitFromEnv(ctypes.byref(h), ctypes.byref(cfg)), None, "attnCommInitFromEnv")
        return cls(h.value)

    def split(self, color, key, **config):
        """attnCommSplit; None for ranks that pass color -1."""
        h = _p()
        cfg = _config(**config) if config else None
        _check(_Split(self._h, color, key, ctypes.byref(h), ctypes.byref(cfg) if cfg else None), self._h,
               "attnCommSplit")
        return Comm(h.value) if h.value else None

    def destroy(self):
        if self._h:
            h, self._h = self._h, _p()
            _check(_Destroy(h), None, "attnCommDestroy")

    def abort(self):
        if self._h:
            h, self._h = self._h, _p()
            _check(_Abort(h), None, "attnCommAbort")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    # -- queries --
    @property
    def rank(self):
        r = ctypes.c_int()
        _check(_UserRank(self._h, ctypes.byref(r)), self._h, "attnCommUserRank")
        return r.value

    @property
    def size(self):
        n = ctypes.c_int()
        _check(_Count(self._h, ctypes.byref(n)), self._h, "attnCommCount")
        return n.value

    def async_error(self):
        e = ctypes.c_int()
        _check(_AsyncError(self._h, ctypes.byref(e)), self._h, "attnCommGetAsyncError")
        return e.value

    def last_error(self):
        return _lib.attnGetLastError(self._h).decode(errors="replace")

    # -- collectives: count is per rank as in NCCL (the send buffer's size) --
    def _two(self, send, recv):
        sp, sn, st = _buffer(send)
        rp, rn, rt = _buffer(recv)
        if st != rt:
            raise AttnError(INVALID_ARGUMENT, "send and receive buffers differ in dtype")
        return sp, sn, rp, rn, st

    def all_gather(self, send, recv, stream=None):
        sp, sn, rp, rn, t = self._two(send, recv)
        if rn < sn * self.size:
            raise AttnError(INVALID_ARGUMENT, f"receive buffer holds {rn} elements, needs {sn * self.size}")
        _check(_AllGather(sp, rp, sn, t, self._h, _stream(stream)), self._h, "attnAllGather")

    def reduce_scatter(self, send, recv, op=SUM, stream=None):
        sp, sn, rp, rn, t = self._two(send, recv)
        if sn < rn * self.size:
            raise AttnError(INVALID_ARGUMENT, f"send buffer holds {sn} elements, needs {rn * self.size}")
        _check(_ReduceScatter(sp, rp, rn, t, op, self._h, _stream(stream)), self._h, "attnReduceScatter")

    def all_reduce(self, send, recv, op=SUM, stream=None):
        sp, sn, rp, rn, t = self._two(send, recv)
        if rn < sn:
            raise AttnError(INVALID_ARGUMENT, f"receive buffer holds {rn} elements, needs {sn}")
        _check(_AllReduce(sp, rp, sn, t, op, self._h, _stream(stream)), self._h, "attnAllReduce")

    def broadcast(self, send, recv, root=0, stream=None):
        rp, rn, t = _buffer(recv)
        sp = _buffer(send)[0] if send is not None else None
        _check(_Broadcast(sp, rp, rn, t, root, self._h, _stream(stream)), self._h, "attnBroadcast")

    def all_to_all(self, send, recv, stream=None):
        sp, sn, rp, rn, t = self._two(send, recv)
        n = self.size
        if sn % n or rn < sn:
            raise AttnError(INVALID_ARGUMENT, f"all_to_all needs equal buffers divisible by {n} ranks")
        _check(_AllToAll(sp, rp, sn // n, t, self._h, _stream(stream)), self._h, "attnAllToAll")

    def all_to_allv(self, send, send_counts, send_displs, recv, recv_counts, recv_displs, stream=None):
        """Per-peer counts and displacements in elements, as attnAllToAllv;
        the library checks them against the buffers' peers."""
        sp, sn, rp, rn, t = self._two(send, recv)
        n = self.size
        arrays = []
        for name, values, limit in (("send", (send_counts, send_displs), sn), ("recv", (recv_counts, recv_displs), rn)):
            counts, displs = [int(x) for x in values[0]], [int(x) for x in values[1]]
            if len(counts) != n or len(displs) != n:
                raise AttnError(INVALID_ARGUMENT, f"{name} counts and displacements need {n} entries each")
            if any(c < 0 or d < 0 or c + d > limit for c, d in zip(counts, displs)):
                raise AttnError(INVALID_ARGUMENT, f"a {name} block lies outside the {limit}-element buffer")
            arrays += [(ctypes.c_size_t * n)(*counts), (ctypes.c_size_t * n)(*displs)]
        sc, sd, rc, rd = arrays
        _check(_AllToAllv(sp, sc, sd, rp, rc, rd, t, self._h, _stream(stream)), self._h, "attnAllToAllv")

    def send(self, buf, peer, stream=None):
        p, n, t = _buffer(buf)
        _check(_Send(p, n, t, peer, self._h, _stream(stream)), self._h, "attnSend")
        _hold_for_group(buf)

    def recv(self, buf, peer, stream=None):
        p, n, t = _buffer(buf)
        _check(_Recv(p, n, t, peer, self._h, _stream(stream)), self._h, "attnRecv")
        _hold_for_group(buf)

    def barrier(self, stream=None):
        _check(_Barrier(self._h, _stream(stream)), self._h, "attnBarrier")

    # -- attention --
    def ring_attention(self, q, k, v, out, layout, num_q_heads, num_kv_heads, head_dim, lse=None,
                       causal=True, softmax_scale=0.0, mode=MODE_AUTO, stream=None):
        """attnRingAttention: out (and lse, float32 [q rows, Hq], optional) of
        this rank's queries over every rank's keys. layout: a SeqLayout."""
        qp, _, t = _buffer(q)
        cfg = _AttnConfig(num_q_heads, num_kv_heads, head_dim, t, softmax_scale, int(causal))
        _check(_RingAttention(qp, _buffer(k)[0], _buffer(v)[0], _buffer(out)[0], _optional_buffer(lse),
                              ctypes.byref(layout._c), ctypes.byref(cfg), mode, self._h, _stream(stream)),
               self._h, "attnRingAttention")

    def level_attention(self, q, k, v, out, layout, num_q_heads, num_kv_heads, head_dim, keep=None,
                        importance=None, lse=None, causal=True, softmax_scale=0.0):
        """attnLevelAttention: as ring_attention, but each peer sends only the
        keys it keeps for the tier between the two ranks. keep: 4 fractions by
        tier (device, host, rack, cluster), or None to keep every key;
        importance: float32 [kv rows], the score of each local key."""
        qp, _, t = _buffer(q)
        cfg = _AttnConfig(num_q_heads, num_kv_heads, head_dim, t, softmax_scale, int(causal))
        drop = None
        if keep is not None:
            if len(keep) != 4:
                raise ValueError("keep takes 4 fractions: device, host, rack, cluster tiers")
            imp = None
            if importance is not None:
                ip, _, it = _buffer(importance)
                if it != FLOAT32:
                    raise TypeError("importance must be float32")
                imp = ctypes.cast(ip, ctypes.POINTER(ctypes.c_float))
            drop = _LevelDrop((ctypes.c_float * 4)(*keep), imp)
        _check(_LevelAttention(qp, _buffer(k)[0], _buffer(v)[0], _buffer(out)[0], _optional_buffer(lse),
                               ctypes.byref(layout._c), ctypes.byref(cfg),
                               ctypes.byref(drop) if drop is not None else None, self._h, None),
               self._h, "attnLevelAttention")


# Inside a group, sends and receives run at the outermost group_end: the
# buffers posted in it are held until then, so a temporary array passed to
# send() is not freed (and its memory reused) before its bytes leave.
_group = threading.local()


def _hold_for_group(buf):
    if getattr(_group, "depth", 0) > 0:
        _group.held.append(buf)


def group_start():
    _check(_GroupStart(), None, "attnGroupStart")
    if getattr(_group, "depth", 0) == 0:
        _group.held = []
    _group.depth = getattr(_group, "depth", 0) + 1


def group_end():
    _group.depth = max(0, getattr(_group, "depth", 0) - 1)
    try:
        _check(_GroupEnd(), None, "attnGroupEnd")
    finally:
        if _group.depth == 0:
            _group.held = []


def merge_attn_states(outs, lses, out, lse, rows, heads, head_dim, stream=None):
    """attnMergeAttnStates over partials outs[j] / lses[j] (float32)."""
    n = len(outs)
    if len(lses) != n:
        raise AttnError(INVALID_ARGUMENT, "as many lse buffers as outputs are needed")
    t = _buffer(outs[0])[2]
    op = (_p * n)(*[_buffer(o)[0] for o in outs])
    lp = (_p * n)(*[_buffer(x)[0] for x in lses])
    _check(_MergeAttnStates(n, op, lp, _buffer(out)[0], _optional_buffer(lse), rows, heads, head_dim, t,
                            _stream(stream)), None, "attnMergeAttnStates")

# ---- layouts and the planner --------------------------------------------------------


class SeqLayout:
    """attnSeqLayout_t over Python sequences of ints (kept alive here)."""

    def __init__(self, q_offsets, q_pos, kv_offsets, kv_pos):
        self._arrays = [_int32_array(a)[0] for a in (q_offsets, q_pos, kv_offsets, kv_pos)]
        qo, qp, ko, kp = self._arrays
        self._c = _SeqLayout(len(q_offsets) - 1, qo, qp, ko, kp)
        self.q_offsets, self.q_pos = list(q_offsets), list(q_pos)
        self.kv_offsets, self.kv_pos = list(kv_offsets), list(kv_pos)


class Shard:
    """One rank's rows from plan_prefill: .layout, .q_index (rows of the
    batch's packed new tokens), .kv_index (rows of the packed full
    sequences)."""

    def __init__(self, s):
        S = s.layout.num_seqs
        self.q_index = [s.q_index[i] for i in range(s.q_rows)]
        self.kv_index = [s.kv_index[i] for i in range(s.kv_rows)]
        self.layout = SeqLayout([s.layout.q_offsets[i] for i in range(S + 1)],
                                [s.layout.q_pos[i] for i in range(s.q_rows)],
                                [s.layout.kv_offsets[i] for i in range(S + 1)],
                                [s.layout.kv_pos[i] for i in range(s.kv_rows)])


def plan_prefill(new_lens, nranks, cached_lens=None):
    """attnPlanPrefill: the load-balanced shards of every rank."""
    nl, S = _int32_array(new_lens)
    cl = _int32_array(cached_lens)[0] if cached_lens is not None else None
    spec = _BatchSpec(S, nl, cl)
    plan = _p()
    _check(_PlanPrefill(ctypes.byref(spec), nranks, ctypes.byref(plan)), None, "attnPlanPrefill")
    try:
        shards = []
        for r in range(nranks):
            s = _Shard()
            _check(_PlanGetShard(plan, r, ctypes.byref(s)), None, "attnPlanGetShard")
            shards.append(Shard(s))
        return shards
    finally:
        _PlanDestroy(plan)
