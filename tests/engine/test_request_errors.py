"""Every bad input gets a clear error naming the problem, raised before any state changes, and the
same engine then serves a valid request correctly."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from nanovllm_ref import LLM, SamplingParams

from ..conftest import QWEN3, checkpoint_path

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(str(checkpoint_path(QWEN3)), dtype="float32", max_model_len=256)


@pytest.fixture(scope="module")
def reference_tokens(llm):
    return llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids


BAD_REQUESTS = {
    "empty prompt": ([], GREEDY, ValueError, "empty"),
    "negative token id": ([5, -1], GREEDY, ValueError, "outside the vocabulary"),
    "token id >= vocab": ([5, 10**9], GREEDY, ValueError, "outside the vocabulary"),
    "prompt longer than max_model_len": ([5] * 300, GREEDY, ValueError, "max_model_len"),
    "prompt + max_tokens too long": ([5] * 250, SamplingParams(max_tokens=10), ValueError, "max_model_len"),
    "token ids of the wrong type": ([5, "6"], GREEDY, TypeError, "list of ints"),
    "prompt of the wrong type": (42, GREEDY, TypeError, "prompt must be"),
    "params of the wrong type": ([5], {"max_tokens": 3}, TypeError, "SamplingParams"),
    "top_k > vocab": ([5], SamplingParams(top_k=10**6), ValueError, "top_k must be <= the vocabulary size"),
    "logit_bias id >= vocab": ([5], SamplingParams(logit_bias={10**6: 1.0}), ValueError, "logit_bias has token id"),
    "stop_token_ids id >= vocab": ([5], SamplingParams(stop_token_ids=[10**6]), ValueError, "stop_token_ids has"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_is_refused_and_the_engine_keeps_serving(llm, reference_tokens, case):
    prompt, params, error, words = BAD_REQUESTS[case]
    free_before = llm.engine.block_manager.num_free_blocks
    with pytest.raises(error, match=words):
        llm.generate([[5, 6, 7], prompt], [GREEDY, params], use_tqdm=False)
    with pytest.raises(error, match=words):
        llm.add_request(prompt, params)
    assert not llm.has_unfinished() and llm.engine.block_manager.num_free_blocks == free_before
    assert llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids == reference_tokens


BAD_PARAMS = {
    "max_tokens < 1": (dict(max_tokens=0), "max_tokens"),
    "negative temperature": (dict(temperature=-0.1), "temperature"),
    "NaN temperature": (dict(temperature=math.nan), "temperature"),
    "top_p 0": (dict(top_p=0.0), "top_p"),
    "top_p > 1": (dict(top_p=1.5), "top_p"),
    "top_k -2": (dict(top_k=-2), "top_k"),
    "top_k float": (dict(top_k=2.5), "top_k"),
    "logprobs above max": (dict(logprobs=21), r"logprobs must be None or an int in \[0, 20\]"),
    "prompt_logprobs negative": (dict(prompt_logprobs=-1), "prompt_logprobs"),
    "stop_token_ids not ints": (dict(stop_token_ids=["a"]), "stop_token_ids"),
    "seed float": (dict(seed=1.5), "seed"),
    "seed beyond 64 bits": (dict(seed=2**64), r"seed must be an int in \[-9223372036854775808, 18446744073709551615\]"),
    "n 0": (dict(n=0), r"n must be an int in \[1, 4096\]"),
    "min_p > 1": (dict(min_p=1.5), r"min_p must be a number in \[0.0, 1.0\]"),
    "presence_penalty > 2": (dict(presence_penalty=2.5), r"presence_penalty must be a number in \[-2.0, 2.0\]"),
    "frequency_penalty nan": (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    "repetition_penalty 0": (dict(repetition_penalty=0.0), r"repetition_penalty must be a number in \(0.0"),
    "min_tokens > max_tokens": (dict(min_tokens=5, max_tokens=4), r"min_tokens must be an int in \[0, 4\]"),
    "stop empty string": (dict(stop=[""]), "stop must be"),
    "logit_bias key not an int": (dict(logit_bias={"five": 1.0}), "logit_bias keys"),
    "logit_bias value > 100": (dict(logit_bias={5: 101.0}), r"logit_bias\[5\] must be a number in \[-100, 100\]"),
    "logprobs_mode unknown": (dict(logprobs_mode="raw"), "logprobs_mode must be one of"),
    "include_stop_str_in_output not bool": (dict(include_stop_str_in_output=1), "include_stop_str_in_output"),
}


@pytest.mark.parametrize("case", list(BAD_PARAMS))
def test_bad_sampling_params_name_the_field(case):
    kwargs, words = BAD_PARAMS[case]
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_sampling_params_list_of_wrong_length(llm, reference_tokens):
    with pytest.raises(ValueError, match="list of 2"):
        llm.generate([[5], [6]], [GREEDY], use_tqdm=False)
    assert llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids == reference_tokens


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(foo=1), TypeError, "unknown LLM config key"),
        (dict(kvcache_block_size=24), ValueError, "power of two"),
        (dict(kvcache_block_size=8), ValueError, "kvcache_block_size"),
        (dict(dtype="int8"), ValueError, "dtype"),
        (dict(device="tpu"), ValueError, "device"),
        (dict(max_model_len=10**6), ValueError, "max_position_embeddings"),
        (dict(num_kvcache_blocks=4), ValueError, "needs 128 blocks"),
        (dict(tensor_parallel_size=3), ValueError, "tensor_parallel_size=3 must divide"),
        (dict(attention_backend="magic"), ValueError, "attention_backend"),
        (dict(cpu_threads=0), ValueError, "cpu_threads must be an int >= 1"),
        (dict(async_scheduling=1), ValueError, "async_scheduling must be a bool or None"),
    ],
)
def test_bad_config_is_refused_at_construction(kwargs, error, words):
    with pytest.raises(error, match=words):
        LLM(str(checkpoint_path(QWEN3)), **{"dtype": "float32", **kwargs})


@pytest.fixture()
def broken_checkpoint(tmp_path):
    src = str(checkpoint_path(QWEN3))
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _edit_weights(folder, edit) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_missing_folder():
    with pytest.raises(ValueError, match="does not exist"):
        LLM("/nonexistent/model")


def test_no_safetensors(broken_checkpoint):
    os.remove(broken_checkpoint / "model.safetensors")
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        LLM(str(broken_checkpoint))


def test_missing_tensor(broken_checkpoint):
    _edit_weights(broken_checkpoint, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(ValueError, match="missing tensors.*layers.1.mlp.down_proj"):
        LLM(str(broken_checkpoint))


def test_missing_packed_shard(broken_checkpoint):
    _edit_weights(broken_checkpoint, lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match=r"qkv_proj.weight\[k\]"):
        LLM(str(broken_checkpoint))


def test_extra_tensor(broken_checkpoint):
    _edit_weights(broken_checkpoint, lambda t: t.__setitem__("model.layers.0.surprise.weight", torch.zeros(2)))
    with pytest.raises(ValueError, match="surprise.weight.*no counterpart"):
        LLM(str(broken_checkpoint))


# a packed linear, the vocab-parallel embedding (both dims) and a plain parameter (no weight_loader)
@pytest.mark.parametrize("name, dims", [("model.layers.0.mlp.up_proj.weight", 0), ("model.embed_tokens.weight", 0),
                                        ("model.embed_tokens.weight", 1), ("model.norm.weight", 0)])
def test_wrong_shape_names_tensor_and_both_shapes(broken_checkpoint, name, dims):
    def shrink(t):
        t[name] = t[name].narrow(dims, 0, t[name].shape[dims] - 1).contiguous()

    _edit_weights(broken_checkpoint, shrink)
    shape = r"\(\d+(, \d+)?,?\)"
    with pytest.raises(ValueError, match=rf"{name}.*checkpoint has {shape}, model expects {shape}"):
        LLM(str(broken_checkpoint))


def test_unsupported_tensor_dtype(broken_checkpoint):
    def quantize(t):
        t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"].to(torch.int8)

    _edit_weights(broken_checkpoint, quantize)
    with pytest.raises(ValueError, match="up_proj.weight.*dtype torch.int8"):
        LLM(str(broken_checkpoint))


def test_truncated_safetensors(broken_checkpoint):
    path = broken_checkpoint / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot read 'model.safetensors'"):
        LLM(str(broken_checkpoint))


def test_unsupported_architecture(broken_checkpoint):
    cfg_path = broken_checkpoint / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture.*Qwen3ForCausalLM"):
        LLM(str(broken_checkpoint))


def test_unsupported_rope_scaling_is_refused(broken_checkpoint):
    cfg_path = broken_checkpoint / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    cfg.pop("rope_parameters", None)
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="rope"):
        LLM(str(broken_checkpoint))


def test_checkpoint_without_tokenizer_serves_token_ids(broken_checkpoint, reference_tokens):
    for name in os.listdir(broken_checkpoint):
        if "token" in name and name.endswith(".json"):
            os.remove(broken_checkpoint / name)
    llm = LLM(str(broken_checkpoint), dtype="float32", max_model_len=256)
    out = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0]
    assert out.token_ids == reference_tokens and out.text == ""
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate(["hello"], GREEDY, use_tqdm=False)


def test_abort_frees_blocks_mid_run(llm, reference_tokens):
    bm = llm.engine.block_manager
    rid = llm.add_request([5] * 40, SamplingParams(max_tokens=50, ignore_eos=True))
    keep = llm.add_request([5, 6, 7], GREEDY)
    llm.step()
    llm.step()
    out = llm.abort_request(rid)
    assert out.finish_reason == "abort" and out.request_id == rid
    done = []
    while llm.has_unfinished():
        done += [o for o in llm.step() if o.finished]
    assert [o.request_id for o in done] == [keep] and done[0].token_ids == reference_tokens
    assert bm.num_free_blocks == bm.num_blocks


def test_nan_logits_fail_one_request_only(llm, reference_tokens, monkeypatch):
    runner = llm.engine.runner
    original = runner.model.compute_logits

    def poisoned(hidden):
        logits = original(hidden)
        logits[0] = float("nan")  # the first logits row of every step: the first scheduled request
        return logits

    monkeypatch.setattr(runner.model, "compute_logits", poisoned)
    outs = llm.generate([[9, 9, 9], [5, 6, 7]], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    assert outs[0].finish_reason == "error" and "non-finite" in outs[0].error
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks
    assert llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids == reference_tokens
