"""Run Triton kernels in Triton's interpreter on machines without a GPU (exact but slow; bf16 tl.dot is broken
there, so CPU checks use float32 / float16).

TRITON_INTERPRET must be set before any @triton.jit function is defined (triton's own included). When triton or
the kernels were already imported in compiled mode (a parent conftest, an earlier test module), they are reloaded
so that their @jit functions are re-decorated for the interpreter.
"""

from __future__ import annotations

import importlib
import os
import sys

KERNEL_MODULES = ("_triton_common", "prefill_attention", "decode_attention", "store_kv", "rmsnorm", "activation",
                  "fused_moe", "sampling", "rejection", "qkv_epilogue")


def use_triton_interpreter() -> bool:
    """Set TRITON_INTERPRET=1 when there is no CUDA GPU and it is not set, and make sure that triton and the kernels
    loaded so far are in interpreter mode (a pip-installed nanovllm_ref's pytest plugin imports them before any
    conftest runs); returns whether the interpreter is on."""
    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    if sys.modules.get("triton") is not None and not _interpreted():
        import triton.language
        import triton.language.standard

        importlib.reload(triton.language.standard)
        importlib.reload(triton.language)
        for name in KERNEL_MODULES:
            module = sys.modules.get(f"nanovllm_ref.kernels.{name}")
            if module is not None:
                importlib.reload(module)
    _index_scalars_of_any_rank()
    return True


def _index_scalars_of_any_rank() -> None:
    """Triton's interpreter before 3.9 turns a scalar tensor into a Python int with ``int(data)``, which numpy >= 2.4
    refuses for the shape-(1,) arrays a scalar load gives ("only 0-dimensional arrays can be converted to Python
    scalars", seen in split-K decode's ``range(start, end, BLOCK_N)`` with triton 3.6). 3.9 squeezes first
    (triton/runtime/interpreter.py, ``__index__``); older versions get the same after their own patching."""
    try:
        import triton
    except ImportError:  # no triton: the kernel candidates skip (testing/kernels.py)
        return
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 9):
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "squeezes_index", False):
        return

    def patch_lang_tensor(tensor: type, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor.squeezes_index = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _interpreted() -> bool:
    """Whether triton's own @jit helpers were defined for the interpreter."""
    import triton.language.standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(triton.language.standard.sum, InterpretedFunction)
