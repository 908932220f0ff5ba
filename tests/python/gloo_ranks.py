"""Ranks as processes in a gloo process group, for the attncomm.torch tests
on CPU tensors: run(nranks, body, banner) spawns them, each with a
communicator from the group (attncomm.torch.init_from_group), calls
body(rank, comm) on each, and reports every rank's failure."""
import os
import tempfile
import time
import traceback

import rank_threads

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, nranks, body, store_path, failures):
    import attncomm.torch as act
    try:
        torch.set_num_threads(1)
        store = dist.FileStore(store_path, nranks)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=nranks)
        comm = act.init_from_group()
        assert (comm.rank, comm.size) == (rank, nranks), (comm.rank, comm.size)
        body(rank, comm)
        comm.destroy()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported by the parent
        failures.put(f"rank {rank}:\n{traceback.format_exc()}")


def run(nranks, body, banner):
    """Exit code 0 (printing banner) when body passed on every rank, else 1
    with each failing rank's traceback; ranks still running after
    rank_threads.DEADLINE_S are killed and fail the run."""
    if os.environ.get("ATTN_LIBRARY") is None:
        print("ATTN_LIBRARY is not set; using the checkout's build")
    failures = mp.get_context("spawn").SimpleQueue()
    hung = False
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.spawn(_worker, args=(nranks, body, os.path.join(d, "store"), failures), nprocs=nranks, join=False)
        # join() returns as each process ends: wait for all of them.
        deadline = time.monotonic() + rank_threads.DEADLINE_S
        while time.monotonic() < deadline and not ctx.join(max(0.0, deadline - time.monotonic())):
            pass
        for p in ctx.processes:
            if p.is_alive():
                hung = True
                p.kill()
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    if hung:
        errors.append(f"ranks still running after {rank_threads.DEADLINE_S} s: killed")
    if errors:
        print("\n".join(errors))
        return 1
    print(banner)
    return 0
