"""Kernel-level conformance: any engine's kernels against nanovllm_ref's public pure-torch references.

:data:`KERNELS` maps a kernel name to a :class:`KernelSpec`: a Hypothesis strategy of inputs (paged batches from
strategies.py, activations scaled by a magnitude from 1e-3 to 1e2, GQA ratios, block sizes, head dims), the
reference (``nanovllm_ref.kernels.*_reference``, whose signature every candidate takes) and the check. A
candidate is a :class:`KernelCandidate` ``(kernel name, label, fn)``; nanovllm_ref's own are
:func:`nanovllm_ref_candidates` (its Triton kernels, the decode kernel once per split count). Another engine
plugs its kernels in by returning its own list from a ``pkg.module:function`` given to ``--kernels`` (see
conformance/README.md)::

    def my_kernels():
        return [KernelCandidate("rms_norm", "mine", my_rms_norm),          # rms_norm_reference's signature
                KernelCandidate("prefill_attention", "mine", my_prefill)]  # prefill_attention_reference's

``size="small"`` draws shapes the Triton interpreter runs in seconds (CPU, CI); ``size="full"`` real ones (GPU).
A candidate that cannot run here says why through ``unavailable`` (nanovllm_ref's Triton kernels: no triton, or no
GPU and no interpreter) and is skipped with that reason; a check that fails raises a short
:class:`~nanovllm_ref.testing.mismatch.KernelMismatch` (the worst element, both values, the tolerance).
:data:`STATISTICAL_CHECKS` adds, for a sampling kernel, a check of its output's distribution (the rejection
sampler's: oracle/rejection_check.py), which another engine's kernel, with its own noise, passes too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from ..kernels.activation import silu_and_mul_reference
from ..kernels.decode_attention import decode_attention_reference
from ..kernels.fused_moe import fused_moe_ref
from ..kernels.prefill_attention import prefill_attention_reference
from ..kernels.qkv_epilogue import qkv_epilogue_reference
from ..kernels.rejection import rejection_sample_reference
from ..kernels.rmsnorm import rms_norm_reference
from ..kernels.rotary import apply_rotary_reference, rope_cos_sin_cache
from ..kernels.sampling import gumbel_sample_reference
from ..kernels.store_kv import store_kv_reference
from ..oracle.rejection_check import check_rejection_sampler
from . import gemm, rejection
from .mismatch import Described, KernelMismatch, check_equal, check_same_layout, triton_unavailable, worst_element
from .strategies import RELATIVE_TOLERANCE, PagedBatch, make_paged_batch, paged_batches, relative_error

MAGNITUDES = (1e-3, 1e-1, 1.0, 1e2)  # activations scaled by these: epsilon and accumulation-dtype bugs show


@dataclass(frozen=True)
class KernelSpec:
    name: str
    inputs: Callable[..., st.SearchStrategy]  # (size, dtypes, magnitude, device) -> strategy of inputs
    call: Callable[[Callable, Any], Any]  # call(fn, inputs) -> output; fn has the reference's signature
    check: Callable[[Any, Any, Any], None]  # check(out, ref_out, inputs): raises KernelMismatch
    reference: Callable

    def draws(self, size: str, dtypes, magnitude: float, device: str) -> st.SearchStrategy:
        """The inputs, printing as their shapes (a failing example's report names no tensor values)."""
        return self.inputs(size, dtypes, magnitude, device).map(lambda x: Described(x) if type(x) is tuple else x)


@dataclass(frozen=True)
class KernelCandidate:
    kernel: str  # a key of KERNELS
    label: str
    fn: Callable  # same signature as KERNELS[kernel].reference
    unavailable: Callable[[], str | None] | None = None  # why it cannot run here (None: it can)

    def skip_reason(self) -> str | None:
        return self.unavailable() if self.unavailable is not None else None


def _scaled(x: torch.Tensor, magnitude: float) -> torch.Tensor:
    return (x.float() * magnitude).to(x.dtype)


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, factor: float = 1.0) -> None:
    check_same_layout(out, ref)
    finite = ref.isfinite()
    if not torch.equal(out.isfinite(), finite):
        wrong = int((out.isfinite() != finite).sum())
        raise KernelMismatch(f"{wrong} elements non-finite where the reference is finite, or the reverse; "
                             f"{worst_element(out, ref)}")
    # where the reference overflows (its dtype's range), the same inf: a difference there would read as NaN
    check_equal(out[~finite], ref[~finite], "where the reference is not finite, the output")
    err, tol = relative_error(out[finite], ref[finite]), RELATIVE_TOLERANCE[dtype] * factor
    if not err < tol:
        raise KernelMismatch(f"relative error {err:.3g} > tolerance {tol:.3g} ({str(dtype)[6:]}); "
                             f"{worst_element(out, ref)}")


# ---- paged attention and the KV store --------------------------------------------------------------------
def _attention_inputs(decode: bool):
    def inputs(size: str, dtypes, magnitude: float, device: str) -> st.SearchStrategy:
        small = size == "small"
        batches = paged_batches(head_dims=(48, 32, 64) if small else (96, 64, 128),  # 48, 96: masked BLOCK_D
                                gqa_ratios=(1, 2, 4) if small else (1, 2, 4, 8),
                                block_sizes=(16, 32) if small else (16, 32, 64, 256), max_seqs=3 if small else 8,
                                max_context=70 if small else 1100, decode_only=decode, dtype=tuple(dtypes),
                                device=device, poison=("nan", "large"))

        def scale(b: PagedBatch) -> PagedBatch:
            b.q = _scaled(b.q, magnitude)  # sharper or flatter softmax
            b.v_cache, b.value = _scaled(b.v_cache, magnitude), _scaled(b.value, magnitude)
            return b  # its repr gives shapes and lengths, not tensors
        return batches.map(scale)
    return inputs


def _prefill_call(fn: Callable, b: PagedBatch) -> torch.Tensor:
    return fn(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, b.scale)


def _decode_call(fn: Callable, b: PagedBatch) -> torch.Tensor:
    return fn(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)


def _attention_check(out: torch.Tensor, ref: torch.Tensor, b: PagedBatch) -> None:
    check_same_layout(out, ref)
    if not bool(out.isfinite().all()):
        raise KernelMismatch(f"{int((~out.isfinite()).sum())} unwritten (NaN) outputs, or poisoned KV read; "
                             f"{worst_element(out, ref)}")
    _close(out, ref, b.q.dtype)


def _store_call(fn: Callable, b: PagedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = b.poisoned_caches()
    fn(b.key, b.value, k, v, b.slot_mapping)
    return k, v


def _store_check(out, ref, b: PagedBatch) -> None:
    for o, r, name in zip(out, ref, ("K cache", "V cache")):
        check_equal(o, r, name)


# ---- elementwise / norm / rotary / MoE / sampling ---------------------------------------------------------
@st.composite
def _norm_inputs(draw, size: str, dtypes, magnitude: float, device: str) -> tuple:
    dtype = draw(st.sampled_from(list(dtypes)))
    # sizes that are not powers of two come first: a kernel that pads to its tile must not let the padding count
    hidden = draw(st.sampled_from([200, 48, 1000, 64] if size == "small" else [2880, 5120, 1024, 4096]))
    tokens = draw(st.integers(1, 5 if size == "small" else 300))
    gen = torch.Generator(device=device).manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = (torch.randn(tokens, hidden, generator=gen, device=device) * magnitude).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen, device=device)).to(draw(st.sampled_from([dtype, torch.float32])))
    res = (torch.randn(tokens, hidden, generator=gen, device=device) * magnitude).to(dtype) \
        if draw(st.booleans()) else None
    return x, w, draw(st.sampled_from([1e-6, 1e-5])), res


def _norm_check(out, ref, inputs) -> None:
    if inputs[3] is not None:
        check_equal(out[1], ref[1], "the residual sum")
        out, ref = out[0], ref[0]
    _close(out, ref, inputs[0].dtype, 0.1)


@st.composite
def _rotary_inputs(draw, size: str, dtypes, magnitude: float, device: str) -> tuple:
    dtype = draw(st.sampled_from(list(dtypes)))
    head_dim = draw(st.sampled_from([80, 16, 32, 48, 64, 128]))  # 80, 48: a half that is no power of two
    base = draw(st.sampled_from([1e4, 5e5, 1e6]))
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    gen = torch.Generator(device=device).manual_seed(draw(st.integers(0, 2**31 - 1)))
    tokens, heads = draw(st.integers(1, 6 if size == "small" else 512)), draw(st.sampled_from([1, 2, 5, 8]))
    x = (torch.randn(tokens, heads + 2, head_dim, generator=gen, device=device) * magnitude).to(dtype)
    x = x[:, 1: heads + 1] if draw(st.booleans()) else x[:, :heads].contiguous()  # a view into fused qkv
    positions = torch.randint(0, 4096, (tokens,), generator=gen, device=device)
    return x, positions, rope_cos_sin_cache(inv_freq, 4096)


def _rotary_check(out, ref, inputs) -> None:
    tol = {torch.float32: 1e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[inputs[0].dtype]
    check_same_layout(out, ref)
    atol = tol * inputs[0].abs().max().item()
    bound = atol + tol * ref.double().abs()
    if not bool(((out.double() - ref.double()).abs() <= bound).all()):
        raise KernelMismatch(f"outside |out - ref| <= {atol:.3g} + {tol:.3g} |ref|; {worst_element(out, ref)}")


@st.composite
def _silu_inputs(draw, size: str, dtypes, magnitude: float, device: str) -> tuple:
    dtype = draw(st.sampled_from(list(dtypes)))
    d = draw(st.sampled_from([24, 100, 512] if size == "small" else [768, 3072, 14336]))
    tokens = draw(st.integers(1, 5 if size == "small" else 300))
    if dtype == torch.float16:  # silu(x) * y of two x 1e2 inputs leaves fp16's range (6.5e4): both sides read inf
        magnitude = min(magnitude, 10.0)
    gen = torch.Generator(device=device).manual_seed(draw(st.integers(0, 2**31 - 1)))
    return ((torch.randn(tokens, 2 * d, generator=gen, device=device) * magnitude).to(dtype),)


@st.composite
def _moe_inputs(draw, size: str, dtypes, magnitude: float, device: str) -> tuple:
    dtype = draw(st.sampled_from(list(dtypes)))
    small = size == "small"
    tokens = draw(st.integers(1, 40 if small else 1024))
    experts = draw(st.sampled_from([4, 8] if small else [8, 64, 128]))
    top_k = draw(st.sampled_from([1, 2, 4] if small else [2, 8]))
    hidden, inter = draw(st.sampled_from([(40, 24), (64, 48)] if small else [(2048, 768), (1024, 512)]))
    if dtype == torch.float16:  # x 1e2 through two projections and a product leaves fp16's range (6.5e4)
        magnitude = min(magnitude, 10.0)
    gen = torch.Generator(device=device).manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = (torch.randn(tokens, hidden, generator=gen, device=device) * magnitude).to(dtype)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen, device=device) / hidden**0.5).to(dtype)
    w_down = (torch.randn(experts, hidden, inter, generator=gen, device=device) / inter**0.5).to(dtype)
    logits = torch.randn(tokens, experts, generator=gen, device=device)
    logits[:, experts - draw(st.integers(0, experts // 2)):] = float("-inf")  # experts nobody routes to
    weights, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    if draw(st.booleans()):  # normalized top-k weights (norm_topk_prob) or raw ones
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return x, w_gate_up, w_down, weights.to(dtype), ids


def _moe_check(out, ref, inputs) -> None:
    _close(out, ref, inputs[0].dtype, 0.1 if inputs[0].dtype == torch.float32 else 1.0)


@st.composite
def _sampling_inputs(draw, size: str, dtypes, magnitude: float, device: str) -> tuple:
    n = draw(st.integers(1, 6 if size == "small" else 256))
    vocab = draw(st.sampled_from([50, 1000, 5000] if size == "small" else [32000, 151936]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    logits = torch.randn(n, vocab, generator=gen) * 3 * magnitude
    if draw(st.booleans()):
        logits[:, :: draw(st.integers(2, 5))] = float("-inf")  # masked by top-k / top-p: never drawn
    if draw(st.booleans()):
        logits[draw(st.integers(0, n - 1)), draw(st.integers(0, vocab - 1))] = float("nan")
    # the simplest draws (temperature 1 or 0, seed 0, position 0) would hide temperature and position bugs
    temperature = torch.tensor([draw(st.sampled_from([0.7, 2.0, 0.0, 1.0])) for _ in range(n)])
    seeds = torch.tensor([draw(st.integers(1, 2**63 - 1)) * draw(st.sampled_from([1, -1])) for _ in range(n)])
    counters = torch.tensor([draw(st.integers(1, 2**33)) for _ in range(n)])
    return tuple(t.to(device) for t in (logits, temperature, seeds, counters))


def _sampling_check(out, ref, inputs) -> None:
    check_equal(out[1], ref[1], "the finite flags")
    # every row's draw is defined but for NaN / +inf ones: a row masked with -inf (top-k / top-p) is flagged not
    # finite (the engine takes the flag before masking) and must still draw the reference's token
    drawn = ~(inputs[0].isnan() | (inputs[0] == float("inf"))).any(dim=-1)
    check_equal(out[0][drawn], ref[0][drawn], "the tokens drawn")


@st.composite
def _epilogue_inputs(draw, size: str, dtypes, magnitude: float, device: str) -> tuple:
    """A packed QKV row per token, q/k norm weights or none, positions, slots in any order with padding (-1)."""
    dtype = draw(st.sampled_from(list(dtypes)))
    kv_heads, group = draw(st.sampled_from([1, 2, 3, 8])), draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([32, 80, 64] if size == "small" else [128, 80, 64]))
    tokens, block_size = draw(st.integers(1, 6 if size == "small" else 512)), draw(st.sampled_from([16, 1, 32]))
    gen = torch.Generator(device=device).manual_seed(draw(st.integers(0, 2**31 - 1)))
    qkv = (torch.randn(tokens, (kv_heads * (group + 2)) * head_dim, generator=gen, device=device) * magnitude)
    base = draw(st.sampled_from([1e6, 1e4]))
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    num_blocks = -(-tokens // block_size) + 2  # room for every token, some blocks left untouched
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=device)[:tokens]
    slots[torch.rand(tokens, generator=gen, device=device) < 0.25] = -1  # padding rows: q only, no K/V store
    weights = [(1 + 0.1 * torch.randn(head_dim, generator=gen, device=device)).to(dtype) for _ in range(2)]
    qw, kw = weights if draw(st.booleans()) else (None, None)  # Qwen3's q/k norm, or none (Llama)
    positions = torch.randint(0, 4096, (tokens,), generator=gen, device=device)
    return (qkv.to(dtype), positions, rope_cos_sin_cache(inv_freq, 4096), qw, kw, draw(st.sampled_from([1e-6, 1e-5])),
            (num_blocks, block_size, kv_heads, head_dim), slots, kv_heads * group, kv_heads)


def _epilogue_call(fn: Callable, inputs: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qkv, positions, cos_sin, qw, kw, eps, cache_shape, slots, heads, kv_heads = inputs
    k, v = (torch.full(cache_shape, float("nan"), dtype=qkv.dtype, device=qkv.device) for _ in range(2))
    return fn(qkv, positions, cos_sin, qw, kw, eps, k, v, slots, heads, kv_heads), k, v  # NaN: never written


def _epilogue_check(out, ref, inputs) -> None:
    (q, k, v), (ref_q, ref_k, ref_v) = out, ref
    _close(q, ref_q, inputs[0].dtype)
    written = ~ref_k.isnan()
    check_equal(k.isnan(), ref_k.isnan(), "which K cache rows are written (NaN: untouched)")
    check_equal(v.isnan(), ref_v.isnan(), "which V cache rows are written (NaN: untouched)")
    check_equal(v[written], ref_v[written], "V (the projection's, bitwise)")
    if written.any():
        _close(k[written], ref_k[written], inputs[0].dtype)


def _plain_call(fn: Callable, inputs: tuple) -> Any:
    return fn(*inputs)


def _plain_check(out, ref, inputs) -> None:
    _close(out, ref, inputs[0].dtype, 0.1)


def _linear_check(out, ref, inputs) -> None:
    _close(out, ref, inputs[0].dtype)  # (the BLAS reference and the kernel sum K in different orders)


KERNELS: dict[str, KernelSpec] = {s.name: s for s in (
    KernelSpec("prefill_attention", _attention_inputs(False), _prefill_call, _attention_check,
               prefill_attention_reference),
    KernelSpec("decode_attention", _attention_inputs(True), _decode_call, _attention_check,
               decode_attention_reference),
    KernelSpec("store_kv", _attention_inputs(False), _store_call, _store_check, store_kv_reference),
    KernelSpec("rms_norm", _norm_inputs, _plain_call, _norm_check, rms_norm_reference),
    KernelSpec("apply_rotary", _rotary_inputs, _plain_call, _rotary_check, apply_rotary_reference),
    KernelSpec("silu_and_mul", _silu_inputs, _plain_call, _plain_check, silu_and_mul_reference),
    KernelSpec("fused_moe", _moe_inputs, _plain_call, _moe_check, fused_moe_ref),
    KernelSpec("gumbel_sample", _sampling_inputs, _plain_call, _sampling_check, gumbel_sample_reference),
    KernelSpec("qkv_epilogue", _epilogue_inputs, _epilogue_call, _epilogue_check, qkv_epilogue_reference),
    KernelSpec("invariant_linear", gemm.linear_inputs, _plain_call, _linear_check, gemm.invariant_linear_reference),
    KernelSpec("rejection_sample", rejection.inputs, _plain_call, rejection.check, rejection_sample_reference),
)}

# Statistical checks per kernel (name -> check(fn, device) -> failures, [] = pass), beside the comparison with the
# reference: what the kernel's output must satisfy in distribution, whatever its noise (another engine's rejection
# sampler draws other tokens than the reference's, and is held to the distribution alone).
STATISTICAL_CHECKS: dict[str, Callable[[Callable, str], list[str]]] = {
    "rejection_sample": check_rejection_sampler,
}


def _decode_every_split(dtype: torch.dtype) -> Callable[[str], PagedBatch]:
    """Contexts that fill every split of a split-K decode kernel (3 splits of 32- or 64-key tiles) for each of 3 KV
    heads (GQA 2): a program mapped to the wrong (head, split) only shows when both axes hold keys."""
    return lambda device: make_paged_batch([200, 1, 130, 64], [1] * 4, num_kv_heads=3, group=2, head_dim=32,
                                           block_size=16, dtype=dtype, device=device, seed=7, poison="nan")


def _sampling_across_splits(device: str) -> tuple:
    """A vocabulary a two-stage sampler cuts into several chunks (20,011 entries: nanovllm_ref's kernel reads 3 of
    7,168, the last partial), the greedy rows' best entries in the first, middle and last chunks, and a row at
    t=0.7."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(5, 20011, generator=gen) * 3
    for row, col in enumerate((20010, 9000, 3, 16383)):
        logits[row, col] = 50.0
    temperature = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.7])
    seeds = torch.tensor([5, -7, 2**40 + 3, 9, 123456789])
    counters = torch.tensor([1, 2, 3, 2**33, 77])
    return tuple(t.to(device) for t in (logits, temperature, seeds, counters))


def _sampling_nonfinite_outside_best_chunk(device: str) -> tuple:
    """The vocabulary of several chunks again, with a NaN, a -inf (a top-k / top-p mask) and a +inf in chunks other
    than the one holding the row's best entry: a row's finite flag is that of all its chunks, not of the winner's."""
    gen = torch.Generator().manual_seed(13)
    logits = torch.randn(4, 20011, generator=gen) * 3
    logits[0, 3], logits[0, 15000] = 50.0, float("nan")
    logits[1, 20010], logits[1, 9000] = 50.0, float("-inf")
    logits[2, 9500], logits[2, 100] = 50.0, float("-inf")
    logits[3, 19000] = float("inf")
    temperature = torch.tensor([0.0, 0.7, 0.0, 1.0])
    seeds, counters = torch.tensor([3, 1 << 35, -11, 8]), torch.tensor([1, 9, 2**33 + 1, 4])
    return tuple(t.to(device) for t in (logits, temperature, seeds, counters))


def _sampling_noise_decides(device: str) -> tuple:
    """1,024 rows of 64 logits at temperature 1: a row's best two scores often differ by less than 1e-2, so a Gumbel
    noise that is off by that much where it is large (u near 1, the values that win) draws other tokens."""
    gen = torch.Generator().manual_seed(17)
    n = 1024
    logits = torch.randn(n, 64, generator=gen)
    seeds = torch.arange(n) * 7919 + 3
    return tuple(t.to(device) for t in (logits, torch.ones(n), seeds, torch.arange(n) + 40))


def _silu_wide_rows(device: str) -> tuple:
    """Rows wider than one 1,024-column block (2,500 = 2 full blocks and a partial one)."""
    gen = torch.Generator().manual_seed(13)
    return ((torch.randn(3, 2 * 2500, generator=gen) * 4).to(device),)


def _norm_with_residual(dtype: torch.dtype) -> Callable[[str], tuple]:
    """The fused add + RMSNorm: 3 rows of a hidden size that is no power of two, with a residual (the small draws
    above may all come without one), so the returned residual x + residual is compared bitwise."""
    def inputs(device: str) -> tuple:
        gen = torch.Generator().manual_seed(17)
        x, res = (torch.randn(3, 200, generator=gen) * 3 for _ in range(2))
        return x.to(dtype).to(device), (1 + 0.1 * torch.randn(200, generator=gen)).to(device), 1e-6, \
            res.to(dtype).to(device)
    return inputs


# Fixed inputs per kernel (name -> device -> inputs), beside the Hypothesis draws: shapes large enough that every
# program axis of a multi-program decomposition (splits, heads, column blocks) holds data, which the small CPU
# draws rarely reach.
FIXED_INPUTS: dict[str, dict[str, Callable[[str], Any]]] = {
    "decode_attention": {"every-split-every-kv-head-float32": _decode_every_split(torch.float32),
                         "every-split-every-kv-head-float16": _decode_every_split(torch.float16)},
    "gumbel_sample": {"vocab-across-splits": _sampling_across_splits, "noise-decides": _sampling_noise_decides,
                      "nonfinite-outside-best-chunk": _sampling_nonfinite_outside_best_chunk},
    "silu_and_mul": {"wide-rows": _silu_wide_rows},
    "rejection_sample": {"across-programs": rejection.across_programs},
    "invariant_linear": {"engine-split-layer": gemm.engine_split_layer},
    "rms_norm": {"residual-float32": _norm_with_residual(torch.float32),
                 "residual-float16": _norm_with_residual(torch.float16)},
}


def backend_candidates(backend_cls: type, label: str) -> list[KernelCandidate]:
    """An attention backend of nanovllm_ref.attention (its ``forward`` over the paged cache) as prefill and decode
    candidates: the backends that are not one kernel (sdpa, the CPU default) meet the same poisoned batches."""
    from ..attention import AttentionMetadata

    def prefill(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale):
        meta = AttentionMetadata(slot_mapping=torch.full((q.shape[0],), -1, device=q.device),
                                 query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=block_tables,
                                 max_query_len=int(query_start_loc.diff().max()), max_seq_len=int(seq_lens.max()))
        return backend_cls(q.shape[1], k_cache.shape[2], q.shape[2], scale).forward(q, k_cache, v_cache, meta)

    def decode(q, k_cache, v_cache, block_tables, seq_lens, scale):
        one_each = torch.arange(seq_lens.shape[0] + 1, dtype=torch.int32, device=q.device)  # query_start_loc
        return prefill(q, k_cache, v_cache, one_each, seq_lens, block_tables, scale)

    return [KernelCandidate("prefill_attention", label, prefill), KernelCandidate("decode_attention", label, decode)]


def nanovllm_ref_candidates() -> list[KernelCandidate]:
    """nanovllm_ref's Triton kernels, each wrapped to its reference's signature (each unavailable without triton, or
    without a GPU and the interpreter), and its sdpa attention backend."""
    from ..attention.sdpa_backend import SdpaBackend
    from ..kernels import (
        activation,
        decode_attention,
        fused_moe,
        prefill_attention,
        qkv_epilogue,
        rejection,
        rmsnorm,
        sampling,
        store_kv,
    )

    def decode_with(splits: int | None) -> Callable:
        def decode(q, k_cache, v_cache, block_tables, seq_lens, scale):
            return decode_attention.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                                     num_splits=splits)
        return decode

    def longest_first(q, k_cache, v_cache, block_tables, seq_lens, scale):  # the engine's order (engine/staging.py)
        return decode_attention.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=3,
                                                 order=torch.argsort(-seq_lens.long(), stable=True))

    candidates = [KernelCandidate("decode_attention", f"triton-splits-{n or 'auto'}", decode_with(n),
                                  triton_unavailable) for n in (None, 1, 3)]
    candidates.append(KernelCandidate("decode_attention", "triton-splits-3-longest-first", longest_first,
                                      triton_unavailable))
    return candidates + [
        KernelCandidate("prefill_attention", "triton", prefill_attention.prefill_attention, triton_unavailable),
        KernelCandidate("store_kv", "triton", store_kv.store_kv, triton_unavailable),
        KernelCandidate("rms_norm", "triton", rmsnorm.rms_norm, triton_unavailable),
        KernelCandidate("silu_and_mul", "triton", activation.silu_and_mul, triton_unavailable),
        KernelCandidate("fused_moe", "triton", fused_moe.fused_moe, triton_unavailable),
        KernelCandidate("gumbel_sample", "triton", sampling.gumbel_sample, triton_unavailable),
        KernelCandidate("qkv_epilogue", "triton", qkv_epilogue.qkv_epilogue, triton_unavailable),
        KernelCandidate("rejection_sample", "triton", rejection.rejection_sample, triton_unavailable),
        *(KernelCandidate("invariant_linear", label, fn, triton_unavailable) for label, fn in gemm.candidates()),
        *backend_candidates(SdpaBackend, "sdpa"),
    ]
