"""The OpenAI-compatible server driven by the official `openai` client on qwen3-tiny: completions, chat,
streaming with usage and logprobs, n=2, stop strings, echo, seed; the `openai` conformance adapter agrees with
the offline engine and the golden conformance suite passes through it."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

from nanovllm_ref import LLM, SamplingParams  # noqa: E402
from nanovllm_ref.oracle.adapters import NanovllmRefAdapter  # noqa: E402
from nanovllm_ref.oracle.openai_adapter import OpenAIAdapter  # noqa: E402
from nanovllm_ref.serve.params import SAMPLING_FIELDS  # noqa: E402

from ..conftest import QWEN3, checkpoint_path  # noqa: E402
from ..support.server import MODEL, running_server  # noqa: E402

PROMPTS = [[5, 6, 7], [9] * 20 + [3, 4], list(range(3, 60))]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server():
    with running_server() as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def offline():
    with LLM(str(checkpoint_path(QWEN3)), dtype="float32", max_model_len=512) as llm:
        yield llm


def test_completion_matches_the_offline_engine(client, offline):
    r = client.completions.create(model=MODEL, prompt="def main(", max_tokens=12, logprobs=3, **GREEDY)
    ref = offline.generate(["def main("], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                        logprobs=3), use_tqdm=False)[0]
    choice = r.choices[0]
    assert choice.text == ref.text and choice.finish_reason == "length"
    assert choice.model_extra["token_ids"] == ref.token_ids
    assert choice.logprobs.token_logprobs == pytest.approx([lp[t] for t, lp in zip(ref.token_ids, ref.logprobs)],
                                                           abs=1e-5)
    assert all(len(top) >= 3 for top in choice.logprobs.top_logprobs)
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids) and r.usage.completion_tokens == 12
    assert r.model == MODEL


def test_served_model_names_and_unknown_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL, "tiny"]
    card = models[0].model_extra
    assert card["root"] == QWEN3 and card["dtype"] == "float32"  # a name, never a filesystem path
    assert card["config"]["vocab_size"] == 1536 and card["max_model_len"] == 512
    assert set(card["config"]) <= {"model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                  "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                                  "tie_word_embeddings", "max_position_embeddings"}  # the architecture,
    assert "rms_norm_eps" not in card["config"] and "/" not in str(card)  # not the whole config, nor a path
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4")
    r = client.completions.create(model="tiny", prompt=[5, 6], max_tokens=2)
    assert r.model == "tiny"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)


def test_stream_with_usage_and_logprobs_equals_the_whole_response(client):
    args = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=10, logprobs=2, **GREEDY)
    whole = client.completions.create(**args).choices[0]
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 10 and last.usage.prompt_tokens == 22
    assert last.usage.prompt_tokens_details.cached_tokens == 16  # the whole response's full block, cached
    assert "".join(c.choices[0].text for c in body) == whole.text
    assert [t for c in body for t in c.choices[0].model_extra["token_ids"]] == whole.model_extra["token_ids"]
    streamed = [lp for c in body for lp in c.choices[0].logprobs.token_logprobs]  # (prefix-cached: not bitwise)
    assert streamed == pytest.approx(whole.logprobs.token_logprobs, abs=1e-5)
    assert body[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in body[:-1])


def test_chat_with_the_chatml_template(client, server):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "import os"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, logprobs=True, top_logprobs=2,
                                       **GREEDY)
    rendered = "<|im_start|>system\nYou write Python.<|im_end|>\n<|im_start|>user\nimport os<|im_end|>\n" \
               "<|im_start|>assistant\n"
    same = client.completions.create(model=MODEL, prompt=rendered, max_tokens=8, **GREEDY).choices[0]
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == same.text
    assert choice.finish_reason == "length" and r.usage.completion_tokens == 8
    assert len(choice.logprobs.content) == 8 and all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    ids_body = {**GREEDY["extra_body"], "return_tokens_as_token_ids": True}
    ids = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, logprobs=True, top_logprobs=2,
                                         temperature=0, extra_body=ids_body).choices[0]
    want = client.completions.create(model=MODEL, prompt=rendered, max_tokens=8, logprobs=0,
                                     temperature=0, extra_body=ids_body).choices[0]
    assert [t.token for t in ids.logprobs.content] == want.logprobs.tokens  # "token_id:N", as on completions
    assert all(t.token.startswith("token_id:") for e in ids.logprobs.content for t in e.top_logprobs)
    newer = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=5, **GREEDY)
    assert newer.usage.completion_tokens == 5 and same.text.startswith(newer.choices[0].message.content)
    stream = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == same.text
    assert stream[-1].usage.completion_tokens == 8


def test_n_choices(client):
    r = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=6, n=2, temperature=1.0,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(len(c.model_extra["token_ids"]) == 6 for c in r.choices) and r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens == 3
    chunks = list(client.completions.create(model=MODEL, prompt=[[5, 6], [7, 8, 9]], max_tokens=4, n=2,
                                            stream=True, extra_body={"ignore_eos": True}))
    tokens = {i: sum(len(c.choices[0].model_extra["token_ids"]) for c in chunks if c.choices[0].index == i)
              for i in range(4)}
    assert tokens == {0: 4, 1: 4, 2: 4, 3: 4}


def test_seed_makes_sampling_reproducible(client):
    args = dict(model=MODEL, prompt="class Logger", max_tokens=16, temperature=1.0, seed=1234,
                extra_body={"ignore_eos": True})
    a, b = client.completions.create(**args), client.completions.create(**args)
    assert a.choices[0].text == b.choices[0].text
    two = client.completions.create(**args, n=2)
    texts = {c.index: c.text for c in two.choices}
    assert texts[0] == a.choices[0].text  # choice i samples with seed + i
    assert texts[1] != texts[0]
    assert client.completions.create(**{**args, "seed": 2**63 - 1}, n=2).choices  # seed + 1 wraps, not overflows


def test_stop_strings_trim_like_vllm(client):
    full = client.completions.create(model=MODEL, prompt="def main(", max_tokens=16, **GREEDY).choices[0].text
    stop = full[5:8]
    assert stop.strip() and full.index(stop) == 5
    r = client.completions.create(model=MODEL, prompt="def main(", max_tokens=16, stop=[stop, "never seen"],
                                  **GREEDY)
    assert r.choices[0].text == full[:5] and r.choices[0].finish_reason == "stop"
    kept = client.completions.create(model=MODEL, prompt="def main(", max_tokens=16, stop=stop, temperature=0,
                                     extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert kept.choices[0].text == full[:8]
    streamed = client.completions.create(model=MODEL, prompt="def main(", max_tokens=16, stop=stop, stream=True,
                                         **GREEDY)
    chunks = [c.choices[0] for c in streamed]
    assert "".join(c.text for c in chunks) == full[:5] and chunks[-1].finish_reason == "stop"
    ids = client.completions.create(model=MODEL, prompt="def main(", max_tokens=16, temperature=0,
                                    extra_body={"stop_token_ids": [r.choices[0].model_extra["token_ids"][0]]})
    assert ids.choices[0].finish_reason == "stop" and len(ids.choices[0].model_extra["token_ids"]) == 1


def test_n_samples_with_stop_strings_stream_the_engines_texts(client, offline):
    """The engine's native n: samples that stop (at different tokens) or run to the length, streamed and whole,
    give the offline engine's texts for the same seed; each choice's pieces add up to its text."""
    args = dict(model=MODEL, prompt="def main(", max_tokens=12, n=4, temperature=1.0, seed=7, stop=["e", "(("],
                extra_body={"ignore_eos": True})
    ref = offline.generate(["def main("], SamplingParams(max_tokens=12, n=4, temperature=1.0, seed=7,
                                                         stop=["e", "(("], ignore_eos=True), use_tqdm=False)[0]
    expected = [(o.text, o.finish_reason) for o in ref.outputs]
    assert {reason for _, reason in expected} == {"stop", "length"} or len({t for t, _ in expected}) > 1
    whole = client.completions.create(**args)
    assert [(c.text, c.finish_reason) for c in sorted(whole.choices, key=lambda c: c.index)] == expected
    chunks = [c.choices[0] for c in client.completions.create(**args, stream=True)]
    for i, (text, reason) in enumerate(expected):
        mine = [c for c in chunks if c.index == i]
        assert "".join(c.text for c in mine) == text and "e" not in text
        assert [c.finish_reason for c in mine if c.finish_reason] == [reason]


def test_skip_special_tokens_is_the_engines(client, offline):
    """A special token (forced by logit_bias) is in the text only with skip_special_tokens false, served and
    offline alike; the token ids have it either way."""
    special = offline.tokenizer.all_special_ids[0]
    texts = {}
    for skip in (True, False):
        r = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=3, temperature=0,
                                      logit_bias={str(special): 100},
                                      extra_body={"ignore_eos": True, "skip_special_tokens": skip})
        params = SamplingParams(max_tokens=3, temperature=0, logit_bias={special: 100}, ignore_eos=True,
                                skip_special_tokens=skip)
        ref = offline.generate([[5, 6, 7]], params, use_tqdm=False)[0]
        assert r.choices[0].model_extra["token_ids"] == ref.token_ids == [special] * 3
        texts[skip] = r.choices[0].text
        assert texts[skip] == ref.text
    assert texts[True] == "" and texts[False] == offline.tokenizer.decode([special] * 3)


def test_min_tokens_outlasts_stop_strings_where_the_engine_has_it(client):
    full = client.completions.create(model=MODEL, prompt="def main(", max_tokens=16, **GREEDY).choices[0].text
    args = dict(model=MODEL, prompt="def main(", max_tokens=16, stop=full[5:8], temperature=0)
    if "min_tokens" not in SAMPLING_FIELDS:
        with pytest.raises(openai.BadRequestError, match="min_tokens"):
            client.completions.create(**args, extra_body={"ignore_eos": True, "min_tokens": 10})
        return
    r = client.completions.create(**args, extra_body={"ignore_eos": True, "min_tokens": 10}).choices[0]
    assert len(r.model_extra["token_ids"]) >= 10 and r.text.startswith(full[:8])


def test_echo_with_prompt_logprobs(client, offline):
    prompt = "import logging\n"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, echo=True, logprobs=1, **GREEDY)
    choice = r.choices[0]
    ids = offline.tokenizer.encode(prompt)
    ref = offline.generate([ids], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=1,
                                                 prompt_logprobs=1), use_tqdm=False)[0]
    assert choice.text == prompt + ref.text
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 4 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = [d[t] for t, d in zip(ids[1:], ref.prompt_logprobs[1:])] + [d[t] for t, d in zip(ref.token_ids,
                                                                                               ref.logprobs)]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-5)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, echo=True, stream=True,
                                            logprobs=1, **GREEDY))
    assert chunks[0].choices[0].text.startswith(prompt)
    assert "".join(c.choices[0].text for c in chunks) == prompt + ref.text
    streamed = [x for c in chunks for x in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(expected, abs=1e-5)


def test_openai_adapter_matches_offline_engine(server):
    remote = OpenAIAdapter(server.base).generate(PROMPTS, max_tokens=8, top_k=5, prompt_logprobs=True)
    local = NanovllmRefAdapter(str(checkpoint_path(QWEN3)), "float32", max_model_len=512).generate(
        PROMPTS, max_tokens=8, top_k=5, prompt_logprobs=True)
    for r, loc in zip(remote, local):
        assert r.token_ids == loc.token_ids
        for a, b in zip(r.topk, loc.topk):
            assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-5
        assert r.prompt_logprobs[0] is None and len(r.prompt_logprobs) == len(loc.prompt_logprobs)


def _run_conformance(engine: str, tmp_path, files: tuple = ("conformance/test_golden.py",)) -> tuple[int, str]:
    import os
    import subprocess
    import sys

    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
           "--engine", engine, "--model", QWEN3, "--dtype", "float32", "--report", str(report), "-k", "not gpu"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_conformance_suite_passes_through_the_openai_adapter(server, tmp_path):
    code, log = _run_conformance(f"openai:{server.base}", tmp_path,
                                 ("conformance/test_golden.py", "conformance/test_serving.py"))
    assert code == 0, log[-3000:]
    assert "passed" in log and "skipped" not in log, log[-3000:]


@pytest.mark.parametrize("what", ["token", "logprob"])
def test_conformance_suite_fails_on_a_perturbed_engine_naming_prompt_and_position(tmp_path, what):
    from ..support.perturbing_adapter import PROMPT, STEP

    code, log = _run_conformance(f"tests.support.perturbing_adapter:{what}_factory", tmp_path)
    assert code != 0, log[-3000:]
    from golden.load import load_golden

    prompt_name = load_golden(QWEN3, "float32").prompt_names[PROMPT]
    assert prompt_name in log and f"step {STEP}" in log, log[-3000:]
