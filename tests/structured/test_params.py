"""`StructuredOutputsParams` (vLLM's fields): exactly one kind, each checked for its form, a canonical cache key;
`SamplingParams(structured_outputs=...)` takes the processing path and needs a tokenizer."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nanovllm_ref import SamplingParams, StructuredOutputsParams


@pytest.mark.parametrize("kwargs, words", [
    ({}, "exactly one of json, regex, choice, grammar, json_object must be set, got none"),
    ({"regex": "a", "json": {}}, "got json, regex"),
    ({"choice": ["a"], "json_object": True}, "got choice, json_object"),
    ({"regex": ""}, "structured_outputs.regex must be a non-empty string"),
    ({"grammar": 3}, "structured_outputs.grammar must be a non-empty string"),
    ({"choice": []}, "structured_outputs.choice must be a non-empty list of strings"),
    ({"choice": ["a", 1]}, "structured_outputs.choice must be a non-empty list of strings"),
    ({"choice": "ab"}, "structured_outputs.choice must be a non-empty list of strings"),
    ({"json": "{not json"}, "structured_outputs.json is not valid JSON"),
    ({"json": [1, 2]}, "structured_outputs.json must be a JSON schema"),
    ({"json": {"a": float("nan")}}, "structured_outputs.json is not JSON-serializable"),
    ({"json": {"a": object()}}, "structured_outputs.json is not JSON-serializable"),
    ({"json_object": 1}, "structured_outputs.json_object must be a bool"),
])
def test_bad_params_name_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        StructuredOutputsParams(**kwargs)


def test_each_kind_and_its_key():
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    as_dict, as_text = StructuredOutputsParams(json=schema), StructuredOutputsParams(json=json.dumps(schema, indent=4))
    assert as_dict.kind == "json" and as_dict.key == as_text.key  # one schema, one compilation, however spaced
    reordered = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    assert StructuredOutputsParams(json=reordered).key != as_dict.key  # (the properties' order is the output's)
    assert StructuredOutputsParams(choice=["x", "y"]).key == ("choice", ("x", "y"))  # a list is kept as a tuple
    assert StructuredOutputsParams(regex="a+").key == ("regex", "a+")
    assert StructuredOutputsParams(grammar='root ::= "a"').kind == "grammar"
    assert StructuredOutputsParams(json_object=True).key == ("json_object", True)
    assert StructuredOutputsParams(json=True).key == ("json", "true")  # a boolean schema
    hash(SamplingParams(structured_outputs=as_dict))  # hashable with a dict schema
    with pytest.raises(dataclasses.FrozenInstanceError):
        as_dict.regex = "a"


def test_sampling_params_take_it_on_the_processing_path():
    spec = StructuredOutputsParams(regex="a+")
    assert SamplingParams(structured_outputs=spec).needs_logits_processing
    assert not SamplingParams().needs_logits_processing
    for bad in ({"regex": "a+"}, "a+"):
        with pytest.raises(ValueError, match="structured_outputs must be a StructuredOutputsParams"):
            SamplingParams(structured_outputs=bad)
    with pytest.raises(ValueError, match="structured_outputs need a tokenizer"):
        SamplingParams(structured_outputs=spec).check_model_limits(1536, has_tokenizer=False)
    SamplingParams(structured_outputs=spec).check_model_limits(1536, has_tokenizer=True)
