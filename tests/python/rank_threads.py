"""Ranks as Python threads for the Python tests (ctypes releases the GIL in
every attncomm call, so the ranks run at once). Importing it also readies a
test process: python/ goes on the path (for `import attncomm`), and a rank
that fails makes its peers time out after 30 s, not the default 5 min."""
import os
import sys
import threading

os.environ.setdefault("ATTN_TIMEOUT_MS", "30000")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

DEADLINE_S = 300


def on_ranks(comms, body, deadline_s=DEADLINE_S):
    """Runs body(rank, comm) on one thread per rank and re-raises the first
    failure. Ranks still running at the deadline abort every communicator,
    so a hang becomes a failure."""
    errors = [None] * len(comms)

    def run(r):
        try:
            body(r, comms[r])
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s)
    if any(t.is_alive() for t in threads):
        for c in comms:
            if c is not None:  # a rank that makes its own communicator may not have one yet
                c.abort()
        raise AssertionError(f"ranks still running after {deadline_s} s")
    for e in errors:
        if e is not None:
            raise e
