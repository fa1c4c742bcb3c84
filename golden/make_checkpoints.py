"""Build the tiny golden checkpoints: a byte-level BPE tokenizer and three briefly trained models.

Everything is made locally from the Python standard library sources (no hub access):

* the tokenizer is trained with the ``tokenizers`` library on the top-level ``*.py`` files of the
  stdlib directory (sorted by name), vocab ``VOCAB_SIZE`` with ``<|endoftext|>`` as id 0
  (used as eos, bos and pad);
* each model is trained from scratch with AdamW for ``CheckpointSpec.steps`` steps on random
  windows of a small text (the stdlib packages ``json`` and ``logging``, ~75k tokens; the golden
  prompts come from the same text), fixed seeds and one thread, then saved in float32 as an HF
  folder. The models deliberately (over)fit that text so that their next-token distributions are
  peaked like a real model's on familiar code, not near-uniform.

Run through ``python -m golden.make`` (``nox -s golden``); never run automatically.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from golden import make_tokenizers
from golden.load import CHECKPOINTS_DIR

EOS = "<|endoftext|>"
EOS_ID = 0
VOCAB_SIZE = 1536
STDLIB_DIR = Path(os.path.dirname(os.__file__))
NUM_THREADS = 1  # fixed: weights and goldens must not depend on the host core count


@dataclass(frozen=True)
class CheckpointSpec:
    """One golden checkpoint: architecture, config overrides and training settings."""

    name: str
    arch: str  # "qwen3", "qwen2", "llama", "mistral" or "qwen3_moe"
    config: dict = field(default_factory=dict)
    seed: int = 0
    steps: int = 1500
    batch_size: int = 3
    seq_len: int = 336  # covers the longest golden prompt (300) + 32 generated tokens
    lr: float = 4e-3
    # post-training rescales (see rescale_for_magnitude): target RMS of the embeddings, the residual stream scaled
    # with them (None: as trained); factor on the attention scores (query scale)
    residual_rms: float | None = None
    score_scale: float = 1.0
    tokenizer: str = "bpe"  # "bpe" (the shared byte-level BPE), "words" or "spm" (golden/make_tokenizers.py)
    random_logit_std: float | None = None  # set: random weights, not trained, lm_head scaled to this logit std


def _arch(hidden: int, inter: int, layers: int, heads: int, kv_heads: int, tied: bool, theta: float, **kw) -> dict:
    return dict(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=tied,
        rope_theta=theta,
        **kw,
    )


SPECS: list[CheckpointSpec] = [
    # tied embeddings, GQA 2, head_dim == hidden / heads
    CheckpointSpec("qwen3-tiny", "qwen3", _arch(64, 192, 2, 4, 2, True, 1e6, head_dim=16), seed=1, steps=2500, lr=5e-3),
    # untied, GQA 4, head_dim 32 != hidden / heads (96 / 8 = 12), 3 layers
    CheckpointSpec("qwen3-gqa4", "qwen3", _arch(96, 256, 3, 8, 2, False, 1e4, head_dim=32), seed=2),
    # Qwen2: q/k/v biases, untied, GQA 2, head_dim = 128 / 4 = 32
    CheckpointSpec("qwen2-tiny", "qwen2", _arch(128, 352, 2, 4, 2, False, 1e6), seed=3),
    # Llama 3.x: "llama3" RoPE scaling (original context 256 < 2048), untied, GQA 4
    CheckpointSpec("llama3-tiny", "llama", _arch(128, 352, 2, 8, 2, False, 5e5, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=256)), seed=4),
    # Mistral: no window within max_position_embeddings (a window below max_model_len is refused by the engine)
    CheckpointSpec("mistral-tiny", "mistral", _arch(96, 256, 2, 4, 1, True, 1e6, head_dim=24, sliding_window=None),
                   seed=5),
    # Qwen3-MoE: 8 experts, top-2, renormalized; layer 1 is dense (mlp_only_layers) so both MLP paths are covered
    CheckpointSpec("qwen3-moe-tiny", "qwen3_moe", _arch(64, 192, 3, 4, 2, False, 1e6, head_dim=16, num_experts=8,
                   num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                   mlp_only_layers=[1]), seed=6),
    # head_dim 32 / 64 (sizes every engine supports, e.g. vLLM's CPU attention), one per family, each with a RoPE
    # base of its own and a code path the checkpoints above leave out (README: "head_dim 32 / 64 checkpoints").
    # Qwen3 tied, GQA 2: residual stream scaled to RMS 2e-3, so rms_norm_eps (1e-6) is a quarter of mean(x^2).
    CheckpointSpec("qwen3-tied-hd64", "qwen3", _arch(128, 320, 2, 4, 2, True, 2.5e5, head_dim=64), seed=11,
                   residual_rms=2e-3),
    # Qwen3 untied, GQA 1, attention_bias (q/k/v and o_proj biases); residual stream at RMS ~300, scores x3.
    CheckpointSpec("qwen3-bias-hd32", "qwen3", _arch(128, 352, 2, 4, 4, False, 3e4, head_dim=32, attention_bias=True),
                   seed=12, residual_rms=300.0, score_scale=3.0),
    # Qwen2, GQA 2, head_dim = 128 / 2: residual stream at RMS ~300, scores x2.
    CheckpointSpec("qwen2-hd64", "qwen2", _arch(128, 352, 2, 2, 1, False, 7.5e4), seed=13, residual_rms=300.0,
                   score_scale=2.0),
    # Llama 3 with attention_bias and mlp_bias (biases on o_proj and down_proj: row-parallel at TP > 1), GQA 4,
    # "llama3" RoPE scaling from an original context of 128 (prompts of 130 and 300 tokens reach the scaled part).
    CheckpointSpec("llama3-bias-hd32", "llama", _arch(128, 352, 2, 8, 2, False, 2e5, head_dim=32, attention_bias=True,
                   mlp_bias=True, rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                   high_freq_factor=2.0, original_max_position_embeddings=128)), seed=14),
    # Mistral untied, GQA 4, rms_norm_eps 1e-5 with the residual stream at RMS 5e-3 (eps is 0.4 of mean(x^2)).
    CheckpointSpec("mistral-hd64", "mistral", _arch(128, 320, 2, 4, 1, False, 5e4, head_dim=64, sliding_window=None,
                   rms_norm_eps=1e-5), seed=15, residual_rms=5e-3),
    # Qwen3-MoE with an unnormalized router (norm_topk_prob false: the top-3 weights sum to < 1), every layer
    # sparse, attention biases (o_proj's row-parallel bias at TP > 1).
    CheckpointSpec("qwen3-moe-unnorm-hd32", "qwen3_moe", _arch(64, 192, 2, 4, 2, False, 4e5, head_dim=32,
                   attention_bias=True, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48,
                   norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[]), seed=16),
    # head_dim 128, the production head size (Qwen3 0.6B-32B, Llama 3, Mistral 7B) and the only one the fp8 decode
    # kernel takes (nanovllm_ref/kernels/decode_attention_fp8.py); Qwen3 tied, GQA 2, Qwen3's RoPE base; hidden 64
    # (q/k/v project up to 4 x 128 / 2 x 128) keeps the checkpoint as small as qwen3-tiny's family.
    CheckpointSpec("qwen3-hd128", "qwen3", _arch(64, 192, 2, 4, 2, True, 1e6, head_dim=128), seed=17,
                   steps=2500, lr=5e-3),
    # Other tokenizer kinds, where text policies differ (golden/make_tokenizers.py): random weights (what these test
    # is text, not the arithmetic), the logits scaled to a std of 4 so that next-token distributions are peaked.
    CheckpointSpec("qwen3-words-hd32", "qwen3", _arch(64, 128, 2, 2, 1, False, 1e6, head_dim=32), seed=21,
                   tokenizer="words", random_logit_std=4.0),
    CheckpointSpec("mistral-spm-hd32", "mistral", _arch(64, 128, 2, 2, 1, False, 1e4, head_dim=32, sliding_window=None),
                   seed=22, tokenizer="spm", random_logit_std=4.0),
]


def corpus_files() -> list[Path]:
    """Tokenizer training text: the top-level stdlib ``*.py`` files, sorted by name."""
    return sorted(STDLIB_DIR.glob("*.py"), key=lambda p: p.name)


def _package_files(*packages: str) -> list[Path]:
    return [p for pkg in packages for p in sorted((STDLIB_DIR / pkg).glob("*.py"), key=lambda p: p.name)]


def prompt_source_files() -> list[Path]:
    """Model training text, also the source of the golden prompts: stdlib ``json`` and ``logging``."""
    return _package_files("json", "logging")


def heldout_files() -> list[Path]:
    """Text never trained on, for the held-out loss in ``train_stats.json``: stdlib ``collections``."""
    return _package_files("collections")


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


# Qwen2's pre-tokenizer regex: transformers 5 rebuilds this pipeline for ``Qwen2Tokenizer`` (which
# AutoTokenizer picks for model_type qwen2 whatever tokenizer_config.json says), so the tokenizer
# is built exactly like it and tokenizes identically through every loading path.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def train_tokenizer():
    """Qwen2-style byte-level BPE trained on :func:`corpus_files`; returns a ``tokenizers.Tokenizer``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([read_text(p) for p in corpus_files()], trainer)
    assert tok.token_to_id(EOS) == EOS_ID and tok.get_vocab_size() == VOCAB_SIZE
    return tok


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_tokenizer(tok, folder: Path) -> None:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json (AutoTokenizer, offline)."""
    tok.save(str(folder / "tokenizer.json"))
    added = {
        str(EOS_ID): {
            "content": EOS,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    }
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "Qwen2Tokenizer",
            "added_tokens_decoder": added,
            "bos_token": EOS,
            "eos_token": EOS,
            "pad_token": EOS,
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 2048,
        },
    )
    _write_json(folder / "special_tokens_map.json", {"bos_token": EOS, "eos_token": EOS, "pad_token": EOS})


def build_config(spec: CheckpointSpec, eos: int = EOS_ID, bos: int = EOS_ID):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    kwargs = dict(spec.config)
    rope_theta = kwargs.pop("rope_theta")
    rope = {"rope_type": "default", **kwargs.pop("rope_scaling", {}), "rope_theta": rope_theta}
    common = dict(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_parameters=rope,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=eos,
        hidden_act="silu",
        initializer_range=0.02,
        use_cache=True,
    )
    cls = {"qwen3": Qwen3Config, "qwen2": Qwen2Config, "llama": LlamaConfig, "mistral": MistralConfig,
           "qwen3_moe": Qwen3MoeConfig}[spec.arch]
    return cls(**{**common, **kwargs})


def lr_at(step: int, spec: CheckpointSpec) -> float:
    """Linear warmup (5%), cosine decay to 10% of the peak."""
    warmup = max(1, spec.steps // 20)
    if step < warmup:
        return spec.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, spec.steps - warmup)
    return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train_model(spec: CheckpointSpec, train_ids: torch.Tensor, eval_ids: torch.Tensor):
    """Train one model from scratch; returns (model, stats dict)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    config = build_config(spec)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(spec.seed)
    offsets = torch.arange(spec.seq_len)
    losses: list[float] = []
    moe = {"output_router_logits": True} if spec.arch == "qwen3_moe" else {}  # + load-balancing loss (training only)
    t0 = time.time()
    model.train()
    for step in range(spec.steps):
        starts = torch.randint(0, len(train_ids) - spec.seq_len, (spec.batch_size,), generator=gen)
        batch = train_ids[starts[:, None] + offsets]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec)
        loss = model(input_ids=batch, labels=batch, **moe).loss  # HF shifts labels internally
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == spec.steps - 1:
            print(f"  [{spec.name}] step {step:4d} loss {loss.item():.4f} ({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    with torch.no_grad():
        n = len(eval_ids) // spec.seq_len
        chunks = eval_ids[: n * spec.seq_len].view(n, spec.seq_len).split(8)
        eval_loss = sum(float(model(input_ids=c, labels=c).loss) * len(c) for c in chunks) / n
    stats = {  # no timings here: the file is hashed, and regeneration must reproduce it bit for bit
        "steps": spec.steps,
        "batch_size": spec.batch_size,
        "seq_len": spec.seq_len,
        "peak_lr": spec.lr,
        "seed": spec.seed,
        "initial_loss": losses[0],
        "final_loss": losses[-1],
        "final_loss_mean_last_50": sum(losses[-50:]) / len(losses[-50:]),
        "heldout_loss": eval_loss,
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }
    return model, stats


# Parameters that write into the residual stream: scaling them all by s scales every hidden state by s, and every
# RMSNorm's output only through eps (each block reads normalized inputs), so the trained function is kept except
# where eps matters. MoE experts are stored fused (`experts.down_proj`) or per expert (`experts.{e}.down_proj.weight`).
RESIDUAL_WRITERS = re.compile(r"(embed_tokens\.weight|o_proj\.(weight|bias)|down_proj(\.weight|\.bias)?)$")


@torch.no_grad()
def rescale_for_magnitude(model, spec: CheckpointSpec) -> dict:
    """Apply ``spec.residual_rms`` / ``spec.score_scale`` to a trained model (in place); returns what was done.

    * residual_rms: scale the residual stream so that the embeddings' RMS is ``residual_rms`` (tiny: RMSNorm's eps
      becomes a sizeable part of mean(x^2), so an engine that drops or misplaces eps diverges; huge: hidden states in
      the hundreds). With tied embeddings the final norm's weight takes 1/s so that the logits are unchanged.
    * score_scale: multiply the queries (q_norm's weight where the model has one, else q_proj's weight and bias),
      so attention scores are that many times larger and softmax is sharper (a missing max-subtraction or a wrong
      online-softmax rescale costs more).
    """
    params = dict(model.named_parameters())
    done: dict = {}
    if spec.residual_rms is not None:
        embed = model.get_input_embeddings().weight
        scale = spec.residual_rms / float(embed.double().pow(2).mean().sqrt())
        for name, p in params.items():
            if RESIDUAL_WRITERS.search(name):
                p.mul_(scale)
        if model.config.tie_word_embeddings:
            model.model.norm.weight.div_(scale)
        done["residual_scale"] = scale
    if spec.score_scale != 1.0:
        has_qk_norm = any(n.endswith("q_norm.weight") for n in params)
        query = re.compile(r"q_norm\.weight$" if has_qk_norm else r"q_proj\.(weight|bias)$")
        for name, p in params.items():
            if query.search(name):
                p.mul_(spec.score_scale)
        done["score_scale"] = spec.score_scale
    return done


@torch.no_grad()
def hidden_state_rms(model, ids: torch.Tensor) -> list[float]:
    """Median over tokens of each residual-stream state's RMS (embeddings, after each layer), on ``ids``."""
    states = model(input_ids=ids[None], output_hidden_states=True).hidden_states[:-1]  # the last one is normed
    return [float(h[0].double().pow(2).mean(-1).sqrt().median()) for h in states]


@torch.no_grad()
def random_model(spec: CheckpointSpec, tok, eos: int, bos: int):
    """A model of random weights (transformers' initialization, seeded) whose lm_head is scaled so that the logits
    on the first training window have std ``spec.random_logit_std``; returns (model, stats dict)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(build_config(spec, eos, bos), attn_implementation="sdpa",
                                             dtype=torch.float32).eval()
    ids = torch.tensor(tok.encode(read_text(prompt_source_files()[0])).ids[: spec.seq_len])
    scale = spec.random_logit_std / float(model(input_ids=ids[None]).logits.std())
    model.get_output_embeddings().weight.mul_(scale)
    return model, {"random_init": True, "seed": spec.seed, "lm_head_scale": scale,
                   "logit_std": spec.random_logit_std, "num_parameters": sum(p.numel() for p in model.parameters())}


def save_checkpoint(model, tok, spec: CheckpointSpec, stats: dict) -> Path:
    folder = CHECKPOINTS_DIR / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").unlink(missing_ok=True)  # replaced by a minimal one below
    # Normalize config.json: legacy keys (rope_theta, torch_dtype) for older readers, sorted keys.
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(
        rope_theta=spec.config["rope_theta"],
        torch_dtype="float32",
        dtype="float32",
        architectures=[type(model).__name__],
    )
    _write_json(folder / "config.json", cfg)
    _write_json(
        folder / "generation_config.json",
        {
            "bos_token_id": cfg["bos_token_id"],
            "eos_token_id": cfg["eos_token_id"],
            "pad_token_id": cfg["pad_token_id"],
            "do_sample": False,
            "transformers_version": cfg.get("transformers_version", ""),
        },
    )
    if spec.tokenizer == "bpe":
        save_tokenizer(tok, folder)
    else:
        make_tokenizers.save(spec.tokenizer, tok, folder)
    _write_json(folder / "train_stats.json", stats)
    return folder


def encode_files(tok, files: list[Path]) -> torch.Tensor:
    """Token ids of the files, each followed by EOS."""
    ids: list[int] = []
    for enc in tok.encode_batch([read_text(p) for p in files]):
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


def finish_stats(model, spec: CheckpointSpec, stats: dict, train_ids: torch.Tensor) -> None:
    """Post-training rescale, if the spec asks for one, and the residual-stream RMS it leaves, into ``stats``
    (checkpoints without a rescale keep the stats they always had)."""
    rescaled = rescale_for_magnitude(model, spec)
    if rescaled:
        stats["post_training"] = rescaled
        stats["hidden_state_rms_median"] = hidden_state_rms(model, train_ids[: spec.seq_len])


def main(names: list[str] | None = None) -> None:
    torch.set_num_threads(NUM_THREADS)
    torch.use_deterministic_algorithms(True)
    t0 = time.time()
    tok = train_tokenizer()
    train_ids = encode_files(tok, prompt_source_files())
    eval_ids = encode_files(tok, heldout_files())
    print(
        f"tokenizer: vocab {tok.get_vocab_size()}, train tokens {len(train_ids)}, "
        f"held-out tokens {len(eval_ids)} ({time.time() - t0:.0f}s)",
        flush=True,
    )
    for spec in SPECS:
        if names and spec.name not in names:
            continue
        if spec.random_logit_std is not None:
            other = make_tokenizers.train(spec.tokenizer, VOCAB_SIZE, [read_text(p) for p in corpus_files()])
            model, stats = random_model(spec, other, *make_tokenizers.special_ids(spec.tokenizer, other))
            stats["tokenizer_text"] = {"files": len(corpus_files()), "glob": "<stdlib>/*.py", "kind": spec.tokenizer}
            print(f"saved {save_checkpoint(model, other, spec, stats)}: random weights, {spec.tokenizer} tokenizer")
            continue
        model, stats = train_model(spec, train_ids, eval_ids)
        finish_stats(model, spec, stats, train_ids)
        stats["train_text"] = {
            "files": [str(p.relative_to(STDLIB_DIR)) for p in prompt_source_files()],
            "tokens": len(train_ids),
        }
        stats["tokenizer_text"] = {"files": len(corpus_files()), "glob": "<stdlib>/*.py"}
        folder = save_checkpoint(model, tok, spec, stats)
        print(f"saved {folder}: final loss {stats['final_loss']:.3f}, held-out {stats['heldout_loss']:.3f}")


if __name__ == "__main__":
    main()
