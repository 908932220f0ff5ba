#!/usr/bin/env python3
"""Reads a collective perf binary's -J output the way nccl-tests' readers do.

Runs BIN (e.g. all_reduce_perf) with -I 1 -J into a temporary directory, as
threads and as processes, then checks nccl-tests' schema (version 3): the
top-level, config and result keys with the types nccl-tests writes, the root
as a string, positive times, per-iteration arrays of `iters` entries, and that
a second run never overwrites the first file (FILE.0).

    test_perf_json.py BUILD/perf/all_reduce_perf [BUILD/perf/broadcast_perf ...]
"""
import json
import os
import subprocess
import sys
import tempfile

ITERS = 6


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def want(obj, key, types, where):
    if key not in obj:
        fail(f"{where}: no '{key}'")
    v, ts = obj[key], types if isinstance(types, tuple) else (types,)
    if not isinstance(v, ts) or (isinstance(v, bool) and bool not in ts):
        fail(f"{where}: '{key}' is {type(v).__name__}, want {types}")
    return obj[key]


def check_per_iter(p, where, procs):
    for k in ("min_us", "max_us", "avg_us", "p50_us", "p95_us", "p99_us", "stdev_us", "cv_pct"):
        want(p, k, (int, float), where)
    want(p, "skipped_iterations", int, where)
    times = want(p, "times_us", list, where)
    if len(times) != ITERS or any(t <= 0 for t in times):
        fail(f"{where}: times_us {times} (want {ITERS} positive entries)")
    if not p["min_us"] <= p["p50_us"] <= p["max_us"]:
        fail(f"{where}: min/p50/max out of order")
    rows = p.get("per_process_max_times_us")
    if procs > 1:
        if not rows or len(rows) != procs or any(len(r) != ITERS for r in rows):
            fail(f"{where}: per_process_max_times_us should be {procs} rows of {ITERS}")
        # nccl-tests: times_us is the max over process rows, per iteration.
        for i in range(ITERS):
            if abs(max(r[i] for r in rows) - times[i]) > 1e-3 * max(1.0, times[i]):
                fail(f"{where}: times_us[{i}] is not the max over process rows")
    elif rows is not None:
        fail(f"{where}: per_process_max_times_us with one process")


def check_file(path, procs, in_place):
    with open(path) as f:
        d = json.load(f)
    if want(d, "version", int, "top") != 3:
        fail("version is not 3")
    for k, t in (("start_time", str), ("end_time", str), ("args", list), ("env", list),
                 ("nccl_version", int), ("attncomm_version", str), ("config", dict),
                 ("results", list), ("out_of_bounds", dict), ("average_bus_bandwidth", dict),
                 ("errors", list)):
        want(d, k, t, "top")
    c = d["config"]
    for k in ("nthreads", "ngpus", "minimum_bytes", "maximum_bytes", "warmup_iters", "iterations",
              "aggregated_iterations", "validation", "graph", "per_iter_skip"):
        want(c, k, int, "config")
    if "step_factor" not in c and "step_bytes" not in c:
        fail("config: neither step_factor nor step_bytes")
    for k in ("blocking_collectives", "per_iter_timing", "parallel_init"):
        if c.get(k) not in ("true", "false"):  # nccl-tests writes these as strings
            fail(f"config: {k} = {c.get(k)!r}")
    if c["iterations"] != ITERS:
        fail("config: iterations")
    devs = want(c, "devices", list, "config")
    if not devs:
        fail("config: no devices")
    for dv in devs:
        for k, t in (("rank", int), ("group", int), ("pid", int), ("hostname", str), ("device", int),
                     ("device_hex", str), ("device_info", str)):
            want(dv, k, t, "devices[]")
    if not d["results"]:
        fail("no results")
    for r in d["results"]:
        where = f"results[size={r.get('size')}]"
        for k, t in (("size", int), ("count", int), ("type", str), ("redop", str), ("root", str),
                     ("actual_iterations", int), ("experiment_name", str)):
            want(r, k, t, where)
        int(r["root"])  # a padded number, as nccl-tests prints it
        for place in ("out_of_place", "in_place") if in_place else ("out_of_place",):
            m = want(r, place, dict, where)
            if want(m, "time", (int, float), where) <= 0:
                fail(f"{where}: {place} time not positive")
            want(m, "alg_bw", (int, float), where)
            want(m, "bus_bw", (int, float), where)
            if want(m, "nwrong", (int, float), where) != 0:
                fail(f"{where}: {place} nwrong {m['nwrong']}")
            check_per_iter(want(r, place + "_per_iter", dict, where), where + " " + place, procs)
    if d["out_of_bounds"].get("okay") != "true" or d["out_of_bounds"].get("count") != 0:
        fail("out_of_bounds not okay")
    want(d["average_bus_bandwidth"], "bandwidth", (int, float), "average_bus_bandwidth")
    if "attncomm" not in d or "timing" not in d["attncomm"]:
        fail("no attncomm.timing")


def run(binary, args, path):
    cmd = [binary] + args + ["-b", "1K", "-e", "16K", "-f", "4", "-n", str(ITERS), "-w", "1",
                             "-c", "1", "-I", "1", "-J", path]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    if p.returncode != 0:
        print(p.stdout)
        fail(f"{' '.join(cmd)} exited {p.returncode}")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for binary in sys.argv[1:]:
            name = os.path.basename(binary)
            in_place = name not in ("sendrecv_perf", "alltoall_perf")
            for args, procs in ((["-t", "2"], 1), (["--procs", "2"], 2)):
                path = os.path.join(tmp, f"{name}-{procs}.json")
                run(binary, args, path)
                check_file(path, procs, in_place)
            # A second run with the same -J must not overwrite the first.
            first = os.path.join(tmp, f"{name}-1.json")
            before = open(first).read()
            run(binary, ["-t", "2"], first)
            if open(first).read() != before or not os.path.exists(first + ".0"):
                fail("-J overwrote an existing file (want FILE.0)")
            check_file(first + ".0", 1, in_place)
            print(f"ok: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
