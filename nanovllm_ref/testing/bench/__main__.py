"""`python -m nanovllm_ref.testing.bench`: the same as `nanovllm-ref bench` (cli.py)."""

import sys

from .cli import main

sys.exit(main())
