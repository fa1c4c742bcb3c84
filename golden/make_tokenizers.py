"""Tokenizers of other kinds for the text goldens: word-level and SentencePiece-style (byte fallback).

Text policies differ where decoding depends on more than each token's bytes, which the shared byte-level BPE
never shows (golden/README.md, "Other tokenizer kinds"):

* ``words``: a ``WordLevel`` model over the ``Whitespace`` pre-tokenizer (``\\w+|[^\\w\\s]+``) and no decoder, so
  decoding joins tokens with spaces (the first token of a text has none); out-of-vocabulary words are ``[UNK]``.
  Special tokens ``<|endoftext|>`` (id 0: eos, bos, pad), ``[UNK]``, ``<|im_start|>``, ``<|im_end|>``.
* ``spm``: SentencePiece as transformers converts it for Llama 2: ``Metaspace`` (spaces become ``▁``, one is
  prepended to the first word), a BPE with byte fallback (a character outside the vocabulary is its UTF-8 bytes
  ``<0xNN>``, so multi-byte characters span tokens), decoder Replace ``▁`` -> space, ByteFallback, Fuse, Strip one
  leading space. ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2 (eos), the 256 byte tokens 3..258, then the merges; added
  special tokens ``<|im_start|>``, ``<|im_end|>`` last.

Both are trained with ``tokenizers`` on the texts given: make_checkpoints passes the same stdlib text as the
BPE's (``make_checkpoints.corpus_files``) and its ``VOCAB_SIZE`` in all (this module imports nothing of it).
``tokenizer_class`` is ``PreTrainedTokenizerFast``, so AutoTokenizer decodes exactly as
``tokenizers.Tokenizer.from_file("tokenizer.json")``.
"""

from __future__ import annotations

import json
from pathlib import Path

WORD_SPECIALS = ("<|endoftext|>", "[UNK]", "<|im_start|>", "<|im_end|>")
SPM_SPECIALS = ("<unk>", "<s>", "</s>")
CHAT_SPECIALS = ("<|im_start|>", "<|im_end|>")
SPM_ALPHABET = 90  # the most frequent characters only: the rest (é, —, emoji, ...) fall back to bytes
# kind -> (eos, bos) token contents
SPECIAL_ROLES = {"words": ("<|endoftext|>", "<|endoftext|>"), "spm": ("</s>", "<s>")}


def train_words(vocab_size: int, texts: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=list(WORD_SPECIALS), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    assert tok.token_to_id(WORD_SPECIALS[0]) == 0 and tok.get_vocab_size() == vocab_size
    return tok


def train_spm(vocab_size: int, texts: list[str]):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    metaspace = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    fixed = [*SPM_SPECIALS, *(f"<0x{b:02X}>" for b in range(256))]
    draft = Tokenizer(models.BPE())
    draft.pre_tokenizer = metaspace
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(fixed) - len(CHAT_SPECIALS), min_frequency=2,
                                  limit_alphabet=SPM_ALPHABET, show_progress=False)
    draft.train_from_iterator(texts, trainer)
    learned = json.loads(draft.to_str())["model"]
    vocab = {t: i for i, t in enumerate(fixed)}
    for token, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = metaspace
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (*SPM_SPECIALS, *CHAT_SPECIALS)])
    assert tok.token_to_id("</s>") == 2 and tok.token_to_id("<0xE2>") == 3 + 0xE2
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok


def train(kind: str, vocab_size: int, texts: list[str]):
    return {"words": train_words, "spm": train_spm}[kind](vocab_size, texts)


def save(kind: str, tok, folder: Path) -> None:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json (AutoTokenizer, offline)."""
    tok.save(str(folder / "tokenizer.json"))
    eos, bos = SPECIAL_ROLES[kind]
    added = {str(i): {"content": t.content, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, t in sorted(tok.get_added_tokens_decoder().items())}
    unk = "[UNK]" if kind == "words" else "<unk>"
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added, "bos_token": bos,
              "eos_token": eos, "pad_token": eos, "unk_token": unk, "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "model_max_length": 2048}
    for path, obj in ((folder / "tokenizer_config.json", config),
                      (folder / "special_tokens_map.json", {"bos_token": bos, "eos_token": eos, "pad_token": eos,
                                                            "unk_token": unk})):
        path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def special_ids(kind: str, tok) -> tuple[int, int]:
    """(eos id, bos id) of a trained tokenizer."""
    eos, bos = SPECIAL_ROLES[kind]
    return tok.token_to_id(eos), tok.token_to_id(bos)
