"""tools/mutants_gpu.py, the GPU column of the mutation table, on the CPU: which mutants it picks (snippets inside
@triton.jit functions, plus gpu=True), the commands it builds, how it classifies a run, and its parallel runner
end to end (a baseline, a real mutant caught, an equivalent rewrite surviving, a budget) with the Triton
interpreter standing in for the GPU."""

from __future__ import annotations

from dataclasses import replace

from tools.mutants import MUTANTS, ROOT, find, pytest_env
from tools.mutants_gpu import (
    GOLDEN_GPU,
    Run,
    classify,
    gpu_args,
    gpu_mutants,
    mark_baseline_failures,
    plan,
    run_all,
    table,
    triton_kernel_lines,
)


def test_picks_the_snippets_inside_triton_kernels_and_the_gpu_sites() -> None:
    chosen = {m.name for m in gpu_mutants(ROOT, MUTANTS)}
    assert {"rmsnorm-kernel-mean", "rotary-kernel-sign", "attention-kernel-causal", "store-kv-kernel-slot0",
            "rmsnorm-kernel-input-dtype", "decode-reduce-no-max", "online-softmax-max-reset",
            "kernel-key-ignores-position", "kernel-nan-row-unflagged", "flash-attn-not-causal", "silu-kernel-sign",
            "fused-moe-kernel-acc-reset", "qkv-epilogue-v-from-k", "fp8-decode-k-scale-twice",
            "fp8-gluon-k-scale-twice", "fp8-gluon-v-scale-axis", "fp8-gluon-cvt-halves-swapped",
            "fp8-gluon-tail-mask"} <= chosen
    # the pure-torch references next to the kernels are the CPU column's
    # a kernel site the GPU's own conversion makes equivalent there (satfinite) is the CPU column's alone
    assert "fp8-no-saturation" not in chosen
    assert not chosen & {"rmsnorm-eps", "rotary-reference-sign", "temperature-multiplies", "seed-position-ignored",
                         "attention-causal-reference", "loader-kv-swap"}
    source = "import triton\n@triton.jit\ndef k(x):\n    y = x\n    return y\n\ndef host(x):\n    return x\n"
    assert triton_kernel_lines(source) == [(3, 5)]  # the def line to the last


def test_commands_run_the_gpu_tests_that_reach_the_site() -> None:
    (kernel,) = find(MUTANTS, ["rmsnorm-kernel-mean"])
    assert gpu_args(kernel) == ("conformance/test_kernels.py", "-k", "rms_norm", "-m", "gpu")
    (flash,) = find(MUTANTS, ["flash-attn-not-causal"])
    assert gpu_args(flash)[: len(GOLDEN_GPU)] == GOLDEN_GPU and "attention_backend=flash-attn" in gpu_args(flash)
    # fp8 kernel sites (Triton and Gluon) run the fp8 tier's kernel check, which puts them on CUDA
    for name in ("fp8-decode-v-scale-axis", "fp8-gluon-tail-mask", "fp8-decode-k-scale-twice"):
        (fp8,) = find(MUTANTS, [name])
        assert gpu_args(fp8) == ("conformance/test_fp8_kv.py", "-k", "kernels"), name
    # a kernel site that the kernel module does not reach runs the engine on CUDA against the goldens
    elsewhere = replace(kernel, name="epilogue", conformance=("conformance/test_workload.py",))
    assert gpu_args(elsewhere) == GOLDEN_GPU
    runs = plan(gpu_mutants(ROOT, MUTANTS))
    baselines = [r for r in runs if r.mutant is None]
    assert runs[: len(baselines)] == baselines and len({r.args for r in baselines}) == len(baselines)
    assert {r.args for r in runs} == {r.args for r in baselines}
    assert "TRITON_INTERPRET" not in pytest_env(ROOT, interpret=False)
    assert pytest_env(ROOT, interpret=True)["TRITON_INTERPRET"] == "1"


def test_classifies_machine_failures_timeouts_and_baselines() -> None:
    assert classify(1, "FAILED conformance/test_kernels.py::test_kernel_gpu[x] - boom\n") == (
        "caught", "conformance/test_kernels.py::test_kernel_gpu[x]")
    assert classify(1, "torch.OutOfMemoryError: CUDA out of memory.\n")[0] == "machine failure"
    assert classify(124, "(timeout)")[0] == "timeout" and classify(0, "")[0] == "survived"
    assert classify(5, "")[0] == "no tests"
    (m,) = find(MUTANTS, ["rmsnorm-kernel-mean"])
    runs = mark_baseline_failures([Run("baseline-0", None, ("a",), "caught", "x"), Run(m.name, m, ("a",), "caught"),
                                   Run("other", m, ("b",), "caught")])
    assert [r.status for r in runs] == ["caught", "baseline failed", "baseline missing"]
    assert "| baseline-0 | `pytest -x -q" in table(runs) and "**FAILED** (`x`)" in table(runs)


def test_runs_baseline_and_mutants_in_parallel_copies() -> None:
    """The runner end to end on the CPU: the Triton interpreter instead of a GPU, the CPU kernel test."""
    (mutant,) = find(MUTANTS, ["rmsnorm-kernel-mean"])
    args = ("conformance/test_kernels.py", "-k", "rms_norm and x100")
    equivalent = replace(mutant, name="equivalent", new="var = tl.sum(h * h, axis=0) / hidden")
    runs = [Run("baseline-0", None, args), Run(mutant.name, mutant, args), Run("equivalent", equivalent, args)]
    before = (ROOT / mutant.file).read_text()
    done = run_all(ROOT, runs, jobs=3, timeout=600, budget=900, env_extra={"TRITON_INTERPRET": "1"},
                   progress=lambda *a, **k: None)
    assert [r.status for r in done] == ["survived", "caught", "survived"], done
    assert "rms_norm" in done[1].by and (ROOT / mutant.file).read_text() == before
    late = run_all(ROOT, [Run("baseline-0", None, args)], jobs=1, timeout=600, budget=0, progress=lambda *a, **k: None)
    assert late[0].status == "not run (budget)"
    text = table(done)
    assert "| baseline-0 |" in text and "caught 1/2 GPU mutants" in text and "equivalent (survived)" in text
