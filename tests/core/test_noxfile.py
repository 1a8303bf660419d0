"""The noxfile finds pyenv's interpreters by itself and describes every session (issue 30 item 2)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import types

import pytest

nox = pytest.importorskip("nox")

NOXFILE = pathlib.Path(__file__).resolve().parents[2] / "noxfile.py"


@pytest.fixture(scope="module")
def noxfile() -> types.ModuleType:
    # imported with an empty pyenv root and PATH restored after: the import appends pyenv's
    # folders to PATH, which this test process must not keep
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYENV_ROOT", os.devnull)
        patch.setenv("PATH", os.environ.get("PATH", ""))
        spec = importlib.util.spec_from_file_location("_noxfile_under_test", NOXFILE)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def _install(root: pathlib.Path, name: str, exe: str | None) -> pathlib.Path:
    bin_dir = root / "versions" / name / "bin"
    bin_dir.mkdir(parents=True)
    if exe is not None:
        (bin_dir / exe).write_text("")
    return bin_dir


def test_newest_pyenv_install_of_each_wanted_version_is_appended(
    noxfile: types.ModuleType, tmp_path: pathlib.Path
) -> None:
    _install(tmp_path, "3.10.2", "python3.10")
    newest_310 = _install(tmp_path, "3.10.13", "python3.10")  # 13 > 2: numeric, not string order
    _install(tmp_path, "3.12.4", None)  # partial install: no python3.12
    only_312 = _install(tmp_path, "3.12.1", "python3.12")
    _install(tmp_path, "3.13.0t", "python3.13t")  # free-threaded: another interpreter
    _install(tmp_path, "3.13-dev", "python3.13")
    _install(tmp_path, "myproject", "python3.13")  # a pyenv-virtualenv
    _install(tmp_path, "3.9.18", "python3.9")  # not wanted
    wanted = ["3.10", "3.11", "3.12", "3.13"]

    assert noxfile.pyenv_bin_dirs(tmp_path, wanted) == {"3.10": newest_310, "3.12": only_312}
    # the user's PATH first and unchanged (an interpreter on it keeps precedence), no duplicate
    path = os.pathsep.join(["/venv/bin", str(only_312), "/usr/bin"])
    assert noxfile.path_with_pyenv(path, tmp_path, wanted) == os.pathsep.join(
        ["/venv/bin", str(only_312), "/usr/bin", str(newest_310)]
    )


def test_without_pyenv_path_is_unchanged(noxfile: types.ModuleType, tmp_path: pathlib.Path) -> None:
    assert noxfile.pyenv_bin_dirs(tmp_path / "absent", ["3.12"]) == {}
    assert noxfile.path_with_pyenv("/a:/b", tmp_path / "absent", ["3.12"]) == "/a:/b"


def test_every_session_interpreter_is_searched(noxfile: types.ModuleType) -> None:
    # tests on 3.10-3.12, tests_onnx on 3.11 and 3.13 (stock onnxruntime)
    assert noxfile.WANTED_PYTHONS == ["3.10", "3.11", "3.12", "3.13"]


def test_every_session_has_a_one_line_description(noxfile: types.ModuleType) -> None:
    # `nox -l` shows a docstring's first line: it must be there and be a whole sentence
    sessions = {name: func for name, func in vars(noxfile).items() if isinstance(func, nox._decorators.Func)}
    assert {"tests", "tests_onnx", "lint", "typecheck", "build", "docs"} <= set(sessions)
    for name, func in sessions.items():
        first = (func.__doc__ or "").strip().splitlines()[0] if func.__doc__ else ""
        assert first.endswith("."), f"session {name!r}: first docstring line {first!r}"
