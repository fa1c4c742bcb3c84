"""Dispatch once: the modules under layers/, models/, kernels/ and attention/ never branch on a tensor's device nor
read the environment (config.resolve_plan decides, from env.py, and the modules pick their functions when they are
built), and the engine sets no attribute on the model's modules by walking over them (a module's mode comes from
the plan it is built for, so engines side by side keep their own)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nanovllm_ref"
BUILT_FROM_THE_PLAN = ("layers", "models", "kernels", "attention")


def per_call_decisions(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every device branch or environment read in a module's code (not its comments or strings)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "is_cuda":
            found.append((node.lineno, ".is_cuda"))
        elif isinstance(node, ast.Attribute) and node.attr == "type" and (
                isinstance(node.value, ast.Attribute) and node.value.attr == "device"
                or isinstance(node.value, ast.Name) and node.value.id == "device"):
            found.append((node.lineno, "device.type"))
        elif isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
            found.append((node.lineno, f"os.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(node.lineno, f"from os import {a.name}") for a in node.names if a.name in ("environ", "getenv")]
    return found


def module_walk_assignments(tree: ast.AST) -> list[int]:
    """Lines of loops over `*.modules()` / `*.named_modules()` whose body sets an attribute (or calls setattr)."""
    found = []
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.For):
            continue
        walks = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in ("modules", "named_modules", "children") for n in ast.walk(loop.iter))
        if not walks:
            continue
        for node in (n for stmt in loop.body for n in ast.walk(stmt)):
            sets = isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
                isinstance(t, ast.Attribute) for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
            calls = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
            if sets or calls:
                found.append(loop.lineno)
                break
    return found


def sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (PACKAGE / folder).rglob("*.py"))


@pytest.mark.parametrize("path", sources(*BUILT_FROM_THE_PLAN), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_device_branch_or_environment_read_below_the_plan(path):
    found = per_call_decisions(ast.parse(path.read_text()))
    assert not found, (f"{path.relative_to(PACKAGE)}: {found}: take the decision from config.Plan when the module "
                       "is built, or as a parameter whose default comes from nanovllm_ref/env.py")


@pytest.mark.parametrize("path", sources("engine"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_engine_sets_no_attribute_by_walking_the_model(path):
    lines = module_walk_assignments(ast.parse(path.read_text()))
    assert not lines, f"{path.relative_to(PACKAGE)}, lines {lines}: build the modules for the plan instead"


def test_the_checks_see_what_they_forbid():
    """The patterns of main before the plan: each is found."""
    branch = "def f(x):\n    return rms_norm if x.is_cuda else ref\n"
    env = "import os\nSLOW = os.environ.get('NANOVLLM_REF_SLOW_KERNELS')\n"
    device = "def g(device):\n    return device.type != 'cuda'\n"
    walk = ("def h(model):\n    for m in model.modules():\n        if hasattr(m, 'batch_invariant'):\n"
            "            m.batch_invariant = True\n")
    assert [what for src in (branch, env, device) for _, what in per_call_decisions(ast.parse(src))] == [
        ".is_cuda", "os.environ", "device.type"]
    assert module_walk_assignments(ast.parse(walk)) == [2]
    assert module_walk_assignments(ast.parse("def k(model):\n    return [m for m in model.modules()]\n")) == []
    assert per_call_decisions(ast.parse('"""x.is_cuda and os.environ, in words"""\n')) == []


def test_config_imports_no_layer_or_backend():
    """config.py resolves the plan that the modules are built from: it imports none of them (no import cycle)."""
    tree = ast.parse((PACKAGE / "config.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert not [m for m in imported if m.split(".")[0] in BUILT_FROM_THE_PLAN], imported


def test_modules_pick_their_functions_from_the_plan_they_are_built_for():
    """Two plans side by side, two sets of choices (no global, no class attribute): kernels or references, the
    batch-invariant products or not, the fused epilogue, the fp8 decode kernel."""
    import torch.nn.functional as F

    from nanovllm_ref.attention import TorchBackend, TritonBackend
    from nanovllm_ref.config import Plan
    from nanovllm_ref.kernels import matmul, rmsnorm
    from nanovllm_ref.kernels.invariant_attention import invariant_attention_reference
    from nanovllm_ref.kernels.prefill_attention import prefill_attention_reference
    from nanovllm_ref.layers.linear import ReplicatedLinear
    from nanovllm_ref.layers.norm import RMSNorm

    cpu, gpu_inv = Plan(), Plan(device="cuda", use_kernels=True, batch_invariant=True, fused_epilogue=True,
                                gluon_fp8_decode=True)
    assert RMSNorm(8, 1e-6, cpu).norm is rmsnorm.rms_norm_reference
    assert RMSNorm(8, 1e-6, gpu_inv).norm is rmsnorm.rms_norm
    assert ReplicatedLinear(4, 4, False, cpu).product is F.linear
    assert ReplicatedLinear(4, 4, False, gpu_inv).product is matmul.invariant_linear
    assert ReplicatedLinear(4, 4, False, Plan(batch_invariant=True)).product is matmul.invariant_linear_reference
    assert TorchBackend(4, 2, 8, 1.0, cpu).attend is prefill_attention_reference
    assert TorchBackend(4, 2, 8, 1.0, Plan(batch_invariant=True)).attend is invariant_attention_reference
    plain, fused = TritonBackend(4, 2, 8, 1.0, cpu), TritonBackend(4, 2, 8, 1.0, gpu_inv)
    assert not plain.fuses_epilogue and not plain.use_gluon and fused.fuses_epilogue and fused.use_gluon
    assert TorchBackend(4, 2, 8, 1.0, gpu_inv).batch_invariant
    assert not TorchBackend(4, 2, 8, 1.0, cpu).batch_invariant


def test_the_plan_takes_the_environment_once(monkeypatch, tmp_path):
    """resolve_plan reads env.py's variables when the engine is resolved: the CPU's plan is the references'; CUDA's
    takes the kernels, the fused epilogue, graphs unless enforce_eager, and the Gluon fp8 decode on sm_90 unless
    NANOVLLM_REF_GLUON=0 or NANOVLLM_REF_SLOW_KERNELS=1 (which also gives the slow tiles)."""
    import torch

    from nanovllm_ref import env
    from nanovllm_ref.config import Config, resolve_plan

    f32 = torch.float32
    cpu = resolve_plan(Config(model=str(tmp_path), batch_invariant=True), "cpu", f32, f32, "torch")
    assert (cpu.use_kernels, cpu.fused_epilogue, cpu.cuda_graphs, cpu.gluon_fp8_decode) == (False,) * 4
    assert cpu.batch_invariant and cpu.cpu_weight_layout and not cpu.kv_fp8 and cpu.backend == "torch"
    monkeypatch.setattr(env, "hopper", lambda device: True)  # (no GPU here: an sm_90 one, as far as the plan knows)
    for gluon, slow in (("1", "0"), ("0", "0"), ("1", "1")):
        monkeypatch.setenv("NANOVLLM_REF_GLUON", gluon)
        monkeypatch.setenv("NANOVLLM_REF_SLOW_KERNELS", slow)
        gpu = resolve_plan(Config(model=str(tmp_path)), "cuda", torch.bfloat16, torch.float8_e4m3fn, "triton")
        assert gpu.use_kernels and gpu.fused_epilogue and gpu.cuda_graphs and gpu.kv_fp8 and not gpu.cpu_weight_layout
        assert gpu.gluon_fp8_decode == ((gluon, slow) == ("1", "0")) and gpu.slow_kernels == (slow == "1")
    eager = resolve_plan(Config(model=str(tmp_path), enforce_eager=True), "cuda", f32, f32, "triton")
    assert not eager.cuda_graphs
