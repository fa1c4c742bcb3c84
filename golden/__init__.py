"""Golden reference data: tiny trained HF checkpoints and transformers outputs for them.

See ``golden/README.md``. Regenerate explicitly with ``nox -s golden`` (``python -m golden.make``);
check integrity with ``python -m golden.verify``; read the data with :mod:`golden.load`.
"""
