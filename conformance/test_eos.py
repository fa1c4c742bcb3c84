"""Several EOS ids in config.json (any engine with run_requests that loads a checkpoint folder; float32).

The checkpoint is served from a copy (files linked) whose config.json lists ``eos_token_id`` = [its EOS, X, Y]
and which has no generation_config.json (vLLM then reads the EOS ids from config.json, as transformers'
``GenerationConfig.from_model_config`` does; nanovllm_ref reads both files). X and Y are tokens the golden greedy
trajectories of two prompts generate: prompt A reaches X (the list's second id) first, prompt B reaches Y (its
third) first, each at step >= 2. Greedy requests of both must stop on that token (kept in token_ids,
finish_reason "stop"; a reported stop_reason is the id, as vLLM makes the EOS ids after the first stop tokens),
and the same requests with ignore_eos run on to max_tokens. An engine honouring only the first or the last id of
the list, or only generation_config.json's, fails. A server (``openai:URL``) serves its own checkpoint: skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanovllm_ref.oracle.adapters import server_url
from nanovllm_ref.oracle.derived import link_checkpoint
from nanovllm_ref.oracle.requests import UNREPORTED, RequestSpec, UnsupportedSetting, supports_requests
from nanovllm_ref.oracle.text_reference import checkpoint_eos

from .harness import ModelSpec, selected_models

DTYPE = "float32"
MAX_TOKENS = 16


def first_steps(tokens: list[int]) -> dict[int, int]:
    """token -> the step it first occurs at."""
    first: dict[int, int] = {}
    for j, t in enumerate(tokens):
        first.setdefault(t, j)
    return first


def eos_pair(trajectories: list[list[int]], eos: set[int]) -> tuple[int, int, int, int] | None:
    """(prompt A, X, prompt B, Y): A reaches X at step >= 2 before any Y, B reaches Y at step >= 2 before any X."""
    firsts = [first_steps(t[:MAX_TOKENS]) for t in trajectories]
    for a, fa in enumerate(firsts):
        for x, sx in fa.items():
            if sx < 2 or x in eos:
                continue
            for b, fb in enumerate(firsts):
                for y, sy in fb.items():
                    if (b != a and y != x and sy >= 2 and y not in eos and fa.get(y, MAX_TOKENS) > sx
                            and fb.get(x, MAX_TOKENS) > sy):
                        return a, x, b, y
    return None


def with_config_eos(src: str, dst: Path, ids: list[int]) -> str:
    link_checkpoint(src, dst, replaced=("config.json", "generation_config.json"))
    config = json.loads((Path(src) / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "eos_token_id": ids}))
    return str(dst)


def test_every_eos_id_of_config_json(pytestconfig, options, engines, references, tmp_path_factory) -> None:
    if server_url(options.engine) is not None:
        pytest.skip("a server serves its own checkpoint: the EOS case needs an engine that loads a checkpoint folder")
    models = selected_models(pytestconfig)
    model = next((m for m in models if m.name == "qwen3-tiny"), models[0])
    ref = references.get(model, DTYPE)
    eos = checkpoint_eos(model.path)
    found = eos_pair([list(o.token_ids) for o in ref.outputs], eos)
    if found is None or len(eos) != 1:
        pytest.skip(f"{model.name}: no two golden trajectories reach two different tokens first")
    a, x, b, y = found
    path = with_config_eos(model.path, tmp_path_factory.mktemp(f"{model.name}-config-eos"), [*eos, x, y])
    adapter = engines.get(ModelSpec(model.name, path, model.golden), DTYPE)
    if not supports_requests(adapter):
        pytest.skip(f"engine {adapter.name} has no run_requests (oracle/requests.py)")
    greedy = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
    specs = [RequestSpec(ref.prompts[i], {**greedy, **extra}) for i in (a, b) for extra in ({}, {"ignore_eos": True})]
    try:
        outs = [o[0] for o in adapter.run_requests(specs)]
    except UnsupportedSetting as e:
        pytest.skip(f"engine lacks a setting: {e}")
    engines.close()  # built on a copy no other module uses
    bad = []
    for (i, stop), (c, ignored) in zip(((a, x), (b, y)), zip(outs[::2], outs[1::2])):
        want = list(ref.outputs[i].token_ids)
        want = want[:want.index(stop) + 1]
        if list(c.token_ids) != want or c.finish_reason != "stop":
            bad.append(f"  {ref.prompt_ids[i]}: tokens {list(c.token_ids)} ({c.finish_reason}), expected {want} "
                       f"(stop on EOS id {stop})")
        elif c.stop_reason is not UNREPORTED and c.stop_reason != stop:
            bad.append(f"  {ref.prompt_ids[i]}: stop_reason {c.stop_reason!r}, expected {stop}")
        if ignored.finish_reason != "length" or len(ignored.token_ids) != MAX_TOKENS:
            bad.append(f"  {ref.prompt_ids[i]} with ignore_eos: {len(ignored.token_ids)} tokens, "
                       f"{ignored.finish_reason!r}")
    assert not bad, f"config.json's eos_token_id {[*eos, x, y]}:\n" + "\n".join(bad)
