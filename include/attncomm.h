/*
 * attncomm.h -- the whole public C API of attncomm.
 *
 * attncomm is a collective communication library for distributed attention in
 * long-context LLM inference, in the manner of NCCL: a communicator is created
 * from a unique id (or from launcher environment variables), every operation
 * returns an attnResult_t, and the readable cause of the last failure is kept
 * per communicator (attnGetLastError).
 *
 * This header is C99-clean: plain C types, opaque handles, no C++ exceptions
 * cross it. Ranks may be threads of one process, processes on one host, or
 * processes on many hosts.
 *
 * Memory: communicators whose config names no device (ATTN_DEVICE_HOST, the
 * default) work on host memory and take a NULL stream. Every call returns only
 * when its operation is complete (blocking communicators), or returns
 * attnInProgress and completes in the background (non-blocking
 * communicators; poll attnCommGetAsyncError).
 *
 * Device communicators (config.device = a CUDA ordinal; builds with CUDA)
 * take device (or host) pointers and a cudaStream_t cast to attnStream_t:
 * each call is enqueued on that stream and returns at once; the stream waits
 * until the operation is done. Host-side arguments (counts, displacements,
 * attention layouts) are copied at the call. An operation that fails later
 * still releases its stream and is reported by attnCommGetAsyncError.
 * Point-to-point calls inside a group run together as one operation on the
 * stream of the group's first call (see attnGroupEnd). Ranks that are threads
 * of one process sharing a GPU: cudaFree and cudaFreeHost may wait for the
 * whole device, including a peer rank's stream that waits for this rank's
 * next call, so (as with NCCL) free with cudaFreeAsync, or only once no
 * rank has an operation pending.
 *
 * CUDA graphs: a call on a stream that is being captured
 * (cudaStreamBeginCapture) becomes part of the graph and runs at every
 * launch of it with the arguments it was captured with (pointers, counts,
 * layouts), reading the buffers' contents, and a KV pool's blocks, as they
 * are at that launch, as NCCL's calls do. Every rank must launch its graphs so that
 * the calls run in the same order on all ranks, and must not launch a
 * graph while another launch of it is running. A graph may outlive its
 * communicator: once the communicator is destroyed, a launch runs nothing
 * of it and releases the stream (outputs undefined). KV pool calls are
 * captured too (see attnKvAppend). Ranks that
 * are threads of one process should capture in
 * cudaStreamCaptureModeThreadLocal or Relaxed: in Global mode another
 * thread's cudaMalloc breaks the capture (CUDA's rule). The library's own
 * threads run in relaxed mode, so they never break an application's
 * capture.
 *
 * Ordering: like NCCL, all ranks of a communicator must issue its collectives
 * in the same order; point-to-point messages between two ranks match in
 * posting order.
 */
#ifndef ATTNCOMM_H_
#define ATTNCOMM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define ATTN_API
#else
#define ATTN_API __attribute__((visibility("default")))
#endif

#define ATTN_MAJOR 0
#define ATTN_MINOR 4
#define ATTN_PATCH 0
/* Version code: MAJOR*10000 + MINOR*100 + PATCH. */
#define ATTN_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
#define ATTN_VERSION_CODE ATTN_VERSION(ATTN_MAJOR, ATTN_MINOR, ATTN_PATCH)

/* Every enum of this header spans the whole of int (the two members this
 * macro adds to each): a caller in C or another language may pass any int,
 * and the library refuses values it does not know instead of holding an enum
 * out of its range, which C++ leaves undefined (NCCL's ncclRedOp_t is made
 * int-sized the same way). Not values to pass. */
#define ATTN_ENUM_SPANS_INT(prefix) \
  prefix##EnumMin_ = -2147483647 - 1, prefix##EnumMax_ = 2147483647

/* ------------------------------------------------------------------ */
/* Result codes                                                        */
/* ------------------------------------------------------------------ */
typedef enum {
  attnSuccess = 0,
  attnUnhandledCudaError = 1, /* a CUDA call failed */
  attnSystemError = 2,        /* an OS call failed (socket, mmap, ...) */
  attnInternalError = 3,      /* a bug in attncomm */
  attnInvalidArgument = 4,    /* a bad pointer, count, type, rank, ... */
  attnInvalidUsage = 5,       /* a valid argument used wrongly (mismatch, order) */
  attnRemoteError = 6,        /* a peer failed or went away */
  attnInProgress = 7,         /* a non-blocking operation is still running */
  attnTimeout = 8,            /* no progress within the communicator's timeout */
  attnNotSupported = 9,       /* not built in, or not possible on this setup */
  attnNumResults = 10,
  ATTN_ENUM_SPANS_INT(attnResult)
} attnResult_t;

/* ------------------------------------------------------------------ */
/* Data types and reduction operations                                 */
/* ------------------------------------------------------------------ */
typedef enum {
  attnInt8 = 0,
  attnUint8 = 1,
  attnInt32 = 2,
  attnInt64 = 3,
  attnFloat16 = 4, /* IEEE half; reductions accumulate in fp32 */
  attnFloat32 = 5,
  attnFloat64 = 6,
  attnBfloat16 = 7, /* bfloat16; reductions accumulate in fp32 */
  attnNumTypes = 8,
  ATTN_ENUM_SPANS_INT(attnDataType)
} attnDataType_t;

typedef enum {
  attnSum = 0,
  attnProd = 1,
  attnMax = 2,
  attnMin = 3,
  attnAvg = 4, /* sum divided by the number of ranks */
  attnNumOps = 5,
  ATTN_ENUM_SPANS_INT(attnRedOp)
} attnRedOp_t;

/* ------------------------------------------------------------------ */
/* Handles                                                             */
/* ------------------------------------------------------------------ */
/* The opaque handles are attnComm_t, attnKvPool_t and attnPlan_t
 * (attnStream_t is the caller's CUDA stream, not a library object). Every
 * call checks its handle against the handles this process holds: a
 * handle that was destroyed, was never created (any other pointer value),
 * or is of another type (a pool passed as a communicator, ...) gets
 * attnInvalidArgument with a message saying which, and its memory is not
 * read. Destroying a handle twice is attnInvalidArgument, not a double
 * free; destroying NULL is a no-op (attnCommDestroy(NULL) excepted: it is
 * attnInvalidArgument). The check cannot tell a destroyed handle from a new
 * one of the same type that the allocator placed at the same address. No
 * C++ exception crosses this API: every function returns a code (out of
 * memory is attnSystemError). */
typedef struct attnComm* attnComm_t;

/* The largest communicator: nranks (ndev for attnCommInitAll) above it is
 * attnInvalidArgument. */
#define ATTN_MAX_NRANKS 65536

/* A stream. NULL for host-memory communicators; a cudaStream_t (cast) for
 * device communicators. */
typedef struct attnStream_st* attnStream_t;

#define ATTN_UNIQUE_ID_BYTES 128
/* Created by attnGetUniqueId on one rank and passed to all others out of
 * band. Carries the bootstrap root's address and a random 128-bit secret.
 * Every connection of the bootstrap and of the TCP transport proves the
 * secret both ways by challenge-response (HMAC-SHA256 over fresh nonces from
 * both sides); the secret itself never travels. Treat the id as a
 * credential: whoever holds it can join as any rank not yet connected. */
typedef struct {
  char internal[ATTN_UNIQUE_ID_BYTES];
} attnUniqueId;

/* ------------------------------------------------------------------ */
/* Configuration                                                       */
/* ------------------------------------------------------------------ */
#define ATTN_CONFIG_UNDEF_INT (-2147483647 - 1)
#define ATTN_CONFIG_UNDEF_PTR NULL
#define ATTN_CONFIG_MAGIC 0xA7C0F16u
#define ATTN_DEVICE_HOST (-1)
#define ATTN_SPLIT_NOCOLOR (-1)

/* Communicator options. Always start from ATTN_CONFIG_INITIALIZER: fields
 * left undefined take their value from the environment or the default. The
 * struct carries its own size and version so it can grow without breaking
 * callers compiled against an older header. */
typedef struct {
  size_t size;          /* sizeof(attnConfig_t) as the caller compiled it */
  unsigned int magic;   /* ATTN_CONFIG_MAGIC */
  unsigned int version; /* ATTN_VERSION_CODE as the caller compiled it */
  int blocking;         /* 1 (default): calls return when done; 0: calls may
                           return attnInProgress, poll attnCommGetAsyncError */
  int timeout_ms;       /* fail an operation that makes no progress for this
                           long (default: ATTN_TIMEOUT_MS, else 300000);
                           0 means wait forever */
  const char* transports; /* comma list of allowed transports, e.g. "shm,tcp"
                             (default: ATTN_TRANSPORT, else all built in) */
  int device;           /* ATTN_DEVICE_HOST (default) for host memory, or a
                           CUDA device ordinal */
  const char* comm_name; /* shown in log lines (default: none) */
} attnConfig_t;

#define ATTN_CONFIG_INITIALIZER                                              \
  {                                                                          \
    sizeof(attnConfig_t), ATTN_CONFIG_MAGIC, ATTN_VERSION_CODE,              \
        ATTN_CONFIG_UNDEF_INT, ATTN_CONFIG_UNDEF_INT, ATTN_CONFIG_UNDEF_PTR, \
        ATTN_CONFIG_UNDEF_INT, ATTN_CONFIG_UNDEF_PTR                         \
  }

/* ------------------------------------------------------------------ */
/* Library and errors                                                  */
/* ------------------------------------------------------------------ */

/* Writes ATTN_VERSION_CODE of the library (not of the header) to *version. */
ATTN_API attnResult_t attnGetVersion(int* version);

/* A static, human-readable name for a result code. Never NULL. */
ATTN_API const char* attnGetErrorString(attnResult_t result);

/* The text of the last failure seen on `comm`, naming the rank, the peer and
 * the cause, e.g. "rank 2 (host a, pid 77): peer 3: connection reset". With
 * comm == NULL, the last failure of the calling thread (e.g. of an init
 * call that produced no communicator). Empty string if none. The pointer is
 * valid until the next call on the same communicator / thread. */
ATTN_API const char* attnGetLastError(attnComm_t comm);

/* ------------------------------------------------------------------ */
/* Communicator creation and destruction                               */
/* ------------------------------------------------------------------ */

/* Creates a unique id on this process and starts the bootstrap root that
 * ranks will meet at (it listens on ATTN_SOCKET_IFNAME's address, else the
 * default route's interface). Call on one rank; send the id to the others
 * over a channel you trust (it holds the secret).
 *
 * What this protects against: a process without the id cannot join, cannot
 * pose as the root (a rank checks the root's proof before it reads the
 * address table) or as a rank, learns nothing reusable from the handshakes,
 * and cannot replay a recorded one. A rank is bound to the address of its
 * first authenticated connection; a second claim is refused. What it does
 * not protect against: data is neither encrypted nor integrity-protected
 * after the handshake (someone on the network path can read or alter it),
 * and a holder of the id is trusted (it can claim a rank that has not
 * connected yet). */
ATTN_API attnResult_t attnGetUniqueId(attnUniqueId* uniqueId);

/* Creates rank `rank` (0 <= rank < nranks) of a new communicator of `nranks`
 * ranks that meet through `commId`. Collective: every rank must call it.
 * Authentication as attnGetUniqueId says. */
ATTN_API attnResult_t attnCommInitRank(attnComm_t* comm, int nranks,
                                       attnUniqueId commId, int rank);

/* As attnCommInitRank, with options. config may be NULL (all defaults).
 * With config->blocking == 0 it may return attnInProgress: the communicator
 * handle is valid at once and attnCommGetAsyncError reports attnSuccess when
 * it is ready. */
ATTN_API attnResult_t attnCommInitRankConfig(attnComm_t* comm, int nranks,
                                             attnUniqueId commId, int rank,
                                             attnConfig_t* config);

/* Creates `ndev` ranks as threads of this process, like ncclCommInitAll:
 * comms[i] is rank i. devlist: NULL for host ranks, else the CUDA device of
 * each rank (several ranks may share one device). */
ATTN_API attnResult_t attnCommInitAll(attnComm_t* comms, int ndev,
                                      const int* devlist);

/* Creates this process's rank from launcher environment variables, tried in
 * order: ATTN_RANK / ATTN_NRANKS / ATTN_ROOT (host:port); torchrun's RANK /
 * WORLD_SIZE / MASTER_ADDR / MASTER_PORT; Open MPI's OMPI_COMM_WORLD_RANK /
 * OMPI_COMM_WORLD_SIZE; MPICH's (Hydra's) PMI_RANK / PMI_SIZE; srun's
 * SLURM_PROCID / SLURM_STEP_NUM_TASKS (or SLURM_NTASKS). Rank 0 starts the
 * bootstrap root at ATTN_ROOT, else at MASTER_ADDR:MASTER_PORT+1; mpirun,
 * mpiexec and srun need neither: under srun the root is the first host of
 * SLURM_STEP_NODELIST (Slurm's "node[01-04]" syntax expanded), under mpirun
 * or mpiexec with every rank on one host (OMPI_COMM_WORLD_LOCAL_SIZE or
 * MPI_LOCALNRANKS equal to the size) it is this host; the port then comes
 * from the launcher's job id, 29600 + (SLURM_JOB_ID * 31 + SLURM_STEP_ID)
 * % 3000 or a hash of OMPI_MCA_ess_base_jobid / PMIX_NAMESPACE / PMI_JOBID
 * into the same range. MASTER_ADDR or MASTER_PORT alone overrides the host
 * or the port. mpirun ranks on several hosts need MASTER_ADDR or
 * ATTN_ROOT; a missing or malformed variable fails with attnInvalidArgument
 * and one line naming it. config may be NULL.
 *
 * The secret comes from ATTN_SECRET_FILE (a file only its owner may read,
 * mode 0600 or stricter, holding 32 hex digits) or ATTN_SECRET (the digits
 * themselves; visible in the process environment); both set must agree.
 * With a secret, connections are authenticated as attnGetUniqueId says.
 * Without one, the secret is derived from the root address, the size and
 * the launcher's job id: that keeps concurrent jobs apart but protects
 * against nobody (anyone who can guess those values can join or pose as a
 * rank); the library logs a WARN once per process then. */
ATTN_API attnResult_t attnCommInitFromEnv(attnComm_t* comm,
                                          attnConfig_t* config);

/* Creates a device communicator beside an NCCL communicator the application
 * already holds: `nccl_comm` is its ncclComm_t (void* so this header needs
 * no nccl.h). Collective over the NCCL communicator's ranks: each calls it,
 * from its own thread or process. The new communicator has NCCL's rank
 * (ncclCommUserRank), size (ncclCommCount) and device (ncclCommCuDevice);
 * rank 0's attnUniqueId is broadcast over NCCL, then every rank runs the
 * usual attnCommInitRankConfig (its bootstrap, transports and timeouts).
 * config may be NULL; config->device, when set, must be NCCL's device.
 *
 * Collectives, barriers and point-to-point groups on it are NCCL calls
 * enqueued on the caller's stream (no proxy thread, no staging copies;
 * fp16/bf16 reductions then accumulate as NCCL does). Attention collectives
 * keep attncomm's own path. Inside attnGroupStart/End its NCCL calls form
 * one NCCL group, launched by the outermost attnGroupEnd.
 *
 * The attncomm communicator does not own the NCCL one: attnCommDestroy
 * leaves it alive, and it must outlive the attncomm communicator.
 * attnCommSplit and attnCommShrink of it give the child an NCCL
 * communicator of its own (ncclCommSplit / ncclCommShrink, NCCL >= 2.27
 * for the latter), owned and destroyed by the child.
 * Errors: NULL comm or nccl_comm -> attnInvalidArgument; a build without
 * NCCL -> attnNotSupported; NCCL failures -> the matching code (e.g.
 * attnUnhandledCudaError, attnSystemError) with NCCL's text in
 * attnGetLastError. */
ATTN_API attnResult_t attnCommInitFromNccl(attnComm_t* comm, void* nccl_comm,
                                           const attnConfig_t* config);

/* Splits `comm` by color: ranks that pass the same color form a new
 * communicator, ordered by key and then by old rank. Collective over comm.
 * Ranks passing ATTN_SPLIT_NOCOLOR get *newcomm = NULL. config may be NULL
 * (inherit comm's options). Runs on the calling thread, after the
 * operations already queued on comm (a non-blocking communicator's, or
 * those a device communicator's streams have enqueued) have run. */
ATTN_API attnResult_t attnCommSplit(attnComm_t comm, int color, int key,
                                    attnComm_t* newcomm, attnConfig_t* config);

/* Flags of attnCommShrink. */
#define ATTN_SHRINK_DEFAULT 0x00 /* let the parent's queued operations finish */
#define ATTN_SHRINK_ABORT 0x01   /* first end the parent's operations in flight */

/* Creates a communicator of comm's ranks minus `excludeRanks` (error
 * recovery: a rank died or hangs; or planned removal). Called by every rank
 * that is not excluded, all with the same list (any order); excluded ranks
 * do not call it. New ranks follow the old order. It needs no help from the
 * excluded ranks, so it works on a communicator broken by their failure
 * (attnCommGetAsyncError != attnSuccess), where attnCommSplit cannot.
 *
 * ATTN_SHRINK_DEFAULT waits for the operations queued on comm, as
 * attnCommSplit does; use it on a healthy communicator. ATTN_SHRINK_ABORT
 * first ends the operations still running on comm in any thread (they
 * return attnRemoteError) and marks comm broken: for a communicator hung
 * on a rank that no longer answers. Either way comm stays allocated; free
 * it with attnCommAbort or attnCommDestroy.
 *
 * config may be NULL (inherit comm's options). Errors: a rank out of range
 * or listed twice, the caller's own rank listed, every rank listed, or an
 * unknown flag -> attnInvalidArgument; survivors passing different lists
 * -> attnInvalidUsage on every survivor as soon as the lists meet (not at
 * the timeout), naming a rank whose list differs; an excluded rank that
 * calls anyway -> attnInvalidUsage, also after the others formed theirs;
 * a survivor that does not answer -> attnTimeout / attnRemoteError. */
ATTN_API attnResult_t attnCommShrink(attnComm_t comm, const int* excludeRanks,
                                     int excludeCount, attnComm_t* newcomm,
                                     attnConfig_t* config, int shrinkFlags);

/* Waits for outstanding operations, then frees the communicator. Calls
 * other threads are making on it are waited for too (use attnCommAbort to
 * stop calls that wait on peers); calls made after it began are refused
 * (attnInvalidArgument). */
ATTN_API attnResult_t attnCommDestroy(attnComm_t comm);

/* Stops the communicator now: operations blocked in other threads return
 * attnRemoteError / attnInvalidUsage, connections are closed (peers see it),
 * and the communicator is freed. Safe to call from any thread. NULL is a
 * no-op; a communicator already being destroyed or aborted is
 * attnInvalidArgument. */
ATTN_API attnResult_t attnCommAbort(attnComm_t comm);

/* The communicator's asynchronous state: attnSuccess, attnInProgress while a
 * non-blocking operation runs, or the error that broke the communicator
 * (after which only attnCommAbort / attnCommDestroy are useful). */
ATTN_API attnResult_t attnCommGetAsyncError(attnComm_t comm,
                                            attnResult_t* asyncError);

/* Number of ranks of comm. */
ATTN_API attnResult_t attnCommCount(const attnComm_t comm, int* count);

/* This caller's rank in comm. */
ATTN_API attnResult_t attnCommUserRank(const attnComm_t comm, int* rank);

/* The CUDA device ordinal comm runs on (ncclCommCuDevice), or
 * ATTN_DEVICE_HOST for a host-memory communicator. */
ATTN_API attnResult_t attnCommDevice(const attnComm_t comm, int* device);

/* ------------------------------------------------------------------ */
/* Shareable host memory (like ncclMemAlloc)                           */
/* ------------------------------------------------------------------ */

/* Allocates `size` (> 0) bytes of zeroed, page-aligned host memory that
 * other processes of a communicator on this host can map. Sends and
 * collectives whose buffers lie in it reach shared-memory peers in other
 * processes with one plain memcpy by the receiver instead of a CMA system
 * call per message (see README, "Shareable buffers"). Any buffer works
 * with every call; this memory only makes same-host transfers cheaper.
 * The mapping is shared, so a child forked after the allocation sees the
 * same bytes, not a copy. Host memory only, whatever the communicator. */
ATTN_API attnResult_t attnMemAlloc(void** ptr, size_t size);

/* Frees memory from attnMemAlloc. NULL is a no-op; any other pointer is
 * attnInvalidArgument. Do not free a buffer an operation still uses. */
ATTN_API attnResult_t attnMemFree(void* ptr);

/* ------------------------------------------------------------------ */
/* Point-to-point                                                      */
/* ------------------------------------------------------------------ */

/* Sends `count` elements to `peer`. Matches the peer's attnRecv calls from
 * this rank in order. Outside a group the call returns when the data has
 * been received (blocking comms). */
ATTN_API attnResult_t attnSend(const void* sendbuff, size_t count,
                               attnDataType_t datatype, int peer,
                               attnComm_t comm, attnStream_t stream);

/* Receives exactly `count` elements from `peer`; a message of another size
 * fails the receive with attnInvalidUsage. A longer message also breaks the
 * link; its sender fails too unless its (small, eager) send had already
 * completed. */
ATTN_API attnResult_t attnRecv(void* recvbuff, size_t count,
                               attnDataType_t datatype, int peer,
                               attnComm_t comm, attnStream_t stream);

/* Between attnGroupStart and attnGroupEnd, operations are queued and run
 * together at attnGroupEnd, so a rank may post sends and receives in any
 * order without deadlock (like ncclGroupStart/End). Groups nest; the
 * outermost attnGroupEnd runs them. Per calling thread. Sends and receives
 * to self pair up in order; when they do not (a count or a size differs),
 * attnGroupEnd fails with attnInvalidUsage after the group's messages to
 * other ranks have run, so those ranks are not left waiting.
 *
 * Device communicators: a group's sends and receives on one communicator
 * become one stream operation, enqueued by attnGroupEnd on the stream of the
 * group's first send/receive; calls that named other streams join it (that
 * stream first waits for their earlier work, and they wait for the group
 * before their later work), as in NCCL. Sends and receives to self pair up
 * in order. Collectives called inside the group are enqueued at their call
 * (on NCCL-backed communicators they join the group's NCCL group), so on
 * the stream they come before the group's sends and receives. */
ATTN_API attnResult_t attnGroupStart(void);
ATTN_API attnResult_t attnGroupEnd(void);

/* ------------------------------------------------------------------ */
/* Collectives (NCCL's argument order and in-place rules)              */
/* ------------------------------------------------------------------ */

/* Bad arguments fail the call with attnInvalidArgument on the rank that
 * passed them. As in NCCL, its peers then wait for a call that will not
 * come, unless signatures are checked (ATTN_CHECK=1): then the refusing
 * rank still takes part in the call's signature exchange and the peers
 * fail the call at once with attnRemoteError naming it. On a device
 * communicator the refusal is enqueued on the stream like the call, and
 * the peers' failure is their async error (attnCommGetAsyncError); with
 * the NCCL backend it is exchanged on the calling thread, outside groups. */

/* recvbuff[r*sendcount ...] = sendbuff of rank r. In place when
 * sendbuff == recvbuff + rank*sendcount*elemsize. */
ATTN_API attnResult_t attnAllGather(const void* sendbuff, void* recvbuff,
                                    size_t sendcount, attnDataType_t datatype,
                                    attnComm_t comm, attnStream_t stream);

/* recvbuff = op over ranks of sendbuff[rank*recvcount ...]. In place when
 * recvbuff == sendbuff + rank*recvcount*elemsize. */
ATTN_API attnResult_t attnReduceScatter(const void* sendbuff, void* recvbuff,
                                        size_t recvcount,
                                        attnDataType_t datatype,
                                        attnRedOp_t op, attnComm_t comm,
                                        attnStream_t stream);

/* recvbuff = op over ranks of sendbuff. In place when sendbuff == recvbuff. */
ATTN_API attnResult_t attnAllReduce(const void* sendbuff, void* recvbuff,
                                    size_t count, attnDataType_t datatype,
                                    attnRedOp_t op, attnComm_t comm,
                                    attnStream_t stream);

/* recvbuff on root = op over ranks of sendbuff; recvbuff is not touched
 * (and may be NULL) on the other ranks. In place when sendbuff == recvbuff
 * on the root. As ncclReduce. */
ATTN_API attnResult_t attnReduce(const void* sendbuff, void* recvbuff,
                                 size_t count, attnDataType_t datatype,
                                 attnRedOp_t op, int root, attnComm_t comm,
                                 attnStream_t stream);

/* recvbuff on every rank = sendbuff of root (sendbuff is read on root only).
 * In place when sendbuff == recvbuff. */
ATTN_API attnResult_t attnBroadcast(const void* sendbuff, void* recvbuff,
                                    size_t count, attnDataType_t datatype,
                                    int root, attnComm_t comm,
                                    attnStream_t stream);

/* Block p of sendbuff (count elements at p*count) goes to rank p, landing at
 * recvbuff + rank*count on it. Not in place. */
ATTN_API attnResult_t attnAllToAll(const void* sendbuff, void* recvbuff,
                                   size_t count, attnDataType_t datatype,
                                   attnComm_t comm, attnStream_t stream);

/* As attnAllToAll with per-peer counts and displacements (in elements):
 * sendcounts[p] elements from sendbuff + sdispls[p] go to rank p, which
 * receives them at recvbuff + rdispls[rank] with recvcounts[rank] equal to
 * this rank's sendcounts[p]. */
ATTN_API attnResult_t attnAllToAllv(const void* sendbuff,
                                    const size_t* sendcounts,
                                    const size_t* sdispls, void* recvbuff,
                                    const size_t* recvcounts,
                                    const size_t* rdispls,
                                    attnDataType_t datatype, attnComm_t comm,
                                    attnStream_t stream);

/* Returns on each rank once every rank has entered it. */
ATTN_API attnResult_t attnBarrier(attnComm_t comm, attnStream_t stream);


/* ------------------------------------------------------------------ */
/* Attention collectives                                               */
/* ------------------------------------------------------------------ */

/* How a log-sum-exp (LSE) the library reads or writes is expressed. */
typedef enum {
  attnLseNatural = 0, /* ln sum exp(score): FlashAttention, PyTorch */
  attnLseBase2 = 1,   /* log2 sum 2^(score * log2 e): FlashInfer */
  ATTN_ENUM_SPANS_INT(attnLseBase)
} attnLseBase_t;
typedef enum {
  attnLseTokenMajor = 0, /* [rows, heads] */
  attnLseHeadMajor = 1,  /* [heads, rows]: FlashAttention's, vLLM's merge */
  ATTN_ENUM_SPANS_INT(attnLseLayout)
} attnLseLayout_t;

#define ATTN_ATTN_CONFIG_MAGIC 0xA77C0F1Au

/* The attention problem every rank computes a share of. Versioned like
 * attnConfig_t: always start from ATTN_ATTN_CONFIG_INITIALIZER (or
 * ATTN_ATTN_CONFIG(...)); fields a caller's older header lacks take their
 * defaults, so later fields can be added without breaking it. */
typedef struct {
  size_t size;          /* sizeof(attnAttnConfig_t) as the caller compiled it */
  unsigned int magic;   /* ATTN_ATTN_CONFIG_MAGIC */
  unsigned int version; /* ATTN_VERSION_CODE as the caller compiled it */
  int num_q_heads;      /* Hq */
  int num_kv_heads;     /* Hkv; num_q_heads % num_kv_heads == 0 (GQA) */
  int head_dim;         /* D, 1..256 */
  attnDataType_t dtype; /* of q, k, v and out: attnFloat32, attnFloat16 or
                           attnBfloat16; partials are accumulated and merged
                           in fp32 whatever this is */
  float softmax_scale;  /* 0 means 1/sqrt(head_dim) */
  int causal;           /* 1: a query sees keys with position <= its own
                           (global positions, see attnSeqLayout_t) */
  /* Since 0.2. The convention of every LSE the calls taking this config
   * write: attention outputs (attnRingAttention, attnLevelAttention,
   * attnKvAttention), on host and device communicators. Default natural,
   * token-major. */
  attnLseBase_t lse_base;
  attnLseLayout_t lse_layout;
  /* Since 0.3. Sliding-window attention on global positions, in
   * FlashAttention's convention: key j is visible to query i only if
   * q_pos[i] - window_left <= kv_pos[j] <= q_pos[i] + window_right, -1
   * leaving that side unbounded (other negative values are refused). With
   * causal the right bound is q_pos[i] whatever window_right says. Change
   * it per call for Gemma- / Mistral-style alternating layers. Blocks no
   * query can see are neither computed nor, where the mode knows it
   * beforehand, sent. */
  int window_left;
  int window_right;
  /* Since 0.3. Logit soft-capping (Gemma 2): each scaled score s becomes
   * softcap * tanh(s / softcap) before the softmax. 0: none. */
  float softcap;
  /* Since 0.3. Attention sinks (GPT-OSS): [num_q_heads] fp32 learned
   * logits, one per query head, added to the softmax denominator of every
   * query row (as exp(sink) next to the exp of its scaled scores), once,
   * after the partials over every rank's keys are merged. The LSE written
   * includes it: out = sum_j exp(s_j - lse) v_j. NULL: none. Host memory on
   * host communicators; on device communicators device, managed or pinned
   * memory, read when the operation runs. A row that sees no key gets
   * out = 0 and lse = sink. */
  const float* sinks;
  /* Since 0.4. The head dim of V and of the output (MLA-shaped heads:
   * DeepSeek's head_dim 192 with head_dim_v 128), 1..256; 0: head_dim.
   * v is [kv rows, Hkv, head_dim_v] and out [q rows, Hq, head_dim_v];
   * softmax_scale's default stays 1/sqrt(head_dim). Every mode moves K
   * rows of head_dim and V rows of head_dim_v, nothing padded. */
  int head_dim_v;
} attnAttnConfig_t;

#define ATTN_ATTN_CONFIG(hq, hkv, d, dtype, scale, causal)                          \
  {                                                                                  \
    sizeof(attnAttnConfig_t), ATTN_ATTN_CONFIG_MAGIC, ATTN_VERSION_CODE, (hq), (hkv), \
        (d), (dtype), (scale), (causal), attnLseNatural, attnLseTokenMajor, -1, -1,  \
        0.0f, NULL, 0                                                                 \
  }
/* No heads yet: set num_q_heads, num_kv_heads and head_dim. fp32, causal,
 * softmax_scale 1/sqrt(head_dim), natural token-major LSE, no window, no
 * softcap, no sinks. */
#define ATTN_ATTN_CONFIG_INITIALIZER ATTN_ATTN_CONFIG(0, 0, 0, attnFloat32, 0.0f, 1)

/* This rank's shard of a batch, packed "THD": the rows of all sequences back
 * to back, each row [heads, head_dim]. Positions are global positions in the
 * sequence, so any placement of tokens on ranks works (our planner's or
 * the caller's).
 *
 * Where the arrays live decides when they are read. Host communicators,
 * and device ones given pageable host arrays, read them during the call
 * (the caller may reuse them once it returns). A device communicator given
 * arrays in device, managed or pinned host memory reads them when the
 * operation runs, in stream order like q, k and v: one CUDA graph captured
 * once then serves every decode step as the engine updates positions and
 * offsets (even the row counts, within the buffers' sizes) before each
 * replay. The four arrays live on one side (a mix is attnInvalidArgument);
 * a bad layout read when the call runs fails it on every rank, reported by
 * attnCommGetAsyncError. */
typedef struct {
  int num_seqs;              /* the same on every rank; a rank may hold no
                                rows of a sequence */
  const int32_t* q_offsets;  /* [num_seqs+1] rows of q/out per sequence */
  const int32_t* q_pos;      /* [q rows] global position of each query */
  const int32_t* kv_offsets; /* [num_seqs+1] rows of k/v per sequence */
  const int32_t* kv_pos;     /* [kv rows] global position of each key */
} attnSeqLayout_t;

typedef enum {
  attnModeAuto = 0,   /* the selector's choice (attnSelectMode) */
  attnModePassKV = 1, /* ring: KV rotates, Q stays (CP paper Alg. 2) */
  attnModePassQ = 2,  /* ring: Q rotates, partial outputs return by
                         all-to-all and merge on receive (Alg. 3) */
  attnModeShipQ = 3,  /* one hop: Q goes to every KV holder, partials come
                         back and merge on receive (decode, small N) */
  attnModeHeadParallel = 4, /* all-to-all over heads (CSPS SP-NTP,
                         DeepSpeed-Ulysses): each rank gets the whole
                         sequence for a share of the heads, attends, and a
                         second all-to-all brings the outputs home. Sends
                         (N-1)/N of Q, K, V and O per rank instead of N-1 KV
                         blocks; balanced whatever the placement. KV heads
                         are replicated when num_kv_heads < N. AUTO
                         weighs it with the rings */
  attnModeAllGatherKV = 5, /* all-gather every rank's KV, then attend
                         (Llama 3's context parallelism): one hop, each
                         block merged on receive while the rest arrive.
                         Sends N-1 KV blocks per rank at once and holds
                         every rank's keys: AUTO weighs it only while
                         those fit in 256 MiB. Host communicators only for
                         now: a device communicator refuses it
                         (attnNotSupported) and AUTO leaves it out there */
  ATTN_ENUM_SPANS_INT(attnAttnMode)
} attnAttnMode_t;

/* Exact attention of this rank's queries over the keys of all ranks.
 * q: [q rows, Hq, D]; k: [kv rows, Hkv, D]; v: [kv rows, Hkv, Dv]; out:
 * [q rows, Hq, Dv] (Dv = cfg->head_dim_v, or D when 0), all in
 * cfg->dtype. lse: [q rows, Hq] float natural-log log-sum-exp of the scaled
 * scores, or NULL. A query that sees no key gets out = 0 and lse = -inf.
 * Collective: every rank calls it with the same cfg, num_seqs and mode.
 * Ranks that disagree fail together (attnInvalidUsage, naming both). A rank
 * whose arguments are refused (attnInvalidArgument) still tells the others,
 * which fail the call with attnRemoteError naming it; the communicator
 * stays usable on every rank. The same holds for attnLevelAttention and
 * attnSelectMode. */
ATTN_API attnResult_t attnRingAttention(const void* q, const void* k, const void* v, void* out,
                                        float* lse, const attnSeqLayout_t* layout,
                                        const attnAttnConfig_t* cfg, attnAttnMode_t mode,
                                        attnComm_t comm, attnStream_t stream);

/* Merges n partial attention results over disjoint key sets:
 * lse = log sum_j exp(lse_j), out = sum_j exp(lse_j - lse) * outs[j].
 * outs[j]: [rows, heads, head_dim] in dtype; lses[j]: [rows, heads].
 * Rows whose every lse_j is -inf give out = 0, lse = -inf. out / lse may
 * alias outs[0] / lses[0] (in place); lse may be NULL. Local: no
 * communication. With a NULL stream every buffer is host memory and the
 * merge runs now; with a CUDA stream every buffer is device (or managed)
 * memory and the merge is enqueued on it (CUDA builds). */
ATTN_API attnResult_t attnMergeAttnStates(int n, const void* const* outs,
                                          const float* const* lses, void* out, float* lse,
                                          int64_t rows, int heads, int head_dim,
                                          attnDataType_t dtype, attnStream_t stream);

/* attnMergeAttnStates for LSEs in another convention: every lses[j] and
 * lse are in lse_base (attnLseBase2: log2, as FlashInfer's) and lse_layout
 * (attnLseHeadMajor: [heads, rows], as FlashAttention returns and vLLM's
 * merge takes). The merge reads and writes them as they are (no conversion
 * pass, no extra copy), in place as attnMergeAttnStates; attnMergeAttnStates
 * is the attnLseNatural, attnLseTokenMajor case. */
ATTN_API attnResult_t attnMergeAttnStatesLse(int n, const void* const* outs,
                                             const float* const* lses, void* out, float* lse,
                                             int64_t rows, int heads, int head_dim,
                                             attnDataType_t dtype, attnLseBase_t lse_base,
                                             attnLseLayout_t lse_layout, attnStream_t stream);

/* The decode-context-parallel merge as one collective. Every rank holds a
 * partial attention result for the same `rows` query rows over its own share
 * of the keys: out_part [rows, heads, head_dim] in dtype, lse_part [rows,
 * heads] float natural-log. attnMergeAttnReduceScatter leaves on each rank
 * the exact merge for its share of the heads, [r * heads / n,
 * (r + 1) * heads / n) on rank r of n (none when heads < n and the share is
 * empty): out [rows, share, head_dim], lse [rows, share] or NULL.
 * attnMergeAttnAllGather leaves all heads on every rank: out [rows, heads,
 * head_dim], lse [rows, heads] or NULL (they may alias the partial). Each
 * rank sends every peer that peer's heads once and folds each slice as it
 * arrives (merge on receive). Rows whose every lse is -inf give 0 and -inf.
 * A device communicator takes device buffers, ordered on `stream`; a host
 * one host buffers and a NULL stream. Collective: the same rows, heads,
 * head_dim and dtype on every rank. */
ATTN_API attnResult_t attnMergeAttnReduceScatter(const void* out_part, const float* lse_part, void* out,
                                                 float* lse, int64_t rows, int heads, int head_dim,
                                                 attnDataType_t dtype, attnComm_t comm, attnStream_t stream);
ATTN_API attnResult_t attnMergeAttnAllGather(const void* out_part, const float* lse_part, void* out,
                                             float* lse, int64_t rows, int heads, int head_dim,
                                             attnDataType_t dtype, attnComm_t comm, attnStream_t stream);

/* --- Level-aware sparse attention (CSPS §3.2.4, "CSA") --- */

/* The tier between two ranks, nearest first: the fabric model's (see
 * attnCommTopoDump; host and rack ids come from hwloc / ATTN_HOSTID /
 * ATTN_RACKID). */
typedef enum {
  attnTierDevice = 0,  /* same host, same GPU */
  attnTierHost = 1,    /* same host */
  attnTierRack = 2,    /* another host of the same rack */
  attnTierCluster = 3,  /* anything farther */
  ATTN_ENUM_SPANS_INT(attnTier)
} attnTier_t;

/* Which of its peers' keys a rank attends to. Farther peers send fewer:
 * CSPS keeps, for a drop ratio p inside the server, 1 - p there, (1 - p) / 2
 * one level out and (1 - p) / 4 two levels out. */
typedef struct {
  float keep[4];           /* by attnTier_t between the two ranks: the
                              fraction of each sequence's keys a peer sends,
                              in [0, 1]. Per sequence of n keys a peer sends
                              round(keep * n) of them, at least one when
                              keep > 0. A rank's own keys are all kept. The
                              same on every rank. */
  const float* importance; /* [kv rows] a score per key of this rank's shard
                              (e.g. the attention mass the previous layer
                              gave it): the highest scores are kept, ties by
                              the earlier row, NaN lowest. NULL only when
                              every keep is 1. Device memory on a device
                              communicator, as the tensors. */
} attnLevelDrop_t;

/* Attention of this rank's queries over its own keys and the keys each peer
 * keeps for the tier between them: a level-aware all-to-all of K/V with token
 * dropping. Dropped keys are neither sent nor computed, nor are keys no
 * query of the receiver can see (causal); only KV heads travel; keys bound
 * for another host or rack cross to it once (a rank there relays them); each
 * peer's keys are folded into the result as they arrive (merge-on-receive),
 * nearest peers first. drop == NULL keeps every key:
 * exact attention, the result of attnRingAttention. q, k, v, out, lse,
 * layout and cfg as attnRingAttention; place near tokens on near ranks
 * (attnCommTopoRank) so the keys dropped are the distant ones. On a device
 * communicator it is enqueued on `stream` as attnRingAttention is (kept
 * keys gathered and every block folded on the GPU); a host one takes a
 * NULL stream. Collective: every rank calls it with the same cfg, num_seqs
 * and keep. */
ATTN_API attnResult_t attnLevelAttention(const void* q, const void* k, const void* v, void* out,
                                         float* lse, const attnSeqLayout_t* layout,
                                         const attnAttnConfig_t* cfg,
                                         const attnLevelDrop_t* drop, attnComm_t comm,
                                         attnStream_t stream);

/* --- Distributed KV cache (Infinite-LLM DistAttention, §4-6) --- */

/* A pool of fixed-size KV blocks on every rank of a communicator. A rank owns
 * the requests it appends to; their blocks live in its own pool or, after a
 * move, in a peer's (the peer lends memory: a creditor; the owner borrows: a
 * debtor). attnKvAttention ships each request's queries to the ranks that
 * hold its blocks, which compute attention over those blocks there and
 * return (O, LSE) partials that the owner merges as they arrive.
 *
 * Host communicators: the pool is host memory, the built-in CPU kernel
 * computes, and every call takes a NULL stream.
 * Device communicators: the pool's K and V live on the communicator's GPU
 * and the built-in CUDA kernels compute. k, v, q, out and lse are device
 * pointers; pos, reqs, q_offsets and q_pos host arrays, read during the
 * call. Every call but create, destroy, stats and placement takes a stream
 * and is enqueued on it: an append's copies, a release's bookkeeping and
 * each collective run in stream order and never block the host. Errors of
 * the arguments and of the pool's books (unknown request, pool full,
 * positions) still return at once; granted and moved are written when the
 * call runs (synchronise the stream before reading them), and a failure
 * there is reported by attnCommGetAsyncError, as for other collectives.
 * On both, a local call made while collectives on the pool are still
 * queued (a device stream, a non-blocking communicator) does not change
 * what those collectives see: they run on the pool as it was when they were
 * enqueued. Blocks freed by such a release become free for appends once
 * the collectives queued before it have run. */
typedef struct attnKvPool* attnKvPool_t;

typedef struct {
  int block_tokens;        /* tokens per block, 1 .. 4096 */
  int num_kv_heads;        /* >= 1 */
  int head_dim;            /* 1 .. 256 */
  attnDataType_t dtype;    /* attnFloat32, attnFloat16 or attnBfloat16 */
  int64_t capacity_blocks; /* blocks of this rank's pool (may differ by rank) */
} attnKvPoolConfig_t;

/* Collective over comm: block_tokens, num_kv_heads, head_dim and dtype must
 * agree on every rank (ranks that disagree fail together, naming both).
 * Like attnCommSplit, runs on the calling thread once the operations
 * already queued on comm have run. */
ATTN_API attnResult_t attnKvPoolCreate(attnComm_t comm, const attnKvPoolConfig_t* config,
                                       attnKvPool_t* pool);
/* Local. The communicator must outlive the pool. Waits for the collectives
 * queued on the pool; on a device communicator, destroy it once the streams
 * of its calls have run them (as any buffer a stream still uses). */
ATTN_API attnResult_t attnKvPoolDestroy(attnKvPool_t pool);

/* Local: appends n tokens (k, v: [n, num_kv_heads, head_dim]; pos: their
 * global positions, increasing) to request req of this rank, creating it on
 * first use. Tokens fill the request's last block when it is here, then new
 * blocks of this rank's pool; attnInvalidUsage when the pool has too few
 * free blocks (nothing is appended then).
 *
 * CUDA graphs: an append on a stream that is being captured is captured
 * (only the arguments' pointers and n are checked then): each launch of
 * the graph appends the n tokens k and v hold at that launch, at the
 * positions pos holds at that launch (a host array that must stay valid;
 * write it before each launch). A launch that cannot append (positions,
 * pool full, pool destroyed) appends nothing and is reported by
 * attnCommGetAsyncError. The request's other calls (appends, release)
 * must come after the stream has run the launches before them. A
 * captured pool collective sees the pool as it is at its launch (see
 * attnKvAttention for its q_pos). */
ATTN_API attnResult_t attnKvAppend(attnKvPool_t pool, int64_t req, const void* k, const void* v,
                                   const int32_t* pos, int n, attnStream_t stream);

/* Local: ends request req of this rank. Its blocks here are freed at once
 * (after the collectives queued before it, see above); its blocks on peers
 * are freed by them during the next collective call on the pool
 * (attnKvMigrate, attnKvAttention, attnKvRebalance). Refused
 * (attnInvalidUsage) on a stream that is being captured into a CUDA
 * graph: a request ends once. */
ATTN_API attnResult_t attnKvRelease(attnKvPool_t pool, int64_t req, attnStream_t stream);

/* Collective over newcomm, which attnCommShrink made from the pool's
 * communicator (called by every survivor, after attnCommShrink and before
 * the old communicator is freed): the pool moves to newcomm, so the KV the
 * survivors hold outlives the lost ranks. Ranks are renumbered as in
 * newcomm. Waits for the collectives queued on the pool (those of a broken
 * communicator end with an error).
 *
 * The blocks the excluded ranks held are gone: each own request that had
 * one is released, as by attnKvRelease, and reported as lost. Blocks held
 * here for the excluded ranks' requests are freed. The survivors then
 * compare books: each owner tells each holder which of its blocks it holds;
 * the holder frees blocks no owner claims (a migration or a release that
 * the failure cut short) and names requests whose claimed blocks it lacks,
 * which their owner releases and reports as lost as well.
 *
 * lost_reqs (may be NULL when max_lost is 0) receives at most max_lost of
 * this rank's lost requests in increasing order; *num_lost (may be NULL)
 * how many there were. The caller re-runs their prefill. Bad input on one
 * rank (NULL pool, a newcomm not shrunk from the pool's communicator) fails
 * the call on every rank before any pool moves. */
ATTN_API attnResult_t attnKvPoolShrink(attnKvPool_t pool, attnComm_t newcomm, int64_t* lost_reqs,
                                       int max_lost, int* num_lost);

/* This rank's pool and requests, for the planner's heartbeat: every local
 * call made so far counted, collectives still queued not. */
typedef struct {
  int64_t capacity_blocks;
  int64_t used_blocks;      /* own blocks here plus blocks lent in */
  int64_t lent_in_blocks;   /* blocks of peers' requests held here */
  int64_t lent_out_blocks;  /* blocks of own requests held by peers */
  int num_requests;         /* own requests (the batch size) */
} attnKvPoolStats_t;
ATTN_API attnResult_t attnKvPoolGetStats(attnKvPool_t pool, attnKvPoolStats_t* stats);

/* Where request req of this rank lives: holders[r] receives the number of its
 * blocks in rank r's pool (holders: [nranks], may be NULL), *tokens the
 * number of its tokens (may be NULL). Local. */
ATTN_API attnResult_t attnKvGetPlacement(attnKvPool_t pool, int64_t req, int64_t* holders,
                                         int64_t* tokens);

/* A move of blocks of request (owner, req) from rank src's pool to rank
 * dst's. The owner is src (it lends its blocks out: the oldest full ones
 * go first) or dst (they come back to it). */
typedef struct {
  int src;
  int dst;
  int owner;
  int64_t req;
  int64_t num_blocks;
} attnKvMove_t;

/* Collective: each rank passes the moves it is the source of (src == its
 * rank; any number, 0 included). Per move the source first asks dst to
 * reserve num_blocks (try_move); dst grants whole moves first come, first
 * served while its free blocks last and refuses the rest; granted blocks
 * are then sent and freed at the source. granted[i] (may be NULL) receives
 * the blocks moved for moves[i]: num_blocks or 0. A move of more blocks
 * than src holds of the request is an error on the source (nothing moves). */
ATTN_API attnResult_t attnKvMigrate(attnKvPool_t pool, const attnKvMove_t* moves, int num_moves,
                                    int64_t* granted, attnStream_t stream);

/* Collective: attention of this rank's queries over all the tokens of its
 * requests, wherever their blocks are. num_reqs requests reqs[i] (own,
 * distinct), with query rows [q_offsets[i], q_offsets[i+1]) of q
 * ([rows, num_q_heads, head_dim], the pool's dtype); out the same shape and
 * dtype; lse [rows, num_q_heads] fp32 or NULL. cfg gives num_q_heads,
 * softmax_scale and causal (num_kv_heads, head_dim, dtype must be the
 * pool's); with causal, q_pos [rows] are the queries' global positions
 * (key visible when its pos <= the query's). Queries go only to ranks that
 * hold blocks of their request; each holder computes over its blocks and
 * returns (O, LSE), merged on arrival (DistAttention's MicroAttention).
 * In a CUDA graph, each launch attends over the pool as it is then, with
 * q_pos read at that launch (decode positions advance with every step;
 * keep the array valid); reqs, q_offsets and cfg are copied at the
 * capture. */
ATTN_API attnResult_t attnKvAttention(attnKvPool_t pool, int num_reqs, const int64_t* reqs,
                                      const int32_t* q_offsets, const void* q,
                                      const int32_t* q_pos, void* out, float* lse,
                                      const attnAttnConfig_t* cfg, attnStream_t stream);

/* The planner's view of one instance (a rank), as its heartbeat reports it. */
typedef struct {
  int batch_size;                 /* beta: own requests being decoded */
  int pending_requests;           /* waiting requests that would join if
                                     memory allowed */
  int64_t pending_blocks;         /* blocks one pending request needs */
  int64_t capacity_blocks;
  int64_t used_blocks;            /* own blocks here plus blocks lent in:
                                     the blocks its attention reads */
  int64_t longest_req;            /* its longest own request, -1 for none */
  int64_t longest_req_blocks;     /* that request's movable blocks here
                                     (full blocks; the last one stays) */
} attnKvInstance_t;

/* The performance model (Infinite-LLM Eq. 5-7) and Alg. 1's thresholds.
 * Time of one layer on an instance with batch b reading a blocks:
 * T = nonattn_us_base + nonattn_us_per_req * b + attn_us_per_block * a;
 * its throughput b / (num_layers * T). A debtor that lends out k blocks
 * reads k fewer and admits min(pending_requests, free / pending_blocks)
 * waiting requests into the memory then free (each reading pending_blocks);
 * a creditor that takes k blocks reads k more. */
typedef struct {
  double nonattn_us_base;
  double nonattn_us_per_req;
  double attn_us_per_block;
  int num_layers;
  int debtor_max_batch;     /* beta_thres: debtors have batch <= this */
  double creditor_max_util; /* U_thres: creditors use <= this of capacity */
} attnKvModel_t;

/* Infinite-LLM Alg. 1 (greedy, debtors by increasing batch, creditors by
 * increasing memory use, ties by lower index; per debtor its longest
 * request; per creditor the block count in [0, Block_max] that maximises the
 * pair's modelled throughput, the smallest on ties; a debtor stops at the
 * first creditor where no move gains; an instance is never both). The model
 * needs nonattn_us_base + nonattn_us_per_req > 0. Pure and deterministic:
 * every rank computes the same plan from the same heartbeats. Writes at
 * most *num_moves moves (src = debtor = owner, dst = creditor) and sets
 * *num_moves to the count. moves == NULL with *num_moves == 0 asks for the
 * count: it is set and the call succeeds. When a buffer is given but more
 * moves were needed, none are written, *num_moves is set to the count
 * needed and the call returns attnInvalidArgument. */
ATTN_API attnResult_t attnKvPlan(const attnKvInstance_t* instances, int num_instances,
                                 const attnKvModel_t* model, attnKvMove_t* moves,
                                 int* num_moves);

/* Collective: the heartbeat and the plan in one call. Every rank reports its
 * instance (the pool gives batch, capacity, use and its longest request;
 * the caller its waiting requests and the blocks each needs), all-gathers
 * the reports, computes attnKvPlan with model (the same on every rank; it
 * must agree) and runs attnKvMigrate on the moves. *moved (may be NULL)
 * receives the blocks this rank sent. */
ATTN_API attnResult_t attnKvRebalance(attnKvPool_t pool, const attnKvModel_t* model,
                                      int pending_requests, int64_t pending_blocks,
                                      int64_t* moved, attnStream_t stream);

/* --- Sharding planner (CP paper §3.5.1) --- */

/* A batch to shard: per sequence, new tokens (T_i) and cached tokens (P_i)
 * whose keys already sit in the KV cache. */
typedef struct {
  int num_seqs;
  const int32_t* new_lens;    /* [num_seqs] T_i >= 0 */
  const int32_t* cached_lens; /* [num_seqs] P_i >= 0, or NULL for none */
} attnBatchSpec_t;

/* One rank's shard, as produced by the planner. Arrays are owned by the
 * plan. q rows are new tokens; kv rows are this rank's cached keys followed,
 * per sequence, by the keys of its own new tokens. */
typedef struct {
  attnSeqLayout_t layout;
  int64_t q_rows;
  int64_t kv_rows;
  const int64_t* q_index;  /* [q_rows] row of each query in the batch's
                              packed new tokens (sequence by sequence) */
  const int64_t* kv_index; /* [kv_rows] row of each key in the batch's packed
                              full sequences (cached then new, by sequence) */
} attnShard_t;

typedef struct attnPlan* attnPlan_t;

/* Load-balanced prefill plan over nranks ranks: each sequence's new tokens
 * are cut into 2*nranks contiguous chunks and rank r takes chunks r and
 * 2*nranks-1-r, so every rank has the same causal work. Nothing is padded:
 * the tokens that do not divide evenly go one per rank in turn, across the
 * whole batch, so ranks' row counts differ by at most one. Cached tokens
 * stay where an earlier plan of length P_i put them. Full prefill is
 * cached_lens == NULL. nranks is at most ATTN_MAX_NRANKS. */
ATTN_API attnResult_t attnPlanPrefill(const attnBatchSpec_t* batch, int nranks,
                                      attnPlan_t* plan);
ATTN_API attnResult_t attnPlanGetShard(attnPlan_t plan, int rank, attnShard_t* shard);
ATTN_API attnResult_t attnPlanDestroy(attnPlan_t plan);

/* Decode placement (CP paper §3.6): the rank that stores the KV of sequence
 * s's new token at decode step `step` is (s + step) % nranks, so ranks fill
 * evenly; the rank that holds its query is s % nranks. Either output may be
 * NULL. */
ATTN_API attnResult_t attnDecodePlacement(int num_seqs, int64_t step, int nranks,
                                          int32_t* kv_rank, int32_t* q_rank);

/* --- Mode selection (CP paper Alg. 1, App. C) --- */

/* Rates the selector's cost model uses. Calibrated once per communicator
 * (link: a short ping-pong with the ring neighbours; kernel: a timed run of
 * the attention kernel, the CUDA one on a device communicator's GPU unless
 * a user kernel is set; interference: the kernel and an exchange timed
 * together), overridable here or by ATTN_MODEL_* variables. */
typedef struct {
  double link_bandwidth_GBps; /* bytes/ns between ring neighbours */
  double link_latency_us;     /* per message */
  double attn_tflops;         /* partial attention compute rate */
  /* Share, 0 to 1, of a transfer's time that also delays the kernel when the
   * two run together. 0: the transfer runs beside it on its own hardware
   * (copy engines, NICs); the CP paper's model, and what a zeroed struct
   * means. 1: it takes the cores the kernel needs (host-memory copies with
   * more ranks than cores), so overlap hides nothing. A step that computes
   * for a and moves data for c then takes max(a, c) + interference * min(a, c). */
  double comm_interference;
} attnCostModel_t;

typedef struct {
  attnAttnMode_t chosen;  /* what attnModeAuto runs */
  double pass_kv_us;      /* predicted time of each mode */
  double pass_q_us;
  double ship_q_us;
  double alg1_threshold_tokens; /* Eq. 2's T threshold with these rates */
  attnAttnMode_t alg1_choice;   /* Alg. 5 (App. C) with these rates */
  double head_parallel_us;      /* attnModeHeadParallel's predicted time */
  double all_gather_kv_us;      /* attnModeAllGatherKV's predicted time */
} attnModeEstimate_t;

/* What attnModeAuto would run for this layout on this communicator, with
 * the predicted time of each mode. Collective (ranks exchange their row
 * counts) and deterministic: every rank gets the same answer. */
ATTN_API attnResult_t attnSelectMode(const attnSeqLayout_t* layout, const attnAttnConfig_t* cfg,
                                     attnComm_t comm, attnModeEstimate_t* estimate);

/* The same model on given totals, without a communicator: new_tokens (T) and
 * cached_tokens (P) summed over the batch, nranks ranks. For what-if
 * studies (e.g. the CP paper's Table 4). */
ATTN_API attnResult_t attnEstimateModes(const attnCostModel_t* model, const attnAttnConfig_t* cfg,
                                        int nranks, int64_t new_tokens, int64_t cached_tokens,
                                        attnModeEstimate_t* estimate);

/* Reads (calibrating first if needed) or replaces the communicator's rates.
 * Collective when it calibrates. */
ATTN_API attnResult_t attnCommGetCostModel(attnComm_t comm, attnCostModel_t* model);
ATTN_API attnResult_t attnCommSetCostModel(attnComm_t comm, const attnCostModel_t* model);

/* --- Plugging in an engine's own attention kernel --- */

/* One partial-attention call: queries of `q` against keys/values of `k`,
 * `v` (this step's block), sequence by sequence. The kernel writes the
 * normalised partial output and its lse, in the output dtype and LSE
 * convention it was registered with (out_dtype, lse_base, lse_layout
 * below: fp32, natural, token-major through attnCommSetAttnKernel); a
 * query that sees no key must get out = 0, lse = -inf. Since 0.3 the
 * kernel applies cfg->window_left, window_right and softcap as the
 * built-in kernel does; cfg->sinks are the library's (applied once, after
 * the merge: the kernel must not). A call with a window or softcap is
 * refused (attnNotSupported, on every rank) on a kernel set through
 * attnCommSetAttnKernel, or through attnCommSetAttnKernelEx from a header
 * older than 0.3. Since 0.4, V and out have cfg->head_dim_v (Dv below,
 * always set); a call whose Dv differs from D is refused the same way on
 * a kernel registered from a header older than 0.4. */
typedef struct {
  const void* q;              /* [q_rows, Hq, D] in cfg->dtype */
  const void* k;              /* [kv_rows, Hkv, D] */
  const void* v;              /* [kv_rows, Hkv, Dv] */
  float* out;                 /* [q_rows, Hq, Dv] in out_dtype (fp16/bf16:
                                 cast it; float* for the ABI's sake) */
  float* lse;                 /* [q_rows, Hq], or [Hq, q_rows] head-major */
  int num_seqs;
  const int32_t* q_offsets;   /* [num_seqs+1] */
  const int32_t* q_pos;       /* [q_rows] */
  const int32_t* kv_offsets;  /* [num_seqs+1] */
  const int32_t* kv_pos;      /* [kv_rows] */
  const attnAttnConfig_t* cfg;
  /* Since 0.2: what the kernel was registered to write (always set). */
  attnDataType_t out_dtype;   /* attnFloat32, or cfg->dtype */
  attnLseBase_t lse_base;
  attnLseLayout_t lse_layout; /* head-major: q_rows = q_offsets[num_seqs] */
} attnAttnKernelArgs_t;

typedef attnResult_t (*attnAttnKernelFn)(const attnAttnKernelArgs_t* args, void* user_data,
                                         attnStream_t stream);

/* Replaces the built-in partial-attention kernel on this communicator
 * (fn == NULL restores it). The library still moves the data and merges.
 *
 * Host communicators call it with host pointers and stream == NULL. Device
 * communicators (config.device >= 0) call it on their proxy thread, in
 * every mode, with DEVICE pointers (q, k, v, out, lse, the offsets and the
 * positions; cfg stays a host pointer) and `stream` set to the library's
 * compute stream for this communicator, which is ordered after the caller's
 * stream: enqueue the kernel on it (the library folds or sends `out`/`lse`
 * on the same stream after fn returns); fn may synchronise it but must not
 * block on the caller's stream, so nothing that waits for the whole device
 * either (cudaFree, cudaFreeHost, cudaDeviceSynchronize, the legacy default
 * stream): the caller's stream is waiting for fn. Allocate stream-ordered
 * (cudaMallocAsync / cudaFreeAsync on `stream`). Only the timing run of
 * AUTO's cost model calls it with host pointers and stream == NULL on a
 * device communicator; the compute stream is never NULL, so a kernel can
 * tell the two apart. */
ATTN_API attnResult_t attnCommSetAttnKernel(attnComm_t comm, attnAttnKernelFn fn,
                                            void* user_data);

#define ATTN_ATTN_KERNEL_MAGIC 0xA77C4E1Bu

/* An engine's kernel as it is: the dtype of the partial output it writes
 * and the convention of its LSE. The library folds that partial as it is
 * (no fp32 round trip, no LSE conversion pass). Versioned like
 * attnAttnConfig_t: start from ATTN_ATTN_KERNEL_INITIALIZER or
 * ATTN_ATTN_KERNEL(...). */
typedef struct {
  size_t size;              /* sizeof(attnAttnKernel_t) as the caller compiled it */
  unsigned int magic;       /* ATTN_ATTN_KERNEL_MAGIC */
  unsigned int version;     /* ATTN_VERSION_CODE as the caller compiled it */
  attnAttnKernelFn fn;      /* NULL restores the built-in kernel */
  void* user_data;
  attnDataType_t out_dtype; /* attnFloat32, attnFloat16 or attnBfloat16; a
                               16-bit one must be each call's cfg->dtype,
                               else that call is refused with
                               attnInvalidArgument naming both, on every
                               rank (the peers name this one) */
  attnLseBase_t lse_base;
  attnLseLayout_t lse_layout;
} attnAttnKernel_t;

#define ATTN_ATTN_KERNEL(fn, user_data, out_dtype, lse_base, lse_layout)                 \
  {                                                                                      \
    sizeof(attnAttnKernel_t), ATTN_ATTN_KERNEL_MAGIC, ATTN_VERSION_CODE, (fn), (user_data), \
        (out_dtype), (lse_base), (lse_layout)                                            \
  }
/* No kernel (the built-in one); fp32 output, natural token-major LSE. */
#define ATTN_ATTN_KERNEL_INITIALIZER \
  ATTN_ATTN_KERNEL(NULL, NULL, attnFloat32, attnLseNatural, attnLseTokenMajor)

/* attnCommSetAttnKernel with the kernel's native output dtype and LSE
 * convention (kernel == NULL, or kernel->fn == NULL, restores the built-in
 * kernel). fn is called as attnCommSetAttnKernel says, with args->out in
 * kernel->out_dtype and args->lse in its convention. attnInvalidArgument
 * for a descriptor not started from ATTN_ATTN_KERNEL_INITIALIZER (magic,
 * size) or with a value out of its enum. attnCommSetAttnKernel(comm, fn,
 * user_data) is this with attnFloat32, attnLseNatural, attnLseTokenMajor. */
ATTN_API attnResult_t attnCommSetAttnKernelEx(attnComm_t comm, const attnAttnKernel_t* kernel);

/* --- Topology: proximity order, splits by locality, dumps --- */

/* Every communicator knows where its ranks sit: rack (ATTN_RACKID or
 * ATTN_TOPO_FILE), host (ATTN_HOSTID, else hostname + boot id), NUMA node
 * and GPU (hwloc), and the tier between any two ranks (same device < same
 * host < same rack < cluster) with a bandwidth and latency per tier. The
 * proximity order sorts ranks by rack, host, NUMA node, GPU, then rank; all
 * ranks derive the same order, and rings of the collectives follow it. */

/* This rank's position (0..nranks-1) in the proximity order. Local. */
ATTN_API attnResult_t attnCommTopoRank(attnComm_t comm, int* topoRank);

/* Types of attnCommSplitType. */
typedef enum {
  attnSplitTypeHost = 0,        /* the ranks of my host */
  attnSplitTypeHostLeaders = 1, /* the first rank (in proximity order) of each
                                   host; the other ranks get *newcomm = NULL */
  attnSplitTypeRack = 2,        /* the ranks of my rack (a host without a rack
                                   id is a rack of its own) */
  attnSplitTypeProximity = 3,    /* every rank, renumbered in proximity order */
  ATTN_ENUM_SPANS_INT(attnSplitType)
} attnSplitType_t;

/* Splits by locality, like MPI_Comm_split_type: collective over comm, every
 * rank passes the same type. New ranks are ordered by key, then by
 * proximity order (pass the same key everywhere, e.g. 0, to get the
 * proximity order). config as in attnCommSplit. */
ATTN_API attnResult_t attnCommSplitType(attnComm_t comm, int type, int key,
                                        attnComm_t* newcomm, attnConfig_t* config);

/* Formats of attnCommTopoDump. */
typedef enum {
  attnTopoFormatText = 0, /* tables for people: tiers, ranks in proximity
                             order, this rank's local hardware view */
  attnTopoFormatDot = 1,  /* Graphviz DOT: racks and hosts as boxes, the
                             proximity ring coloured by tier */
  attnTopoFormatJson = 2,  /* the ATTN_TOPO_FILE / ATTN_TOPO_DUMP_FILE schema
                             (topology/README.md) */
  ATTN_ENUM_SPANS_INT(attnTopoFormat)
} attnTopoFormat_t;

/* Writes the communicator's fabric model as text into buf (NUL-terminated).
 * buf == NULL: *size receives the bytes needed (with the NUL). Otherwise
 * *size is buf's capacity; when too small, nothing is written, *size
 * receives the bytes needed and attnInvalidArgument is returned. Local. */
ATTN_API attnResult_t attnCommTopoDump(attnComm_t comm, int format, char* buf, size_t* size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ATTNCOMM_H_ */
