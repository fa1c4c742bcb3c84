"""The server, the chat CLI and the oracle drive the engine through its public API only (step outputs, stats(),
add_observer, reset_prefix_cache): none of them reads the engine's request table, scheduler or block manager, so
the engine's internals can change under them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "nanovllm_ref"
USERS = ("serve", "oracle", "llm.py")
INTERNALS = re.compile(r"engine\.(requests|scheduler|block_manager|new_text)\b|\.on_schedule\s*=")


def _sources() -> list[Path]:
    return sorted(p for u in USERS for p in ([ROOT / u] if u.endswith(".py") else (ROOT / u).rglob("*.py")))


def test_serve_chat_and_the_oracle_read_no_engine_internals():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in _sources()
            for n, line in enumerate(p.read_text().splitlines(), 1) if INTERNALS.search(line)]
    assert not hits, "engine internals read outside the engine:\n" + "\n".join(hits)


def test_the_pattern_finds_what_it_forbids():
    for line in ("llm.engine.requests[rid]", "self.llm.engine.scheduler.running", "e.engine.block_manager.blocks",
                 "scheduler.on_schedule = f"):
        assert INTERNALS.search(line), line
    assert len(_sources()) > 10 and ROOT / "serve" / "chat.py" in _sources()
