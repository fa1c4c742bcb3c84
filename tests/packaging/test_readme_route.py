"""The README's "Test your engine" section is what CI runs (`.ci/run` -> `nox -s installed`, which executes its
bash block line for line), covers the documented routes and fits on one screen."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Test your engine"


def section() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index(HEADING)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("#"))
    return lines[start:end]


def test_ci_runs_the_readme_block() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^nox -s [\w ]*\binstalled\b", run, re.M), run
    nox = (ROOT / "noxfile.py").read_text()
    assert f'readme_block("{HEADING}")' in nox and 'def installed(' in nox


def test_the_block_covers_every_route_and_fits_one_screen() -> None:
    text = "\n".join(section())
    block = text[text.index("```bash\n") + 8: text.rindex("```")]
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    assert any(c.startswith("python3 -m venv") for c in commands)
    assert any("pip install" in c and "[conformance]" in c and ".whl" in c for c in commands)
    assert any(c.startswith('cd "$(mktemp -d)"') for c in commands)  # the suite runs from outside the checkout
    runs = [c for c in commands if c.startswith(("pytest --pyargs conformance", "nanovllm-ref conformance"))]
    assert len(runs) == 4 and all("--model qwen3-tiny --dtype float32" in c for c in runs)
    assert "--engine" not in runs[0] and "--engine hf" in runs[1]
    assert "--engine openai:http://127.0.0.1:8011/v1" in runs[2]
    assert "--engine toy_engine.adapter:make_engine" in runs[3]
    serve = [c for c in commands if c.startswith("nanovllm-ref serve qwen3-tiny")]
    assert len(serve) == 1 and ("--no-access-log" in serve[0] or ">" in serve[0].split("&")[0]), serve  # quiet
    torch = [c for c in commands if c.startswith("pip install torch")]
    assert len(torch) == 1 and "https://download.pytorch.org/whl/cpu" in torch[0], torch  # CPU build, any pip default
    assert any("examples/external_engine[test]" in c for c in commands)
    assert len(section()) <= 40 and max(len(line) for line in section()) <= 120
