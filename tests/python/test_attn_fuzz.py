#!/usr/bin/env python3
"""Random attention collectives through the C API, ranks as threads: random
batches (sequences, query and key rows spread over the ranks at random
positions, GQA, causal or not, every ring mode, level attention with and
without dropping), and now and then one rank with bad arguments (head_dim
300, no kv heads, decreasing offsets, a num_seqs of its own).

What must hold: a call with bad arguments fails on every rank (the refusing
rank with attnInvalidArgument, the others naming it) and the next call works
everywhere; every call that succeeds and drops nothing equals a float64
numpy reference.

Seeds are fixed (ATTN_FUZZ_SEEDS, ATTN_FUZZ_ITERS widen the search). Exit 77
(skipped) without numpy."""
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

D, HKV = 8, 2
MODES = [ac.MODE_AUTO, ac.MODE_PASS_KV, ac.MODE_PASS_Q, ac.MODE_SHIP_Q, ac.MODE_HEAD_PARALLEL, ac.MODE_ALL_GATHER_KV]


def make_case(rnd, n):
    """One call, the same on every rank: each sequence's tokens (distinct
    positions), the rank holding each key, and the queries with their ranks."""
    case = {"hq": rnd.choice([2, 4]), "causal": rnd.random() < 0.7, "mode": rnd.choice(MODES),
            "level": rnd.random() < 0.3, "bad": rnd.random() < 0.15, "badrank": rnd.randrange(n),
            "badkind": rnd.randrange(4), "seqs": []}
    case["keep"] = [rnd.choice([1.0, 0.5]) for _ in range(4)] if case["level"] and rnd.random() < 0.5 else None
    gen = np.random.default_rng(rnd.getrandbits(32))
    for _ in range(rnd.randint(0, 3)):
        length = rnd.randint(0, 12)
        pos = np.array(sorted(rnd.sample(range(64), length)), np.int32)
        queries = sorted(rnd.sample(range(length), rnd.randint(0, length)))
        case["seqs"].append({
            "pos": pos, "kv_rank": [rnd.randrange(n) for _ in range(length)],
            "q_tok": queries, "q_rank": [rnd.randrange(n) for _ in queries],
            "k": gen.uniform(-1, 1, (length, HKV, D)).astype(np.float32),
            "v": gen.uniform(-1, 1, (length, HKV, D)).astype(np.float32),
            "q": gen.uniform(-1, 1, (len(queries), case["hq"], D)).astype(np.float32)})
    return case


def shard(case, r):
    """This rank's layout lists and tensors."""
    qo, qp, ko, kp, qs, ks, vs = [0], [], [0], [], [], [], []
    for s in case["seqs"]:
        mine_k = [i for i, owner in enumerate(s["kv_rank"]) if owner == r]
        mine_q = [j for j, owner in enumerate(s["q_rank"]) if owner == r]
        kp += [int(s["pos"][i]) for i in mine_k]
        ko.append(ko[-1] + len(mine_k))
        qp += [int(s["pos"][s["q_tok"][j]]) for j in mine_q]
        qo.append(qo[-1] + len(mine_q))
        ks.append(s["k"][mine_k])
        vs.append(s["v"][mine_k])
        qs.append(s["q"][mine_q])

    def packed(parts, heads):
        a = np.concatenate(parts) if parts else np.zeros((0, heads, D), np.float32)
        return np.ascontiguousarray(a) if len(a) else np.zeros((1, heads, D), np.float32)  # never NULL
    return qo, qp, ko, kp, packed(qs, case["hq"]), packed(ks, HKV), packed(vs, HKV)


class AttnFuzz(unittest.TestCase):
    def run_seed(self, seed, iters, n):
        rnd = random.Random(seed)
        cases = [make_case(rnd, n) for _ in range(iters)]
        comms = ac.Comm.init_all(n)
        checked = [0] * n

        def body(r, comm):
            for it, case in enumerate(cases):
                qo, qp, ko, kp, q, k, v = shard(case, r)
                hq, hkv, d = case["hq"], HKV, D
                refuses = case["bad"] and r == case["badrank"]
                if refuses:
                    kind = case["badkind"]
                    if kind == 0:
                        d = 300
                    elif kind == 1:
                        hkv = 0
                    elif kind == 2:
                        qo = [0, 1, 0] if len(qo) < 3 else [0, qo[2] + 1] + qo[2:]
                        ko = [0, 0, 0] if len(ko) < 3 else ko
                    else:
                        qo, ko = qo + [qo[-1]], ko + [ko[-1]]  # one more sequence than the others
                lay = ac.SeqLayout(qo, qp, ko, kp)
                out = np.zeros_like(q)
                lse = np.zeros((q.shape[0], hq), np.float32)
                what = f"seed {seed}, call {it}, rank {r}"
                try:
                    if case["level"]:
                        imp = None
                        if case["keep"] is not None:
                            imp = np.random.default_rng(it).uniform(0, 1, k.shape[0]).astype(np.float32)
                        comm.level_attention(q, k, v, out, lay, hq, hkv, d, keep=case["keep"], importance=imp,
                                             lse=lse, causal=case["causal"])
                    else:
                        comm.ring_attention(q, k, v, out, lay, hq, hkv, d, lse=lse, causal=case["causal"],
                                            mode=case["mode"])
                    failed = None
                except ac.AttnError as e:
                    failed = e
                if case["bad"]:
                    self.assertIsNotNone(failed, what + ": a call with a refused rank succeeded")
                    want = ac.INVALID_ARGUMENT if refuses else None
                    if want is not None and case["badkind"] != 3:
                        self.assertEqual(failed.code, want, f"{what}: {failed}")
                elif not case["bad"]:
                    self.assertIsNone(failed, f"{what}: {failed}")
                comm.barrier()  # in step whatever happened
                if failed is not None or case["bad"]:
                    continue
                if case["keep"] is not None and min(case["keep"]) < 1:
                    continue  # dropped keys: no exact reference
                row = 0
                for s in case["seqs"]:
                    mine = [j for j, owner in enumerate(s["q_rank"]) if owner == r]
                    if not mine:
                        continue
                    qpos = [int(s["pos"][s["q_tok"][j]]) for j in mine]
                    ro, rl = attention_at_positions(s["q"][mine], qpos, s["k"], s["v"], s["pos"], case["causal"])
                    np.testing.assert_allclose(out[row:row + len(mine)], ro, atol=3e-5, err_msg=what)
                    np.testing.assert_allclose(lse[row:row + len(mine)], rl, atol=3e-5, err_msg=what)
                    row += len(mine)
                    checked[r] += len(mine)

        try:
            on_ranks(comms, body)
        finally:
            for c in comms:
                c.destroy()
        self.assertGreater(sum(checked), 0, "no call was checked")

    def test_random_attention_calls(self):
        seeds = [int(s) for s in os.environ.get("ATTN_FUZZ_SEEDS", "1,2,3,4").split(",")]
        iters = int(os.environ.get("ATTN_FUZZ_ITERS", "60"))
        for seed in seeds:
            for n in (2, 3):
                with self.subTest(seed=seed, nranks=n):
                    self.run_seed(seed, iters, n)


if __name__ == "__main__":
    unittest.main()
