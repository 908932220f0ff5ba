#!/usr/bin/env python3
"""Random sequences of the standard collectives through the C API: every
collective with random counts (0 to a few hundred thousand elements), types,
reduction ops, roots and in-place use; all-to-allv with gaps between blocks;
groups of sends and receives in random order (self included) and groups
mixing them with collectives; splits into random colors; and now and then a
call with bad arguments on every rank, a group whose send to self has no
receive on one rank, or (with ATTN_CHECK=1) bad arguments on one rank only.

What must hold: every result equals a numpy reference computed from every
rank's inputs (bytes outside the result stay as they were); a call with bad
arguments fails with its code (with signature checks, on every rank: the
others naming the refusing rank) and the next call works; a barrier after
each call finds the ranks in step.

Ranks run as threads of this process (with blocking and with non-blocking
communicators, whose results are checked after Comm.wait()), and as processes (this script started
once per rank) over a fabric of two emulated hosts with small pipeline
chunks and shared-memory rings, under each all-gather / reduce-scatter
algorithm and all-to-all schedule. Seeds are fixed (ATTN_FUZZ_SEEDS,
ATTN_FUZZ_ITERS widen the search). Exit 77 (skipped) without numpy."""
import json
import os
import random
import subprocess
import sys
import unittest

from rank_threads import on_ranks  # first: the path to python/ and the test timeout

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipped")
    sys.exit(77)

import attncomm as ac  # noqa: E402

DTYPES = [np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64]
OPS = [ac.SUM, ac.PROD, ac.MAX, ac.MIN, ac.AVG]
KINDS = ["all_gather"] * 3 + ["reduce_scatter"] * 3 + ["all_reduce"] * 3 + ["broadcast"] * 2 + ["reduce"] * 2 + \
    ["all_to_all"] * 2 + ["all_to_allv"] * 2 + ["p2p"] * 3 + ["group"] * 2 + ["barrier", "split", "bad", "bad_self"]
SENTINEL = 77
NOCOLOR = -1  # ATTN_SPLIT_NOCOLOR


def pick_count(rnd, large=True):
    x = rnd.random()
    if x < 0.1:
        return 0
    if x < 0.2:
        return 1
    if x < 0.7 or not large:
        return rnd.randint(2, 300)
    if x < 0.96:
        return rnd.randint(1000, 40000)
    return rnd.randint(100000, 300000)


def values(key, r, count, dtype, op=ac.SUM, nranks=1):
    """Rank r's input for the call named by key (a list of ints): small
    integers, so every reduction is exact in every type. AVG inputs are a
    common base plus offsets that sum to zero over the ranks."""
    dt = np.dtype(dtype)
    unsigned = dt.kind == "u"
    rng = np.random.default_rng(key + [r])
    if op == ac.AVG:
        base = np.random.default_rng(key + [999]).integers(10 if unsigned else -20, 40 if unsigned else 21, count)
        offs = [np.random.default_rng(key + [1000 + q]).integers(-2, 3, count) for q in range(nranks)]
        offs[0] = -sum(offs[1:]) if nranks > 1 else np.zeros(count, np.int64)
        return (base + offs[r]).astype(dt)
    if op == ac.PROD:
        return rng.choice([1, 2] if unsigned else [-1, 1, 2], count).astype(dt)
    if op in (ac.MAX, ac.MIN):
        return rng.integers(0 if unsigned else -100, 101, count).astype(dt)
    return rng.integers(0 if unsigned else -3, 4, count).astype(dt)


def reduced(parts, op, dtype):
    a = np.stack([p.astype(np.float64) for p in parts]) if parts else np.zeros((0, 0))
    out = {ac.SUM: a.sum(0), ac.PROD: a.prod(0), ac.MAX: a.max(0), ac.MIN: a.min(0),
           ac.AVG: a.sum(0) / len(parts)}[op]
    return out.astype(np.int64).astype(dtype) if np.dtype(dtype).kind in "iu" else out.astype(dtype)


def layout_with_gaps(rnd, counts):
    """Displacements for blocks of `counts` in a random order with random
    gaps between them; returns (displs, total)."""
    order = list(range(len(counts)))
    rnd.shuffle(order)
    displs, at = [0] * len(counts), 0
    for p in order:
        at += rnd.choice([0, 0, 1, 5])
        displs[p] = at
        at += counts[p]
    return displs, at + rnd.choice([0, 3])


def make_group_ops(rnd, n, msgs):
    """Each rank's sends and receives of msgs [(src, dst, count, dtype)] in a
    random interleaving that keeps the order of messages between each pair."""
    per_rank = []
    for r in range(n):
        queues = {}
        for i, (src, dst, _, _) in enumerate(msgs):
            if src == r:
                queues.setdefault(("send", dst), []).append(i)
            if dst == r:
                queues.setdefault(("recv", src), []).append(i)
        ops = []
        keys = sorted(queues)
        while keys:
            key = rnd.choice(keys)
            ops.append((key[0], queues[key].pop(0)))
            if not queues[key]:
                keys.remove(key)
        per_rank.append(ops)
    return per_rank


def make_call(rnd, n, allow_split=True, queued=False):
    """One call, the same on every rank. queued: for non-blocking
    communicators, where a failure of a queued call is the communicator's
    sticky async error: no call that fails after it was queued."""
    kind = rnd.choice(KINDS)
    if kind == "split" and not allow_split:
        kind = "all_reduce"
    if kind == "bad_self" and queued:
        kind = "p2p"
    c = {"kind": kind, "dtype": rnd.randrange(len(DTYPES)), "op": rnd.choice(OPS), "count": pick_count(rnd),
         "root": rnd.randrange(n), "in_place": rnd.random() < 0.3}
    if kind == "all_to_allv":
        c["counts"] = [[pick_count(rnd, large=rnd.random() < 0.2) for _ in range(n)] for _ in range(n)]
        c["send_layout"] = [layout_with_gaps(rnd, c["counts"][r]) for r in range(n)]
        c["recv_layout"] = [layout_with_gaps(rnd, [c["counts"][q][r] for q in range(n)]) for r in range(n)]
    elif kind in ("p2p", "bad_self"):
        msgs = []
        for _ in range(rnd.randint(1, 2 * n)):
            msgs.append((rnd.randrange(n), rnd.randrange(n), pick_count(rnd, large=rnd.random() < 0.1),
                         rnd.randrange(len(DTYPES))))
        c["msgs"] = msgs
        c["ops"] = make_group_ops(rnd, n, msgs)
        c["bad_rank"] = rnd.randrange(n)
    elif kind == "group":
        c["parts"] = [make_call(rnd, n, False, queued) for _ in range(rnd.randint(1, 3))]
        c["parts"] = [p for p in c["parts"] if p["kind"] in ("all_gather", "reduce_scatter", "all_reduce",
                                                             "broadcast", "reduce", "all_to_all", "p2p")]
    elif kind == "split":
        c["colors"] = [rnd.choice([0, 1, 1, NOCOLOR]) for _ in range(n)]
        c["keys"] = [rnd.randint(-2, 2) for _ in range(n)]
        c["inner"] = {color: make_call(rnd, c["colors"].count(color), False, queued)
                      for color in (0, 1) if color in c["colors"]}  # a call for each new communicator
    elif kind == "bad":
        c["bad_kind"] = rnd.randrange(5)
        c["bad_rank"] = rnd.randrange(n) if CHECKED and not queued and rnd.random() < 0.7 else None  # None: all
    return c


class Outcome:
    """What one call left to check once the group (if any) has run."""

    def __init__(self):
        self.checks = []

    def expect(self, got, want, what):
        self.checks.append((got, want, what))

    def verify(self, comm, what):
        comm.wait(120)  # a non-blocking communicator's calls have run (at once on a blocking one)
        for got, want, w in self.checks:
            np.testing.assert_array_equal(got, want, err_msg=f"{what}: {w}")
        return len(self.checks)


def post_collective(comm, r, n, c, key, out):
    """Issues collective c on this rank and records what its result must be."""
    dt = DTYPES[c["dtype"]]
    cnt, op, root = c["count"], c["op"], c["root"]
    kind = c["kind"]
    if kind == "all_gather":
        recv = np.full(cnt * n, SENTINEL, dt)
        mine = values(key, r, cnt, dt)
        if c["in_place"]:
            recv[r * cnt:(r + 1) * cnt] = mine
            send = recv[r * cnt:(r + 1) * cnt]
        else:
            send = mine
        comm.all_gather(send, recv)
        out.expect(recv, np.concatenate([values(key, q, cnt, dt) for q in range(n)]), "all_gather")
        return [send, recv]
    if kind == "reduce_scatter":
        send = values(key, r, cnt * n, dt, op, n)
        recv = send[r * cnt:(r + 1) * cnt] if c["in_place"] else np.full(cnt, SENTINEL, dt)
        comm.reduce_scatter(send, recv, op=op)
        want = reduced([values(key, q, cnt * n, dt, op, n) for q in range(n)], op, dt)[r * cnt:(r + 1) * cnt]
        out.expect(recv, want, f"reduce_scatter op {op}")
        return [send, recv]
    if kind == "all_reduce":
        send = values(key, r, cnt, dt, op, n)
        recv = send if c["in_place"] else np.full(cnt, SENTINEL, dt)
        comm.all_reduce(send, recv, op=op)
        out.expect(recv, reduced([values(key, q, cnt, dt, op, n) for q in range(n)], op, dt), f"all_reduce op {op}")
        return [send, recv]
    if kind == "broadcast":
        recv = np.full(cnt, SENTINEL, dt)
        send = None
        if r == root:
            if c["in_place"]:
                recv[:] = values(key, root, cnt, dt)
                send = recv
            else:
                send = values(key, root, cnt, dt)
        comm.broadcast(send, recv, root=root)
        out.expect(recv, values(key, root, cnt, dt), f"broadcast root {root}")
        return [send, recv]
    if kind == "reduce":
        # In place every rank passes send as recv; out of place the
        # non-roots pass none. Only the root's buffer changes.
        send = values(key, r, cnt, dt, op, n)
        recv = send if c["in_place"] else (np.full(cnt, SENTINEL, dt) if r == root else None)
        comm.reduce(send, recv, op=op, root=root)
        if r == root:
            out.expect(recv, reduced([values(key, q, cnt, dt, op, n) for q in range(n)], op, dt), f"reduce op {op}")
        else:
            out.expect(send, values(key, r, cnt, dt, op, n), f"reduce op {op}: a non-root's send")
        return [send, recv]
    if kind == "all_to_all":
        send = values(key, r, cnt * n, dt)
        recv = np.full(cnt * n, SENTINEL, dt)
        comm.all_to_all(send, recv)
        out.expect(recv, np.concatenate([values(key, q, cnt * n, dt)[r * cnt:(r + 1) * cnt] for q in range(n)]),
                   "all_to_all")
        return [send, recv]
    if kind == "all_to_allv":
        counts = c["counts"]
        sd, stotal = c["send_layout"][r]
        rd, rtotal = c["recv_layout"][r]
        send = values(key, r, stotal, dt)
        recv = np.full(rtotal, SENTINEL, dt)
        comm.all_to_allv(send, counts[r], sd, recv, [counts[q][r] for q in range(n)], rd)
        want = np.full(rtotal, SENTINEL, dt)
        for q in range(n):
            qsd, qtotal = c["send_layout"][q]
            block = values(key, q, qtotal, dt)[qsd[r]:qsd[r] + counts[q][r]]
            want[rd[q]:rd[q] + counts[q][r]] = block
        out.expect(recv, want, "all_to_allv")
        return [send, recv]
    if kind == "p2p":
        held = []
        for what, i in c["ops"][r]:
            src, dst, mcnt, mdt = c["msgs"][i]
            if what == "send":
                buf = values(key + [i], src, mcnt, DTYPES[mdt])
                comm.send(buf, dst)
            else:
                buf = np.full(mcnt, SENTINEL, DTYPES[mdt])
                comm.recv(buf, src)
                out.expect(buf, values(key + [i], src, mcnt, DTYPES[mdt]), f"message {i} from rank {src}")
            held.append(buf)
        return held
    raise AssertionError(f"not a collective: {kind}")


def run_call(comm, r, n, c, key, what):
    """Runs call c on this rank; returns how many results it checked."""
    kind = c["kind"]
    if kind == "barrier":
        comm.barrier()
        return 0
    if kind == "p2p":
        out = Outcome()
        ac.group_start()
        try:
            held = post_collective(comm, r, n, c, key, out)
        finally:
            ac.group_end()
        del held
        return out.verify(comm, what)
    if kind == "group":
        out = Outcome()
        held = []
        ac.group_start()
        try:
            for j, part in enumerate(c["parts"]):
                held += post_collective(comm, r, n, part, key + [j], out)
        finally:
            ac.group_end()
        return out.verify(comm, what)
    if kind == "split":
        color, mykey = c["colors"][r], c["keys"][r]
        sub = comm.split(color, mykey)
        if sub is not None:
            sub.wait(120)
        if color == NOCOLOR:
            assert sub is None, f"{what}: NOCOLOR gave a communicator"
            return 0
        members = sorted((c["keys"][q], q) for q in range(n) if c["colors"][q] == color)
        try:
            assert (sub.rank, sub.size) == ([q for _, q in members].index(r), len(members)), \
                f"{what}: split rank/size {(sub.rank, sub.size)}, members {members}"
            got = np.zeros(len(members), np.int64)
            sub.all_gather(np.array([r], np.int64), got)
            sub.wait(120)
            np.testing.assert_array_equal(got, [q for _, q in members], err_msg=f"{what}: parent ranks in order")
            return 1 + run_call(sub, sub.rank, sub.size, c["inner"][color], key + [color], what + " (inside the split)")
        finally:
            sub.destroy()
    if kind == "bad":
        return run_bad(comm, r, n, c, what)
    if kind == "bad_self":
        return run_bad_self(comm, r, n, c, key, what)
    out = Outcome()
    held = post_collective(comm, r, n, c, key, out)
    del held
    return out.verify(comm, what)


def expect_error(code, fn, what):
    try:
        fn()
    except ac.AttnError as e:
        assert e.code == code, f"{what}: got {e}, wanted code {code}"
        return
    raise AssertionError(f"{what}: succeeded, wanted code {code}")


def run_bad(comm, r, n, c, what):
    """A bad call on every rank, or with signature checks on one rank only
    (the others make the call right): it fails everywhere."""
    if c.get("bad_rank") is not None and n > 1 and r != c["bad_rank"]:
        x = np.zeros(max(2, c["count"]), np.float32)
        y = np.zeros(x.size * n, np.float32)
        calls = [lambda: comm.all_reduce(x, x), lambda: comm.broadcast(x, x, root=0),
                 lambda: comm.all_gather(x, y), lambda: comm.reduce_scatter(y, x),
                 lambda: comm.reduce(x, x, root=0)]
        try:
            calls[c["bad_kind"]]()
        except ac.AttnError as e:
            assert e.code == ac.REMOTE_ERROR and f"rank {c['bad_rank']} could not take part" in str(e), \
                f"{what}: {e}"
            return 0
        raise AssertionError(f"{what}: succeeded though rank {c['bad_rank']} refused its arguments")
    x = np.zeros(max(2, c["count"]), np.float32)  # 2+: the misplaced all-gather below overlaps
    y = np.zeros(x.size * (n + 1), np.float32)
    k = c["bad_kind"] if n > 1 else 0  # one rank: no misplaced overlap to make
    if k == 0:
        expect_error(ac.INVALID_ARGUMENT, lambda: comm.all_reduce(x, x, op=99), what + ": op 99")
    elif k == 1:
        expect_error(ac.INVALID_ARGUMENT, lambda: comm.broadcast(x, x, root=n), what + f": root {n}")
    elif k == 2:
        expect_error(ac.INVALID_ARGUMENT, lambda: comm.all_gather(y[r * x.size + 1:(r + 1) * x.size + 1], y[:n * x.size]), what + ": misplaced in place")
    elif k == 3:
        expect_error(ac.INVALID_ARGUMENT, lambda: comm.reduce_scatter(y, y[:x.size], op=-1), what + ": op -1")
    else:
        expect_error(ac.INVALID_ARGUMENT, lambda: comm.reduce(x, x, root=-1), what + ": root -1")
    return 0


def run_bad_self(comm, r, n, c, key, what):
    """A group of messages where one rank also sends to itself without the
    receive: that rank fails with attnInvalidUsage, every message between
    ranks still arrives, and the communicator stays usable."""
    out = Outcome()
    ac.group_start()
    failed = None
    try:
        held = post_collective(comm, r, n, dict(c, kind="p2p"), key, out)
        if r == c["bad_rank"]:
            held.append(np.ones(3, np.int32))
            comm.send(held[-1], r)
    finally:
        try:
            ac.group_end()
        except ac.AttnError as e:
            failed = e
    if r == c["bad_rank"]:
        assert failed is not None and failed.code == ac.INVALID_USAGE, f"{what}: unmatched send to self gave {failed}"
        out.checks = [ch for ch in out.checks if not ch[2].endswith(f"rank {r}")]  # its own self messages
    else:
        assert failed is None, f"{what}: {failed}"
    return out.verify(comm, what)


def run_sequence(comm, r, n, seed, iters, queued=False):
    rnd = random.Random(seed * 1000 + n)
    checked = 0
    for it in range(iters):
        c = make_call(rnd, n, queued=queued)
        what = f"seed {seed}, {n} ranks, call {it} ({c['kind']}), rank {r}"
        if os.environ.get("ATTN_FUZZ_TRACE"):
            print(what, c, flush=True)
        checked += run_call(comm, r, n, c, [seed, n, it], what)
        comm.barrier()  # in step whatever happened
    return checked


CHECKED = os.environ.get("ATTN_CHECK") == "1"  # collectives compare signatures (read at init)


def seeds():
    return [int(s) for s in os.environ.get("ATTN_FUZZ_SEEDS", "1,2,3").split(",")]


def iters():
    return int(os.environ.get("ATTN_FUZZ_ITERS", "60"))


# Fabrics for the process runs: two emulated hosts (shm inside, tcp across),
# pipelines cut into small chunks and small shared-memory rings, so the
# algorithms' chunking and the hierarchical paths run at modest sizes.
FABRICS = [
    {"ATTN_ALGO": "hier", "ATTN_ALLTOALL": "stepped", "ATTN_CHUNK_SIZE": "16384"},
    {"ATTN_ALGO": "ring", "ATTN_ALLTOALL": "concurrent", "ATTN_SHM_SLOTS": "2", "ATTN_SHM_SLOT_BYTES": "4096"},
    {"ATTN_ALGO": "direct", "ATTN_CHUNK_SIZE": "65536", "ATTN_TCP_NSOCKS": "3", "ATTN_TCP_STRIPE_MIN": "4096",
     "ATTN_CHECK": "1"},
]


class CollFuzz(unittest.TestCase):
    def test_random_collectives_on_threads(self):
        for seed in seeds():
            for n in (2, 3, 4):
                with self.subTest(seed=seed, nranks=n):
                    comms = ac.Comm.init_all(n)
                    checked = [0] * n

                    def body(r, comm):
                        checked[r] = run_sequence(comm, r, n, seed, iters())

                    try:
                        on_ranks(comms, body)
                    finally:
                        for c in comms:
                            c.destroy()
                    self.assertGreater(sum(checked), 0)

    def test_random_collectives_on_non_blocking_threads(self):
        """Non-blocking communicators: calls are queued and run on the
        communicator's executor; results are checked after wait()."""
        for seed in seeds():
            for n in (2, 3):
                with self.subTest(seed=seed, nranks=n):
                    uid = ac.UniqueId()
                    comms = [None] * n
                    checked = [0] * n

                    def body(r, _):
                        comms[r] = ac.Comm.init_rank(n, uid, r, blocking=False)
                        comms[r].wait(120)
                        checked[r] = run_sequence(comms[r], r, n, seed, iters(), queued=True)
                        comms[r].wait(120)

                    try:
                        on_ranks(comms, body)
                    finally:
                        for c in comms:
                            if c is not None:
                                c.destroy()
                    self.assertGreater(sum(checked), 0)

    def test_random_collectives_with_signature_checks(self):
        """The thread runs again with ATTN_CHECK=1 (bad arguments on one rank
        only among them), in a process of their own: the variable is read
        when a communicator is made."""
        env = dict(os.environ, ATTN_CHECK="1")
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "CollFuzz.test_random_collectives_on_threads"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout.decode(errors="replace")[-4000:])

    def test_random_collectives_on_processes_over_two_hosts(self):
        n = 4
        for fabric, seed in ((f, s) for f in FABRICS for s in seeds()):
            with self.subTest(fabric=fabric, seed=seed):
                uid = ac.UniqueId().bytes().hex()
                kids = []
                for r in range(n):
                    env = dict(os.environ, **fabric, ATTN_HOSTID=f"fuzzhost{r % 2}")
                    args = [sys.executable, os.path.abspath(__file__), "--rank",
                            json.dumps({"uid": uid, "rank": r, "nranks": n, "seed": seed, "iters": iters()})]
                    kids.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
                outputs = []
                for p in kids:
                    try:
                        text, _ = p.communicate(timeout=240)
                    except subprocess.TimeoutExpired:
                        for k in kids:
                            k.kill()
                        text, _ = p.communicate()
                    outputs.append((p.returncode, text.decode(errors="replace")))
                for r, (code, text) in enumerate(outputs):
                    self.assertEqual(code, 0, f"rank {r} ({fabric}):\n{text[-4000:]}")
                    self.assertIn(f"rank {r}: ", text)
                    if os.environ.get("ATTN_FUZZ_TRACE"):
                        print(text)


def rank_main(spec):
    """One rank of the process runs: exits 0 when every call checked out."""
    s = json.loads(spec)
    with ac.Comm.init_rank(s["nranks"], ac.UniqueId(bytes.fromhex(s["uid"])), s["rank"]) as comm:
        checked = run_sequence(comm, s["rank"], s["nranks"], s["seed"], s["iters"])
    print(f"rank {s['rank']}: {checked} results checked")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2])
    else:
        unittest.main()
