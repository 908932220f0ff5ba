"""attncomm.torch's merges of partial attention (attnMergeAttnStates and the
merge collectives) as custom ops, in either LSE convention.
"""

import torch

import attncomm as _ac
from attncomm._torch_base import (  # noqa: F401
    _DTYPES,
    _check_lse_base,
    _check_lse_of,
    _check_op_side,
    _check_out,
    _check_side,
    _comm_id,
    _comm_of,
    _lse_in,
    _lse_out,
    _lse_shape,
    _rank_size,
    _raw_lse,
    _require,
    _result,
    _stream_of)


# ---- merging partial attention ----------------------------------------------------------


@torch.library.custom_op("attncomm::merge_attn_states", mutates_args=("out", "lse"))
def _merge_attn_states_op(outs: list[torch.Tensor], lses: list[torch.Tensor], out: torch.Tensor,
                          lse: torch.Tensor, lse_base: int, lse_layout: int, stream: int) -> None:
    rows, heads, dim = out.shape
    _ac.merge_attn_states(list(outs), list(lses), out, lse, rows, heads, dim, stream=stream or None,
                          lse_base=lse_base, lse_layout=lse_layout)


@_merge_attn_states_op.register_fake
def _(outs, lses, out, lse, lse_base, lse_layout, stream):
    return None


def merge_attn_states(outs, lses, out=None, lse=None, stream=None, *, lse_base="e", lse_layout="th"):
    """attnMergeAttnStates on torch tensors: partial outputs outs[j] [rows,
    H, D] (float32, float16 or bfloat16) over disjoint key sets and their
    lses[j] (float32, [rows, H] with lse_layout "th", [H, rows] with "ht";
    natural log with lse_base "e", base 2 with "2") merged into (out, lse),
    lse in the same convention. out and lse may be given; in place
    (out=outs[0], lse=lses[0]) works eagerly, not inside torch.compile
    (the op declares only out and lse written). CUDA tensors merge on the GPU, on torch's current stream
    unless `stream` is given. Local: no communication."""
    _check_lse_base(lse_base)
    _require(len(outs) == len(lses) and len(outs) > 0, "outs and lses: the same number of partials, at least one")
    first = outs[0]
    _require(isinstance(first, torch.Tensor) and first.dim() == 3, "outs[0]: a [rows, heads, head_dim] tensor")
    rows, heads, dim = first.shape
    want = _lse_shape(rows, heads, lse_layout)
    for j, (o, s) in enumerate(zip(outs, lses)):
        _require(isinstance(o, torch.Tensor) and o.dtype == first.dtype and o.shape == first.shape
                 and o.is_contiguous() and o.device == first.device,
                 f"outs[{j}]: contiguous {first.dtype} {tuple(first.shape)} on {first.device} is needed")
        _require(isinstance(s, torch.Tensor) and s.dtype == torch.float32 and tuple(s.shape) == want
                 and s.is_contiguous() and s.device == first.device,
                 f"lses[{j}]: contiguous float32 {want} on {first.device} is needed (lse_layout {lse_layout!r})")
    _require(first.dtype in _DTYPES, f"outs[0]: dtype {first.dtype} is not float32, float16 or bfloat16")
    out = torch.empty_like(first) if out is None else out
    _check_out(first, out)
    if lse is not None:
        _check_lse_of("lse", lse, rows, heads, first.device, lse_layout)
    else:
        lse = torch.empty(want, dtype=torch.float32, device=first.device)
    # The library reads and writes every LSE in the caller's convention
    # (attnMergeAttnStatesLse): no conversion pass, no extra copy.
    _merge_attn_states_op(list(outs), list(lses), out, lse, 1 if lse_base == "2" else 0,
                          1 if lse_layout == "ht" else 0, _stream_of(first, stream))
    return out, lse


def _merge_collective_op(name, all_gather):
    @torch.library.custom_op(f"attncomm::{name}", mutates_args=("out", "lse"))
    def op(out_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, comm_id: int,
           stream: int) -> None:
        comm = _comm_of(comm_id)
        _check_op_side(comm, out_part)
        call = comm.merge_attn_all_gather if all_gather else comm.merge_attn_reduce_scatter
        rows, heads, dim = out_part.shape
        call(out_part, lse_part, out, lse, rows, heads, dim, stream=stream or None)

    @op.register_fake
    def _(out_part, lse_part, out, lse, comm_id, stream):
        return None

    return op


_merge_reduce_scatter_op = _merge_collective_op("merge_attn_reduce_scatter", False)
_merge_all_gather_op = _merge_collective_op("merge_attn_all_gather", True)


def _merge_collective(comm, out_part, lse_part, out, lse, return_lse, stream, all_gather, lse_base, lse_layout):
    _check_lse_base(lse_base)
    _require(isinstance(out_part, torch.Tensor) and out_part.dim() == 3,
             "out_part: a [rows, heads, head_dim] tensor is needed")
    _require(out_part.dtype in _DTYPES, f"out_part: dtype {out_part.dtype} is not float32, float16 or bfloat16")
    _require(out_part.is_contiguous(), "out_part: not contiguous")
    _check_side(comm, out_part, "out_part")
    rows, heads, dim = out_part.shape
    want_part = _lse_shape(rows, heads, lse_layout)
    _require(isinstance(lse_part, torch.Tensor) and lse_part.dtype == torch.float32
             and tuple(lse_part.shape) == want_part and lse_part.is_contiguous()
             and lse_part.device == out_part.device,
             f"lse_part: contiguous float32 {want_part} on {out_part.device} is needed (lse_layout {lse_layout!r})")
    r, n = _rank_size(comm)
    share = heads if all_gather else (r + 1) * heads // n - r * heads // n
    want = (rows, share, dim)
    out = torch.empty(want, dtype=out_part.dtype, device=out_part.device) if out is None else out
    _require(isinstance(out, torch.Tensor), "out: a torch.Tensor is needed")
    _require(tuple(out.shape) == want, f"out: shape {tuple(out.shape)}, {want} is needed")
    _require(out.dtype == out_part.dtype, f"out: dtype {out.dtype}, out_part is {out_part.dtype}")
    _require(out.device == out_part.device, f"out: on {out.device}, out_part on {out_part.device}")
    _require(out.is_contiguous(), "out: not contiguous")
    if lse is not None:
        _check_lse_of("lse", lse, rows, share, out_part.device, lse_layout)
    raw = _raw_lse(rows, share, out_part.device, lse, lse_base, lse_layout)
    op = _merge_all_gather_op if all_gather else _merge_reduce_scatter_op
    op(out_part, _lse_in(lse_part, lse_base, lse_layout), out, raw, _comm_id(comm), _stream_of(out_part, stream))
    return _result(out, raw, lse, return_lse, lse_base, lse_layout)


def merge_attn_reduce_scatter(comm, out_part, lse_part, *, out=None, lse=None, return_lse=False, lse_base="e",
                              lse_layout="th", stream=None):
    """attnMergeAttnReduceScatter: every rank's partial (out_part [rows,
    heads, D], lse_part float32 [rows, heads] ("th") or [heads, rows]
    ("ht"), natural log ("e") or base 2 ("2")) for the same query rows over
    its own keys, merged; this rank gets its share of the heads ([rank *
    heads // n, (rank + 1) * heads // n)) as out [rows, share, D] (and lse,
    in the same convention). The decode-context-parallel merge as one call."""
    return _merge_collective(comm, out_part, lse_part, out, lse, return_lse, stream, False, lse_base, lse_layout)


def merge_attn_all_gather(comm, out_part, lse_part, *, out=None, lse=None, return_lse=False, lse_base="e",
                          lse_layout="th", stream=None):
    """As merge_attn_reduce_scatter, with every head on every rank."""
    return _merge_collective(comm, out_part, lse_part, out, lse, return_lse, stream, True, lse_base, lse_layout)


