"""The structured_outputs request setting through the adapters (oracle/requests.py): the OpenAI adapter's two routes,
nanovllm_ref's StructuredOutputsParams, and the reference's spec handling (oracle/grammar_reference.py)."""

from __future__ import annotations

import pytest

from nanovllm_ref.oracle.grammar_reference import check_spec, schema_of, to_lark
from nanovllm_ref.oracle.openai_adapter import structured_body
from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_extra_body_route_sends_the_setting_as_it_is() -> None:
    params = {"max_tokens": 3, "structured_outputs": {"regex": "[a-z]+"}}
    assert structured_body(params, "structured_outputs") == params


@pytest.mark.parametrize("spec, expected", [
    ({"json": SCHEMA}, {"type": "json_schema", "json_schema": {"name": "conformance", "schema": SCHEMA}}),
    ({"json": '{"type": "object"}'}, {"type": "json_schema", "json_schema": {"name": "conformance",
                                                                             "schema": {"type": "object"}}}),
    ({"json_object": True}, {"type": "json_object"}),
])
def test_response_format_route_carries_json_specs(spec, expected) -> None:
    body = structured_body({"max_tokens": 3, "structured_outputs": spec}, "response_format")
    assert body == {"max_tokens": 3, "response_format": expected}


def test_response_format_route_keeps_other_kinds_in_the_extra_body() -> None:
    params = {"structured_outputs": {"choice": ["a", "b"]}}
    assert structured_body(params, "response_format") == params


def test_nanovllm_ref_builds_its_structured_outputs_params() -> None:
    from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
    from nanovllm_ref.sampling_params import StructuredOutputsParams

    params = NanovllmRefAdapter._params([RequestSpec([1, 2], {"structured_outputs": {"choice": ["a", "b"]}})])[0]
    assert params.structured_outputs == StructuredOutputsParams(choice=("a", "b"))
    with pytest.raises(UnsupportedSetting, match="StructuredOutputsParams"):
        NanovllmRefAdapter._params([RequestSpec([1], {"structured_outputs": {"no_such_kind": "x"}})])


@pytest.mark.parametrize("spec", [{}, {"regex": "a", "choice": ["a"]}, {"pattern": "a"}])
def test_a_spec_needs_exactly_one_known_kind(spec) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        check_spec(spec)


def test_the_reference_grammars() -> None:
    assert schema_of({"json_object": True}) == {"type": "object"}
    assert schema_of({"json": '{"type": "string"}'}) == {"type": "string"}
    assert to_lark({"regex": "a/b"}).endswith("start: /a\\/b/")
    assert to_lark({"choice": ["x", 'y"']}).endswith('start: "x" | "y\\""')
    lark = to_lark({"json": SCHEMA}, leading_space=True)
    assert '"no_forcing": true' in lark and "LEAD?" in lark and "whitespace_pattern" in lark
