#!/bin/bash
# Session 6, issue 17 acceptance 3: the GPU column of the mutation table. Every Triton-kernel mutant of
# tools/mutants.py (a snippet inside a @triton.jit function) and every gpu=True one (flash-attn) against
# `pytest conformance -m gpu` (the kernel module at full shapes; test_golden_gpu on qwen3-tiny where the kernel
# module cannot reach the site), each in its own copy of the tree, all at once (16 cores), the unmutated baseline
# of each command queued first and run alongside. One nvidia-h200 call: 480 s budget, 420 s per pytest.
# Writes $OUT/mutants_gpu/table.md, one log per run there, and $OUT/mutants_gpu.log.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -c "import flash_attn; print('flash_attn', flash_attn.__version__)" 2>/dev/null \
  || echo "flash_attn not installed: flash-attn-not-causal's baseline will fail (reported, not counted)"
python3 -m tools.mutants --gpu --list
timeout 540 python3 -m tools.mutants --gpu --jobs 16 --timeout 420 --budget 480 --out "$OUT/mutants_gpu" \
  > "$OUT/mutants_gpu.log" 2>&1
echo "rc=$?"
cat "$OUT/mutants_gpu.log"
