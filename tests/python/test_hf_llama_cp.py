#!/usr/bin/env python3
"""examples/hf_llama_cp.py under torchrun: transformers' Llama served with
context parallelism over attncomm (3 gloo ranks, CPU tensors, a host
communicator from the torch group), multi-turn prefill and decode, every
logit against the single-process model in every mode, fp32 and bf16; on
CUDA tensors with a device communicator too where a GPU is. Exit 77
(skipped) without torch or transformers."""
import os
import re
import subprocess
import sys

try:
    import torch
    import transformers  # noqa: F401
except ImportError as e:
    print(f"{e.name} is not installed: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "hf_llama_cp.py")


def run(*args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", EXAMPLE, *args]
    print("$", " ".join(cmd), flush=True)
    env = dict(os.environ, ATTN_TIMEOUT_MS=os.environ.get("ATTN_TIMEOUT_MS", "60000"))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    verdicts = re.findall(r"rank \d+ +\S+ +\S+: [^\n]*?: (ok|FAIL)", done.stdout)
    print(done.stdout[-6000:])
    if done.returncode != 0:
        print(done.stderr[-8000:])
    return done.returncode == 0 and verdicts.count("ok") == 3 * 5


def main():
    ok = run("--dtype", "float32") and run("--dtype", "bfloat16")
    if ok and torch.cuda.is_available() and torch.cuda.device_count() >= 1:
        ok = run("--device", "cuda", "--dtype", "bfloat16")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
