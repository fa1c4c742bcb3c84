"""An OpenAI-compatible server over the engine (FastAPI + uvicorn + pydantic), and the `nanovllm-ref` CLI.

    python -m nanovllm_ref.serve MODEL [--served-model-name NAME] [--chat-template FILE] ...
    nanovllm-ref serve MODEL ...

Modules, each importing only those above it: protocol (request models) -> params (request -> SamplingParams),
text (incremental detokenization, stop strings) -> engine_loop (the engine's thread) -> handlers (one
request's engine requests) -> routes (endpoint logic) -> app (FastAPI, errors, limits) -> server (uvicorn) -> cli.
References: the OpenAI API reference; vLLM's entrypoints/openai (protocol.py, serving_completion.py,
serving_chat.py) for the extensions and behaviours matched here.
"""
