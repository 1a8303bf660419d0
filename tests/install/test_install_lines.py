"""The install lines of README.md, the package READMEs and the docs work as copied on a fresh
machine, from a clone (issue 30, item 1): the distributions are not on PyPI, so each line names
the folders ``./packages/...`` (an adapter beside core, whose ``==0.1.0`` pin pip finds nowhere
else), run from the repository's root.

The lines are read from the pages by ``tests/doc_blocks.py`` (the blocks as displayed, not a
copy) and run with bash in fresh virtual environments, one per extra: ``[cpu]`` (the adapters and
torch, then the pages' own Python blocks and the ``python -c`` check) and ``[stock]`` (core on
stock onnxruntime, a fit checked against numpy). ``[gpu]`` and ``[cuda]`` are not run (see
:data:`NOT_RUN`); the PyTorch line is run with the CPU build the sessions pin (:data:`SUBSTITUTED`).
A line naming a distribution without its folder must say it waits for PyPI ("once published").

Marked ``slow`` (about 2 minutes, pip's downloads and builds): CI runs it once, in
``nox -s install_lines``; no test suite's folder holds it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from doc_blocks import ROOT, code_blocks, inline_commands, shell_kind, shell_lines

#: the pages whose install lines a reader copies (README.md, each distribution's, the docs)
PAGES = [
    "README.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("packages/*/README.md")),
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.rst")),
]
#: pages that mention a pip command in their prose only (the gallery's scripts)
PROSE_PAGES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "examples").glob("*.py"))
#: a line run in another form, and why
SUBSTITUTED = {
    "pip install torch --index-url https://download.pytorch.org/whl/cpu": (
        "pip install torch==2.13.0",
        "CI reaches the package registry, not PyTorch's own index: torch==2.13.0 is the CPU build "
        "the nox sessions pin (pip finds it there), the one that index gives",
    ),
}
#: the extras whose lines are not run, and why
NOT_RUN = {
    "gpu": "onnxruntime-gpu and NVIDIA's CUDA 13 wheels (GBs) need a GPU to be of use: the cuda-marked "
    "tests (nox -s tests, device=cuda) run where one exists",
    "cuda": "onnxruntime-training's CUDA build and the CUDA 11.8 wheels (GBs), Python <= 3.11, need a GPU: "
    "the cuda-marked tests run where one exists",
}
#: the environment each run extra's lines go to: one onnxruntime build per environment
RUN = ("cpu", "stock")
_EXTRA = re.compile(r"\[(\w+)\]")


def _command(line: str) -> str:
    """The command of a documented line, without its trailing comment."""
    return line.split(" #", 1)[0].strip()


def _block_commands() -> list[tuple[str, str]]:
    """``(page:line, command)`` of every install line in the pages' shell blocks, page order."""
    found = []
    for page in PAGES:
        for block in code_blocks(page):
            if block.language == "bash":
                found += [
                    (block.where, _command(c)) for c in shell_lines(block) if shell_kind(c) == "install"
                ]
    return found


def _from_clone(command: str) -> bool:
    """Whether every requirement of a pip line is a folder of the clone (or PyTorch's line)."""
    if command in SUBSTITUTED:
        return True
    requirements = [w for w in shlex.split(command)[2:] if not w.startswith("-")]
    return bool(requirements) and all(r.startswith("./packages/") for r in requirements)


def _extra(command: str) -> str:
    found = set(_EXTRA.findall(command))
    assert len(found) <= 1, f"{command}: one extra per environment"
    return found.pop() if found else "cpu"  # torch's line goes with the adapters' environment


def _paragraph(page: str, text: str) -> str:
    """The paragraph (between blank lines) of a page that holds ``text``."""
    for paragraph in re.split(r"\n\s*\n", (ROOT / page).read_text(encoding="utf-8")):
        if text in paragraph:
            return paragraph
    raise AssertionError(f"{text!r} not in {page}")


def test_every_install_line_installs_from_the_clone_or_waits_for_pypi() -> None:
    blocks = _block_commands()
    assert len({c for _, c in blocks}) >= 7, blocks  # core's four extras, the adapters, torch
    for where, command in blocks:
        assert _from_clone(command), f"{where}: {command!r} names a distribution that is not on PyPI"
        assert _extra(command) in (*RUN, *NOT_RUN), f"{where}: {command!r}"
    shown = {c for _, c in blocks}
    for page in PAGES + PROSE_PAGES:
        for literal in inline_commands(page):
            if _from_clone(literal):
                # the same line as a block's: run (or excluded) with it
                assert literal in shown, f"{page}: {literal!r} is in no install block"
            else:
                paragraph = _paragraph(page, literal)
                assert "once published" in paragraph.lower(), f"{page}: {literal!r} is not on PyPI"


def test_the_error_messages_install_what_the_extras_name() -> None:
    """The pip commands of the runtime's error messages (ort-train-core is installed, its
    runtime is missing) name the requirements of core's extras, which work from a clone."""
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    from ort_train_core import _runtime

    with open(ROOT / "packages" / "ort-train-core" / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]

    def named(fix: str) -> list[str]:
        assert fix.startswith("pip install ")
        return shlex.split(fix)[2:]

    cpu_training, cpu_stock = (r.split(";")[0].replace(" ", "") for r in extras["cpu"])
    assert named(_runtime.PIP_FIX_CPU) == [cpu_training]
    assert named(_runtime.PIP_FIX_STOCK) == [r.replace(" ", "") for r in extras["stock"]] == [cpu_stock]
    assert named(_runtime.PIP_FIX_GPU) == [r.replace(" ", "") for r in extras["gpu"]]
    assert named(_runtime.PIP_FIX_CUDA) == [r.replace(" ", "") for r in extras["cuda"]]


def _venv(folder: Path) -> dict[str, str]:
    """A fresh virtual environment; the variables of a shell that activated it."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    bindir = folder / ("Scripts" if os.name == "nt" else "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(VIRTUAL_ENV=str(folder), PATH=os.pathsep.join([str(bindir), env.get("PATH", "")]))
    return env


def _sh(command: str, env: dict[str, str]) -> str:
    """Runs a documented command with bash, from the repository's root, as a reader would."""
    proc = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _run_lines(extra: str, env: dict[str, str]) -> list[str]:
    """Runs, once each and in page order, the install lines that go to ``extra``'s environment."""
    ran: list[str] = []
    for _, command in _block_commands():
        if command in ran or _extra(command) != extra:
            continue
        _sh(SUBSTITUTED.get(command, (command,))[0], env)
        ran.append(command)
    return ran


#: what a fresh environment holds, read from pip's records (not from ort_train_core's)
_DISTRIBUTIONS = (
    "import importlib.metadata as m; print(sorted(d.metadata['Name'].lower() for d in m.distributions()))"
)


@pytest.mark.slow
def test_cpu_lines_in_a_fresh_venv(tmp_path: Path) -> None:
    env = _venv(tmp_path / "venv")
    ran = _run_lines("cpu", env)
    assert any("ort-train-sklearn" in c for c in ran), ran
    assert any("ort-train-torch" in c for c in ran), ran
    installed = _sh(f'python -c "{_DISTRIBUTIONS}"', env)
    runtimes = sorted(set(re.findall(r"'(onnxruntime[\w-]*)'", installed)))
    # the training build where it has a wheel, alone: plain onnxruntime beside it would replace it
    from ort_train_core._runtime import has_training_wheel

    assert runtimes == (["onnxruntime-training-cpu"] if has_training_wheel() else ["onnxruntime"])
    import ort_train_core

    checks = [line for page in PAGES for b in code_blocks(page) if b.language == "bash"
              for line in shell_lines(b) if shell_kind(line) == "check"]  # fmt: skip
    assert checks
    for line in checks:  # getting started's first check: the version and the providers
        printed = _sh(line, env)
        assert printed.split()[0] == ort_train_core.__version__, printed
        assert "CPUExecutionProvider" in printed
    # the distributions' pages' Python blocks (and the first model of getting started), with
    # their printed output, in this environment
    pages = [
        "packages/ort-train-core/README.md",
        "packages/ort-train-sklearn/README.md",
        "packages/ort-train-torch/README.md",
        "docs/getting_started.rst",
    ]
    print(_sh(shlex.join(["python", str(ROOT / "tests" / "doc_blocks.py"), *pages]), env))


_STOCK_FIT = """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.capi.build_and_package_info import package_name
    from ort_train_core import OrtGradientOptimizer, add_loss_output
    from ort_train_core._backends import default_backend_name

    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Z"]), helper.make_node("Add", ["Z", "b"], ["Y"])],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
        [numpy_helper.from_array(np.zeros((3, 1), np.float32), "W"),
         numpy_helper.from_array(np.zeros(1, np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    trainer = OrtGradientOptimizer(add_loss_output(model), max_iter=100, batch_size=16,
                                   learning_rate=0.05, random_state=0).fit(X, y)
    reference = np.linalg.lstsq(np.c_[X, np.ones(64)], y, rcond=None)[0]
    state = trainer.get_state()
    assert np.allclose(state["W"].ravel(), reference[:3], atol=1e-3), (state, reference)
    assert np.allclose(state["b"], reference[3], atol=1e-3), (state, reference)
    print(package_name, default_backend_name())
"""


@pytest.mark.slow
def test_stock_lines_in_a_fresh_venv(tmp_path: Path) -> None:
    env = _venv(tmp_path / "venv")
    assert _run_lines("stock", env)
    installed = _sh(f'python -c "{_DISTRIBUTIONS}"', env)
    assert sorted(set(re.findall(r"'(onnxruntime[\w-]*)'", installed))) == ["onnxruntime"]
    script = tmp_path / "fit.py"
    script.write_text(textwrap.dedent(_STOCK_FIT))
    assert _sh(shlex.join(["python", str(script)]), env).split() == ["onnxruntime", "onnx"]
