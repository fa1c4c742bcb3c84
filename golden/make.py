"""Regenerate everything in ``golden/``: checkpoints, golden outputs and ``manifest.json``.

Explicit only (``nox -s golden`` calls this); nothing regenerates goldens automatically.

    python -m golden.make                  # tokenizer + training + goldens + manifest
    python -m golden.make --goldens-only   # keep the checkpoints, recompute outputs + manifest
    python -m golden.make qwen3-moe-tiny   # only these checkpoints (+ their goldens); the rest is kept
"""

from __future__ import annotations

import argparse
import time

from golden import make_checkpoints, make_goldens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--goldens-only", action="store_true", help="do not retrain the checkpoints")
    parser.add_argument("names", nargs="*", help="only these checkpoints (default: all)")
    args = parser.parse_args(argv)
    t0 = time.time()
    if not args.goldens_only:
        make_checkpoints.main(args.names)
    make_goldens.main(args.names)
    print(f"golden/ regenerated in {time.time() - t0:.0f}s; check with: python -m golden.verify")


if __name__ == "__main__":
    main()
