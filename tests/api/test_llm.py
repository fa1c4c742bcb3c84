"""`LLM`'s offline API as vLLM users call it: `generate` with one prompt (a text, token ids, a prompt dict) or a
list, `chat` with one conversation or a list (the checkpoint's or a given chat template, vLLM's options), and
golden checkpoint names resolved to their folders by the caller (golden.load.resolve_model), never by `LLM`."""

from __future__ import annotations

import pytest

from golden.load import resolve_model
from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.chat_template import read_chat_template

from ..conftest import QWEN3, checkpoint_path
from ..support.server import CHATML

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
CONVERSATION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def main("}]


@pytest.fixture(scope="module")
def llm():
    with LLM(resolve_model(QWEN3), dtype="float32", max_model_len=256) as llm:  # a golden name's folder
        yield llm


def test_a_golden_name_resolves_to_its_checkpoint_and_llm_reads_folders_only(llm, tmp_path, monkeypatch):
    assert llm.config.model == str(checkpoint_path(QWEN3)) == llm.model_name
    monkeypatch.chdir(tmp_path)  # the engine does not read golden names: that is its callers' (the CLI, the oracle)
    with pytest.raises(ValueError, match=f"{QWEN3!r} does not exist"):
        LLM(QWEN3, dtype="float32")


def test_one_prompt_in_any_form_equals_the_same_prompt_in_a_list(llm):
    [ref] = llm.generate(["def main("], GREEDY, use_tqdm=False)
    ids = ref.prompt_token_ids
    for prompt in ("def main(", ids, {"prompt": "def main("}, {"prompt_token_ids": ids}):
        outs = llm.generate(prompt, GREEDY, use_tqdm=False)
        assert [o.token_ids for o in outs] == [ref.token_ids], prompt
    outs = llm.generate([{"prompt_token_ids": ids}, "import os"], GREEDY, use_tqdm=False)
    assert outs[0].token_ids == ref.token_ids and len(outs) == 2
    assert llm.generate([], GREEDY, use_tqdm=False) == []  # an empty batch


@pytest.mark.parametrize("bad, message", [
    ({"prompt": "x", "extra": 1}, "either 'prompt' or 'prompt_token_ids'"),
    (None, "prompts must be"),
    ([3.5], "a prompt must be a str or a list of token ids"),
])
def test_bad_prompts_are_refused_with_a_message(llm, bad, message):
    with pytest.raises(TypeError, match=message):
        llm.generate(bad, GREEDY, use_tqdm=False)
    assert not llm.has_unfinished()


def test_chat_is_generate_on_the_rendered_conversation(llm):
    template = read_chat_template(CHATML)
    assert read_chat_template("chatml") == template  # the built-in one (`--chat-template chatml`)
    [out] = llm.chat(CONVERSATION, GREEDY, use_tqdm=False, chat_template=template)
    text = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\ndef main(<|im_end|>\n<|im_start|>assistant\n"
    [ref] = llm.generate(text, GREEDY, use_tqdm=False)
    assert out.prompt_token_ids == ref.prompt_token_ids and out.token_ids == ref.token_ids
    # a list of conversations; text parts as content; no generation prompt
    parts = [{"role": "user", "content": [{"type": "text", "text": "def "}, {"type": "text", "text": "main("}]}]
    outs = llm.chat([CONVERSATION, parts], GREEDY, use_tqdm=False, chat_template=template)
    assert len(outs) == 2 and outs[0].token_ids == ref.token_ids
    [bare] = llm.chat(parts, GREEDY, use_tqdm=False, chat_template=template, add_generation_prompt=False)
    assert bare.prompt_token_ids == llm.tokenizer.encode("<|im_start|>user\ndef main(<|im_end|>\n",
                                                         add_special_tokens=False)


def test_chat_template_kwargs_reach_the_template(llm):
    template = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    [out] = llm.chat(CONVERSATION[1:], GREEDY, use_tqdm=False, chat_template=template,
                     chat_template_kwargs={"greeting": "hi "})
    assert out.prompt_token_ids == llm.tokenizer.encode("hi def main(", add_special_tokens=False)


def test_chat_without_a_template_or_with_bad_messages_says_why(llm, monkeypatch):
    monkeypatch.setattr(llm.tokenizer, "chat_template", None)  # (whether the checkpoint ships one or not)
    with pytest.raises(ValueError, match="no tokenizer or chat template"):
        llm.chat(CONVERSATION, GREEDY, use_tqdm=False)
    with pytest.raises(TypeError, match="a conversation"):
        llm.chat("hello", GREEDY, use_tqdm=False)
    with pytest.raises(TypeError, match="a 'role' and a 'content'"):
        llm.chat([{"content": "no role"}], GREEDY, use_tqdm=False, chat_template=read_chat_template(CHATML))
    assert not llm.has_unfinished()


def test_the_readme_snippet_runs_from_any_folder(tmp_path):
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    snippet = re.search(r"```python\n(.*?)```", (root / "README.md").read_text(), re.S).group(1)
    assert 'LLM(resolve_model("qwen3-tiny")' in snippet and "llm.chat(" in snippet
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_model_resolver_prefers_a_checkpoint_folder_then_a_golden_name(tmp_path, monkeypatch):
    import shutil

    from golden.load import golden_name

    monkeypatch.chdir(tmp_path)
    golden = str(checkpoint_path(QWEN3))
    assert resolve_model(QWEN3) == golden and golden_name(resolve_model(QWEN3)) == QWEN3
    (tmp_path / QWEN3).mkdir()  # a folder of that name without a checkpoint: the golden one still
    assert resolve_model(QWEN3) == golden
    shutil.copy(f"{golden}/config.json", tmp_path / QWEN3)  # a checkpoint folder here: it wins, as given
    assert resolve_model(QWEN3) == QWEN3 and golden_name(QWEN3) is None
    (tmp_path / "empty").mkdir()
    assert resolve_model("empty") == "empty"  # (the loader then says that config.json is missing)
    with pytest.raises(ValueError, match=r"'sub/qwen3-tiny' does not exist: it is neither .* \(.*qwen3-tiny"):
        resolve_model("sub/qwen3-tiny")  # a path is never read as a golden name


def test_adapters_take_golden_names_from_any_folder(tmp_path, monkeypatch):
    from nanovllm_ref.oracle.adapters import load_adapter

    monkeypatch.chdir(tmp_path)
    with LLM(resolve_model(QWEN3), dtype="float32", max_model_len=256) as llm:
        [ref] = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    hf = load_adapter("hf", QWEN3, "float32")  # transformers reads the golden folder, not the hub
    try:
        [out] = hf.generate([[5, 6, 7]], max_tokens=6, top_k=1, prompt_logprobs=False)
    finally:
        hf.close()
    assert out.token_ids == ref.token_ids
