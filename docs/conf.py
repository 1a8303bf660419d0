"""Sphinx configuration of the ort-train site (``nox -s docs`` builds it with ``-W``).

The benchmarks page shows the newest reports of ``benchmarks/results/``: at build time this file
copies their Markdown tables and PNG plots into ``_generated/benchmarks/``. Every name the three
packages export (``__all__``) must have its ``auto*`` directive in ``api.rst``: the build warns
(fails, under ``-W``) for each one missing.
"""

from __future__ import annotations

import importlib
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sphinx.util import logging as sphinx_logging

import ort_train_core

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "benchmarks" / "results"
GENERATED = HERE / "_generated"

project = "ort-train"
author = "ort-train developers"
copyright = "ort-train developers"
release = ort_train_core.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# the generated benchmark page is pulled into benchmarks.md, not a page of its own;
# sphinx-gallery reads examples/ itself and writes the pages of auto_examples/
exclude_patterns = ["_build", "_generated", "examples"]

html_theme = "pydata_sphinx_theme"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_title = f"ort-train {release}"

# ---- autodoc ---------------------------------------------------------------------------------
autodoc_member_order = "bysource"
# the numpydoc sections name each parameter's type: the signature keeps the defaults only
autodoc_typehints = "none"
autodoc_class_signature = "mixed"
autodoc_inherit_docstrings = False

# ---- numpydoc --------------------------------------------------------------------------------
# api.rst lists the members it documents: no autosummary table of every attribute and method
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# ---- MyST ------------------------------------------------------------------------------------
myst_heading_anchors = 3
# the benchmark reports are written by benchmarks/*.py, not for this site: a skipped heading
# level in one of them must not fail the build
suppress_warnings = ["myst.header"]

# ---- sphinx-gallery ----------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": ["examples"],
    "gallery_dirs": ["auto_examples"],
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "matplotlib_animations": False,
    "image_scrapers": ("matplotlib",),
    # one failing example fails the build
    "only_warn_on_example_error": False,
    # every build runs every example: a change in the packages must not hide behind the
    # outputs of an earlier build
    "run_stale_examples": True,
    "show_memory": False,
    "min_reported_time": 1,
}

# skl2onnx and onnxconverter-common warn on import with current numpy/scikit-learn (not ours)
warnings.filterwarnings("ignore", category=DeprecationWarning, module="skl2onnx")
warnings.filterwarnings("ignore", category=DeprecationWarning, module="onnxconverter_common")


# ---- the benchmarks page ---------------------------------------------------------------------
# Report names (benchmarks/_common.py): <host>-<date>[-<name>][-quick].{json,md}; a report's
# plots are <report stem>[-<plot>].png and its Markdown links them by file name.
_REPORT = re.compile(r"^(?P<host>.+?)-(?P<date>\d{4}-\d{2}-\d{2})(?P<name>(?:-.+)?)$")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


@dataclass
class Report:
    stem: str
    series: str  # host and name, without the date and "-quick"
    date: str  # ISO: sorts as text
    quick: bool
    markdown: Path | None = None
    plots: list[Path] = field(default_factory=list)


def _report(stem: str) -> Report:
    m = _REPORT.match(stem)
    if m is None:
        return Report(stem, stem, "", False)
    name = m["name"]
    quick = name.endswith("-quick")
    return Report(stem, m["host"] + name.removesuffix("-quick"), m["date"], quick)


def newest_reports(folder: Path) -> list[Report]:
    """Per series, the newest full run (a quick run only where the series has no full run),
    with its Markdown and its plots; sorted by series."""
    reports = {md.stem: _report(md.stem) for md in sorted(folder.glob("*.md"))} if folder.is_dir() else {}
    for report in reports.values():
        report.markdown = folder / f"{report.stem}.md"
    for png in sorted(folder.glob("*.png")) if folder.is_dir() else []:
        owners = [s for s in reports if png.stem == s or png.stem.startswith(s + "-")]
        if owners:
            reports[max(owners, key=len)].plots.append(png)
        else:  # a plot without a report: a series of its own
            reports[png.stem] = _report(png.stem)
            reports[png.stem].plots.append(png)
    best: dict[str, Report] = {}
    for report in reports.values():
        current = best.get(report.series)
        if current is None or (not report.quick, report.date) > (not current.quick, current.date):
            best[report.series] = report
    return [best[k] for k in sorted(best)]


def write_benchmark_page(results: Path = RESULTS, generated: Path = GENERATED) -> Path:
    """Copies the newest reports' plots into ``generated/benchmarks/`` and writes their Markdown,
    one after the other, to ``generated/benchmarks/reports.md``, which ``benchmarks.md`` includes
    (images relative to it, one heading level down)."""
    target = generated / "benchmarks"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    parts = []
    for report in newest_reports(results):
        for png in report.plots:
            shutil.copy2(png, target / png.name)
        text = report.markdown.read_text(encoding="utf-8") if report.markdown else f"# {report.series}\n"
        linked = {Path(link).name for _, link in _IMAGE.findall(text)}

        def keep_image(m: re.Match[str]) -> str:
            # a plot the report links but that is not there would fail the build
            if (target / Path(m[2]).name).is_file():
                return f"![{m[1]}]({Path(m[2]).name})"
            return f"*(plot {m[2]} not found)*"

        text = _IMAGE.sub(keep_image, text)
        extra = [f"![{png.stem}]({png.name})" for png in report.plots if png.name not in linked]
        files = [p.name for p in ([report.markdown] if report.markdown else []) + report.plots]
        source = f"*Files: {', '.join(f'`{name}`' for name in files)} in `benchmarks/results/`.*"
        parts.append("\n\n".join([text.rstrip(), *extra, source]) + "\n")
    if not parts:
        parts.append("No report in `benchmarks/results/` yet: `nox -s bench` writes them.\n")
    page = target / "reports.md"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page


write_benchmark_page()


# ---- every public name in the API reference --------------------------------------------------
PACKAGES = ("ort_train_core", "ort_train_sklearn", "ort_train_torch")


def undocumented_names(api_text: str) -> list[str]:
    """The names of the packages' ``__all__`` that no ``auto*`` directive of ``api_text`` names."""
    missing = []
    for package in PACKAGES:
        for name in importlib.import_module(package).__all__:
            directive = re.compile(rf"^\.\. auto\w+:: {package}\.{name}\s*$", re.MULTILINE)
            if not name.startswith("_") and not directive.search(api_text):
                missing.append(f"{package}.{name}")
    return missing


def _check_api_reference(app: Any) -> None:
    # a warning fails the -W build: a name exported without its documentation is a bug
    logger = sphinx_logging.getLogger(__name__)
    for name in undocumented_names((HERE / "api.rst").read_text(encoding="utf-8")):
        logger.warning(f"{name} is exported (__all__) but docs/api.rst does not document it")


def setup(app: Any) -> None:
    app.connect("builder-inited", _check_api_reference)
