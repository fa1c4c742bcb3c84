"""`GET /docs`: the API reference as one self-contained HTML page, rendered on the server from the OpenAPI schema.

FastAPI's own /docs (Swagger UI) and /redoc load their scripts and styles from a CDN, so they are blank on a
machine without internet access, where a local inference server often runs. This page has no script and no
external resource: per endpoint its method, path, summary, the request body's fields (name, type, default,
description; nested models expanded once) and a curl line. The machine-readable schema stays at /openapi.json.
"""

from __future__ import annotations

import html
import json
from typing import Any

_STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
code,pre{font-family:ui-monospace,monospace;background:#f4f4f4}pre{padding:.6rem;overflow-x:auto}
h2{margin-top:2.2rem;border-bottom:1px solid #ddd}.m{font-weight:bold;padding:0 .4rem;color:#fff;background:#357}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;
vertical-align:top}th{background:#f4f4f4}"""


def _ref(schema: dict, spec: dict) -> dict:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _type(schema: dict, spec: dict) -> str:
    """A short type: `int`, `str | list[int]`, `StreamOptions | null`."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(_type(s, spec) for s in schema[key])
    if schema.get("type") == "array":
        return f"list[{_type(schema.get('items', {}), spec)}]"
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    return {"integer": "int", "string": "str", "number": "float", "boolean": "bool", "object": "object"}.get(
        schema.get("type", ""), schema.get("type", "any"))


def _fields(schema: dict, spec: dict) -> str:
    schema = _ref(schema, spec)
    required = set(schema.get("required", ()))
    rows = []
    for name, prop in schema.get("properties", {}).items():
        default = "required" if name in required else json.dumps(prop.get("default"))
        rows.append(f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(_type(prop, spec))}</td>"
                    f"<td>{html.escape(default)}</td><td>{html.escape(prop.get('description', ''))}</td></tr>")
    if not rows:
        return ""
    return "<table><tr><th>field</th><th>type</th><th>default</th><th>description</th></tr>" + "".join(rows) + \
        "</table>"


def _nested(schema: dict, spec: dict, seen: set[str]) -> list[str]:
    """Names of the models a body refers to (messages, stream_options, ...), each once per page."""
    names = []
    for prop in _ref(schema, spec).get("properties", {}).values():
        text = json.dumps(prop)
        for name in spec.get("components", {}).get("schemas", {}):
            if f'"#/components/schemas/{name}"' in text and name not in seen:
                seen.add(name)
                names.append(name)
    return names


def _operation(method: str, path: str, op: dict, spec: dict, seen: set[str]) -> str:
    parts = [f"<h2><span class=m>{method.upper()}</span> <code>{html.escape(path)}</code></h2>",
             f"<p>{html.escape(op.get('summary', ''))}</p>"]
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    curl = f"curl http://HOST:PORT{path}"
    if body is not None:
        parts.append("<h3>Request body</h3>" + _fields(body, spec))
        for name in _nested(body, spec, seen):
            parts.append(f"<h4>{html.escape(name)}</h4>" + _fields({"$ref": f"#/components/schemas/{name}"}, spec))
        curl += " -H 'Content-Type: application/json' -d '{...}'"
    return "".join(parts) + f"<pre>{html.escape(curl)}</pre>"


def docs_html(spec: dict[str, Any]) -> str:
    """The page for an OpenAPI schema (FastAPI's `app.openapi()`)."""
    info = spec.get("info", {})
    seen: set[str] = set()
    ops = [_operation(m, p, op, spec, seen) for p, item in spec.get("paths", {}).items() for m, op in item.items()]
    title = html.escape(f"{info.get('title', 'API')} {info.get('version', '')}")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{title}</title><style>{_STYLE}</style></head>"
            f"<body><h1>{title}</h1><p>{html.escape(info.get('summary', ''))}. Errors are "
            "<code>{\"error\": {\"message\", \"type\", \"param\", \"code\"}}</code>. The OpenAPI schema: "
            f"<a href=/openapi.json>/openapi.json</a>.</p>{''.join(ops)}</body></html>")
