"""Every task of the monorepo: `nox -l` lists them.

Environments use virtualenv + pip (not uv): torch is pinned to 2.13.0, a CPU build; outside a machine
that holds that wheel, point pip at https://download.pytorch.org/whl/cpu (PIP_EXTRA_INDEX_URL) or it
downloads the multi-GB CUDA build.
Interpreters: the `python3.X` on PATH, else the newest pyenv install of each (no PYENV_VERSION needed);
the test sessions log which Pythons were found and which one each session runs.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import sys
from collections.abc import Mapping, Sequence

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = False
nox.options.sessions = ["lint", "typecheck", "tests", "tests_onnx"]

ROOT = pathlib.Path(__file__).parent
PYTHONS = ["3.10", "3.11", "3.12"]
#: the interpreter of lint, typecheck, docs and the checks run once
PRIMARY_PYTHON = "3.11"
PACKAGES = ["ort-train-core", "ort-train-sklearn", "ort-train-torch"]
# torch's dynamo exporter (`torch.onnx.export(..., dynamo=True)`) imports onnxscript; the tests
# exporting with it skip without, and install it where torch is
ONNXSCRIPT = "onnxscript; python_version == '3.11'"
# pip takes the CPU build of torch from local disk only with this exact pin (Python 3.11); any
# looser spec downloads a multi-GB CUDA build. Other interpreters test without torch.
TORCH = "torch==2.13.0; python_version == '3.11'"


def _install_core(session: nox.Session, device: str = "cpu") -> None:
    session.install("-e", f"packages/ort-train-core[{device}]")


# what each distribution's tests need beside the distribution itself: torch only where it is the
# point, so that a missing dependency of one adapter cannot hide behind another's install
TEST_SUITES = {
    # core's tests check a fix on every route, the scikit-learn estimators and OnnxModule
    # included (issue 26): the scikit-learn adapter everywhere, the torch one where torch is
    "core": (
        ["ort-train-core", "ort-train-sklearn"],
        # nox: test_noxfile.py imports the noxfile (its pyenv discovery, its session list)
        [
            "scikit-learn",
            "skl2onnx",
            TORCH,
            ONNXSCRIPT,
            "transformers; python_version == '3.11'",
            "nox; python_version == '3.11'",
        ],
        "tests/core",
    ),
    "sklearn": (["ort-train-core", "ort-train-sklearn"], [], "tests/sklearn_adapter"),
    # torch first, pinned: the adapter's own `torch>=2.1` would otherwise fetch a CUDA build
    "torch": (["ort-train-core", "ort-train-torch"], [TORCH, ONNXSCRIPT], "tests/torch_adapter"),
    # issue 17's zoo: architectures exported from torch (both exporters; the dynamo one needs
    # onnxscript), trained by every route of the three distributions (about a minute)
    "zoo": (
        ["ort-train-core", "ort-train-sklearn", "ort-train-torch"],
        [TORCH, "transformers", "onnxscript", "scikit-learn", "skl2onnx"],
        "tests/zoo",
    ),
}
# suites that need torch, provided for Python 3.11 only
_TORCH_SUITES = ("torch", "zoo")
#: the interpreter of the sessions on stock onnxruntime: onnxruntime-training has no wheel for it,
#: so the `[cpu]` extra installs stock onnxruntime there (the `onnx` backend); no torch either
STOCK_PYTHON = "3.13"
#: the suites that also run on the `onnx` backend (issue 27: core and scikit-learn on both runtimes;
#: issue 28: the zoo, on 3.11 only, where torch is)
ONNX_SUITES = ("core", "sklearn", "zoo")
#: the variable that makes every trainer, estimator and OnnxModule use a backend (_backends.py)
BACKEND_VARIABLE = "ORT_TRAIN_BACKEND"


#: every interpreter a session asks for
WANTED_PYTHONS = sorted({*PYTHONS, PRIMARY_PYTHON, STOCK_PYTHON}, key=lambda v: tuple(map(int, v.split("."))))


def pyenv_bin_dirs(root: pathlib.Path, versions: Sequence[str]) -> dict[str, pathlib.Path]:
    """The `bin` folder of the newest pyenv install of each wanted `X.Y` under `root/versions`.

    Parameters
    ----------
    root : pathlib.Path
        pyenv's root (`$PYENV_ROOT`, by default `~/.pyenv`).
    versions : Sequence[str]
        The wanted `X.Y` versions.

    Returns
    -------
    dict[str, pathlib.Path]
        `X.Y` -> the `bin` folder of its highest `X.Y.Z` holding `pythonX.Y`; versions pyenv lacks
        are left out, as are dev, free-threaded (`t`) and virtualenv entries.
    """
    newest: dict[str, tuple[int, pathlib.Path]] = {}
    try:
        entries = list((root / "versions").iterdir())
    except OSError:  # no pyenv here
        return {}
    for entry in entries:
        match = re.fullmatch(r"(\d+\.\d+)\.(\d+)", entry.name)
        if match is None or match[1] not in versions:
            continue
        if not (entry / "bin" / f"python{match[1]}").is_file():  # a partial or broken install
            continue
        patch = int(match[2])
        if match[1] not in newest or patch > newest[match[1]][0]:
            newest[match[1]] = (patch, entry / "bin")
    return {version: newest[version][1] for version in versions if version in newest}


def path_with_pyenv(path: str, root: pathlib.Path, versions: Sequence[str]) -> str:
    """`path` (a PATH value) with the pyenv `bin` folders of `versions` appended.

    Appended, not prepended: an interpreter already on PATH (a virtualenv, a pyenv shim of an
    active version, the system's python3.12) keeps precedence, and the bare `python` and `pip`
    of commands run with `external=True` keep their meaning. A pyenv shim of an inactive version
    (`python3.12` while `pyenv version` says 3.11) finds the appended folder too: pyenv falls back
    to PATH when the active versions lack the command.
    """
    entries = [entry for entry in path.split(os.pathsep) if entry]
    extra = [str(folder) for folder in pyenv_bin_dirs(root, versions).values()]
    return os.pathsep.join([*entries, *(folder for folder in extra if folder not in entries)])


def _pyenv_root(environ: Mapping[str, str]) -> pathlib.Path:
    # pyenv's own rule (`pyenv root`), without running it
    return pathlib.Path(environ.get("PYENV_ROOT") or pathlib.Path.home() / ".pyenv")


# nox looks for `python3.X` on PATH; pyenv makes only its active versions visible there (its
# shims run the versions `pyenv version` names), so without this every session but the active
# version's was skipped as a missing interpreter unless PYENV_VERSION listed the others
os.environ["PATH"] = path_with_pyenv(os.environ.get("PATH", ""), _pyenv_root(os.environ), WANTED_PYTHONS)
_REPORTED: list[bool] = []


def _report_interpreters(session: nox.Session) -> None:
    """Logs once per nox run which wanted Pythons exist (the others' sessions are skipped), and
    in every session the interpreter it runs."""
    if not _REPORTED:
        _REPORTED.append(True)
        # pyenv's shims folder left out: a shim names no interpreter (the report gives the file)
        shims = str(_pyenv_root(os.environ) / "shims")
        path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != shims)
        found = {v: shutil.which(f"python{v}", path=path) for v in WANTED_PYTHONS}
        listed = ", ".join(f"{v} ({exe})" for v, exe in found.items() if exe)
        missing = [v for v, exe in found.items() if exe is None]
        session.log(f"Pythons found: {listed or 'none'}")
        if missing:
            session.log(f"Pythons missing (their sessions are skipped): {', '.join(missing)}")
    session.run("python", "-c", _PRINT_PYTHON, silent=False)


_PRINT_PYTHON = "import platform, sys; print('python:', platform.python_version(), 'from', sys.base_prefix)"

# CI time (2 cores, 45 minutes, issue 27 item 8). Before issue 27, lint, typecheck and the
# 3.10-3.12 `tests` took 17-25 min. The four tests_onnx sessions add, measured on the 2-core
# machine at n=1 under a load of 5-7 (2026-11-26): 3.13 core 70 s install + 238 s tests, 3.13
# scikit-learn 60 s + 342 s (with the API checks), 3.11 core 115 s + 233 s (without them); 3.11
# scikit-learn about 60 s + 250 s: about 23 min more at one test process. A test process uses
# one core (CPU time 15-21 s for test_math_contract's 656 tests, about its wall time: small graphs,
# where Python and session creation dominate), so core and scikit-learn, the long suites, run on
# two pytest-xdist workers (their collection is the same in every process, whatever the hash
# seed): on CI's idle cores about half their time; measured under other jobs' load here it was a
# wash (21-29 s at n=1 against 25-27 s at n=2). The torch and zoo suites stay in one process
# (the zoo's Dropout trend test depends on what its process ran before; both are short). The slow
# checks run once per backend: scikit-learn's parametrize_with_checks (~80 s a run) on 3.11 for
# the training build (`tests`) and on 3.13 for ours (`tests_onnx`). Should the total pass 45 min,
# the next cut is 3.12's scikit-learn suite (the same libraries as 3.11's; 3.10 keeps the oldest
# scikit-learn).
XDIST = ["-n", "2"]
XDIST_SUITES = ("core", "sklearn")


@nox.session(python=PYTHONS)
@nox.parametrize("device", ["cpu", "cuda"])
@nox.parametrize("package", list(TEST_SUITES))
def tests(session: nox.Session, package: str, device: str) -> None:
    """One distribution's tests; `device=cuda` runs the tests marked `cuda` (they skip without a GPU)."""
    _report_interpreters(session)
    if device == "cuda":
        if shutil.which("nvidia-smi") is None:
            session.skip("no NVIDIA GPU on this machine: the cuda tests run where one exists")
        if session.python != "3.11":
            session.skip("onnxruntime-training (CUDA) has wheels for Python <= 3.11 only")
        if package == "zoo":
            session.skip("the zoo has no cuda-marked tests: it compares CPU training with torch's")
    _skip_without_torch(session, package)
    args = _install_suite(session, package, device)
    marker = ["-m", "cuda"] if device == "cuda" else []
    if device == "cpu" and session.python != PRIMARY_PYTHON and not session.posargs:
        # scikit-learn's API checks (80 s a run) test behaviour no interpreter changes: once is
        # enough, and CI's 45 minutes cannot pay them three times
        marker = ["-m", "not sklearn_checks"]
    session.run("python", "-m", "pytest", *marker, *args, env={"ORT_TRAIN_TEST_DEVICE": device})


def _skip_without_torch(session: nox.Session, package: str) -> None:
    if package in _TORCH_SUITES and session.python != "3.11":
        session.skip(
            "the torch suites run on Python 3.11 only: torch==2.13.0 is pinned there (its CPU "
            "build; other Pythons would download a multi-GB CUDA build)"
        )


def _install_suite(session: nox.Session, package: str, device: str) -> list[str]:
    """Installs one suite's distributions and test dependencies; returns pytest's arguments
    (the posargs, else the suite's folder, with `-n 2` where it pays and none were given)."""
    (core, *adapters), extra, folder = TEST_SUITES[package]
    if package in (*_TORCH_SUITES, "core"):
        session.install(TORCH)  # (its marker installs nothing off 3.11)
    session.install("-e", f"packages/{core}[{device}]")
    for dist in adapters:
        session.install("-e", f"packages/{dist}")
    if package == "core" and session.python == PRIMARY_PYTHON:
        session.install("-e", "packages/ort-train-torch")
    session.install("pytest>=8", "pytest-xdist", "hypothesis", *extra)
    if session.posargs:
        return list(session.posargs)
    return [*(XDIST if package in XDIST_SUITES and device == "cpu" else []), folder]


@nox.session(python=[PRIMARY_PYTHON, STOCK_PYTHON])
@nox.parametrize("package", list(ONNX_SUITES))
def tests_onnx(session: nox.Session, package: str) -> None:
    """Core, scikit-learn or zoo tests on the `onnx` backend: 3.11 on the training build, 3.13 on stock.

    The zoo needs torch: 3.11 only.

    On 3.11 every trainer, estimator and OnnxModule uses our backend over the training build's
    onnxruntime (`ORT_TRAIN_BACKEND=onnx`); on 3.13 the `[cpu]` extra installs stock onnxruntime,
    where ours is the default (tests needing torch skip: no torch for 3.13 here)."""
    _report_interpreters(session)
    _skip_without_torch(session, package)
    if session.python == PRIMARY_PYTHON:
        session.env[BACKEND_VARIABLE] = "onnx"
    args = _install_suite(session, package, "cpu")
    # the runtime and backend the suite runs on, checked before it runs (a resolver change that
    # put the training build on 3.13 would otherwise pass unnoticed)
    expected = "onnxruntime-training-cpu" if session.python == PRIMARY_PYTHON else "onnxruntime"
    session.run("python", "-c", _EXPECT_BACKEND.format(package=expected))
    marker = []
    if session.python == PRIMARY_PYTHON and not session.posargs:
        marker = ["-m", "not sklearn_checks"]  # run for this backend on 3.13
    session.run("python", "-m", "pytest", *marker, *args, env={"ORT_TRAIN_TEST_DEVICE": "cpu"})


_EXPECT_BACKEND = """
import importlib.metadata as m
from onnxruntime.capi.build_and_package_info import package_name
from ort_train_core._backends import default_backend_name
assert package_name == {package!r}, package_name
assert default_backend_name() == 'onnx', default_backend_name()
print('onnxruntime:', package_name, m.version(package_name), '- backend:', default_backend_name())
"""


#: onnxruntime-node's install script downloads CUDA binaries from NuGet (a host CI cannot reach)
#: unless told to skip: the CPU binaries the tests use are in the npm package itself
_NPM_ENV = {"ONNXRUNTIME_NODE_INSTALL": "skip"}


@nox.session(python=PRIMARY_PYTHON)
def tests_js(session: nox.Session) -> None:
    """The JavaScript loop js/train_step.mjs: onnxruntime-node and -web train an exported step.

    Installs the npm packages with `npm ci` (needs node and npm), then checks the weights that 20
    steps in Node.js give against OrtGradientOptimizer's (tests/js)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        session.error(
            f"{' and '.join(missing)} not found on PATH: this session installs onnxruntime-node and "
            "onnxruntime-web with npm (js/package-lock.json) and runs js/train_step.mjs with Node.js >= 18"
        )
    # about 50 s in a fresh venv (npm ci 5 s, the installs, 8 tests in 9 s; measured 2026-11-27)
    session.run("node", "--version", external=True)
    session.run("npm", "ci", "--prefix", "js", "--no-audit", "--no-fund", external=True, env=_NPM_ENV)
    # the export and the reference trainer use the `onnx` backend: the runtime the extra gives will do
    _install_core(session)
    session.install("pytest>=8", "scikit-learn")
    session.run("python", "-m", "pytest", *(session.posargs or ["tests/js"]))


@nox.session(python=PRIMARY_PYTHON)
def tests_cpp(session: nox.Session) -> None:
    """The C++ loop examples/cpp/train_step.cpp, built with g++ and checked against Python's.

    Compiled against onnxruntime's C++ API and checked against OrtGradientOptimizer's weights
    (tests/cpp).

    The headers come from Debian 13's libonnxruntime-dev (examples/cpp/onnxruntime_headers.sh,
    apt-get, no install); the library from the stock onnxruntime wheel the `[stock]` extra brings."""
    if shutil.which("g++") is None or shutil.which("apt-get") is None:
        session.error("g++ and apt-get (a Debian-like machine) are needed to build the C++ loop")
    headers = str(ROOT / "build" / "onnxruntime-headers")
    session.run("bash", "examples/cpp/onnxruntime_headers.sh", headers, external=True)
    # stock onnxruntime: its wheel ships libonnxruntime.so.1.* (the training build's does not)
    _install_core(session, "stock")
    session.install("pytest>=8", "scikit-learn")
    session.run(
        "python",
        "-m",
        "pytest",
        "-rs",
        *(session.posargs or ["tests/cpp"]),
        env={"ONNXRUNTIME_INCLUDE_DIR": headers},
    )


@nox.session(python=PRIMARY_PYTHON)
def lint(session: nox.Session) -> None:
    """Ruff: lint rules and formatting (`ruff check`, `ruff format --check`) on the whole tree."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PRIMARY_PYTHON)
def typecheck(session: nox.Session) -> None:
    """Mypy (strict) on the three distributions, with the settings of pyproject.toml."""
    session.install("mypy", "numpy", TORCH)
    _install_core(session)
    session.install("-e", "packages/ort-train-sklearn", "-e", "packages/ort-train-torch")
    session.run("mypy")


@nox.session(python=PRIMARY_PYTHON)
def demo(session: nox.Session) -> None:
    """Trains a linear model and an MLP on load_diabetes and writes the trained .onnx files."""
    _install_core(session)
    session.install("scikit-learn", "skl2onnx")
    session.run("python", "demo/run_demo.py", *(session.posargs or ["--out", "demo_output"]))


@nox.session(python=PRIMARY_PYTHON)
def docs(session: nox.Session) -> None:
    """Builds the Sphinx site in docs/_build/html, running every gallery example.

    Any warning fails the build."""
    # torch pinned (its CPU build), before the torch adapter asks for `torch>=2.1`
    session.install("torch==2.13.0")
    _install_core(session)
    session.install("-e", "packages/ort-train-sklearn", "-e", "packages/ort-train-torch")
    session.install(
        "sphinx>=7.2",
        "sphinx-gallery>=0.17",
        "myst-parser>=3",
        "pydata-sphinx-theme>=0.16",
        "numpydoc>=1.8",
        "matplotlib",
        "networkx",
        "scikit-learn",
        "skl2onnx",
    )
    session.run(
        "sphinx-build", "-E", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html", *session.posargs
    )


@nox.session(python=PRIMARY_PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks against numpy, torch and scikit-learn (CPU); `-- --quick` for a short run.

    The quick run takes under 5 minutes on 2 cores."""
    args = list(session.posargs)
    # torch first, pinned (on a GPU machine PyPI's torch==2.13.0 is a CUDA build)
    session.install("torch==2.13.0")
    _install_core(session)
    # transformers: the zoo table's BERT (bench_zoo.py skips it without)
    session.install("scikit-learn", "skl2onnx", "matplotlib", "psutil", "transformers")
    session.install("-e", "packages/ort-train-sklearn", "-e", "packages/ort-train-torch")
    # the target benchmarks of the training loops, OrtMLPRegressor, OnnxModule and the zoo
    # (issue 17); `-- --quick`, `-- --only bench_zoo`
    session.run("python", "benchmarks/run.py", *args)


@nox.session(python=PRIMARY_PYTHON)
def install_lines(session: nox.Session) -> None:
    """The install lines of README.md and the docs, run as copied in fresh venvs (about 2.5 min).

    tests/install (marked slow; in no suite's folder, so CI runs it once, here): from the root,
    each line's folders and extra; then the pages' Python blocks in the environment they made."""
    _install_core(session)  # tests/conftest.py imports ort_train_core; the lines install their own
    session.install("pytest>=8")
    session.run("python", "-m", "pytest", *(session.posargs or ["tests/install"]))


@nox.session(python=PRIMARY_PYTHON)
def build(session: nox.Session) -> None:
    """Builds wheel and sdist of every distribution and installs each wheel alone.

    Each wheel goes into a fresh venv and is imported there: what a user's pip gets."""
    session.install("build")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for package in PACKAGES:
        session.run(
            "python",
            "-m",
            "build",
            "--sdist",
            "--wheel",
            "--outdir",
            str(dist / package),
            f"packages/{package}",
        )
    tmp = pathlib.Path(session.create_tmp())
    for package in PACKAGES:
        wheel = next((dist / package).glob("*.whl"))
        module = package.replace("-", "_")
        venv = tmp / f"venv-{package}"
        shutil.rmtree(venv, ignore_errors=True)
        session.run(sys.executable, "-m", "venv", str(venv), external=True)
        bindir = venv / ("Scripts" if os.name == "nt" else "bin")
        py = str(bindir / "python")
        # without an extra, no runtime: the import must fail with the fix in its message
        # siblings are pinned to the same version: pip finds them among the wheels just built
        links = [arg for d in PACKAGES for arg in ("--find-links", str(dist / d))]
        # torch pinned (its CPU build), before anything that depends on torch
        pins = ["torch==2.13.0"] if package == "ort-train-torch" else []
        session.run(py, "-m", "pip", "install", "-q", *links, *pins, str(wheel), external=True)
        session.run(py, "-c", _EXPECT_RUNTIME_ERROR.format(module=module), external=True)
        session.run(py, "-m", "pip", "install", "-q", *links, *pins, f"{wheel}[cpu]", external=True)
        torch_check = "" if package == "ort-train-torch" else "; assert 'torch' not in sys.modules"
        session.run(
            py,
            "-c",
            f"import {module}, sys; print({module}.__version__){torch_check}",
            external=True,
        )


_EXPECT_RUNTIME_ERROR = """
try:
    import {module}
except ImportError as exc:
    assert type(exc).__name__ == 'TrainingRuntimeError', exc
    assert 'pip install' in str(exc), exc
    print('without a runtime:', type(exc).__name__)
else:
    raise SystemExit('import succeeded without onnxruntime-training')
"""
