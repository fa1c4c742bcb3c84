"""The grammar's view of the vocabulary: xgrammar's TokenizerInfo, with each token's text as the engine's text policy
gives it.

A grammar constrains the output text, token by token, so every token must stand for the bytes it adds to the text
(engine/detokenizer.py: decoding primed with the prompt, vLLM's policy). xgrammar knows two encodings of a token's
bytes (xgrammar docs, "Tokenizer Info"; its `TokenizerInfo.from_huggingface` detects them):

- byte-level BPE (GPT-2's byte-to-unicode alphabet: golden qwen3-*, llama3-*): "Ġab" is b" ab";
- byte fallback with Metaspace (SentencePiece as transformers converts it: golden mistral-spm-hd32): "▁ab" is b" ab"
  (a word start after the prompt; the decoder's strip applies to the text's first character only), "<0xE2>" one byte;

and takes any other vocabulary as raw text (RAW). Those tokens are decoded here in context: the text a token adds
after an ordinary token, as the detokenizer sees every output token (after the prompt). That is what a tokenizer
without a decoder does (WordLevel: golden qwen3-words-hd32; tokenizers joins its tokens with spaces, so "ab" adds
" ab"), and a WordPiece decoder's "##ab" ("ab", glued on) too.

Special tokens (EOS, BOS, [UNK], chat markers) get no text: xgrammar then never allows them inside the grammar
(skip_special_tokens drops them from the text anyway); the request's stop tokens are allowed where the grammar may
end (the matcher's stop tokens, manager.py). Ids past the tokenizer up to the model's `vocab_size` (a padded LM
head) are never allowed. vLLM builds the same TokenizerInfo (vllm/v1/structured_output/backend_xgrammar.py).
"""

from __future__ import annotations

import json
from typing import Any


def special_ids(tokenizer: Any) -> set[int]:
    """The tokenizer's special tokens: its named ones and every added token marked special."""
    ids = set(getattr(tokenizer, "all_special_ids", ()))
    ids.update(i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False))
    return ids


def in_context_texts(tokenizer: Any, ids: list[int], special: set[int]) -> dict[int, str]:
    """The text each token of `ids` adds after an ordinary token (one batch decode; a raw vocabulary's texts)."""
    backend = tokenizer.backend_tokenizer
    context = next(i for i in range(len(tokenizer)) if i not in special and backend.decode([i]))
    before = backend.decode([context], skip_special_tokens=False)
    pairs = backend.decode_batch([[context, i] for i in ids], skip_special_tokens=False)
    token_strs = tokenizer.convert_ids_to_tokens(ids)
    # (a decoder that does not extend the context's text: the token's own string, as xgrammar takes it)
    return {i: text[len(before):] if text.startswith(before) else s for i, text, s in zip(ids, pairs, token_strs)}


def tokenizer_info(tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> Any:
    """xgrammar's TokenizerInfo of `tokenizer` over the model's `vocab_size` ids (>= or < the tokenizer's: the mask's
    width), special tokens without text, a raw vocabulary's tokens as decoded in context (module docstring)."""
    import xgrammar as xgr

    special = special_ids(tokenizer)
    encoded = [""] * vocab_size
    for token, i in tokenizer.get_vocab().items():
        if i < vocab_size and i not in special:
            encoded[i] = token
    if _has_no_decoder(tokenizer):  # (xgrammar's detection would warn that it found none: raw)
        vocab_type, add_prefix_space = xgr.VocabType.RAW, False
    else:
        detected = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
        vocab_type, add_prefix_space = detected.vocab_type, detected.add_prefix_space
    if vocab_type == xgr.VocabType.RAW and getattr(tokenizer, "backend_tokenizer", None) is not None:
        ordinary = [i for i, t in enumerate(encoded) if t]
        for i, text in in_context_texts(tokenizer, ordinary, special).items():
            encoded[i] = text
    return xgr.TokenizerInfo(encoded, vocab_type, vocab_size=vocab_size, stop_token_ids=stop_ids,
                             add_prefix_space=add_prefix_space)


def _has_no_decoder(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and json.loads(backend.to_str()).get("decoder") is None


def space_before_every_token(info: Any) -> bool:
    """Whether every token with text adds whitespace first (a decoder joining tokens with spaces): then no output
    text can begin otherwise, and JSON is only written with leading whitespace (compiler.py)."""
    stops = set(info.stop_token_ids)  # (xgrammar's properties build their lists on every read)
    texts = [t for i, t in enumerate(info.decoded_vocab) if t and i not in stops]
    return bool(texts) and all(t[:1].isspace() for t in texts)
