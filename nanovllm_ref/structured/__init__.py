"""Structured outputs (vLLM's `StructuredOutputsParams`: a JSON schema, a regex, a choice, a grammar, any JSON
object), on xgrammar: vocab.py the grammar's view of the tokenizer (TokenizerInfo), compiler.py the compile cache,
manager.py the engine's StructuredOutputManager (one matcher per sequence, each step's token bitmask), applied by
kernels/token_bitmask.py. xgrammar is imported on the first structured request (the `structured` extra).
References: vLLM vllm/v1/structured_output/ (backend_xgrammar.py, __init__.py); xgrammar's documentation
(https://xgrammar.mlc.ai/docs/).
"""
