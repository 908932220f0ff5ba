#!/usr/bin/env python3
"""The C API from Python (python/attncomm, ctypes + numpy): collectives
and ring attention on host memory, the distributed KV cache (pool, moves,
attention over lent blocks, the planner), ranks as threads and as processes,
and errors as exceptions with the library's text. Attention is checked against
an independent float64 numpy reference. Exit 77 (skipped) without numpy."""
import os
import sys
import threading
import unittest

from rank_threads import on_ranks  # first: the path to python/ and the test timeout

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipped")
    sys.exit(77)

import attncomm as ac  # noqa: E402
from attn_reference import exact_attention  # noqa: E402


def random_batch(rng, new_lens, cached_lens, hq, hkv, d, dtype):
    new_rows = sum(new_lens)
    full_rows = sum(t + p for t, p in zip(new_lens, cached_lens))
    q = rng.uniform(-1, 1, (new_rows, hq, d)).astype(dtype)
    k = rng.uniform(-1, 1, (full_rows, hkv, d)).astype(dtype)
    v = rng.uniform(-1, 1, (full_rows, hkv, d)).astype(dtype)
    return q, k, v


class Collectives(unittest.TestCase):
    def test_every_collective_on_threads(self):
        for n in (1, 2, 3, 4):
            comms = ac.Comm.init_all(n)
            count = 7

            def body(r, c):
                self.assertEqual((c.rank, c.size, c.device), (r, n, ac.DEVICE_HOST))
                x = np.arange(count, dtype=np.float32) + 100 * r
                y = np.zeros(count * n, np.float32)
                c.all_gather(x, y)
                np.testing.assert_array_equal(
                    y, np.concatenate([np.arange(count, dtype=np.float32) + 100 * q for q in range(n)]))
                s = np.zeros(count, np.float64)
                c.all_reduce(np.full(count, r + 1.0), s, op=ac.SUM)
                np.testing.assert_array_equal(s, np.full(count, n * (n + 1) / 2))
                rs = np.zeros(count, np.int64)
                c.reduce_scatter(np.arange(count * n, dtype=np.int64), rs, op=ac.MAX)
                np.testing.assert_array_equal(rs, np.arange(count * r, count * (r + 1)))
                b = np.full(count, -1, np.int32)
                c.broadcast(np.arange(count, dtype=np.int32) if r == n - 1 else None, b, root=n - 1)
                np.testing.assert_array_equal(b, np.arange(count, dtype=np.int32))
                red = np.full(count, -1.0, np.float32) if r == 0 else None  # only the root passes recv
                c.reduce(np.arange(count, dtype=np.float32) * (r + 1), red, op=ac.SUM, root=0)
                if r == 0:
                    np.testing.assert_array_equal(red, np.arange(count, dtype=np.float32) * (n * (n + 1) / 2))
                a = np.repeat(np.arange(n, dtype=np.float16) + 10 * r, count)
                t = np.zeros_like(a)
                c.all_to_all(a, t)
                np.testing.assert_array_equal(t, np.repeat(10 * np.arange(n, dtype=np.float16) + r, count))
                if n > 1:  # a ring shift in one group
                    got = np.zeros(count, np.uint8)
                    ac.group_start()
                    c.send(np.full(count, r, np.uint8), (r + 1) % n)
                    c.recv(got, (r - 1) % n)
                    ac.group_end()
                    np.testing.assert_array_equal(got, np.full(count, (r - 1) % n, np.uint8))
                c.barrier()

            try:
                on_ranks(comms, body)
            finally:
                for c in comms:
                    c.destroy()

    def test_all_to_allv_and_split(self):
        n = 4
        comms = ac.Comm.init_all(n)

        def body(r, c):
            # rank r sends p + r + 1 elements, valued 100 r + p, to rank p
            send_counts = [p + r + 1 for p in range(n)]
            send_displs = np.concatenate([[0], np.cumsum(send_counts)[:-1]]).tolist()
            send = np.concatenate([np.full(k, 100 * r + p, np.int32) for p, k in enumerate(send_counts)])
            recv_counts = [r + q + 1 for q in range(n)]
            recv_displs = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).tolist()
            recv = np.full(sum(recv_counts), -1, np.int32)
            c.all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs)
            want = np.concatenate([np.full(k, 100 * q + r, np.int32) for q, k in enumerate(recv_counts)])
            np.testing.assert_array_equal(recv, want)
            # even and odd ranks apart, reversed by key
            sub = c.split(r % 2, -r)
            try:
                self.assertEqual((sub.size, sub.rank), (2, 1 - r // 2))
                x = np.array([r], np.int64)
                y = np.zeros(2, np.int64)
                sub.all_gather(x, y)
                np.testing.assert_array_equal(y, sorted([r, r + 2] if r < 2 else [r - 2, r], reverse=True))
            finally:
                sub.destroy()

        try:
            on_ranks(comms, body)
        finally:
            for c in comms:
                c.destroy()

    def test_shrink_after_a_rank_aborts(self):
        n = 3
        comms = ac.Comm.init_all(n)
        lost = 1

        def body(r, c):
            if r == lost:
                c.abort()  # this rank is gone; its peers' next collective fails
                return
            with self.assertRaises(ac.AttnError):
                c.all_reduce(np.ones(1000, np.float32), np.zeros(1000, np.float32))
            small = c.shrink([lost], abort=True)
            try:
                self.assertEqual((small.size, small.rank), (2, 0 if r == 0 else 1))
                s = np.zeros(8, np.float64)
                small.all_reduce(np.full(8, r + 1.0), s)
                np.testing.assert_array_equal(s, np.full(8, 1.0 + 3.0))
            finally:
                small.destroy()
                c.abort()

        on_ranks(comms, body)

    def test_kv_pool_follows_a_shrink(self):
        n = 3
        comms = ac.Comm.init_all(n)
        lost = 2
        bt, hkv, d = 4, 2, 8

        def tokens(owner, req, count):
            rng = np.random.default_rng(1000 * owner + req)
            return (rng.standard_normal((count, hkv, d)).astype(np.float32),
                    rng.standard_normal((count, hkv, d)).astype(np.float32), np.arange(count, dtype=np.int32))

        def body(r, c):
            pool = ac.KvPool(c, bt, hkv, d, np.float32, 32)
            k, v, pos = tokens(r, 10 + r, 3 * bt)
            pool.append(10 + r, k, v, pos)
            # Rank 0 lends a block to rank 1 and one to rank 2 (the one lost).
            pool.migrate([(0, 1, 0, 10, 1), (0, 2, 0, 10, 1)] if r == 0 else [])
            if r == lost:
                pool.close()
                c.abort()
                return
            small = c.shrink([lost], abort=True)
            self.assertEqual(pool.shrink(small), [10] if r == 0 else [])
            c.abort()
            try:
                st = pool.stats()
                self.assertEqual((st["num_requests"], st["lent_in_blocks"]), (0, 0) if r == 0 else (1, 0))
                pool.migrate([])  # collectives run on the new communicator
            finally:
                pool.close()
                small.destroy()

        on_ranks(comms, body)

    def test_ranks_as_processes_meet_through_a_unique_id(self):
        n = 3
        uid = ac.UniqueId()
        raw = uid.bytes()
        self.assertEqual(len(raw), 128)
        kids = []
        for r in range(n):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    with ac.Comm.init_rank(n, ac.UniqueId(raw), r, timeout_ms=60000) as c:
                        x = np.full(4, r + 1, np.int32)
                        c.all_reduce(x, x)
                        code = 0 if (x == n * (n + 1) // 2).all() else 3
                finally:
                    os._exit(code)
            kids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in kids]
        self.assertEqual(codes, [0] * n)


class NonBlocking(unittest.TestCase):
    def test_calls_queue_and_wait_reports_their_results(self):
        """blocking=False: creation and calls return at once, wait() runs
        them out; temporaries passed to queued calls (in and out of groups)
        stay alive until then; a queued call that fails raises from wait()
        with the library's text, on the rank it failed on."""
        n = 3
        uid = ac.UniqueId()
        comms = [None] * n
        count = 50000

        def body(r, _):
            c = ac.Comm.init_rank(n, uid, r, blocking=False, timeout_ms=30000)
            comms[r] = c
            c.wait(60)
            s = np.zeros(count, np.float64)
            for _ in range(3):  # queued one after another, inputs are temporaries
                c.all_reduce(np.full(count, r + 1.0), s)
            g = np.zeros(4 * n, np.int32)
            c.all_gather(np.arange(4, dtype=np.int32) + 10 * r, g)
            got = np.zeros(1000, np.int32)
            ac.group_start()
            c.send(np.full(1000, r, np.int32), (r + 1) % n)
            c.recv(got, (r - 1) % n)
            ac.group_end()
            c.wait(60)
            np.testing.assert_array_equal(s, np.full(count, n * (n + 1) / 2))
            np.testing.assert_array_equal(g, np.concatenate([np.arange(4) + 10 * q for q in range(n)]))
            np.testing.assert_array_equal(got, np.full(1000, (r - 1) % n))
            # Rank 1 receives a message shorter than it asked for: only it fails.
            if r == 0:
                c.send(np.ones(4, np.float32), 1)
            elif r == 1:
                c.recv(np.zeros(8, np.float32), 0)
            if r == 1:
                with self.assertRaises(ac.AttnError) as e:
                    c.wait(60)
                self.assertEqual(e.exception.code, ac.INVALID_USAGE)
                self.assertIn("expected 32 bytes but 16 arrived", str(e.exception))
            else:
                c.wait(60)

        try:
            on_ranks([None] * n, body)
        finally:
            for c in comms:
                if c is not None:
                    c.destroy()


class RingAttention(unittest.TestCase):
    def check_modes(self, n, dtype, tol, new_lens, cached_lens, hq=4, hkv=2, d=32):
        rng = np.random.default_rng(n * 1000 + sum(new_lens))
        q, k, v = random_batch(rng, new_lens, cached_lens, hq, hkv, d, dtype)
        ref_o, ref_lse = exact_attention(q, k, v, new_lens, cached_lens)
        shards = ac.plan_prefill(new_lens, n, cached_lens)
        comms = ac.Comm.init_all(n)
        modes = (ac.MODE_PASS_KV, ac.MODE_PASS_Q, ac.MODE_SHIP_Q, ac.MODE_AUTO, ac.MODE_HEAD_PARALLEL,
                 ac.MODE_ALL_GATHER_KV)

        def body(r, c):
            s = shards[r]
            qi, ki = np.array(s.q_index, np.int64), np.array(s.kv_index, np.int64)
            mq, mk, mv = (np.ascontiguousarray(a) for a in (q[qi], k[ki], v[ki]))
            for mode in modes:
                out = np.full_like(mq, np.nan)
                lse = np.full((len(qi), hq), np.nan, np.float32)
                c.ring_attention(mq, mk, mv, out, s.layout, hq, hkv, d, lse=lse, mode=mode)
                scale = np.abs(ref_o[qi]).max(initial=1e-30)
                err = np.abs(out.astype(np.float64) - ref_o[qi]).max(initial=0) / scale
                lerr = np.abs(lse - ref_lse[qi]).max(initial=0)
                self.assertLess(err, tol, f"rank {r} of {n}, mode {mode}, {np.dtype(dtype).name}: out")
                self.assertLess(lerr, tol, f"rank {r} of {n}, mode {mode}, {np.dtype(dtype).name}: lse")

        try:
            on_ranks(comms, body)
        finally:
            for c in comms:
                c.destroy()

    def test_prefill_every_mode_equals_exact_attention(self):
        for n in (1, 2, 3, 4):
            self.check_modes(n, np.float32, 1e-4, [67, 30], [0, 0])

    def test_partial_prefill_with_cached_tokens(self):
        for n in (2, 4):
            self.check_modes(n, np.float32, 1e-4, [9, 40, 1], [120, 33, 64], hq=8, hkv=2, d=16)

    def test_half_precision(self):
        self.check_modes(3, np.float16, 2e-2, [50], [20])


class LevelAttention(unittest.TestCase):
    """attnLevelAttention from Python: keeping every key is exact attention;
    dropping keeps, from each peer, the most important half of its keys
    (threads share a host: every peer is at the host tier)."""

    def test_keep_all_is_exact_and_dropping_keeps_the_most_important_keys(self):
        rng = np.random.default_rng(11)
        n, L, hq, hkv, d = 3, 41, 4, 2, 8
        q, k, v = random_batch(rng, [L], [0], hq, hkv, d, np.float32)
        importance = rng.random(L).astype(np.float32)
        ref_o, ref_lse = exact_attention(q, k, v, [L], [0])
        shards = ac.plan_prefill([L], n)
        keep_host = 0.5

        def reference_over(keys, qi):
            # Causal attention of rows qi over the key rows `keys` only
            # (positions are rows: one sequence, no cached tokens).
            mask = np.full(L, False)
            mask[keys] = True
            group = hq // hkv
            kk = np.repeat(k.astype(np.float64), group, axis=1)
            vv = np.repeat(v.astype(np.float64), group, axis=1)
            s = np.einsum("qhd,khd->hqk", q[qi].astype(np.float64), kk) / np.sqrt(d)
            ok = mask[None, None, :] & (np.arange(L)[None, None, :] <= np.array(qi)[None, :, None])
            s = np.where(ok, s, -np.inf)
            m = s.max(axis=2, keepdims=True)
            e = np.exp(s - m)
            z = e.sum(axis=2, keepdims=True)
            return np.einsum("hqk,khd->qhd", e / z, vv), (m + np.log(z))[:, :, 0].T

        def kept_from(p):
            ki = np.array(shards[p].kv_index, np.int64)
            count = min(len(ki), max(1, int(np.floor(keep_host * len(ki) + 0.5)))) if len(ki) else 0
            order = np.argsort(-importance[ki], kind="stable")
            return ki[order[:count]]

        comms = ac.Comm.init_all(n)

        def body(r, c):
            s = shards[r]
            qi, ki = np.array(s.q_index, np.int64), np.array(s.kv_index, np.int64)
            mq, mk, mv = (np.ascontiguousarray(a) for a in (q[qi], k[ki], v[ki]))
            out = np.full_like(mq, np.nan)
            lse = np.full((len(qi), hq), np.nan, np.float32)
            c.level_attention(mq, mk, mv, out, s.layout, hq, hkv, d, lse=lse)
            self.assertLess(np.abs(out - ref_o[qi]).max(initial=0), 1e-4, f"rank {r}: keep all")
            keys = np.concatenate([ki] + [kept_from(p) for p in range(n) if p != r])
            want_o, want_lse = reference_over(keys, qi)
            c.level_attention(mq, mk, mv, out, s.layout, hq, hkv, d, lse=lse,
                              keep=(1.0, keep_host, 1.0, 1.0), importance=importance[ki].copy())
            self.assertLess(np.abs(out - want_o).max(initial=0), 1e-4, f"rank {r}: dropping")
            self.assertLess(np.abs(lse - want_lse).max(initial=0), 1e-4, f"rank {r}: dropping lse")

        try:
            on_ranks(comms, body)
        finally:
            for c in comms:
                c.destroy()


def positional_attention(q, q_pos, k, v, k_pos, causal, scale=None):
    """Float64 softmax attention of rows q [rows, Hq, D] over keys k, v
    [keys, Hkv, D] of one request (GQA: query head h reads kv head
    h // (Hq / Hkv)); with causal, a key is seen when its position <= the
    query's. Returns out [rows, Hq, D] and the natural-log lse [rows, Hq]."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / np.sqrt(q.shape[2]) if scale is None else scale
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->hqk", q, kk) * scale
    if causal:
        s = np.where(np.asarray(k_pos)[None, None, :] <= np.asarray(q_pos)[None, :, None], s, -np.inf)
    m = s.max(axis=2, keepdims=True)
    e = np.exp(s - m)
    z = e.sum(axis=2, keepdims=True)
    return np.einsum("hqk,khd->qhd", e / z, vv), (m + np.log(z))[:, :, 0].T


class KvCache(unittest.TestCase):
    """The distributed KV cache (attnKvPool*) from Python: 3 ranks as threads
    append requests, rank 0 lends blocks of its request to rank 1, and each
    rank's attention over its requests (decode rows everywhere, a causal chunk
    on rank 0) equals a float64 numpy reference over all of the request's
    tokens, wherever they are stored."""

    N, BLOCK, HQ, HKV, D, CAPACITY = 3, 4, 4, 2, 8, 16
    # rank -> {request id: tokens}; positions have gaps so causality is on
    # positions, not rows
    REQUESTS = {0: {10: 23}, 1: {11: 17}, 2: {20: 9, 21: 6}}

    def make_tokens(self, rng, count, first_pos):
        k = rng.uniform(-1, 1, (count, self.HKV, self.D)).astype(np.float32)
        v = rng.uniform(-1, 1, (count, self.HKV, self.D)).astype(np.float32)
        return k, v, first_pos + 2 * np.arange(count)

    def check_attention(self, r, pool, tokens, reqs, q_rows, q_pos, causal, rng):
        """Runs pool.attention for reqs with q_rows[i] rows each and checks it
        against positional_attention over tokens[req] (k, v, pos)."""
        rows = sum(q_rows)
        q = rng.uniform(-1, 1, (rows, self.HQ, self.D)).astype(np.float32)
        offsets = np.cumsum([0] + list(q_rows)).tolist()
        out, lse = pool.attention(reqs, offsets, q, q_pos=q_pos if causal else None, causal=causal)
        self.assertEqual((out.shape, out.dtype, lse.shape, lse.dtype),
                         (q.shape, np.float32, (rows, self.HQ), np.float32))
        for i, req in enumerate(reqs):
            k, v, pos = tokens[req]
            sl = slice(offsets[i], offsets[i + 1])
            want_o, want_lse = positional_attention(q[sl], None if q_pos is None else q_pos[sl], k, v, pos, causal)
            scale = np.abs(want_o).max(initial=1e-30)
            self.assertLess(np.abs(out[sl] - want_o).max(initial=0) / scale, 1e-4, f"rank {r}, request {req}: out")
            self.assertLess(np.abs(lse[sl] - want_lse).max(initial=0), 1e-4, f"rank {r}, request {req}: lse")

    def test_lent_blocks_stay_in_attention_and_bad_calls_fail_everywhere(self):
        comms = ac.Comm.init_all(self.N)
        barrier = threading.Barrier(self.N)

        def body(r, c):
            rng = np.random.default_rng(100 + r)
            with c.kv_pool(self.BLOCK, self.HKV, self.D, ac.FLOAT32, self.CAPACITY) as pool:
                tokens = {}
                for req, count in self.REQUESTS[r].items():
                    tokens[req] = self.make_tokens(rng, count, first_pos=5 + r)
                    pool.append(req, *tokens[req])

                # rank 0 lends the 3 oldest full blocks of its 23-token request
                # (6 blocks) to rank 1
                granted = pool.migrate([(0, 1, 0, 10, 3)] if r == 0 else [])
                np.testing.assert_array_equal(granted, [3] if r == 0 else np.zeros(0, np.int64))
                stats = pool.stats()
                want = {0: dict(used_blocks=3, lent_in_blocks=0, lent_out_blocks=3, num_requests=1),
                        1: dict(used_blocks=5 + 3, lent_in_blocks=3, lent_out_blocks=0, num_requests=1),
                        2: dict(used_blocks=3 + 2, lent_in_blocks=0, lent_out_blocks=0, num_requests=2)}[r]
                self.assertEqual(stats, dict(capacity_blocks=self.CAPACITY, **want), f"rank {r}")
                if r == 0:
                    holders, count = pool.placement(10)
                    np.testing.assert_array_equal(holders, [3, 3, 0])
                    self.assertEqual((holders.dtype, count), (np.int64, 23))
                    # 2 more tokens: one fills the last block (still here), one opens a block
                    k, v, pos = tokens[10]
                    k2, v2, _ = self.make_tokens(rng, 2, 0)
                    pos2 = pos[-1] + 2 + 2 * np.arange(2)
                    pool.append(10, k2, v2, pos2)
                    tokens[10] = (np.concatenate([k, k2]), np.concatenate([v, v2]), np.concatenate([pos, pos2]))
                    holders, count = pool.placement(10)
                    np.testing.assert_array_equal(holders, [4, 3, 0])
                    self.assertEqual(count, 25)
                    with self.assertRaises(ac.AttnError) as e:  # a local error: this rank only
                        pool.placement(11)
                    self.assertEqual(e.exception.code, ac.INVALID_ARGUMENT)
                    self.assertIn("11", str(e.exception))

                # decode rows (one per request, after its last token); on rank
                # 0 also a causal chunk at key positions, between keys and after
                reqs = sorted(tokens)
                decode_pos = np.array([tokens[q][2][-1] + 1 for q in reqs], np.int32)
                self.check_attention(r, pool, tokens, reqs, [1] * len(reqs), decode_pos, True, rng)
                if r == 0:
                    kp = tokens[10][2]
                    chunk_pos = np.array([kp[0], kp[3], kp[3] + 1, kp[11], kp[20], kp[-1], kp[-1] + 7], np.int32)
                    self.check_attention(r, pool, tokens, [10], [len(chunk_pos)], chunk_pos, True, rng)
                elif r == 1:  # not causal: every key, no positions
                    self.check_attention(r, pool, tokens, [11], [3], None, False, rng)
                else:
                    self.check_attention(r, pool, tokens, [], [], np.zeros(0, np.int32), True, rng)

                # bad input on one rank fails the collective on every rank: a
                # request rank 2 does not have (seen by the library) ...
                q = np.zeros((len(reqs), self.HQ, self.D), np.float32)
                bad = [999] + reqs[1:] if r == 2 else reqs
                with self.assertRaises(ac.AttnError) as e:
                    pool.attention(bad, list(range(len(reqs) + 1)), q, decode_pos)
                if r == 2:
                    self.assertEqual(e.exception.code, ac.INVALID_ARGUMENT)
                    self.assertIn("999", str(e.exception))
                else:
                    self.assertIn("rank 2", str(e.exception))
                # ... and a wrong dtype on rank 1, a list on rank 0 (refused by
                # the module, which still tells the peers)
                with self.assertRaises(ac.AttnError) as e:
                    pool.attention(reqs, list(range(len(reqs) + 1)),
                                   {0: q.tolist(), 1: q.astype(np.float64)}.get(r, q), decode_pos)
                if r == 1:
                    self.assertIn("float64", str(e.exception))
                with self.assertRaises(ac.AttnError):  # a move from a request rank 0 lacks
                    pool.migrate([(0, 2, 0, 77, 1)] if r == 0 else [])
                # the pool still works afterwards
                self.check_attention(r, pool, tokens, reqs, [1] * len(reqs), decode_pos, True, rng)

                # releasing frees the lent blocks at the next collective call
                barrier.wait()
                if r == 0:
                    pool.release(10)
                pool.migrate([])
                self.assertEqual(pool.stats()["used_blocks"], {0: 0, 1: 5, 2: 5}[r], f"rank {r}")
                self.assertEqual(pool.stats()["lent_in_blocks"], 0)
                # nobody is a debtor now (rank 0 has no request, the others
                # exceed the batch threshold): rebalancing moves nothing
                model = dict(nonattn_us_base=100.0, nonattn_us_per_req=10.0, attn_us_per_block=0.1, num_layers=1,
                             debtor_max_batch=0, creditor_max_util=0.9)
                self.assertEqual(pool.rebalance(model), 0)

        try:
            on_ranks(comms, body)
        finally:
            for c in comms:
                c.destroy()

    def test_plan_moves_blocks_from_the_debtor(self):
        model = dict(nonattn_us_base=100.0, nonattn_us_per_req=10.0, attn_us_per_block=0.1, num_layers=1,
                     debtor_max_batch=2, creditor_max_util=0.5)
        # instance 0: small batch, nearly full, 4 requests waiting for 10
        # blocks each; instance 1: big batch, mostly free memory
        debtor = dict(batch_size=1, pending_requests=4, pending_blocks=10, capacity_blocks=100, used_blocks=95,
                      longest_req=7, longest_req_blocks=90)
        creditor = dict(batch_size=8, capacity_blocks=100, used_blocks=10)
        moves = ac.kv_plan([debtor, creditor], model)
        self.assertEqual(len(moves), 1)
        m = moves[0]
        self.assertEqual((m.src, m.dst, m.owner, m.req), (0, 1, 0, 7))
        # 35 blocks free 40, enough for all 4 waiting requests; past that the
        # creditor loses more throughput per block than the debtor gains
        self.assertEqual(m.num_blocks, 35)
        self.assertEqual(moves, ac.kv_plan([debtor, creditor], {**model}))  # deterministic
        # two debtors: the count comes first, then every move
        moves = ac.kv_plan([debtor, creditor, dict(debtor, longest_req=9)], dict(model, creditor_max_util=0.9))
        self.assertGreaterEqual(len(moves), 2)
        self.assertEqual({(m.src, m.owner, m.req) for m in moves}, {(0, 0, 7), (2, 2, 9)})
        self.assertTrue(all(m.dst == 1 and m.num_blocks > 0 for m in moves))
        # no debtor, no move; a bad model is the library's error
        self.assertEqual(ac.kv_plan([creditor, creditor], model), [])
        with self.assertRaises(ac.AttnError) as e:
            ac.kv_plan([debtor, creditor], dict(model, num_layers=0))
        self.assertEqual(e.exception.code, ac.INVALID_ARGUMENT)
        self.assertIn("num_layers", str(e.exception))
        with self.assertRaises(ac.AttnError):
            ac.kv_plan([debtor], dict(model, typo=1))


class SelectorAndTopology(unittest.TestCase):
    def test_cost_model_mode_choice_and_placement(self):
        # The CP paper's Table 4 (Llama3-405B per CP rank, CP4, T+P = 128000)
        # with H100 rates: pass-Q wins at 1% miss, pass-KV at 50% and 100%.
        h100 = ac.CostModel(50.0, 10.0, 989.0, 0.0)
        for miss, want in ((0.01, ac.MODE_PASS_Q), (0.5, ac.MODE_PASS_KV), (1.0, ac.MODE_PASS_KV)):
            t = round(128000 * miss)
            e = ac.estimate_modes(h100, 4, t, 128000 - t, 128, 8, 128, dtype=ac.BFLOAT16)
            self.assertEqual(e.chosen, want, f"miss {miss}: {e}")
            self.assertGreater(min(e.pass_kv_us, e.pass_q_us), 0)
            # All-gather KV: pass-KV's bytes in one hop, never slower in the model.
            self.assertLessEqual(e.all_gather_kv_us, e.pass_kv_us)
        # Decode placement: new KV at (s + step) % n, the query at s % n.
        self.assertEqual(ac.decode_placement(5, 3, 4), ([3, 0, 1, 2, 3], [0, 1, 2, 3, 0]))

        n = 3
        comms = ac.Comm.init_all(n)
        shards = ac.plan_prefill([50, 17], n)
        slow = {"link_bandwidth_GBps": 0.01, "link_latency_us": 1.0, "attn_tflops": 1000.0}
        seen = [None] * n

        def body(r, c):
            c.cost_model = slow  # comm_interference defaults to 0
            self.assertEqual(c.cost_model, ac.CostModel(0.01, 1.0, 1000.0, 0.0))
            seen[r] = c.select_mode(shards[r].layout, 8, 8, 16)
            # Every rank is somewhere in the proximity order, and a split by
            # host keeps the three threads (one host) together.
            self.assertIn(c.topo_rank, range(n))
            self.assertIn("rank", c.topo_dump("text"))
            self.assertTrue(c.topo_dump("json").lstrip().startswith("{"))
            host = c.split_type(ac.SPLIT_HOST)
            try:
                self.assertEqual(host.size, n)
            finally:
                host.destroy()
            with self.assertRaises(ac.AttnError):
                c.topo_dump("svg")
            c.destroy()

        on_ranks(comms, body)
        # Collective and deterministic: one answer for all. Without GQA, on
        # slow links and fast compute, head-parallel moves the fewest bytes.
        self.assertTrue(all(e == seen[0] for e in seen), seen)
        self.assertEqual(seen[0].chosen, ac.MODE_HEAD_PARALLEL, seen[0])
        with self.assertRaises(ac.AttnError):
            ac.estimate_modes((1.0, 2.0), 2, 10, 0, 8, 8, 16)


class Merge(unittest.TestCase):
    def test_merging_partials_over_disjoint_keys_equals_attention_over_all(self):
        rng = np.random.default_rng(7)
        rows, hq, d = 5, 4, 16
        q, k, v = random_batch(rng, [rows], [40], hq, 2, d, np.float32)
        ref_o, ref_lse = exact_attention(q, k, v, [rows], [40], causal=False)
        outs, lses = [], []
        for part in (slice(0, 10), slice(10, 31), slice(31, 45)):
            o, l = exact_attention(q, k[part], v[part], [rows], [part.stop - part.start - rows], causal=False)
            outs.append(o.astype(np.float32))
            lses.append(l.astype(np.float32))
        outs.append(np.zeros_like(outs[0]))  # a partial that saw no key
        lses.append(np.full_like(lses[0], -np.inf))
        out = np.empty_like(outs[0])
        lse = np.empty_like(lses[0])
        ac.merge_attn_states(outs, lses, out, lse, rows, hq, d)
        np.testing.assert_allclose(out, ref_o, atol=1e-5)
        np.testing.assert_allclose(lse, ref_lse, atol=1e-5)


class Errors(unittest.TestCase):
    def test_bad_calls_raise_with_the_library_text(self):
        comms = ac.Comm.init_all(2)
        try:
            with self.assertRaises(ac.AttnError) as e:
                ac._check(ac._AllReduce(None, None, 5, ac.FLOAT32, ac.SUM, comms[0]._h, None), comms[0]._h,
                          "attnAllReduce")
            self.assertEqual(e.exception.code, ac.INVALID_ARGUMENT)
            self.assertIn("rank 0", str(e.exception))
            self.assertIn("NULL", str(e.exception))
            with self.assertRaises(ac.AttnError) as e:
                comms[0].all_reduce(np.zeros(3, np.float32), np.zeros(3, np.int32))
            self.assertEqual(e.exception.code, ac.INVALID_ARGUMENT)
            with self.assertRaises(ac.AttnError):
                ac.UniqueId(b"short")
            # A collective: rank 1's bad arguments (3 heads over 2 kv heads)
            # fail it there, and rank 0, told so, fails it naming rank 1.
            errors = [None, None]

            def attend(r, c):
                hq = 3 if r == 1 else 2
                try:
                    c.ring_attention(np.zeros((1, hq, 8), np.float32), np.zeros((1, 2, 8), np.float32),
                                     np.zeros((1, 2, 8), np.float32), np.zeros((1, hq, 8), np.float32),
                                     ac.SeqLayout([0, 1], [0], [0, 1], [0]), hq, 2, 8)
                except ac.AttnError as err:
                    errors[r] = err
            on_ranks(comms, attend)
            self.assertEqual(errors[1].code, ac.INVALID_ARGUMENT)
            self.assertIn("rank 1", str(errors[1]))
            self.assertEqual(errors[0].code, ac.REMOTE_ERROR)
            self.assertIn("rank 1 could not take part", str(errors[0]))
        finally:
            for c in comms:
                c.destroy()
        self.assertIn("timed out", ac.error_string(ac.TIMEOUT))


if __name__ == "__main__":
    unittest.main()
