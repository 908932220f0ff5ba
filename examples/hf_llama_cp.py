#!/usr/bin/env python3
"""A transformers Llama served with context parallelism over attncomm.

    torchrun --nproc-per-node 3 examples/hf_llama_cp.py [--dtype bfloat16] [--modes pass_kv,ship_q]

Every rank builds the same model (random weights from a small config, no
download) and the same conversation. The model's attention is replaced by
attncomm.torch.ring_attention through transformers' attention interface;
everything else runs as it is. Each rank keeps the keys and values of its
own tokens only (a sharded persistent KV cache, kept here per layer):
 - prefill turns: the new tokens of a turn are dealt to the ranks in
   contiguous balanced chunks; each rank runs the model on its chunk at its
   global positions, and attention sees every rank's cache and chunk;
 - decode steps: every rank runs the new token (the query is replicated),
   and the step's owner (round-robin) keeps its key and value.
The logits of every token are checked against the single-process model on
the whole conversation (fp32 within 1e-4 relative, bf16 within 2e-2), in
every mode asked for. Ranks run on CPU tensors over a gloo group with a
host communicator, or on CUDA tensors over an NCCL group with a device
communicator when a GPU is there (--device cuda).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import attncomm.torch as act  # noqa: E402
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM  # noqa: E402

TURNS = [23, 17]   # prompt tokens of each prefill turn
DECODE_STEPS = 5


class ShardedCache:
    """This rank's keys and values per layer, and their global positions."""

    def __init__(self, layers):
        self.k = [None] * layers
        self.v = [None] * layers
        self.pos = torch.empty(0, dtype=torch.int32)
        # Set for each forward: the queries' positions, which of them this
        # rank keeps, the mode.
        self.q_pos = None
        self.keep = None
        self.mode = "auto"


def cp_attention(comm, cache):
    """The attention function transformers calls per layer: query, key,
    value [1, heads, tokens, head_dim] of this rank's tokens of the step."""

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        layer = module.layer_idx
        q = query[0].transpose(0, 1).contiguous()                  # [T, Hq, D]
        k_new = key[0].transpose(0, 1)[cache.keep]                 # kept rows only
        v_new = value[0].transpose(0, 1)[cache.keep]
        k = k_new if cache.k[layer] is None else torch.cat([cache.k[layer], k_new])
        v = v_new if cache.v[layer] is None else torch.cat([cache.v[layer], v_new])
        cache.k[layer], cache.v[layer] = k, v
        kv_pos = torch.cat([cache.pos, cache.q_pos[cache.keep]])
        layout = act.SeqLayout(torch.tensor([0, q.shape[0]], dtype=torch.int32), cache.q_pos,
                               torch.tensor([0, k.shape[0]], dtype=torch.int32), kv_pos)
        out = act.ring_attention(comm, q, k.contiguous(), v.contiguous(), layout, mode=cache.mode, causal=True,
                                 softmax_scale=scaling)
        return out.unsqueeze(0), None                              # [1, T, Hq, D]

    return attend


def tiny_llama(dtype, device):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def conversation(device):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 512, (n,), generator=g).to(device) for n in TURNS]


@torch.no_grad()
def reference_logits(model, turns, steps):
    """Single process, the whole conversation: logits of every prompt token
    and of every decoded token (greedy)."""
    ids = torch.cat(turns)
    logits = []
    for _ in range(steps + 1):
        out = model(ids.unsqueeze(0)).logits[0].float()
        logits.append(out)
        ids = torch.cat([ids, out[-1].argmax().view(1)])
    # Every position once: the last pass has them all.
    return logits[-1], ids


@torch.no_grad()
def serve(model, comm, turns, steps, mode, rank, nranks, device):
    """Context-parallel serving; returns {position: logits} of this rank's
    tokens and the decoded ids."""
    cache = ShardedCache(model.config.num_hidden_layers)
    cache.mode = mode
    name = f"attncomm_cp_{id(cache)}"
    AttentionInterface.register(name, cp_attention(comm, cache))
    model.config._attn_implementation = name
    got, start = {}, 0

    def run(ids, positions, keep):
        cache.q_pos = positions.to(torch.int32).cpu()
        cache.keep = keep
        out = model(ids.unsqueeze(0), position_ids=positions.unsqueeze(0).to(device), use_cache=False).logits[0]
        cache.pos = torch.cat([cache.pos, cache.q_pos[keep.cpu()]])
        return out.float()

    for turn in turns:
        # Contiguous balanced chunks of the turn's tokens.
        bounds = [start + len(turn) * r // nranks for r in range(nranks + 1)]
        lo, hi = bounds[rank], bounds[rank + 1]
        positions = torch.arange(lo, hi)
        out = run(turn[lo - start:hi - start], positions, torch.ones(hi - lo, dtype=torch.bool))
        for i, p in enumerate(range(lo, hi)):
            got[p] = out[i]
        start += len(turn)
    # The next token comes from the last prompt token's logits, on its rank.
    last = torch.zeros(1, dtype=torch.long, device=device)
    if start - 1 in got:
        last[0] = got[start - 1].argmax()
    dist.broadcast(last, src=nranks - 1)
    decoded = []
    for s in range(steps):
        owner = s % nranks
        out = run(last, torch.tensor([start]), torch.tensor([rank == owner]))
        got[start] = out[0]
        last = out[0].argmax().view(1)
        decoded.append(int(last))
        start += 1
    model.config._attn_implementation = "sdpa"
    return got, decoded


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--modes", default="pass_kv,pass_q,ship_q,head_parallel,auto")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    on_gpu = args.device == "cuda"
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, nranks = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    dtype = getattr(torch, args.dtype)
    tol = 1e-4 if dtype == torch.float32 else 2e-2

    comm = act.init_from_group()
    model = tiny_llama(dtype, device)
    turns = conversation(device)
    ref, ref_ids = reference_logits(model, turns, DECODE_STEPS)
    failures = 0
    for mode in args.modes.split(","):
        got, decoded = serve(model, comm, turns, DECODE_STEPS, mode, rank, nranks, device)
        worst = 0.0
        for p, row in got.items():
            want = ref[p]
            err = ((row - want).abs() / want.abs().max().clamp_min(1e-6)).max().item()
            worst = max(worst, err)
        # ref_ids[p + 1] is the greedy token after position p.
        same_ids = decoded == ref_ids[sum(TURNS) + 1:sum(TURNS) + 1 + DECODE_STEPS].tolist()
        ok = worst <= tol and same_ids
        failures += not ok
        line = (f"rank {rank} {mode:13s} {args.dtype}: {len(got)} tokens, worst relative logit error {worst:.2e}"
                f" (limit {tol:g}), decoded {'as' if same_ids else 'UNLIKE'} the single process: "
                f"{'ok' if ok else 'FAIL'}\n")
        sys.stdout.write(line)  # one write: the ranks share the terminal
        sys.stdout.flush()
    comm.destroy()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
