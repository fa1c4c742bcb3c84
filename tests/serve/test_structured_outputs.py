"""Structured outputs over HTTP with the official `openai` client: OpenAI's `response_format` (json_schema,
json_object, text) and vLLM's `structured_outputs` extra body (regex, choice, grammar, json) on /v1/completions and
/v1/chat/completions, whole and streamed, the same as the offline engine; an invalid schema or grammar, two kinds at
once or both parameters are a 400 naming the parameter, and the engine serves the next request."""

from __future__ import annotations

import json
import re

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")

from nanovllm_ref import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402
from nanovllm_ref.chat_template import read_chat_template  # noqa: E402

from ..conftest import QWEN3, checkpoint_path  # noqa: E402
from ..support.server import CHATML, MODEL, running_server  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "enum": ["ab", "cd"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["name", "n"]}
REGEX = "[a-z]{2,8} [0-9]{2}"
MESSAGES = [{"role": "user", "content": "def main("}]
GREEDY = {"model": MODEL, "temperature": 0, "max_tokens": 48}


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


def offline_chat(offline: LLM, spec: StructuredOutputsParams) -> str:
    params = SamplingParams(temperature=0, max_tokens=48, structured_outputs=spec)
    return offline.chat(MESSAGES, params, chat_template=read_chat_template(CHATML), use_tqdm=False)[0].text


def streamed_chat(client, **kwargs) -> tuple[str, str]:
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].choices[0].finish_reason


def test_chat_response_format_json_schema(client, offline):
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(messages=MESSAGES, response_format=fmt, **GREEDY)
    text = r.choices[0].message.content
    value = json.loads(text)
    assert r.choices[0].finish_reason == "stop" and value["name"] in ("ab", "cd") and 0 <= value["n"] <= 9
    assert list(value) == ["name", "n"]  # the schema's order
    assert text == offline_chat(offline, StructuredOutputsParams(json=SCHEMA))
    assert streamed_chat(client, messages=MESSAGES, response_format=fmt, **GREEDY) == (text, "stop")


def completions_body(kwargs: dict) -> dict:
    """`kwargs` for `completions.create`, which has no `response_format` (OpenAI's legacy endpoint): in the extra body,
    as vLLM's server takes it there too."""
    if "response_format" not in kwargs:
        return kwargs
    extra = {**kwargs.get("extra_body", {}), "response_format": kwargs["response_format"]}
    return {**{k: v for k, v in kwargs.items() if k != "response_format"}, "extra_body": extra}


def test_json_object_and_text(client, offline):
    r = client.completions.create(prompt="print(", **GREEDY, **completions_body(
        {"response_format": {"type": "json_object"}}))
    params = SamplingParams(temperature=0, max_tokens=48, structured_outputs=StructuredOutputsParams(json_object=True))
    assert r.choices[0].text == offline.generate(["print("], params, use_tqdm=False)[0].text
    assert isinstance(json.loads(r.choices[0].text), dict) and r.choices[0].finish_reason == "stop"
    plain = client.completions.create(prompt="print(", **GREEDY).choices[0].text
    text = completions_body({"response_format": {"type": "text"}})
    assert client.completions.create(prompt="print(", **GREEDY, **text).choices[0].text == plain
    assert plain != r.choices[0].text


def test_extra_body_structured_outputs_on_both_endpoints_whole_and_streamed(client, offline):
    body = {"extra_body": {"structured_outputs": {"regex": REGEX}}}
    r = client.completions.create(prompt="def main(", **GREEDY, **body).choices[0]
    params = SamplingParams(temperature=0, max_tokens=48, structured_outputs=StructuredOutputsParams(regex=REGEX))
    assert r.text == offline.generate(["def main("], params, use_tqdm=False)[0].text
    assert re.fullmatch(REGEX, r.text) and r.finish_reason == "stop"
    chunks = [c.choices[0] for c in client.completions.create(prompt="def main(", stream=True, **GREEDY, **body)]
    assert "".join(c.text for c in chunks) == r.text and chunks[-1].finish_reason == "stop"
    choice = {"extra_body": {"structured_outputs": {"choice": ["yes", "no", "maybe so"]}}}
    whole = client.chat.completions.create(messages=MESSAGES, **GREEDY, **choice).choices[0].message.content
    assert whole in ("yes", "no", "maybe so")
    assert streamed_chat(client, messages=MESSAGES, **GREEDY, **choice) == (whole, "stop")
    grammar = {"extra_body": {"structured_outputs": {"grammar": 'root ::= ("ab" | "cd") [0-9]'}}}
    r = client.completions.create(prompt="def main(", n=2, temperature=1.0, seed=3, max_tokens=8, model=MODEL,
                                  **grammar)
    assert all(re.fullmatch("(ab|cd)[0-9]", c.text) for c in r.choices)
    schema = {"extra_body": {"structured_outputs": {"json": json.dumps(SCHEMA)}}}  # (a schema as text too)
    assert json.loads(client.chat.completions.create(messages=MESSAGES, **GREEDY, **schema).choices[0].message.content)


@pytest.mark.parametrize("kwargs, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "response_format", 'structured_outputs.json: Unsupported type "objec"'),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "response_format.json_schema.schema: required"),
    ({"extra_body": {"structured_outputs": {"regex": "[a-"}}}, "structured_outputs.regex", "Regex parsing error"),
    ({"extra_body": {"structured_outputs": {"grammar": 'root ::= "a" |'}}}, "structured_outputs.grammar",
     "EBNF parser error"),
    ({"extra_body": {"structured_outputs": {"regex": "a+", "choice": ["a"]}}}, "structured_outputs",
     "exactly one of json, regex, choice, grammar, json_object must be set, got regex, choice"),
    ({"extra_body": {"structured_outputs": {}}}, "structured_outputs", "must be set, got none"),
    ({"extra_body": {"structured_outputs": {"regex": "a+", "whitespace_pattern": " "}}}, "structured_outputs",
     "unknown parameter"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"structured_outputs": {"regex": "a+"}}},
     "response_format", "not both"),
    ({"response_format": {"type": "xml"}}, "response_format", "response_format.type"),
])
def test_a_bad_spec_is_a_400_naming_the_parameter_and_the_engine_goes_on(client, server, kwargs, param, words):
    for create, args in ((client.completions.create, {"prompt": "def main(", **completions_body(kwargs)}),
                         (client.chat.completions.create, {"messages": MESSAGES, **kwargs})):
        with pytest.raises(openai.BadRequestError) as info:
            create(**GREEDY, **args)
        error = info.value.body
        assert error["param"] == param and words in error["message"], error
    assert not server.served.loop.active_request_ids()  # nothing was added
    r = client.completions.create(prompt="def main(", **GREEDY, extra_body={"structured_outputs": {"regex": REGEX}})
    assert re.fullmatch(REGEX, r.choices[0].text)
