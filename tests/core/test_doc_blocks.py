"""Every code block of README.md, the package READMEs and the docs runs as copied (issue 30,
item 4), and shows what it prints.

Each page's Python blocks run in order in one namespace (a page is read top to bottom, a block
using what an earlier one made), in a fresh working folder (the files they write: ``block.onnx``,
``step.onnx``, ...). A block that prints must be followed by its ``Output:`` block, which the
test compares with what it printed (numbers to the precision shown, within 1%: the other backend
and onnxruntime build differ in the last bits). No other block is skipped silently: every shell
command is classified by :func:`doc_blocks.shell_kind` and :data:`SHELL_KINDS` says which test
runs that kind; a page whose blocks import what this environment lacks (torch off Python 3.11)
skips, naming the module.

The extractor is ``tests/doc_blocks.py``, shared with the install test
(``tests/install/test_install_lines.py``), which runs the install lines in a fresh venv.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

from doc_blocks import ROOT, Block, code_blocks, run_block, same_output, shell_kind, shell_lines

#: every page with code, and how many Python blocks it has (a block lost or added shows here)
PYTHON_BLOCKS = {
    "README.md": 0,
    "packages/ort-train-core/README.md": 2,
    "packages/ort-train-sklearn/README.md": 1,
    "packages/ort-train-torch/README.md": 1,
    "docs/api.rst": 0,
    "docs/autodiff.rst": 0,
    "docs/benchmarks.md": 0,
    "docs/derivative.rst": 1,
    "docs/exported_models.rst": 3,
    "docs/getting_started.rst": 1,
    "docs/index.rst": 1,
    "docs/migration_onnxcustom.rst": 6,
    "docs/outside_python.rst": 3,
    "docs/sklearn.rst": 2,
    "docs/torch.rst": 1,
    "docs/tutorial.rst": 5,
}
#: pages Sphinx or sphinx-gallery writes: nothing to copy from them
GENERATED = {"docs/sg_execution_times.rst"}
#: where each kind of shell command is run, instead of here
SHELL_KINDS = {
    "install": "tests/install/test_install_lines.py runs them in a fresh venv (nox -s install_lines)",
    "check": "tests/install/test_install_lines.py runs it after the install lines",
    "nox": "CI runs these sessions (.ci/run); tests/core/test_noxfile.py checks the noxfile",
    "cli": "tests/core/test_cli*.py run every subcommand and option shown",
    "build": "the C++ loop's build and run: tests/cpp (nox -s tests_cpp)",
    "bench": "benchmark scripts (minutes each): nox -s bench runs them, CI does not",
}
#: other block languages that hold no code to run
OTHER_LANGUAGES = {
    "text": "what the Python block before it prints (compared there)",
    "{include}": "a MyST include of generated benchmark tables",
}
#: modules a page may import that not every test environment has (its test skips without)
OPTIONAL_MODULES = {"torch", "sklearn", "skl2onnx", "ort_train_sklearn", "ort_train_torch"}
#: a warning a block gives fails its page when our code raises it, or when it points at the block
#: and is not a library's deprecation notice (those come and go with the installed versions:
#: torch's for its TorchScript exporter, which exported_models.rst recommends as it keeps the
#: parameters); third-party code's own warnings are the installed libraries' business
_DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def _allowed(w: warnings.WarningMessage, block: Block) -> bool:
    if "ort_train_" in Path(w.filename).as_posix():
        return False
    return not (w.filename == block.where and not issubclass(w.category, _DEPRECATIONS))


def _pages() -> list[str]:
    found = ["README.md", *(p.relative_to(ROOT).as_posix() for p in ROOT.glob("packages/*/README.md"))]
    found += [p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.rst")]
    found += [p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")]
    return sorted(set(found) - GENERATED)


def test_every_page_is_listed() -> None:
    assert sorted(PYTHON_BLOCKS) == _pages()


def test_same_output_reads_numbers_to_their_precision() -> None:
    assert same_output("0.4851 [-0.01  0.2]\n", "0.485 [-0.01 0.2]")
    assert same_output("-2.96e-05\n", "-3.0e-05")
    assert not same_output("0.495\n", "0.485")
    assert not same_output("['X', 'W']\n", "['X', 'W', 'Y_grad']")
    assert not same_output("", "0.485")


def _imported(blocks: list[Block]) -> set[str]:
    names = set()
    for block in blocks:
        for node in ast.walk(ast.parse(block.code)):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def _run(block: Block, namespace: dict[str, object]) -> tuple[str, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # as a reader's python shows them, not pytest's errors
        printed = run_block(block, namespace)
    return printed, caught


@pytest.mark.parametrize("page", [page for page, n in PYTHON_BLOCKS.items() if n])
def test_python_blocks_run_as_copied(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [b for b in code_blocks(page) if b.language == "python"]
    assert len(blocks) == PYTHON_BLOCKS[page]
    for module in sorted(_imported(blocks) & OPTIONAL_MODULES):
        pytest.importorskip(module, reason=f"{page} imports {module}, not installed here")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in blocks:
        printed, caught = _run(block, namespace)
        unexpected = [
            f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
            for w in caught
            if not _allowed(w, block)
        ]
        assert not unexpected, f"{block.where} warns: {unexpected}"
        if block.output is None:
            assert not printed, f"{block.where} prints but shows no Output block:\n{printed}"
        else:
            assert same_output(printed, block.output), (
                f"{block.where} printed\n{printed}\nbut its Output block shows\n{block.output}"
            )


@pytest.mark.parametrize("page", sorted(PYTHON_BLOCKS))
def test_every_other_block_is_run_elsewhere(page: str) -> None:
    """Each non-Python block is a shell command of a known kind (run by the test SHELL_KINDS
    names), an Output block, or a language listed in OTHER_LANGUAGES."""
    blocks = code_blocks(page)
    outputs = {b.output for b in blocks if b.output is not None}
    for block in blocks:
        if block.language in ("bash", "sh", "console", "shell"):
            kinds = {line: shell_kind(line) for line in shell_lines(block)}
            unknown = [line for line, kind in kinds.items() if kind not in SHELL_KINDS]
            assert not unknown, f"{block.where}: commands no test runs: {unknown}"
        elif block.language == "text":
            assert block.code in outputs, f"{block.where}: a text block that follows no Python block"
        elif block.language != "python":
            assert block.language in OTHER_LANGUAGES, f"{block.where}: a {block.language!r} block"
