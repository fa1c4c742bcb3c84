"""What the real-peer drivers share (tools/peer_vllm.py, tools/peer_local.py): running test_golden through an
engine in a pytest subprocess, an engine's server in its own process group, and the results table; and llama.cpp's
OpenAI-compatible server as a route of `nox -s peer-llamacpp` (``server_rows``): for each checkpoint its f32 GGUF
(oracle/llamacpp_adapter.py ``convert``) served by ``python -m llama_cpp.server`` on 127.0.0.1 (``--model_alias``
the checkpoint's path, so the adapter's name check holds), test_golden through ``--engine llamacpp:URL
--engine-arg server_dtype=float32 --engine-arg echo=false``, the server stopped; on the first checkpoint also with
``echo`` (prompt logprobs), which shows llama-cpp-python's echo bug (ECHO_BUG).

A table row is one (engine, checkpoint, dtype or quantization, route) comparison with its verdict and the largest
and mean |dlogprob|; failures traced to the engine or its converter (``known``: checkpoint -> what) stay in the
table as such and do not fail the driver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_conformance(engine: str, models: list[str], dtypes: list[str], report: Path, log: Path,
                       timeout_s: float, engine_args: Sequence[str] = (), tag: str = "peer") -> int:
    """test_golden through ``engine`` (``engine_args``: ``KEY=VALUE`` for its factory); the JSON report and the log
    land in ``report`` / ``log``."""
    cmd = [sys.executable, "-m", "pytest", "conformance/test_golden.py", "-q", "-p", "no:cacheprovider", "-k",
           "not gpu", "--engine", engine, "--model", ",".join(models), "--dtype", ",".join(dtypes),
           "--report", str(report)]
    for arg in engine_args:
        cmd += ["--engine-arg", arg]
    with log.open("w") as out:
        try:
            return subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[{tag}] timed out after {timeout_s:.0f} s\n")
            return 124


class Server:
    """A server command on 127.0.0.1 in its own process group (so that stopping it stops its workers), up once
    ``health_url`` answers 200; ``url`` is that URL's origin (``http://127.0.0.1:PORT``)."""

    def __init__(self, cmd: list[str], health_url: str, log: Path, startup_s: float, name: str,
                 env: dict[str, str] | None = None) -> None:
        self.log, self.name = log.open("w"), name
        self.url = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(health_url))
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name}'s server exited with {self.proc.returncode} during start-up (see {log})")
            try:
                with urllib.request.urlopen(health_url, timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(3)
        self.stop()
        raise RuntimeError(f"{name}'s server was not up after {startup_s:.0f} s (see {log})")

    def stop(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()


def rows_of(report: Path, engine: str, route: str, models: list[str], dtypes: list[str], log: Path,
            known: dict[str, str] | None = None, label: str | None = None) -> list[dict]:
    """One table row per (model, dtype) of a run; a pair missing from the report errored before comparing (the
    log's last error line is the evidence). ``label`` replaces the dtype column (e.g. a quantization)."""
    data = json.loads(report.read_text()) if report.is_file() else {}
    prompts, set_failures = data.get("prompts", []), data.get("set_failures", [])
    rows = []
    for model in models:
        for dtype in dtypes:
            mine = [p for p in prompts if p["model"] == model and p["dtype"] == dtype]
            row = {"engine": engine, "checkpoint": model, "dtype": label or dtype, "route": route}
            base = model.partition("@")[0]
            if not mine:
                why = last_error(log, model)
                verdict = f"ERROR before comparing: {why} (see {log.name})"
                if known and base in known:
                    verdict = f"FAIL, known bug: {known[base]}; {why}"
                rows.append({**row, "verdict": verdict, "max_diff": "-", "mean_diff": "-"})
                continue
            counts = {s: sum(p["status"] == s for p in mine) for s in ("match", "diverged-ok", "fail")}
            set_fail = [f for f in set_failures if f["model"] == model and f["dtype"] == dtype]
            verdict = "FAIL" if counts["fail"] or set_fail else "pass"
            detail = f"{counts['match']} exact, {counts['diverged-ok']} diverged within top-k"
            detail += f", {counts['fail']} failed" if counts["fail"] else ""
            count = sum(p.get("gen_diff_count", 0) for p in mine)
            mean = f"{sum(p['gen_diff_sum'] for p in mine) / count:.3g}" if count else "-"
            detail += f", set mean {mean} > mean_tol {set_fail[0]['mean_tol']:.3g}" if set_fail else ""
            if verdict == "FAIL" and known and base in known:
                verdict = f"FAIL, known bug: {known[base]}"
            rows.append({**row, "verdict": f"{verdict} ({detail})",
                         "max_diff": f"{max(p['max_abs_diff'] for p in mine):.3g}", "mean_diff": mean})
    return rows


def last_error(log: Path, model: str = "") -> str:
    """The last ``E   ...Error: ...`` line of a pytest log (of ``model``'s test_golden section when it has one),
    shortened, or ``-``."""
    if not log.is_file():
        return "-"
    text = log.read_text(errors="replace")
    sections = [s for s in text.split("_ test_golden[")[1:] if s.startswith(f"{model}-")] if model else []
    lines = [ln[1:].strip() for ln in (sections[-1] if sections else text).splitlines()
             if ln.startswith("E ") and ("Error" in ln or "Exception" in ln)]
    return lines[-1][:160] if lines else "-"


def markdown(rows: list[dict]) -> str:
    head = ("| engine | checkpoint | dtype | route | verdict | max \\|dlogprob\\| | set mean \\|dlogprob\\| |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n")
    return head + "".join(f"| {r['engine']} | {r['checkpoint']} | {r['dtype']} | {r['route']} | {r['verdict']} | "
                          f"{r['max_diff']} | {r['mean_diff']} |\n" for r in rows)


def all_passed(rows: list[dict]) -> bool:
    """Every row passed, failed for a known engine / converter bug, or (a planted bug) was caught."""
    return all(r["verdict"].startswith(("pass", "FAIL, known", "caught")) for r in rows)


SERVER_ROUTE = "HTTP (`python -m llama_cpp.server`, `--engine llamacpp:URL`)"
ECHO_BUG = ("llama-cpp-python 0.3.36's echo=True logprobs read each token's logprob from its own position's row (the "
            "next token's distribution) and drop the last token (reproduction: llamacpp-echo, "
            "`git show 04813df:tools/probe_peer_bugs.py`)")

# the server's own bugs, on checkpoints that pass in-process
SERVER_BUGS = {"mistral-spm-hd32": "llama-cpp-python 0.3.36 names every byte-fallback token '' in its logprobs (the "
               "token's bytes decoded with errors='ignore'), so the ids of its answers cannot be recovered "
               "(reproduction: llamacpp-byte-tokens in `git show 04813df:tools/probe_peer_bugs.py`)"}


def server_rows(label: str, models: list[str], out: Path, run_s: float, known: dict[str, str] | None = None,
                port: int = 8771, startup_s: float = 600.0) -> list[dict]:
    """One row per checkpoint (no echo), plus the echo row of the first; ``known``: checkpoint -> engine bug."""
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.llamacpp_adapter import convert

    rows = []
    for model in models:
        report, log = out / f"http-{model}.json", out / f"http-{model}.log"
        try:
            gguf = convert(checkpoint_path(model))
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias",
                   checkpoint_path(model), "--logits_all", "true", "--n_ctx", "512", "--n_threads", "1",
                   "--n_threads_batch", "1", "--type_k", "0", "--type_v", "0",  # f32 KV cache (default f16)
                   "--host", "127.0.0.1", "--port", str(port)]
            server = Server(cmd, f"http://127.0.0.1:{port}/v1/models", out / f"server-{model}.log", startup_s,
                            "llama.cpp")
        except (RuntimeError, OSError) as e:
            log.write_text(f"E   RuntimeError: {e}\n")
        else:
            url = f"llamacpp:http://127.0.0.1:{port}/v1"
            try:
                pytest_conformance(url, [model], ["float32"], report, log, run_s,
                                   ["server_dtype=float32", "echo=false"], tag="peer_llamacpp_server")
                if model == models[0]:
                    echo_report, echo_log = out / f"http-echo-{model}.json", out / f"http-echo-{model}.log"
                    pytest_conformance(url, [model], ["float32"], echo_report, echo_log, run_s,
                                       ["server_dtype=float32"], tag="peer_llamacpp_server")
            finally:
                server.stop()
        rows += rows_of(report, label, SERVER_ROUTE + ", no prompt logprobs", [model], ["float32"], log,
                        {**(known or {}), **SERVER_BUGS})
        if model == models[0]:
            rows += rows_of(out / f"http-echo-{model}.json", label, SERVER_ROUTE + ", `echo` (prompt logprobs)",
                            [model], ["float32"], out / f"http-echo-{model}.log", {model: ECHO_BUG})
    return rows
