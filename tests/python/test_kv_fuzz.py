#!/usr/bin/env python3
"""Random sequences of distributed-KV-cache calls on three ranks (threads),
through the C API: appends (some with bad sizes, ids or positions),
releases, placement queries, migrations (some with bad moves), attention
(some naming unknown or repeated requests, some with requests that have no
query rows) and rebalancing (some with a bad model).

What must hold whatever the sequence: bad input fails with an error, never a
crash or a hang; a collective that fails, fails on every rank and leaves the
communicator in step for the next call; the pool's books stay consistent;
and every attention that succeeds equals a float64 numpy reference over the
tokens this rank appended to each request, wherever migration moved them.

Seeds are fixed (ATTN_FUZZ_SEEDS="1,2,..." and ATTN_FUZZ_ITERS widen the
search). Exit 77 (skipped) without numpy."""
import ctypes
import os
import random
import sys
import unittest

from rank_threads import on_ranks  # first: the path to python/ and the test timeout

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipped")
    sys.exit(77)

import attncomm as ac  # noqa: E402
from attn_reference import attention_at_positions  # noqa: E402

N, BT, HKV, D, HQ, CAP = 3, 4, 2, 8, 4, 24
IDS = [1, 2, 3, 7, -5, 2**62]
_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)


class Rank:
    """One rank's random calls and what it knows it appended."""

    def __init__(self, rank, seed, tc):
        self.rank, self.rnd, self.tc = rank, random.Random(seed * 1009 + rank), tc
        self.tokens = {}  # req -> (k, v, pos) appended and not released
        self.checked = 0

    def local_calls(self, pool):
        for _ in range(self.rnd.randint(0, 3)):
            op, req = self.rnd.random(), self.rnd.choice(IDS)
            if op < 0.6:
                self.append(pool, req)
            elif op < 0.75:
                rc = ac._KvRelease(pool._h, req, None)
                if rc == ac.SUCCESS:
                    self.tokens.pop(req, None)
                else:
                    self.tc.assertNotIn(req, self.tokens, "releasing a live request failed")
            else:
                holders, tokens = np.zeros(N, np.int64), ctypes.c_int64()
                rc = ac._KvGetPlacement(pool._h, req, holders.ctypes.data_as(_i64p), ctypes.byref(tokens))
                if req in self.tokens:
                    self.tc.assertEqual(rc, ac.SUCCESS)
                    self.tc.assertEqual(tokens.value, len(self.tokens[req][2]))
                    self.tc.assertEqual(int(holders.sum()), -(-tokens.value // BT))

    def append(self, pool, req):
        n = self.rnd.choice([0, 1, 3, 5, 9, -1])
        rows = max(n, 1)
        k = np.random.default_rng(self.rnd.getrandbits(32)).uniform(-1, 1, (rows, HKV, D)).astype(np.float32)
        v = np.random.default_rng(self.rnd.getrandbits(32)).uniform(-1, 1, (rows, HKV, D)).astype(np.float32)
        old = self.tokens.get(req)
        start = int(old[2][-1]) + 1 if old is not None else 0
        pos = np.arange(start, start + rows, dtype=np.int32)
        if self.rnd.random() < 0.2 and rows > 1:
            pos[[0, 1]] = pos[[1, 0]]  # not increasing
        if self.rnd.random() < 0.1:
            pos[:] = -3
        rc = ac._KvAppend(pool._h, req, k.ctypes.data, v.ctypes.data, pos.ctypes.data_as(_i32p), n, None)
        if rc != ac.SUCCESS or n <= 0:
            return
        if old is None:
            self.tokens[req] = (k[:n], v[:n], pos[:n])
        else:
            self.tokens[req] = tuple(np.concatenate([a, b[:n]]) for a, b in zip(old, (k, v, pos)))

    def migrate(self, pool, bad):
        moves = []
        for _ in range(self.rnd.randint(0, 3)):
            if bad:
                dst = self.rnd.choice([x for x in range(N) if x != self.rank] + [self.rank, -1, N])
                owner = self.rnd.choice([self.rank, dst, (self.rank + 2) % N])
                moves.append((self.rank, dst, owner, self.rnd.choice(IDS), self.rnd.choice([0, 1, 2, 5, -1])))
            elif self.tokens:
                dst = self.rnd.choice([x for x in range(N) if x != self.rank])
                moves.append((self.rank, dst, self.rank, self.rnd.choice(sorted(self.tokens)), 1))
        try:
            pool.migrate(moves)
        except ac.AttnError:
            pass

    def attention(self, pool):
        reqs = [r for r in sorted(self.tokens) if self.rnd.random() < 0.7]
        if self.rnd.random() < 0.03:
            reqs.append(reqs[0] if reqs else 99)  # repeated or unknown
        rows = [self.rnd.choice([0, 0, 1, 2]) for _ in reqs]
        offs = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
        q = np.random.default_rng(self.rnd.getrandbits(32)).uniform(-1, 1, (int(offs[-1]), HQ, D)).astype(np.float32)
        qpos = np.array([self.rnd.randint(-2, 40) for _ in range(int(offs[-1]))], np.int32)
        causal = self.rnd.random() < 0.7
        try:
            out, lse = pool.attention(reqs, offs, q, q_pos=qpos, causal=causal)
        except ac.AttnError:
            return
        for i, req in enumerate(reqs):
            k, v, kpos = self.tokens[req]
            a, b = int(offs[i]), int(offs[i + 1])
            ro, rl = attention_at_positions(q[a:b], qpos[a:b], k, v, kpos, causal)
            np.testing.assert_allclose(out[a:b], ro, atol=2e-5, rtol=1e-4, err_msg=f"rank {self.rank} req {req}")
            np.testing.assert_allclose(lse[a:b], rl, atol=2e-5, rtol=1e-5, err_msg=f"rank {self.rank} req {req}")
            self.checked += b - a

    def rebalance(self, pool, bad):
        model = {"nonattn_us_base": 100.0, "nonattn_us_per_req": 10.0, "attn_us_per_block": 5.0}
        if bad:
            model["attn_us_per_block"] = self.rnd.choice([-1.0, float("nan")])
        try:
            pool.rebalance(model, self.rnd.choice([0, 1, 3]), self.rnd.choice([0, 1, 2]))
        except ac.AttnError:
            pass


class KvFuzz(unittest.TestCase):
    def run_seed(self, seed, iters):
        shared = random.Random(seed)
        plan = [(shared.random(), shared.random() < 0.1) for _ in range(iters)]  # the same on every rank
        comms = ac.Comm.init_all(N)
        ranks = [Rank(r, seed, self) for r in range(N)]

        def body(r, comm):
            me = ranks[r]
            with comm.kv_pool(BT, HKV, D, ac.FLOAT32, CAP) as pool:
                for which, bad in plan:
                    me.local_calls(pool)
                    stats = pool.stats()
                    self.assertTrue(0 <= stats["used_blocks"] <= stats["capacity_blocks"], stats)
                    self.assertEqual(stats["num_requests"], len(me.tokens))
                    comm.barrier()  # in step: a failed call left nothing behind
                    if which < 0.45:
                        me.migrate(pool, bad)
                    elif which < 0.85:
                        me.attention(pool)
                    else:
                        me.rebalance(pool, bad)
                    self.assertEqual(comm.async_error(), ac.SUCCESS, comm.last_error())

        try:
            on_ranks(comms, body)
        finally:
            for c in comms:
                c.destroy()
        self.assertGreater(sum(r.checked for r in ranks), 0, "no attention call succeeded")

    def test_random_call_sequences(self):
        seeds = [int(s) for s in os.environ.get("ATTN_FUZZ_SEEDS", "1,2,3,4,5,6").split(",")]
        iters = int(os.environ.get("ATTN_FUZZ_ITERS", "200"))
        for seed in seeds:
            with self.subTest(seed=seed):
                self.run_seed(seed, iters)


if __name__ == "__main__":
    unittest.main()
