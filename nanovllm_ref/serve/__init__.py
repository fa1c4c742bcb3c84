"""An OpenAI-compatible server over the engine (FastAPI + uvicorn + pydantic), and the `nanovllm-ref` CLI.

    python -m nanovllm_ref.serve MODEL [--served-model-name NAME] [--chat-template FILE] ...
    nanovllm-ref serve MODEL ...

Modules, each importing only those above it (and the engine's: nanovllm_ref.chat_template holds the templates
and the one conversation renderer, which LLM.chat shares): protocol (request models) -> params (request ->
SamplingParams) -> engine_loop (the engine's thread) -> metrics (Prometheus, vLLM's names) -> handlers (one
request's engine requests) -> routes (endpoint logic) -> docs (the offline /docs page) -> app (FastAPI, errors,
limits, access log) -> server (uvicorn) -> chat (the terminal chat) -> cli.
References: the OpenAI API reference; vLLM's entrypoints/openai (protocol.py, serving_completion.py,
serving_chat.py) for the extensions and behaviours matched here.
"""
