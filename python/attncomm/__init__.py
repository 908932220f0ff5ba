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

Non-blocking communicators (blocking=False, or ATTN_COMM_BLOCKING=0):
creation and every call return at once with the work queued; comm.wait()
waits until it has all run (raising AttnError if some of it failed), and
comm.async_error() polls. The arrays a queued call was given are held until
wait() has seen it finish, so temporaries are safe to pass.

Mode selection: comm.select_mode(layout, ...), comm.cost_model (get and
set), estimate_modes(model, ...); topology: comm.topo_rank,
comm.topo_dump(fmt), comm.split_type(SPLIT_HOST, ...); decode_placement.

The distributed KV cache: pool = comm.kv_pool(...) (a KvPool: append,
migrate, attention over lent blocks, rebalance) and kv_plan(instances,
model); it needs numpy.

The library is ATTN_LIBRARY when set, else the one bundled by
`pip install ./python` after a build, else libattncomm.so from a build
directory of the checkout this package sits in (build/, build-*/), else the
system's (`cmake --install`). `pip install ./python` installs this package;
`attncomm.torch` is the PyTorch layer (torch tensors, torch.distributed
groups, custom ops that torch.compile traces).
"""
import collections
import collections.abc
import ctypes
import ctypes.util
import glob
import os
import threading
import time

# ---- the library ---------------------------------------------------------


def _find_library():
    env = os.environ.get("ATTN_LIBRARY")
    if env:
        return env
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libattncomm.so")
    if os.path.exists(bundled):  # pip install ./python after a build (setup.py)
        return bundled
    # python/attncomm/__init__.py in a checkout: the build directories of its root.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
MODE_AUTO, MODE_PASS_KV, MODE_PASS_Q, MODE_SHIP_Q, MODE_HEAD_PARALLEL, MODE_ALL_GATHER_KV = range(6)
TIER_DEVICE, TIER_HOST, TIER_RACK, TIER_CLUSTER = range(4)  # attnTier_t: indices of level_attention keep
SPLIT_HOST, SPLIT_HOST_LEADERS, SPLIT_RACK, SPLIT_PROXIMITY = range(4)  # attnSplitType_t
_TOPO_FORMAT = {"text": 0, "dot": 1, "json": 2}  # attnTopoFormat_t
DEVICE_HOST = -1
_CONFIG_MAGIC = 0xA7C0F16
_ATTN_CONFIG_MAGIC = 0xA77C0F1A
LSE_NATURAL, LSE_BASE2 = range(2)          # attnLseBase_t
LSE_TOKEN_MAJOR, LSE_HEAD_MAJOR = range(2)  # attnLseLayout_t
_HEADER_VERSION = 400  # ATTN_VERSION_CODE of the header these declarations follow (0.4.0)
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
    """attnAttnConfig_t (versioned: size, magic, version first)."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("num_q_heads", ctypes.c_int), ("num_kv_heads", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("dtype", ctypes.c_int), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int),
                ("lse_base", ctypes.c_int), ("lse_layout", ctypes.c_int),
                ("window_left", ctypes.c_int), ("window_right", ctypes.c_int), ("softcap", ctypes.c_float),
                ("sinks", ctypes.c_void_p), ("head_dim_v", ctypes.c_int)]

    def __init__(self, num_q_heads=0, num_kv_heads=0, head_dim=0, dtype=0, softmax_scale=0.0, causal=1,
                 lse_base=0, lse_layout=0, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
                 head_dim_v=0):
        super().__init__(ctypes.sizeof(_AttnConfig), _ATTN_CONFIG_MAGIC, _HEADER_VERSION, num_q_heads,
                         num_kv_heads, head_dim, dtype, softmax_scale, causal, lse_base, lse_layout,
                         int(window_left), int(window_right), float(softcap), sinks, int(head_dim_v))


def _sinks_of(sinks, num_q_heads):
    """The address of float32 sinks [num_q_heads] (a buffer, numpy array or
    tensor), or None."""
    if sinks is None:
        return None
    p, n, t = _buffer(sinks)
    if t != FLOAT32 or n != num_q_heads:
        raise AttnError(INVALID_ARGUMENT, f"sinks: float32 with num_q_heads = {num_q_heads} values, got "
                                          f"{n} of type {t}")
    return p


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
_Shrink = _declare("attnCommShrink", _comm, _i32p, ctypes.c_int, ctypes.POINTER(_comm), ctypes.POINTER(_Config),
                   ctypes.c_int)
SHRINK_DEFAULT, SHRINK_ABORT = 0x00, 0x01
_Destroy = _declare("attnCommDestroy", _comm)
_Abort = _declare("attnCommAbort", _comm)
_AsyncError = _declare("attnCommGetAsyncError", _comm, ctypes.POINTER(ctypes.c_int))
_Count = _declare("attnCommCount", _comm, ctypes.POINTER(ctypes.c_int))
_UserRank = _declare("attnCommUserRank", _comm, ctypes.POINTER(ctypes.c_int))
_Device = _declare("attnCommDevice", _comm, ctypes.POINTER(ctypes.c_int))
_Send = _declare("attnSend", _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_Recv = _declare("attnRecv", _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_GroupStart = _declare("attnGroupStart")
_GroupEnd = _declare("attnGroupEnd")
_AllGather = _declare("attnAllGather", _p, _p, ctypes.c_size_t, ctypes.c_int, _comm, _p)
_ReduceScatter = _declare("attnReduceScatter", _p, _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_AllReduce = _declare("attnAllReduce", _p, _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_Broadcast = _declare("attnBroadcast", _p, _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _comm, _p)
_Reduce = _declare("attnReduce", _p, _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, _comm, _p)
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
_MergeAttnStatesLse = _declare("attnMergeAttnStatesLse", ctypes.c_int, ctypes.POINTER(_p), ctypes.POINTER(_p), _p,
                               _p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, _p)
_MergeAttnReduceScatter = _declare("attnMergeAttnReduceScatter", _p, _p, _p, _p, ctypes.c_int64, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_int, _comm, _p)
_MergeAttnAllGather = _declare("attnMergeAttnAllGather", _p, _p, _p, _p, ctypes.c_int64, ctypes.c_int,
                               ctypes.c_int, ctypes.c_int, _comm, _p)


class _CostModel(ctypes.Structure):
    _fields_ = [("link_bandwidth_GBps", ctypes.c_double), ("link_latency_us", ctypes.c_double),
                ("attn_tflops", ctypes.c_double), ("comm_interference", ctypes.c_double)]


class _ModeEstimate(ctypes.Structure):
    _fields_ = [("chosen", ctypes.c_int), ("pass_kv_us", ctypes.c_double), ("pass_q_us", ctypes.c_double),
                ("ship_q_us", ctypes.c_double), ("alg1_threshold_tokens", ctypes.c_double),
                ("alg1_choice", ctypes.c_int), ("head_parallel_us", ctypes.c_double),
                ("all_gather_kv_us", ctypes.c_double)]


_SelectMode = _declare("attnSelectMode", ctypes.POINTER(_SeqLayout), ctypes.POINTER(_AttnConfig), _comm,
                       ctypes.POINTER(_ModeEstimate))
_EstimateModes = _declare("attnEstimateModes", ctypes.POINTER(_CostModel), ctypes.POINTER(_AttnConfig),
                          ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(_ModeEstimate))
_GetCostModel = _declare("attnCommGetCostModel", _comm, ctypes.POINTER(_CostModel))
_SetCostModel = _declare("attnCommSetCostModel", _comm, ctypes.POINTER(_CostModel))
_TopoRank = _declare("attnCommTopoRank", _comm, ctypes.POINTER(ctypes.c_int))
_TopoDump = _declare("attnCommTopoDump", _comm, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t))
_SplitType = _declare("attnCommSplitType", _comm, ctypes.c_int, ctypes.c_int, ctypes.POINTER(_comm),
                      ctypes.POINTER(_Config))
_DecodePlacement = _declare("attnDecodePlacement", ctypes.c_int, ctypes.c_int64, ctypes.c_int, _i32p, _i32p)
_PlanPrefill = _declare("attnPlanPrefill", ctypes.POINTER(_BatchSpec), ctypes.c_int, ctypes.POINTER(_p))
_PlanGetShard = _declare("attnPlanGetShard", _p, ctypes.c_int, ctypes.POINTER(_Shard))
_PlanDestroy = _declare("attnPlanDestroy", _p)


class _KvPoolConfig(ctypes.Structure):
    _fields_ = [("block_tokens", ctypes.c_int), ("num_kv_heads", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("dtype", ctypes.c_int), ("capacity_blocks", ctypes.c_int64)]


class _KvPoolStats(ctypes.Structure):
    _fields_ = [("capacity_blocks", ctypes.c_int64), ("used_blocks", ctypes.c_int64),
                ("lent_in_blocks", ctypes.c_int64), ("lent_out_blocks", ctypes.c_int64),
                ("num_requests", ctypes.c_int)]


class _KvMove(ctypes.Structure):
    _fields_ = [("src", ctypes.c_int), ("dst", ctypes.c_int), ("owner", ctypes.c_int), ("req", ctypes.c_int64),
                ("num_blocks", ctypes.c_int64)]


class _KvInstance(ctypes.Structure):
    _fields_ = [("batch_size", ctypes.c_int), ("pending_requests", ctypes.c_int),
                ("pending_blocks", ctypes.c_int64), ("capacity_blocks", ctypes.c_int64),
                ("used_blocks", ctypes.c_int64), ("longest_req", ctypes.c_int64),
                ("longest_req_blocks", ctypes.c_int64)]


class _KvModel(ctypes.Structure):
    _fields_ = [("nonattn_us_base", ctypes.c_double), ("nonattn_us_per_req", ctypes.c_double),
                ("attn_us_per_block", ctypes.c_double), ("num_layers", ctypes.c_int),
                ("debtor_max_batch", ctypes.c_int), ("creditor_max_util", ctypes.c_double)]


_kvpool = _p  # attnKvPool_t
_KvPoolCreate = _declare("attnKvPoolCreate", _comm, ctypes.POINTER(_KvPoolConfig), ctypes.POINTER(_kvpool))
_KvPoolDestroy = _declare("attnKvPoolDestroy", _kvpool)
_KvPoolShrink = _declare("attnKvPoolShrink", _kvpool, _comm, _i64p, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
_KvAppend = _declare("attnKvAppend", _kvpool, ctypes.c_int64, _p, _p, _i32p, ctypes.c_int, _p)
_KvRelease = _declare("attnKvRelease", _kvpool, ctypes.c_int64, _p)
_KvPoolGetStats = _declare("attnKvPoolGetStats", _kvpool, ctypes.POINTER(_KvPoolStats))
_KvGetPlacement = _declare("attnKvGetPlacement", _kvpool, ctypes.c_int64, _i64p, _i64p)
_KvMigrate = _declare("attnKvMigrate", _kvpool, ctypes.POINTER(_KvMove), ctypes.c_int, _i64p, _p)
_KvAttention = _declare("attnKvAttention", _kvpool, ctypes.c_int, _i64p, _i32p, _p, _i32p, _p,
                        ctypes.POINTER(ctypes.c_float), ctypes.POINTER(_AttnConfig), _p)
_KvPlan = _declare("attnKvPlan", ctypes.POINTER(_KvInstance), ctypes.c_int, ctypes.POINTER(_KvModel),
                   ctypes.POINTER(_KvMove), ctypes.POINTER(ctypes.c_int))
_KvRebalance = _declare("attnKvRebalance", _kvpool, ctypes.POINTER(_KvModel), ctypes.c_int, ctypes.c_int64,
                        _i64p, _p)

# ---- errors -----------------------------------------------------------------


class AttnError(RuntimeError):
    """A failed attncomm call: .code is the attnResult_t, str() the message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def error_string(code):
    return _lib.attnGetErrorString(code).decode()


def _check(code, comm=None, what=""):
    """Raises AttnError unless the call succeeded or was queued (IN_PROGRESS:
    a non-blocking communicator); returns the code."""
    if code in (SUCCESS, IN_PROGRESS):
        return code
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
        self._pending = []  # arrays of calls a non-blocking communicator queued (wait() lets them go)
        self._pending_lock = threading.Lock()

    def _queued(self, code, *arrays):
        """Holds the arrays of a call that runs later: inside a group until
        group_end, on a non-blocking communicator (IN_PROGRESS) until
        wait(). A temporary passed to the call then lives until it ran."""
        arrays = [a for a in arrays if a is not None]
        if getattr(_group, "depth", 0) > 0:
            _group.held.extend((self, a) for a in arrays)
        elif code == IN_PROGRESS:
            self._hold(arrays)
        return code

    def _hold(self, arrays):
        with self._pending_lock:
            self._pending.extend(arrays)

    def wait(self, timeout_s=None):
        """Non-blocking communicators: waits until creation and every queued
        call have run; raises AttnError (with the last-error text) if one
        failed, TimeoutError past timeout_s. Returns at once on a blocking
        communicator with nothing queued."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = 1e-5
        while True:
            e = self.async_error()
            if e != IN_PROGRESS:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"communicator still busy after {timeout_s} s")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        if e != SUCCESS:
            raise AttnError(e, f"queued operation: {error_string(e)}: {self.last_error()}")
        with self._pending_lock:
            self._pending = []

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
        """attnCommInitFromEnv (ATTN_RANK/ATTN_NRANKS/ATTN_ROOT, torchrun's,
        Open MPI's, MPICH's or srun's variables)."""
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

    def split_type(self, type, key=0, **config):
        """attnCommSplitType (SPLIT_HOST, SPLIT_HOST_LEADERS, SPLIT_RACK,
        SPLIT_PROXIMITY); None where the type leaves this rank out."""
        h = _p()
        cfg = _config(**config) if config else None
        _check(_SplitType(self._h, type, key, ctypes.byref(h), ctypes.byref(cfg) if cfg else None), self._h,
               "attnCommSplitType")
        return Comm(h.value) if h.value else None

    def shrink(self, exclude, abort=False, **config):
        """attnCommShrink: the ranks not in `exclude` (every survivor passes
        the same list) form a new communicator, also after the excluded
        ranks died. abort=True first ends the operations still running on
        this communicator (SHRINK_ABORT). This one stays allocated."""
        ranks = [int(r) for r in exclude]
        arr = (ctypes.c_int * max(1, len(ranks)))(*ranks)
        h = _p()
        cfg = _config(**config) if config else None
        _check(_Shrink(self._h, arr if ranks else None, len(ranks), ctypes.byref(h),
                       ctypes.byref(cfg) if cfg else None, SHRINK_ABORT if abort else SHRINK_DEFAULT),
               self._h, "attnCommShrink")
        return Comm(h.value)

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

    @property
    def device(self):
        """The CUDA device ordinal, or DEVICE_HOST (-1) for host memory."""
        cached = getattr(self, "_device", None)  # fixed for the communicator's life
        if cached is None:
            d = ctypes.c_int()
            _check(_Device(self._h, ctypes.byref(d)), self._h, "attnCommDevice")
            cached = self._device = d.value
        return cached

    def async_error(self):
        e = ctypes.c_int()
        _check(_AsyncError(self._h, ctypes.byref(e)), self._h, "attnCommGetAsyncError")
        return e.value

    def last_error(self):
        return _lib.attnGetLastError(self._h).decode(errors="replace")

    @property
    def topo_rank(self):
        """attnCommTopoRank: this rank's place in the proximity order."""
        r = ctypes.c_int()
        _check(_TopoRank(self._h, ctypes.byref(r)), self._h, "attnCommTopoRank")
        return r.value

    def topo_dump(self, fmt="text"):
        """attnCommTopoDump: the fabric model as "text", "dot" or "json"."""
        if fmt not in _TOPO_FORMAT:
            raise AttnError(INVALID_ARGUMENT, f"topology format {fmt!r}: one of {', '.join(_TOPO_FORMAT)}")
        size = ctypes.c_size_t(0)
        _check(_TopoDump(self._h, _TOPO_FORMAT[fmt], None, ctypes.byref(size)), self._h, "attnCommTopoDump")
        buf = ctypes.create_string_buffer(size.value)
        _check(_TopoDump(self._h, _TOPO_FORMAT[fmt], buf, ctypes.byref(size)), self._h, "attnCommTopoDump")
        return buf.value.decode(errors="replace")

    # -- the selector's cost model --
    @property
    def cost_model(self):
        """attnCommGetCostModel (collective the first time: it calibrates)."""
        m = _CostModel()
        _check(_GetCostModel(self._h, ctypes.byref(m)), self._h, "attnCommGetCostModel")
        return _cost_model_of(m)

    @cost_model.setter
    def cost_model(self, model):
        """attnCommSetCostModel from a CostModel, a 4-tuple in its order or a
        dict with its fields."""
        m = _struct_from(_CostModel, _as_fields(model, CostModel), {"comm_interference": 0.0}, "cost model")
        _check(_SetCostModel(self._h, ctypes.byref(m)), self._h, "attnCommSetCostModel")

    def select_mode(self, layout, num_q_heads, num_kv_heads, head_dim, dtype=FLOAT32, causal=True,
                    softmax_scale=0.0):
        """attnSelectMode (collective): what MODE_AUTO would run for this
        layout here, and each mode's predicted time."""
        cfg = _AttnConfig(num_q_heads, num_kv_heads, head_dim, dtype, softmax_scale, int(causal))
        e = _ModeEstimate()
        _check(_SelectMode(ctypes.byref(layout._c), ctypes.byref(cfg), self._h, ctypes.byref(e)), self._h,
               "attnSelectMode")
        return _estimate_of(e)

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
        self._queued(_check(_AllGather(sp, rp, sn, t, self._h, _stream(stream)), self._h, "attnAllGather"), send, recv)

    def reduce_scatter(self, send, recv, op=SUM, stream=None):
        sp, sn, rp, rn, t = self._two(send, recv)
        if sn < rn * self.size:
            raise AttnError(INVALID_ARGUMENT, f"send buffer holds {sn} elements, needs {rn * self.size}")
        self._queued(_check(_ReduceScatter(sp, rp, rn, t, op, self._h, _stream(stream)), self._h, "attnReduceScatter"),
                     send, recv)

    def all_reduce(self, send, recv, op=SUM, stream=None):
        sp, sn, rp, rn, t = self._two(send, recv)
        if rn < sn:
            raise AttnError(INVALID_ARGUMENT, f"receive buffer holds {rn} elements, needs {sn}")
        self._queued(_check(_AllReduce(sp, rp, sn, t, op, self._h, _stream(stream)), self._h, "attnAllReduce"),
                     send, recv)

    def broadcast(self, send, recv, root=0, stream=None):
        rp, rn, t = _buffer(recv)
        sp = _buffer(send)[0] if send is not None else None
        self._queued(_check(_Broadcast(sp, rp, rn, t, root, self._h, _stream(stream)), self._h, "attnBroadcast"),
                     send, recv)

    def reduce(self, send, recv, op=SUM, root=0, stream=None):
        """attnReduce: recv on `root` gets op over every rank's send; the
        other ranks may pass recv=None (theirs is not touched)."""
        sp, sn, t = _buffer(send)
        rp = None
        if recv is not None:
            rp, rn, rt = _buffer(recv)
            if rt != t:
                raise AttnError(INVALID_ARGUMENT, "send and receive buffers differ in dtype")
            if rn < sn:
                raise AttnError(INVALID_ARGUMENT, f"receive buffer holds {rn} elements, needs {sn}")
        self._queued(_check(_Reduce(sp, rp, sn, t, op, root, self._h, _stream(stream)), self._h, "attnReduce"),
                     send, recv)

    def all_to_all(self, send, recv, stream=None):
        sp, sn, rp, rn, t = self._two(send, recv)
        n = self.size
        if sn % n or rn < sn:
            raise AttnError(INVALID_ARGUMENT, f"all_to_all needs equal buffers divisible by {n} ranks")
        self._queued(_check(_AllToAll(sp, rp, sn // n, t, self._h, _stream(stream)), self._h, "attnAllToAll"),
                     send, recv)

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
        self._queued(_check(_AllToAllv(sp, sc, sd, rp, rc, rd, t, self._h, _stream(stream)), self._h,
                            "attnAllToAllv"), send, recv)

    def send(self, buf, peer, stream=None):
        p, n, t = _buffer(buf)
        self._queued(_check(_Send(p, n, t, peer, self._h, _stream(stream)), self._h, "attnSend"), buf)

    def recv(self, buf, peer, stream=None):
        p, n, t = _buffer(buf)
        self._queued(_check(_Recv(p, n, t, peer, self._h, _stream(stream)), self._h, "attnRecv"), buf)

    def barrier(self, stream=None):
        self._queued(_check(_Barrier(self._h, _stream(stream)), self._h, "attnBarrier"))

    # -- attention --
    def ring_attention(self, q, k, v, out, layout, num_q_heads, num_kv_heads, head_dim, lse=None,
                       causal=True, softmax_scale=0.0, mode=MODE_AUTO, stream=None, window_left=-1,
                       window_right=-1, softcap=0.0, sinks=None, head_dim_v=0):
        """attnRingAttention: out (and lse, float32 [q rows, Hq], optional) of
        this rank's queries over every rank's keys. layout: a SeqLayout.
        window_left / window_right: a sliding window in tokens (-1: none on
        that side); softcap: logit soft-capping (0: none); sinks: float32
        [num_q_heads] attention sinks (None: none); head_dim_v: the head dim
        of v and out (MLA; 0: head_dim)."""
        qp, _, t = _buffer(q)
        cfg = _AttnConfig(num_q_heads, num_kv_heads, head_dim, t, softmax_scale, int(causal),
                          window_left=window_left, window_right=window_right, softcap=softcap,
                          sinks=_sinks_of(sinks, num_q_heads), head_dim_v=head_dim_v)
        self._queued(_check(_RingAttention(qp, _buffer(k)[0], _buffer(v)[0], _buffer(out)[0], _optional_buffer(lse),
                                           ctypes.byref(layout._c), ctypes.byref(cfg), mode, self._h,
                                           _stream(stream)), self._h, "attnRingAttention"),
                     q, k, v, out, lse, layout, cfg, sinks)

    def merge_attn_reduce_scatter(self, out_part, lse_part, out, lse, rows, heads, head_dim, stream=None):
        """attnMergeAttnReduceScatter: every rank's partial (out_part [rows,
        heads, head_dim], float32 lse_part [rows, heads]) merged; this rank
        gets its share of the heads, [rank * heads // n, (rank + 1) * heads // n),
        in out [rows, share, head_dim] and lse (or None)."""
        op, _, t = _buffer(out_part)
        self._queued(_check(_MergeAttnReduceScatter(op, _buffer(lse_part)[0], _buffer(out)[0], _optional_buffer(lse),
                                                    rows, heads, head_dim, t, self._h, _stream(stream)),
                            self._h, "attnMergeAttnReduceScatter"), out_part, lse_part, out, lse)

    def merge_attn_all_gather(self, out_part, lse_part, out, lse, rows, heads, head_dim, stream=None):
        """attnMergeAttnAllGather: as merge_attn_reduce_scatter, every head on
        every rank (out [rows, heads, head_dim]; may alias out_part)."""
        op, _, t = _buffer(out_part)
        self._queued(_check(_MergeAttnAllGather(op, _buffer(lse_part)[0], _buffer(out)[0], _optional_buffer(lse),
                                                rows, heads, head_dim, t, self._h, _stream(stream)),
                            self._h, "attnMergeAttnAllGather"), out_part, lse_part, out, lse)

    def kv_pool(self, block_tokens, num_kv_heads, head_dim, dtype=FLOAT32, capacity_blocks=0):
        """attnKvPoolCreate (collective): a distributed KV cache over this
        communicator's ranks; see KvPool. dtype: FLOAT32, FLOAT16, BFLOAT16
        or a name ("float32", ...)."""
        return KvPool(self, block_tokens, num_kv_heads, head_dim, dtype, capacity_blocks)

    def level_attention(self, q, k, v, out, layout, num_q_heads, num_kv_heads, head_dim, keep=None,
                        importance=None, lse=None, causal=True, softmax_scale=0.0, window_left=-1,
                        window_right=-1, softcap=0.0, sinks=None, head_dim_v=0):
        """attnLevelAttention: as ring_attention, but each peer sends only the
        keys it keeps for the tier between the two ranks. keep: 4 fractions by
        tier (device, host, rack, cluster), or None to keep every key;
        importance: float32 [kv rows], the score of each local key. window,
        softcap, sinks and head_dim_v as ring_attention."""
        qp, _, t = _buffer(q)
        cfg = _AttnConfig(num_q_heads, num_kv_heads, head_dim, t, softmax_scale, int(causal),
                          window_left=window_left, window_right=window_right, softcap=softcap,
                          sinks=_sinks_of(sinks, num_q_heads), head_dim_v=head_dim_v)
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
        self._queued(_check(_LevelAttention(qp, _buffer(k)[0], _buffer(v)[0], _buffer(out)[0], _optional_buffer(lse),
                                            ctypes.byref(layout._c), ctypes.byref(cfg),
                                            ctypes.byref(drop) if drop is not None else None, self._h, None),
                            self._h, "attnLevelAttention"),
                     q, k, v, out, lse, layout, cfg, drop, importance, sinks)


# Inside a group, calls run at the outermost group_end: the arrays passed to
# them are held until then (Comm._queued), so a temporary passed to send()
# is not freed (and its memory reused) before its bytes leave; on a
# non-blocking communicator, until its wait().
_group = threading.local()


def group_start():
    _check(_GroupStart(), None, "attnGroupStart")
    if getattr(_group, "depth", 0) == 0:
        _group.held = []
    _group.depth = getattr(_group, "depth", 0) + 1


def group_end():
    _group.depth = max(0, getattr(_group, "depth", 0) - 1)
    code = None
    try:
        code = _check(_GroupEnd(), None, "attnGroupEnd")
    finally:
        if _group.depth == 0:
            held, _group.held = _group.held, []
            if code == IN_PROGRESS:  # queued on non-blocking communicators
                for comm, a in held:
                    comm._hold([a])


def merge_attn_states(outs, lses, out, lse, rows, heads, head_dim, stream=None, lse_base=0, lse_layout=0):
    """attnMergeAttnStates over partials outs[j] / lses[j] (float32); with
    lse_base 1 (base 2) or lse_layout 1 (head-major), attnMergeAttnStatesLse,
    every LSE read and written in that convention."""
    n = len(outs)
    if len(lses) != n:
        raise AttnError(INVALID_ARGUMENT, "as many lse buffers as outputs are needed")
    t = _buffer(outs[0])[2]
    op = (_p * n)(*[_buffer(o)[0] for o in outs])
    lp = (_p * n)(*[_buffer(x)[0] for x in lses])
    if lse_base == 0 and lse_layout == 0:
        _check(_MergeAttnStates(n, op, lp, _buffer(out)[0], _optional_buffer(lse), rows, heads, head_dim, t,
                                _stream(stream)), None, "attnMergeAttnStates")
        return
    _check(_MergeAttnStatesLse(n, op, lp, _buffer(out)[0], _optional_buffer(lse), rows, heads, head_dim, t,
                               int(lse_base), int(lse_layout), _stream(stream)), None, "attnMergeAttnStatesLse")

# ---- layouts and the planner --------------------------------------------------------


class SeqLayout:
    """attnSeqLayout_t over Python sequences of ints (kept alive here), or,
    through from_buffers, over int32 arrays or tensors in host memory that
    the library reads in place when the call runs."""

    def __init__(self, q_offsets, q_pos, kv_offsets, kv_pos):
        self._arrays = [_int32_array(a)[0] for a in (q_offsets, q_pos, kv_offsets, kv_pos)]
        qo, qp, ko, kp = self._arrays
        self._c = _SeqLayout(len(q_offsets) - 1, qo, qp, ko, kp)
        self.q_offsets, self.q_pos = list(q_offsets), list(q_pos)
        self.kv_offsets, self.kv_pos = list(kv_offsets), list(kv_pos)

    _NAMES = ("q_offsets", "q_pos", "kv_offsets", "kv_pos")

    @classmethod
    def from_buffers(cls, q_offsets, q_pos, kv_offsets, kv_pos):
        """A layout over four contiguous int32 buffers (numpy arrays, torch
        tensors): cu_seqlens-style offsets [num_seqs + 1] and global
        positions [rows], not copied. The buffers are held by the layout.
        Host buffers are read during a call; CUDA (or pinned) ones by a
        device communicator when the call runs on its stream, so a captured
        CUDA graph reads the values of each replay (attnSeqLayout_t). All
        four live on one side; CUDA ones only for a device communicator."""
        self = cls.__new__(cls)
        bufs = (q_offsets, q_pos, kv_offsets, kv_pos)
        on_cuda = [bool(getattr(b, "is_cuda", False)) for b in bufs]
        if any(on_cuda) and not all(on_cuda):
            raise AttnError(INVALID_ARGUMENT, "layout: " + ", ".join(
                f"{n} on {'CUDA' if c else 'the host'}" for n, c in zip(cls._NAMES, on_cuda)) +
                "; all four live on one side")
        self.on_cuda = all(on_cuda)
        ptrs = []
        for name, b in zip(cls._NAMES, bufs):
            ptr, n, t = _buffer(b)
            if t != INT32:
                raise AttnError(INVALID_ARGUMENT, f"layout {name}: int32 is needed")
            ptrs.append((ptr, n))
        if ptrs[0][1] < 1 or ptrs[0][1] != ptrs[2][1]:
            raise AttnError(INVALID_ARGUMENT, f"layout: q_offsets has {ptrs[0][1]} entries and kv_offsets "
                                              f"{ptrs[2][1]}: both need num_seqs + 1")
        self._arrays = list(bufs)
        c = [ctypes.cast(p, _i32p) if n else None for p, n in ptrs]
        self._c = _SeqLayout(ptrs[0][1] - 1, c[0], c[1], c[2], c[3])
        self.q_rows, self.kv_rows = ptrs[1][1], ptrs[3][1]
        return self


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


CostModel = collections.namedtuple("CostModel", "link_bandwidth_GBps link_latency_us attn_tflops comm_interference")
CostModel.__doc__ = "attnCostModel_t: the rates the mode selector uses (attncomm.h)."
ModeEstimate = collections.namedtuple(
    "ModeEstimate",
    "chosen pass_kv_us pass_q_us ship_q_us head_parallel_us alg1_threshold_tokens alg1_choice all_gather_kv_us")
ModeEstimate.__doc__ = "attnModeEstimate_t: the chosen mode (MODE_*) and each mode's predicted time."


def _as_fields(obj, tuple_type):
    """A namedtuple or plain tuple in tuple_type's order as a dict; other
    objects (dicts, objects with attributes) as they are."""
    if isinstance(obj, tuple):
        if len(obj) != len(tuple_type._fields):
            raise AttnError(INVALID_ARGUMENT, f"{len(obj)} values for {tuple_type.__name__}'s "
                                              f"{len(tuple_type._fields)} fields")
        return dict(zip(tuple_type._fields, obj))
    return obj


def _cost_model_of(m):
    return CostModel(m.link_bandwidth_GBps, m.link_latency_us, m.attn_tflops, m.comm_interference)


def _estimate_of(e):
    return ModeEstimate(e.chosen, e.pass_kv_us, e.pass_q_us, e.ship_q_us, e.head_parallel_us,
                        e.alg1_threshold_tokens, e.alg1_choice, e.all_gather_kv_us)


def estimate_modes(model, nranks, new_tokens, cached_tokens, num_q_heads, num_kv_heads, head_dim,
                   dtype=FLOAT32, causal=True, softmax_scale=0.0):
    """attnEstimateModes: the selector's model on given totals, without a
    communicator (what-if studies, e.g. the CP paper's Table 4)."""
    m = _struct_from(_CostModel, _as_fields(model, CostModel), {"comm_interference": 0.0}, "cost model")
    cfg = _AttnConfig(num_q_heads, num_kv_heads, head_dim, dtype, softmax_scale, int(causal))
    e = _ModeEstimate()
    _check(_EstimateModes(ctypes.byref(m), ctypes.byref(cfg), nranks, new_tokens, cached_tokens,
                          ctypes.byref(e)), None, "attnEstimateModes")
    return _estimate_of(e)


def decode_placement(num_seqs, step, nranks):
    """attnDecodePlacement: per sequence, the rank that stores this decode
    step's new KV and the rank that holds its query (two lists)."""
    kv = (ctypes.c_int32 * max(num_seqs, 1))()
    q = (ctypes.c_int32 * max(num_seqs, 1))()
    _check(_DecodePlacement(num_seqs, step, nranks, kv, q), None, "attnDecodePlacement")
    return list(kv[:num_seqs]), list(q[:num_seqs])


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

# ---- distributed KV cache ---------------------------------------------------------

KvMove = collections.namedtuple("KvMove", "src dst owner req num_blocks")
KvMove.__doc__ = """attnKvMove_t: num_blocks blocks of request (owner, req) from rank
src's pool to rank dst's. KvPool.migrate also takes plain 5-tuples in this
order, or dicts with these keys."""

_KV_INSTANCE_DEFAULTS = {"pending_requests": 0, "pending_blocks": 0, "longest_req": -1, "longest_req_blocks": 0}


def _numpy():
    import numpy  # only the KV cache needs it: the rest of the module also takes torch tensors
    return numpy


def _struct_from(struct, obj, defaults, what):
    """A ctypes struct from a dict (or any object with attributes) named by
    the C fields; missing fields take defaults, else it is an error."""
    names = [f[0] for f in struct._fields_]
    if isinstance(obj, collections.abc.Mapping):
        unknown = sorted(set(obj) - set(names))
        if unknown:
            raise AttnError(INVALID_ARGUMENT, f"{what}: unknown fields {unknown}")
        given = dict(obj)
    else:
        given = {n: getattr(obj, n) for n in names if hasattr(obj, n)}
    missing = [n for n in names if n not in given and n not in defaults]
    if missing:
        raise AttnError(INVALID_ARGUMENT, f"{what}: fields {missing} are missing")
    try:
        return struct(**{n: given.get(n, defaults.get(n)) for n in names})
    except TypeError as e:
        raise AttnError(INVALID_ARGUMENT, f"{what}: {e}") from None


def _kv_move(m, what):
    if isinstance(m, collections.abc.Mapping):
        return _struct_from(_KvMove, m, {}, what)
    m = tuple(m)
    if len(m) != 5:
        raise AttnError(INVALID_ARGUMENT, f"{what}: (src, dst, owner, req, num_blocks), not {len(m)} values")
    return _KvMove(*(int(x) for x in m))


def _ints(values, dtype, what, count=None):
    """values as a contiguous numpy integer array of dtype, refusing
    non-integers and values out of its range (no silent wrap)."""
    np = _numpy()
    a = np.asarray(values).reshape(-1)
    if a.size and a.dtype.kind not in "iu":
        raise AttnError(INVALID_ARGUMENT, f"{what} must hold integers, not {a.dtype.name}")
    info = np.iinfo(dtype)
    if a.size and (int(a.min()) < info.min or int(a.max()) > info.max):
        raise AttnError(INVALID_ARGUMENT, f"{what} holds values outside {np.dtype(dtype).name}")
    if count is not None and a.size != count:
        raise AttnError(INVALID_ARGUMENT, f"{what} holds {a.size} values, needs {count}")
    return np.ascontiguousarray(a, dtype=dtype)


def _kv_dtype(dtype):
    """An attnDataType_t from a code, a name or a numpy dtype; -1 (which the
    library refuses on every rank) when unknown."""
    if isinstance(dtype, int):
        return dtype
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    return _TYPE_BY_NAME.get(name.replace("torch.", ""), -1)


class KvPool:
    """A distributed KV cache (attnKvPool_t, Infinite-LLM DistAttention):
    fixed-size blocks of K/V on every rank (host memory, or the GPU of a
    device communicator). A rank owns the
    requests it appends to; migrate() lends their blocks to peers, and
    attention() computes over all of a request's tokens wherever they are.

    Made by Comm.kv_pool (collective). Arrays are numpy, C-contiguous, of the
    pool's dtype (float32, float16, or ml_dtypes' bfloat16). Local calls
    (append, release, stats, placement) fail on their rank only; collective
    calls (migrate, attention, rebalance) fail on every rank when one rank's
    input is bad, including input refused here before reaching the library.
    Close the pool (close() or a with block) before destroying its Comm.

    On a device communicator k, v, q, out and lse are CUDA tensors (torch),
    each call takes stream= and is enqueued on it (synchronise before
    reading out, lse or migrate's granted); ids, offsets and positions stay
    host arrays."""

    def __init__(self, comm, block_tokens, num_kv_heads, head_dim, dtype, capacity_blocks):
        self.comm = comm
        self.block_tokens, self.num_kv_heads, self.head_dim = int(block_tokens), int(num_kv_heads), int(head_dim)
        self.dtype = _kv_dtype(dtype)
        self.nranks = comm.size
        cfg = _KvPoolConfig(self.block_tokens, self.num_kv_heads, self.head_dim, self.dtype, int(capacity_blocks))
        h = _p()
        _check(_KvPoolCreate(comm._h, ctypes.byref(cfg), ctypes.byref(h)), comm._h, "attnKvPoolCreate")
        self._h = h

    def close(self):
        """attnKvPoolDestroy (local)."""
        if self._h:
            h, self._h = self._h, _p()
            _check(_KvPoolDestroy(h), None, "attnKvPoolDestroy")

    def shrink(self, newcomm):
        """attnKvPoolShrink (collective over newcomm, which Comm.shrink made
        from this pool's communicator): the pool moves to newcomm. Returns
        the ids of this rank's requests that lost blocks with the excluded
        ranks (released; prefill them again). Call it before the old
        communicator is destroyed."""
        most = max(1, self.stats()["num_requests"])  # lost requests are own requests
        lost = _numpy().zeros(most, _numpy().int64)
        count = ctypes.c_int()
        _check(_KvPoolShrink(self._h, newcomm._h, lost.ctypes.data_as(_i64p), most, ctypes.byref(count)),
               newcomm._h, "attnKvPoolShrink")
        self.comm, self.nranks = newcomm, newcomm.size
        return [int(x) for x in lost[:count.value]]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _rows(self, x, what, heads=None):
        """Address and row count of x: [rows, heads, head_dim] of the pool's
        dtype (heads defaults to num_kv_heads)."""
        ptr, _, t = _buffer(x)
        heads = self.num_kv_heads if heads is None else heads
        shape = tuple(x.shape)
        if len(shape) != 3 or shape[1:] != (heads, self.head_dim):
            raise AttnError(INVALID_ARGUMENT, f"{what} has shape {shape}, needs (rows, {heads}, {self.head_dim})")
        if t != self.dtype:
            raise AttnError(INVALID_ARGUMENT, f"{what} is {x.dtype}, the pool holds attnDataType_t {self.dtype}")
        return ptr, shape[0]

    # -- local --
    def append(self, req, k, v, pos, stream=None):
        """attnKvAppend: n tokens to request req of this rank (created on
        first use). k, v: [n, num_kv_heads, head_dim]; pos: their n global
        positions (ints, increasing). Raises (nothing appended) when the pool
        has too few free blocks. Inside a CUDA graph capture (stream
        capturing, e.g. under torch.cuda.graph) the append is captured and
        each launch reads k, v and pos as they are then: pass pos as an int32
        numpy array (or CPU int32 tensor) that you keep and rewrite before
        each launch; what fails at a launch is comm.async_error()."""
        kp, n = self._rows(k, "k")
        vp, nv = self._rows(v, "v")
        if nv != n:
            raise AttnError(INVALID_ARGUMENT, f"k has {n} rows but v {nv}")
        p = _ints(pos, _numpy().int32, "pos", n)
        _check(_KvAppend(self._h, int(req), kp, vp, p.ctypes.data_as(_i32p), n, _stream(stream)), None,
               "attnKvAppend")

    def release(self, req, stream=None):
        """attnKvRelease: ends request req of this rank (peers free their
        blocks of it at the next collective call)."""
        _check(_KvRelease(self._h, int(req), _stream(stream)), None, "attnKvRelease")

    def stats(self):
        """attnKvPoolGetStats as a dict: capacity_blocks, used_blocks (own
        blocks here plus blocks lent in), lent_in_blocks, lent_out_blocks,
        num_requests (own requests)."""
        s = _KvPoolStats()
        _check(_KvPoolGetStats(self._h, ctypes.byref(s)), None, "attnKvPoolGetStats")
        return {name: getattr(s, name) for name, _ in _KvPoolStats._fields_}

    def placement(self, req):
        """attnKvGetPlacement: (holders, tokens) of request req of this rank:
        holders[r] (int64 array [nranks]) the number of its blocks in rank r's
        pool, tokens its token count."""
        holders = _numpy().zeros(self.nranks, _numpy().int64)
        tokens = ctypes.c_int64()
        _check(_KvGetPlacement(self._h, int(req), holders.ctypes.data_as(_i64p), ctypes.byref(tokens)), None,
               "attnKvGetPlacement")
        return holders, tokens.value

    # -- collective --
    def _refuse(self, empty_call, error, what):
        """Bad input found here: a call the library refuses locally tells the
        peers in its first exchange, so they fail too instead of waiting for
        this rank; then the precise error is raised here."""
        empty_call()
        if isinstance(error, AttnError):
            raise error
        raise AttnError(INVALID_ARGUMENT, f"{what}: {type(error).__name__}: {error}") from error

    def migrate(self, moves, stream=None):
        """attnKvMigrate: this rank's moves (it is their src; any number, none
        included) as KvMove, 5-tuples (src, dst, owner, req, num_blocks) or
        dicts. Returns granted, int64 [len(moves)]: the blocks moved for each
        (num_blocks, or 0 when dst had too few free blocks)."""
        np = _numpy()
        try:
            moves = list(moves)
            cm = (_KvMove * max(1, len(moves)))(*[_kv_move(m, f"moves[{i}]") for i, m in enumerate(moves)])
        except Exception as e:  # noqa: BLE001 - any failure here must reach the peers
            self._refuse(lambda: _KvMigrate(self._h, None, -1, None, _stream(stream)), e, "moves")
        granted = np.zeros(len(moves), np.int64)
        _check(_KvMigrate(self._h, cm, len(moves), granted.ctypes.data_as(_i64p), _stream(stream)), self.comm._h,
               "attnKvMigrate")
        return granted

    def attention(self, reqs, q_offsets, q, q_pos=None, num_q_heads=None, causal=True, scale=0.0, want_lse=True,
                  out=None, lse=None, stream=None, window_left=-1, window_right=-1, softcap=0.0, sinks=None):
        """attnKvAttention: attention of this rank's queries over all the
        tokens of its requests, wherever their blocks are. reqs: own request
        ids (distinct); q_offsets: len(reqs) + 1 row offsets into q, from 0 to
        q's rows; q: [rows, num_q_heads (default q.shape[1]), head_dim] of
        the pool's dtype; q_pos: the queries' global positions (needed with
        causal: a key is seen when its pos <= the query's); scale 0 means
        1/sqrt(head_dim). Returns (out like q, lse float32 [rows, num_q_heads]
        or None without want_lse). out and lse may be given (device
        communicators: CUDA tensors, which they must be); else numpy arrays
        are made. Inside a CUDA graph capture, q_pos is read at each launch
        (pass an int32 numpy array you keep, as for append). window, softcap
        and sinks as Comm.ring_attention (sinks must outlive a queued call)."""
        np = _numpy()
        try:
            r = _ints(reqs, np.int64, "reqs")
            offs = _ints(q_offsets, np.int32, "q_offsets", len(r) + 1)
            shape = tuple(q.shape)
            hq = int(num_q_heads) if num_q_heads is not None else (shape[1] if len(shape) == 3 else 0)
            qp, rows = self._rows(q, "q", hq)
            if int(offs[-1]) != rows:
                raise AttnError(INVALID_ARGUMENT, f"q_offsets ends at {int(offs[-1])} but q has {rows} rows")
            pos = None if q_pos is None else _ints(q_pos, np.int32, "q_pos", rows)
            if out is None:
                out = np.empty_like(q)
            if lse is None and want_lse:
                lse = np.empty((rows, hq), np.float32)
            sinks_p = _sinks_of(sinks, hq)
        except Exception as e:  # noqa: BLE001 - any failure here must reach the peers
            self._refuse(lambda: _KvAttention(self._h, -1, None, None, None, None, None, None, None, _stream(stream)), e,
                         "attention")
        cfg = _AttnConfig(hq, self.num_kv_heads, self.head_dim, self.dtype, scale, int(causal),
                          window_left=window_left, window_right=window_right, softcap=softcap, sinks=sinks_p)
        _check(_KvAttention(self._h, len(r), r.ctypes.data_as(_i64p), offs.ctypes.data_as(_i32p), qp,
                            pos.ctypes.data_as(_i32p) if pos is not None else None, _buffer(out)[0],
                            ctypes.cast(_buffer(lse)[0], ctypes.POINTER(ctypes.c_float)) if lse is not None else None,
                            ctypes.byref(cfg), _stream(stream)), self.comm._h, "attnKvAttention")
        return out, lse

    def rebalance(self, model, pending_requests=0, pending_blocks=0, stream=None):
        """attnKvRebalance: every rank's heartbeat, kv_plan with model (a dict
        as in kv_plan, the same on every rank) and the moves it plans.
        pending_requests / pending_blocks: this rank's waiting requests and the
        blocks each needs. Returns the blocks this rank sent (with a stream:
        a one-element int64 array, written when the stream runs the call)."""
        try:
            m = _struct_from(_KvModel, model, {}, "model")
        except Exception as e:  # noqa: BLE001 - any failure here must reach the peers
            self._refuse(lambda: _KvRebalance(self._h, None, 0, 0, None, _stream(stream)), e, "model")
        moved = _numpy().zeros(1, _numpy().int64)
        _check(_KvRebalance(self._h, ctypes.byref(m), int(pending_requests), int(pending_blocks),
                            moved.ctypes.data_as(_i64p), _stream(stream)), self.comm._h, "attnKvRebalance")
        # With a stream the count is written when the stream runs the call.
        return int(moved[0]) if stream is None else moved


def kv_plan(instances, model):
    """attnKvPlan (Infinite-LLM Alg. 1, no communicator): the moves (KvMove,
    src = debtor = owner, dst = creditor) for these instances.

    instances: one dict (or object with attributes) per rank with the fields
    of attnKvInstance_t: batch_size, capacity_blocks, used_blocks and
    optionally pending_requests (0), pending_blocks (0), longest_req (-1:
    none) and longest_req_blocks (0). model: the fields of attnKvModel_t, all
    required: nonattn_us_base, nonattn_us_per_req, attn_us_per_block (us),
    num_layers, debtor_max_batch, creditor_max_util."""
    insts = [_struct_from(_KvInstance, x, _KV_INSTANCE_DEFAULTS, f"instances[{i}]") for i, x in enumerate(instances)]
    arr = (_KvInstance * max(1, len(insts)))(*insts)
    m = _struct_from(_KvModel, model, {}, "model")
    count = ctypes.c_int(0)
    _check(_KvPlan(arr, len(insts), ctypes.byref(m), None, ctypes.byref(count)), None, "attnKvPlan")
    if count.value == 0:
        return []
    moves = (_KvMove * count.value)()
    _check(_KvPlan(arr, len(insts), ctypes.byref(m), moves, ctypes.byref(count)), None, "attnKvPlan")
    return [KvMove(x.src, x.dst, x.owner, x.req, x.num_blocks) for x in moves[:count.value]]
