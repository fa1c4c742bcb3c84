"""The bitmask builder (structured/manager.py): each row's mask follows that row's own tokens, as a fresh matcher
fed them would give it, whatever rows came before (speculative decoding: several rows per sequence, drafts rejected
afterwards); the request's stop tokens where the grammar may end, only them once it ended; never an all-zero row."""

from __future__ import annotations

import numpy as np
import pytest

from nanovllm_ref.sampling_params import ProcessedRow, SamplingParams, StructuredOutputsParams
from nanovllm_ref.structured.manager import StructuredOutputManager

from .conftest import KINDS, VOCAB, allowed, tokenizer

xgr = pytest.importorskip("xgrammar")

PROMPT = [5, 6, 7, 8]
EOS = 0
SCHEMA = StructuredOutputsParams(json={"type": "object", "properties": {"n": {"type": "integer"}},
                                       "required": ["n"]})


def manager(kind: str = "byte-level") -> StructuredOutputManager:
    return StructuredOutputManager(tokenizer(KINDS[kind]), VOCAB, frozenset({EOS}))


def row(i: int, spec: StructuredOutputsParams, output: list[int], seq_id: int = 1,
        stops: frozenset[int] = frozenset({EOS})) -> ProcessedRow:
    return ProcessedRow(i, SamplingParams(structured_outputs=spec), PROMPT + output, len(PROMPT), stops, seq_id)


def fresh(m: StructuredOutputManager, spec: StructuredOutputsParams, output: list[int], stops=(EOS,)) -> set[int]:
    """The allowed ids of a new matcher fed `output`."""
    matcher = xgr.GrammarMatcher(m.compile(spec), override_stop_tokens=list(stops))
    assert all(matcher.accept_token(t) for t in output)
    mask = xgr.allocate_token_bitmask(1, VOCAB)
    matcher.fill_next_token_bitmask(mask)
    return allowed(mask.numpy()[0])


def encode(text: str, kind: str = "byte-level") -> list[int]:
    return tokenizer(KINDS[kind]).encode(text, add_special_tokens=False)


def test_rows_with_drafts_then_a_rejected_draft_match_a_fresh_matcher():
    m = manager()
    m.add(1, SCHEMA, frozenset({EOS}))
    out = encode('{"n": 12')
    history, draft, other = out[:6], out[6], encode("-")[0]  # '{"n": ', then '1' or '-'
    assert draft != other
    # one step: the row of the sequence's tokens, then the row verifying its first draft token
    mask, rows = m.bitmask([row(0, SCHEMA, history), row(1, SCHEMA, history + [draft])])
    assert rows == [0, 1] and mask.dtype == np.int32 and mask.shape == (2, VOCAB // 32)
    assert allowed(mask[0]) == fresh(m, SCHEMA, history)
    assert allowed(mask[1]) == fresh(m, SCHEMA, history + [draft])
    assert allowed(mask[0]) != allowed(mask[1])
    # the draft was rejected: the next step's row has the target's token instead (shorter than what was consumed)
    mask, _ = m.bitmask([row(0, SCHEMA, history + [other])])
    assert allowed(mask[0]) == fresh(m, SCHEMA, history + [other])
    mask, _ = m.bitmask([row(0, SCHEMA, history)])  # (and back: rolled back again)
    assert allowed(mask[0]) == fresh(m, SCHEMA, history)


def test_a_draft_the_grammar_refuses_does_not_crash_and_the_next_row_recovers():
    m = manager()
    m.add(1, SCHEMA, frozenset({EOS}))
    history, bad = encode('{"n'), encode("]")[0]  # "]" cannot come inside a key
    mask, _ = m.bitmask([row(0, SCHEMA, history), row(1, SCHEMA, history + [bad]),
                         row(2, SCHEMA, history + [bad, bad])])
    assert allowed(mask[0]) == fresh(m, SCHEMA, history) and all(allowed(r) for r in mask)  # any mask, never zero
    later = encode('{"n": 3')
    mask, _ = m.bitmask([row(0, SCHEMA, later)])
    assert allowed(mask[0]) == fresh(m, SCHEMA, later)


def test_rows_of_several_sequences_and_plain_rows_among_them():
    m = manager()
    regex = StructuredOutputsParams(regex="[a-z]{2,4} [0-9]{2}")
    m.add(1, SCHEMA, frozenset({EOS}))
    m.add(2, regex, frozenset({EOS}))
    plain = ProcessedRow(1, SamplingParams(min_tokens=2), PROMPT, len(PROMPT), frozenset({EOS}), 3)
    mask, rows = m.bitmask([row(0, SCHEMA, encode('{"'), seq_id=1), plain, row(2, regex, encode("ab"), seq_id=2)])
    assert rows == [0, 2]
    assert allowed(mask[0]) == fresh(m, SCHEMA, encode('{"')) and allowed(mask[1]) == fresh(m, regex, encode("ab"))
    assert m.bitmask([plain]) is None


def test_stop_tokens_where_the_grammar_may_end_and_only_them_once_it_ended():
    m = manager()
    spec, stops = StructuredOutputsParams(regex="ab|abcd"), frozenset({EOS, 7})  # EOS and a stop_token_id
    m.add(1, spec, stops)
    a, b, c, d = (encode(x)[0] for x in "abcd")

    def at(output: list[int]) -> set[int]:
        return allowed(m.bitmask([row(0, spec, output, stops=stops)])[0][0])

    assert not at([a]) & stops  # not yet
    assert stops <= at([a, b]) and c in at([a, b])  # may end, or go on
    assert at([a, b, c, d]) == stops  # ended: only the stop tokens
    assert at([a, b, c, d, EOS]) == stops  # (ignore_eos: it goes on past EOS, the matcher terminated)
    m.add(2, spec, frozenset())  # ignore_eos without stop_token_ids: the engine's EOS ends the grammar
    assert allowed(m.bitmask([row(0, spec, [a, b, c, d], seq_id=2, stops=frozenset())])[0][0]) == {EOS}


def test_a_dead_end_allows_the_stop_tokens():
    # a word-level vocabulary puts a space before every token: no key can be "n" (a dead end xgrammar cannot see)
    m = manager("word-level")
    m.add(1, SCHEMA, frozenset({EOS}))
    history = encode('{ "', "word-level")
    assert fresh(m, SCHEMA, history) == set()  # what xgrammar's mask is there
    assert allowed(m.bitmask([row(0, SCHEMA, history)])[0][0]) == {EOS}


def test_matchers_per_sequence_and_release():
    m = manager()
    for seq_id in (1, 2):  # two samples of one request: each its own matcher
        m.add(seq_id, SCHEMA, frozenset({EOS}))
    one, two = encode('{"n": 1'), encode('{"n'),
    mask, _ = m.bitmask([row(0, SCHEMA, one, seq_id=1), row(1, SCHEMA, two, seq_id=2)])
    assert allowed(mask[0]) == fresh(m, SCHEMA, one) and allowed(mask[1]) == fresh(m, SCHEMA, two)
    assert m.num_tracked == 2
    m.release(1)
    m.release(1)  # (idempotent)
    assert m.num_tracked == 1
