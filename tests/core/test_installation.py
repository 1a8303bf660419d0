"""Installation that just works (issue 27, item 3): which onnxruntime each extra installs where,
what a missing training build says, and two onnxruntime builds in one environment.

The extras' markers are checked against the wheels onnxruntime-training-cpu 1.19.2 has on the
registry (listed below, as ``pip download --only-binary :all:`` found them), not against the
code that mirrors them.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from ort_train_core import TrainingRuntimeError, _backends, _runtime

packaging_requirements = pytest.importorskip("packaging.requirements")
packaging_specifiers = pytest.importorskip("packaging.specifiers")
tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = pathlib.Path(__file__).resolve().parents[2]
ADAPTERS = ("ort-train-sklearn", "ort-train-torch")
#: (Python, sys.platform, platform.machine()) with a wheel of onnxruntime-training-cpu 1.19.2
#: (cp310-cp312: manylinux x86_64, macosx_11_0_universal2, win_amd64; none for aarch64 or 3.13+)
TRAINING_WHEELS = {
    (python, system, machine)
    for python in ("3.10", "3.11", "3.12")
    for system, machine in (
        ("linux", "x86_64"),
        ("darwin", "arm64"),
        ("darwin", "x86_64"),
        ("win32", "AMD64"),
    )
}
PLATFORMS = [
    ("linux", "x86_64"),
    ("linux", "aarch64"),
    ("darwin", "arm64"),
    ("darwin", "x86_64"),
    ("win32", "AMD64"),
    ("win32", "ARM64"),
]


def _project(package: str) -> dict:
    with open(ROOT / "packages" / package / "pyproject.toml", "rb") as f:
        project: dict = tomllib.load(f)["project"]
    return project


def _extra(package: str, extra: str) -> list:
    return [packaging_requirements.Requirement(r) for r in _project(package)["optional-dependencies"][extra]]


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12", "3.13", "3.14"])
@pytest.mark.parametrize(("system", "machine"), PLATFORMS)
def test_cpu_extra_takes_the_training_build_only_where_it_has_a_wheel(python, system, machine):
    env = {
        "python_version": python,
        "sys_platform": system,
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
    }
    chosen = [r.name for r in _extra("ort-train-core", "cpu") if r.marker is None or r.marker.evaluate(env)]
    has_wheel = (python, system, machine) in TRAINING_WHEELS
    assert chosen == (["onnxruntime-training-cpu"] if has_wheel else ["onnxruntime"])
    # the runtime's own reading (what its error messages say) agrees with the marker
    major, minor = python.split(".")
    assert _runtime.has_training_wheel((int(major), int(minor)), system, machine) is has_wheel


def test_stock_and_gpu_extras_take_stock_onnxruntime_everywhere():
    for extra, name in (("stock", "onnxruntime"), ("gpu", "onnxruntime-gpu")):
        (req,) = _extra("ort-train-core", extra)
        assert (req.name, req.marker) == (name, None)
        assert req.specifier.contains("1.32.0")
        assert not req.specifier.contains("1.19.2")  # the floor: the first release after the training build


@pytest.mark.parametrize("package", ["ort-train-core", *ADAPTERS])
def test_every_distribution_installs_on_python_3_13_and_3_14(package):
    spec = packaging_specifiers.SpecifierSet(_project(package)["requires-python"])
    assert all(spec.contains(v) for v in ("3.10.0", "3.12.9", "3.13.0", "3.14.0"))
    assert "Programming Language :: Python :: 3.14" in _project(package)["classifiers"]


@pytest.mark.parametrize("package", ADAPTERS)
def test_the_adapters_extras_are_core_s(package):
    extras = _project(package)["optional-dependencies"]
    assert set(extras) == set(_project("ort-train-core")["optional-dependencies"])
    for extra in extras:
        (req,) = _extra(package, extra)
        assert (req.name, req.extras) == ("ort-train-core", {extra})


# ---- the training backend without the training build ----------------------------------------


def test_the_training_backend_on_stock_onnxruntime_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(_runtime, "is_training_build", lambda capi: False)
    monkeypatch.setattr(_runtime, "has_training_wheel", lambda: True)
    monkeypatch.setattr(_runtime, "installed_onnxruntime_distributions", lambda: {"onnxruntime": "1.32.0"})
    with pytest.raises(TrainingRuntimeError) as info:
        _backends.get_backend("onnxruntime-training")
    assert str(info.value) == (
        "backend 'onnxruntime-training' needs the training build of onnxruntime (onnxruntime-training-cpu "
        f"or onnxruntime-training 1.19.2), but the loaded onnxruntime is {_runtime.loaded_build()}: "
        "backend='onnx' trains with it. To install it: pip uninstall -y onnxruntime && "
        "pip install onnxruntime-training-cpu==1.19.2"
    )
    assert _backends.get_backend("onnx").name == "onnx"  # the other backend still comes


def test_the_training_backend_where_it_has_no_wheel_says_so(monkeypatch):
    monkeypatch.setattr(_runtime, "is_training_build", lambda capi: False)
    monkeypatch.setattr(_runtime, "has_training_wheel", lambda: False)
    monkeypatch.setenv("ORT_TRAIN_BACKEND", "onnxruntime-training")  # the default named by the variable
    with pytest.raises(TrainingRuntimeError) as info:
        _backends.get_backend()
    here = f"Python {sys.version_info[0]}.{sys.version_info[1]}"
    assert f"onnxruntime-training has no wheel for {here} on {sys.platform}" in str(info.value)
    assert "its last release (1.19.2) has them for CPython 3.10-3.12" in str(info.value)
    assert "backend='onnx' trains with it" in str(info.value)
    assert "pip install" not in str(info.value)


# ---- two builds in one environment ----------------------------------------------------------


_IMPORT_AND_RECORD = """
    import json, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import ort_train_core
    print(json.dumps([[w.category.__name__, str(w.message)] for w in caught]))
"""


def _import_with(tmp_path: pathlib.Path, *fakes: tuple[str, str]) -> list:
    """Imports ort_train_core in a fresh interpreter beside fake distributions (their metadata
    only, the way pip records them) and returns the warnings it gave."""
    for name, version in fakes:
        info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_IMPORT_AND_RECORD)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    caught: list = json.loads(proc.stdout.strip().splitlines()[-1])
    return caught


def test_one_build_imports_without_a_warning(tmp_path):
    assert _import_with(tmp_path) == []


def test_two_builds_in_one_environment_warn_with_the_fix(tmp_path):
    installed = _runtime.installed_onnxruntime_distributions()
    caught = _import_with(tmp_path, ("onnxruntime-gpu", "1.31.1"))
    assert [category for category, _ in caught] == ["RuntimeWarning"]
    message = caught[0][1]
    both = {**installed, "onnxruntime-gpu": "1.31.1"}
    assert message.startswith(", ".join(f"{k}=={v}" for k, v in both.items()) + " are installed together")
    assert "installs the same folder 'onnxruntime/', so they overwrote each other's files" in message
    assert f"the loaded one says it is {_runtime.loaded_build()}" in message
    uninstall = "pip uninstall -y " + " ".join(both)
    cpu = "onnxruntime-training-cpu==1.19.2" if _runtime.has_training_wheel() else '"onnxruntime>=1.20"'
    assert f"{uninstall} && pip install {cpu}" in message
    assert f'{uninstall} && pip install "onnxruntime-gpu[cuda,cudnn]>=1.20"' in message
