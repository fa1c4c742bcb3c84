"""`python -m nanovllm_ref.serve MODEL [flags]`: the same as `nanovllm-ref serve MODEL [flags]`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
