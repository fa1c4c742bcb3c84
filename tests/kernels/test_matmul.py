"""The batch-invariant products (kernels/matmul.py) and attention (kernels/invariant_attention.py).

Each is checked for its value (against F.linear / the attention reference, within rounding) and for what it is
for: a row's result bitwise the same whatever rows surround it, how many there are, and where it sits among them.
On the CPU the Triton kernels run in the interpreter (float32 / float16: its bfloat16 dot is wrong, FACTS.md).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nanovllm_ref.kernels import matmul
from nanovllm_ref.kernels.invariant_attention import KEY_TILE, invariant_attention_reference
from nanovllm_ref.kernels.matmul import ROW_TILE, invariant_linear, invariant_linear_reference
from nanovllm_ref.kernels.prefill_attention import prefill_attention_reference
from nanovllm_ref.testing import relative_error

from .conftest import DEVICE, ON_GPU

PRODUCTS = [invariant_linear_reference, invariant_linear]


def embedded(row: torch.Tensor, others: torch.Tensor, at: int) -> torch.Tensor:
    return torch.cat([others[:at], row[None], others[at:]])


@pytest.mark.parametrize("product", PRODUCTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("bias", [False, True])
def test_value_is_the_linear_product(product, bias):
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(37, 96, generator=gen, device=DEVICE)
    w = torch.randn(80, 96, generator=gen, device=DEVICE)
    b = torch.randn(80, generator=gen, device=DEVICE) if bias else None
    out = product(x.view(37, 1, 96), w, b)
    assert out.shape == (37, 1, 80)
    assert relative_error(out.view(37, 80), F.linear(x, w, b)) < 1e-5


# the Triton kernel's invariance is a property of the compiled kernel: the interpreter's numpy dot (OpenBLAS) computes
# a row differently by its position even in a fixed shape, so it is checked on the GPU only
INVARIANT = [invariant_linear_reference] + ([invariant_linear] if ON_GPU else [])
CPU_DTYPES = [torch.float32] + ([torch.float16, torch.bfloat16] if ON_GPU else [])


@pytest.mark.parametrize("product", INVARIANT, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_row_is_bitwise_independent_of_the_batch(product, dtype):
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    k, n = 200, 72  # neither a multiple of the tiles
    w = (torch.randn(n, k, generator=gen, device=DEVICE) / 8).to(dtype)
    row = torch.randn(k, generator=gen, device=DEVICE).to(dtype)
    alone = product(row[None], w)[0]
    cases = [(2, 1), (ROW_TILE + 3, 5), (70, 69), (130, 64), *((ROW_TILE, at) for at in range(ROW_TILE))]
    for m, at in cases:
        others = torch.randn(m - 1, k, generator=gen, device=DEVICE).to(dtype)
        got = product(embedded(row, others, at), w)[at]
        assert torch.equal(got, alone), f"{m} rows, the row at {at}: differs from the row alone"


def test_plain_cpu_matmul_is_not_row_invariant():
    """Why the mode exists: the BLAS's own choice of kernel by row count changes a row's bits (on this machine's
    BLAS; where it does not, the batch-invariance mutants still show the engine-level effect)."""
    gen = torch.Generator().manual_seed(2)
    w, row = torch.randn(512, 1024, generator=gen), torch.randn(1024, generator=gen)
    alone = F.linear(row[None], w)[0]
    batches = [F.linear(embedded(row, torch.randn(m - 1, 1024, generator=gen), m // 2), w)[m // 2]
               for m in (3, 17, 64, 200)]
    if all(torch.equal(b, alone) for b in batches):
        pytest.skip("this BLAS happens to be row-invariant at these shapes")
    assert not all(torch.equal(b, alone) for b in batches)


def paged(gen: torch.Generator, lens: list[int], kv_heads: int, d: int, block: int = 16):
    blocks = sum(-(-n // block) for n in lens) + 1
    k_cache = torch.randn(blocks, block, kv_heads, d, generator=gen)
    v_cache = torch.randn(blocks, block, kv_heads, d, generator=gen)
    width = max(-(-n // block) for n in lens)
    tables, nxt = torch.zeros(len(lens), width, dtype=torch.int32), 1
    for i, n in enumerate(lens):
        for j in range(-(-n // block)):
            tables[i, j], nxt = nxt, nxt + 1
    return k_cache, v_cache, tables


def test_invariant_attention_value_and_chunk_invariance():
    """Against the reference within rounding; and a query token's output bitwise the same whether it comes in a
    long chunk, a short one, alone (decode) or beside other sequences."""
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, d, n = 4, 2, 32, 2 * KEY_TILE + 7
    k_cache, v_cache, tables = paged(gen, [n, 45], kv_heads, d)
    q_all = torch.randn(n, heads, d, generator=gen)
    other = torch.randn(30, heads, d, generator=gen)

    def run(q_parts: list[torch.Tensor], q_lens: list[int], seq_lens: list[int], rows: list[int]) -> torch.Tensor:
        starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        lens, tab = torch.tensor(seq_lens, dtype=torch.int32), tables[rows]
        out = invariant_attention_reference(torch.cat(q_parts), k_cache, v_cache, starts, lens, tab, d**-0.5)
        ref = prefill_attention_reference(torch.cat(q_parts), k_cache, v_cache, starts, lens, tab, d**-0.5)
        assert relative_error(out, ref) < 1e-5
        return out

    token = n - 1  # the last prompt token, as its logits make the first output token
    whole = run([q_all], [n], [n], [0])[token]
    tail = run([q_all[n - 5 :]], [5], [n], [0])[4]
    decode = run([q_all[token:]], [1], [n], [0])[0]
    beside = run([other, q_all[token:]], [30, 1], [45, n], [1, 0])[30]
    for name, got in (("a 5-token chunk", tail), ("a decode step", decode), ("beside a 30-token chunk", beside)):
        assert torch.equal(got, whole), f"the token's output in {name} differs from the whole prompt's"


@pytest.mark.parametrize("bias", [False, True])
def test_split_k_paths_agree_bitwise(bias):
    """The split-K configuration: its two paths (each program adds its K splits in order, or a second pass adds the
    float32 partials in order) are the same operations, so the same bits; and the value is the product's."""
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    x = torch.randn(37, 200, generator=gen, device=DEVICE)  # K = 200
    w = torch.randn(80, 200, generator=gen, device=DEVICE)
    b = torch.randn(80, generator=gen, device=DEVICE) if bias else None
    config = (16, 32, 32, 2, 4, 2, 3)  # K_SPLIT 96 (a multiple of BLOCK_K): splits of 96, 96 and 8
    serial, parts = (invariant_linear(x, w, b, config=config, serial=s) for s in (True, False))
    assert relative_error(parts, F.linear(x, w, b)) < 1e-5
    assert torch.equal(serial, parts)


def test_configuration_is_per_layer_shape():
    """The measured table covers the headline model's layers with valid configurations; other shapes take the
    module's default tiles unsplit (never anything chosen by the row count: gemm_config takes no row count)."""
    table = matmul._tuned()
    assert (1024, 3072) in table and (4096, 1024) in table
    for (n, k), (block_m, block_n, block_k, _group_m, warps, _stages, split) in table.items():
        assert all(b & (b - 1) == 0 for b in (block_m, block_n, block_k, warps)) and 1 <= split <= k // block_k
        assert matmul.gemm_config(n, k) == table[n, k]
    assert matmul.gemm_config(80, 96) == matmul.NARROW_TILE and matmul.gemm_config(4096, 96) == matmul.TILE
