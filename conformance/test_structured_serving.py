"""Structured outputs over HTTP: vLLM's extra body ``structured_outputs`` and OpenAI's ``response_format``, whole and
streamed, on /v1/completions and /v1/chat/completions, and a 400 for an invalid spec (the server still serving).

Runs against the server of ``--engine openai:URL`` (its ``--model`` checkpoint is the reference's), and under the
default ``--engine nanovllm_ref`` against nanovllm_ref's own server on qwen3-tiny (conformance/local_server.py); other
in-process engines have no HTTP surface (skipped, naming ``--engine openai:URL``). A server that refuses the fields
(a 4xx naming them) has the cases skipped with its message. What is checked is test_structured.py's validity: every
output the server finished on "stop" is accepted whole by the reference matcher and validates, one that ended on
"length" is a prefix the matcher accepts (token ids come back through ``return_tokens_as_token_ids``); a streamed
output's pieces concatenate to its text, which validates; the chat route's message content validates.
"""

from __future__ import annotations

import json

import pytest

from nanovllm_ref.oracle.openai_adapter import OpenAIAdapter
from nanovllm_ref.oracle.requests import RequestSpec

from .harness import Options, selected_dtypes, selected_models
from .local_server import local_server
from .structured_specs import SPECS, why_invalid
from .test_serving import _post, _served_normally
from .test_structured import MAX_TOKENS, Checkpoint, greedy, sampled, validity_problems

CAPABILITY = "structured outputs"
HTTP_SPECS = ("enum", "nested", "array-bounds", "json-object", "regex", "choice", "grammar")
JSON_SPECS = tuple(n for n in HTTP_SPECS if "json" in SPECS[n].structured or "json_object" in SPECS[n].structured)
INVALID = {  # body fields -> what is wrong with them
    "schema-type": {"structured_outputs": {"json": {"type": "no-such-type"}}},
    "schema-text": {"structured_outputs": {"json": "{not json"}},
    "regex": {"structured_outputs": {"regex": "([a-z"}},
    "grammar": {"structured_outputs": {"grammar": "root ::= undefined_rule"}},
    "two-kinds": {"structured_outputs": {"regex": "a", "choice": ["a"]}},
    "response-format-schema": {"response_format": {"type": "json_schema",
                                                   "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
}


@pytest.fixture(scope="module")
def structured_server(options: Options, pytestconfig: pytest.Config, engines):
    """(base URL, served model name, the checkpoint's references); an openai:URL server is checked to serve --model
    (the first selected, qwen3-tiny where selected) as the engine pool checks it."""
    models = selected_models(pytestconfig)
    model = next((m for m in models if m.name == "qwen3-tiny"), models[0])
    if options.engine == "nanovllm_ref":
        with local_server(model.path, model.name, **dict(options.engine_args)) as base:
            yield base, model.name, Checkpoint(model)
        return
    if not options.engine.startswith("openai:"):
        pytest.skip("an HTTP-serving check: run with --engine openai:URL")
    adapter = engines.get(model, selected_dtypes(pytestconfig)[0])
    yield adapter.base_url, adapter.model, Checkpoint(model)


def client(structured_server, route: str) -> OpenAIAdapter:
    base, model, _ = structured_server
    return OpenAIAdapter(base, served_model=model, structured_route=route)


def call(adapter: OpenAIAdapter, method: str, requests: list[RequestSpec]) -> list:
    try:
        return getattr(adapter, method)(requests)
    except RuntimeError as e:  # an HTTP error: a server without the field says so with a 4xx
        if " answered HTTP 4" in str(e) and adapter.structured_route in str(e):
            pytest.skip(f"the server refuses {adapter.structured_route}: {str(e)[:300]}")
        raise


VALID = {"structured_outputs": {"structured_outputs": {"choice": ["yes", "no"]}},
         "response_format": {"response_format": {"type": "json_object"}}}


def http_specs(ckpt: Checkpoint, json_only: bool = False) -> list[str]:
    """The specs sent over HTTP that fit the checkpoint's vocabulary: HTTP_SPECS (JSON_SPECS), or on a WordLevel
    vocabulary its words' specs (free JSON has dead ends there)."""
    names = [n for n in (JSON_SPECS if json_only else HTTP_SPECS) if n in ckpt.specs]
    return names or [n for n in ckpt.specs if not json_only or "json" in ckpt.specs[n].structured]


def json_schema_spec(ckpt: Checkpoint):
    """A JSON-schema spec that fits the checkpoint's vocabulary ("enum"; on a WordLevel one its words' JSON)."""
    return next(ckpt.specs[n] for n in ("enum", "words-json") if n in ckpt.specs)


def require_field(base: str, model: str, field: str, route: str = "completions") -> None:
    """Skip, with the server's message, where a valid request carrying ``field`` is refused."""
    body = {"model": model, "max_tokens": 4, "temperature": 0, **VALID[field]}
    body.update({"messages": [{"role": "user", "content": "Hi."}]} if route.startswith("chat") else {"prompt": [9, 10]})
    status, raw = _post(base, body, route)
    if status == 400 and b"template" in raw and route.startswith("chat"):
        pytest.skip(f"the server has no chat template: {raw[:300]!r}")
    if 400 <= status < 500:
        pytest.skip(f"the server refuses a valid {field} on /v1/{route}: {raw[:300]!r}")


@pytest.mark.parametrize("route", ["structured_outputs", "response_format"])
def test_outputs_over_http_are_valid(route, structured_server) -> None:
    """Greedy and seeded-sampled requests through /v1/completions; response_format carries the JSON specs."""
    ckpt = structured_server[2]
    names = http_specs(ckpt, json_only=route == "response_format")
    requests = [RequestSpec(ckpt.prompt, greedy(ckpt.specs[n].structured, logprobs=1)) for n in names]
    requests += [RequestSpec(ckpt.prompt, {**sampled(ckpt.specs[n].structured, 99 + i), "logprobs": 0})
                 for i, n in enumerate(names)]
    outs = call(client(structured_server, route), "run_requests", requests)
    bad = [f"  {n} {list(c.token_ids)}: {p}" for n, group in zip(names + names, outs) for c in group
           for p in validity_problems(ckpt, ckpt.specs[n], c)]
    assert not bad, f"{route}:\n" + "\n".join(bad)


def test_streamed_outputs_are_valid(structured_server) -> None:
    """Streamed /v1/completions: the pieces concatenate to the text, and that validates (or is a valid prefix)."""
    ckpt, bad = structured_server[2], []
    names = http_specs(ckpt)
    requests = [RequestSpec(ckpt.prompt, sampled(ckpt.specs[n].structured, 7 + i, n=1)) for i, n in enumerate(names)]
    for name, streamed in zip(names, call(client(structured_server, "structured_outputs"), "stream_requests",
                                          requests)):
        s = streamed[0]
        if "".join(s.pieces) != s.completion.text:
            bad.append(f"  {name}: pieces {s.pieces} do not add up to {s.completion.text!r}")
        bad += [f"  {name}: {p}" for p in validity_problems(ckpt, ckpt.specs[name], s.completion)]
    assert not bad, "streamed:\n" + "\n".join(bad)


def test_chat_response_format_is_valid(structured_server) -> None:
    """/v1/chat/completions with response_format json_schema (OpenAI's route): the message content validates."""
    base, model, ckpt = structured_server
    spec = json_schema_spec(ckpt).structured
    body = {"model": model, "messages": [{"role": "user", "content": "A color."}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "color", "schema": spec["json"]}}}
    require_field(base, model, "response_format", "chat/completions")
    status, raw = _post(base, body, "chat/completions")
    assert status == 200, raw[:500]
    choice = json.loads(raw)["choices"][0]
    if choice["finish_reason"] == "stop":
        why = why_invalid(spec, choice["message"]["content"])
        assert why is None, f"chat content {choice['message']['content']!r} {why}"
    else:
        assert choice["finish_reason"] == "length", choice


@pytest.mark.parametrize("case", list(INVALID))
def test_an_invalid_spec_is_a_400_and_the_server_goes_on(case, structured_server) -> None:
    base, model, _ = structured_server
    require_field(base, model, next(iter(INVALID[case])))  # (else any body with the field is a 400)
    status, raw = _post(base, {"model": model, "prompt": [9, 10, 11], "max_tokens": 4, **INVALID[case]})
    assert 400 <= status < 500, (status, raw[:500])
    body = json.loads(raw)
    assert body.get("error", {}).get("message") or body.get("message"), raw[:500]
    _served_normally(base, model)


def test_official_openai_client(structured_server) -> None:
    """The official ``openai`` client, as users call a server: /v1/completions with vLLM's extra body, whole and
    streamed, and /v1/chat/completions with ``response_format`` json_schema; every output valid as
    test_structured.py judges it (token ids through ``return_tokens_as_token_ids``: one that ended on "length" a prefix
    the grammar accepts), and an invalid schema is the client's BadRequestError."""
    openai = pytest.importorskip("openai", reason="the official client comes with nanovllm_ref[conformance]")
    from nanovllm_ref.oracle.openai_adapter import _token_id
    from nanovllm_ref.oracle.requests import Completion

    base, model, ckpt = structured_server
    require_field(base, model, "structured_outputs")
    api = openai.OpenAI(base_url=base, api_key="EMPTY", max_retries=0, timeout=600)
    ids = {"return_tokens_as_token_ids": True}
    outputs = []  # (what, spec, Completion)
    names = [n for n in ("enum", "regex", "choice", "nested") if n in ckpt.specs] or http_specs(ckpt)
    for name in names:
        spec = ckpt.specs[name]
        c = api.completions.create(model=model, prompt=ckpt.prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=0,
                                   extra_body={"structured_outputs": spec.structured, **ids}).choices[0]
        tokens = [_token_id(t) for t in c.logprobs.tokens]
        outputs.append((f"{name} whole", spec, Completion(tokens, c.finish_reason, text=c.text)))
        streamed = Completion([], None, text="")
        for chunk in api.completions.create(model=model, prompt=ckpt.prompt, max_tokens=MAX_TOKENS, temperature=1.0,
                                            seed=11, stream=True, logprobs=0,
                                            extra_body={"structured_outputs": spec.structured, **ids}):
            for choice in chunk.choices:
                streamed.text += choice.text or ""
                streamed.token_ids += [_token_id(t) for t in (choice.logprobs.tokens if choice.logprobs else [])]
                streamed.finish_reason = choice.finish_reason or streamed.finish_reason
        outputs.append((f"{name} streamed", spec, streamed))
    spec = json_schema_spec(ckpt)
    require_field(base, model, "response_format", "chat/completions")
    chat = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "A color."}], max_tokens=MAX_TOKENS, temperature=0,
        logprobs=True, top_logprobs=0, extra_body=ids,
        response_format={"type": "json_schema", "json_schema": {"name": "color", "schema": spec.structured["json"]}},
    ).choices[0]
    tokens = [_token_id(t.token) for t in chat.logprobs.content]
    outputs.append(("chat response_format", spec, Completion(tokens, chat.finish_reason, text=chat.message.content)))
    bad = [f"  {what} {list(c.token_ids)}: {p}" for what, spec, c in outputs
           for p in validity_problems(ckpt, spec, c)]
    assert not bad, "through the openai client:\n" + "\n".join(bad)
    with pytest.raises(openai.BadRequestError):
        api.completions.create(model=model, prompt=ckpt.prompt, max_tokens=4, extra_body=INVALID["schema-type"])
    _served_normally(base, model)
