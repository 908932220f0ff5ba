#!/usr/bin/env python3
"""plot_perf.py's crossover and JSON recognition on synthetic data (no
matplotlib needed), and, where matplotlib is, one PNG of each kind."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plot_perf  # noqa: E402


class Crossover(unittest.TestCase):
    def test_linear_crossing(self):
        # a - b goes from -1 to +1 between x = 1 and x = 3: crosses at 2.
        self.assertAlmostEqual(plot_perf.crossover([1, 3], [1, 3], [2, 2], log_x=False)[0], 2.0)

    def test_log_crossing(self):
        # Interpolated in log10(x): halfway between 1 and 100 is 10.
        xs = plot_perf.crossover([1, 100], [0, 2], [1, 1], log_x=True)
        self.assertEqual(len(xs), 1)
        self.assertAlmostEqual(xs[0], 10.0)

    def test_paper_shape(self):
        # pass-Q faster at low miss rates, pass-KV at high: one crossing, between 3% and 6%.
        miss = [1.5625, 3.125, 6.25, 12.5, 25, 50, 100]
        kv = [10, 10, 10, 10, 11, 12, 14]
        q = [6, 8, 12, 16, 22, 30, 45]
        xs = plot_perf.crossover(miss, kv, q)
        self.assertEqual(len(xs), 1)
        self.assertTrue(3.125 < xs[0] < 6.25, xs)

    def test_no_crossing(self):
        self.assertEqual(plot_perf.crossover([1, 2, 4], [1, 1, 1], [2, 3, 4]), [])

    def test_touch_counts_once(self):
        self.assertEqual(plot_perf.crossover([1, 2, 3], [1, 2, 3], [2, 2, 2], log_x=False), [2])

    def test_several_crossings(self):
        self.assertEqual(len(plot_perf.crossover([1, 2, 3, 4], [0, 2, 0, 2], [1, 1, 1, 1], log_x=False)), 3)


RING = {"program": "ring_attn_perf", "results": [
    {"T": t, "P": 1000 - t, "batch": 1, "nranks": 4, "mode": m, "auto_chose": "", "time_us": us}
    for t, kv, q in [(10, 900, 500), (100, 1000, 1100), (1000, 2000, 4000)]
    for m, us in (("pass-kv", kv), ("pass-q", q))]}
DECODE = {"program": "decode_attn_perf", "results": [
    {"T": b, "P": b * 99, "batch": b, "nranks": 2, "mode": "pass-q", "time_us": 10.0 * b} for b in (1, 4, 16)]}
LEVEL = {"program": "level_attn_perf", "results": [
    {"variant": "pass-kv", "time_us": 100, "speedup_vs_pass_kv": 1},
    {"variant": "level 1:0.5:0.25", "time_us": 60, "speedup_vs_pass_kv": 1.66}]}
KV = {"program": "kv_attn_perf", "results": [
    {"lent_fraction": f, "step_us": 100 - 50 * f, "migrate_us": 1 + 100 * f} for f in (0, 0.5, 1)]}
COLL = {"version": 3, "args": ["/x/all_gather_perf", "-t", "2"], "config": {},
        "attncomm": {"transport": "shm", "algo": "ring", "mode": "threads"},
        "results": [{"size": s, "count": s // 4, "type": "float", "redop": "none", "root": "none",
                     "out_of_place": {"time": 1.0, "alg_bw": s / 1e3, "bus_bw": s / 2e3, "nwrong": 0},
                     "in_place": {"time": 1.0, "alg_bw": s / 1e3, "bus_bw": s / 1.5e3, "nwrong": None}}
                    for s in (1024, 4096, 16384)]}


class Recognition(unittest.TestCase):
    def test_kinds(self):
        self.assertEqual(plot_perf.kind_of(RING), "ring_attn_perf")
        self.assertEqual(plot_perf.kind_of(COLL), "collective")
        self.assertEqual(plot_perf.kind_of({"results": DECODE["results"]}), "decode_attn_perf")
        self.assertEqual(plot_perf.kind_of([{"variant": "x", "time_us": 1}]), "level_attn_perf")
        self.assertIsNone(plot_perf.kind_of({"results": []}))
        self.assertEqual(plot_perf.collective_label(COLL, "a.json"), "all_gather_perf shm/ring")
        self.assertEqual(plot_perf.collective_label({}, "/d/attn-shm.all_gather.r2.json"), "attn-shm.all_gather")
        self.assertEqual(plot_perf.collective_group({}, "/d/attn-shm.reduce_scatter.r1.json"), "reduce_scatter")


class Png(unittest.TestCase):
    def run_plot(self, docs):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, doc in enumerate(docs):
                paths.append(os.path.join(d, "f%d.json" % i))
                with open(paths[-1], "w") as f:
                    json.dump(doc, f)
            out = os.path.join(d, "out.png")
            p = subprocess.run([sys.executable, os.path.join(HERE, "plot_perf.py")] + paths + ["-o", out],
                               capture_output=True, text=True)
            png = open(out, "rb").read() if os.path.exists(out) else b""
            return p, png

    def test_bad_input(self):
        p, _ = self.run_plot([{"hello": 1}])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("not a perf binary's JSON", p.stderr)

    def test_every_kind(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib not installed")
        p, png = self.run_plot([RING, DECODE, LEVEL, KV, COLL, COLL])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertGreater(len(png), 10000)


if __name__ == "__main__":
    unittest.main()
