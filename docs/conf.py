"""Sphinx configuration of the ort-train site (``nox -s docs`` builds it with ``-W``).

The benchmarks page shows chosen reports of ``benchmarks/results/``: at build time this file
copies their Markdown tables and PNG plots into ``_generated/benchmarks/``. Every name the three
packages export (``__all__``) must have its ``auto*`` directive in ``api.rst``: the build warns
(fails, under ``-W``) for each one missing.
"""

from __future__ import annotations

import importlib
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

from sphinx.util import logging as sphinx_logging

import ort_train_core

sys.path.insert(0, str(Path(__file__).resolve().parent))
import html_checks  # docs/html_checks.py, beside this file

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
    # the top bar shows index.rst's first six pages (the gallery and the API reference among
    # them), the others under "More"
    "header_links_before_dropdown": 6,
}
# every page is a top-level page of the top bar: a "Section Navigation" sidebar would be empty
# on all but the gallery's, where it lists the examples
# (pages by name: Sphinx warns when a page matches two patterns with wildcards)
html_sidebars: dict[str, list[str]] = {"**": []} | {
    f"auto_examples/{name}": ["sidebar-nav-bs"]
    for name in ["index", *(p.stem for p in sorted((HERE / "examples").glob("plot_*.py")))]
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
# benchmarks.md shows chosen reports of benchmarks/results/ (written by benchmarks/*.py as
# <host>-<date>[-<name>][-quick].md, their plots <report stem>[-<plot>].png linked by file name)
# and lists them all. At build time each report is copied into _generated/benchmarks/ without
# its title line (the page gives each its own heading), its plots beside it.
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def report_body(text: str, images: Path) -> tuple[str, str]:
    """A report's title (its first ``# `` line) and the rest, with each image link pointing at
    a file of ``images`` (a plot that is not there becomes a note: a missing image fails the
    build)."""
    lines = text.strip().splitlines()
    title = lines.pop(0)[2:].strip() if lines and lines[0].startswith("# ") else ""

    def keep_image(m: re.Match[str]) -> str:
        name = Path(m[2]).name
        return f"![{m[1]}]({name})" if (images / name).is_file() else f"*(plot {m[2]} not found)*"

    return title, _IMAGE.sub(keep_image, "\n".join(lines).strip())


def write_benchmark_pages(results: Path = RESULTS, generated: Path = GENERATED) -> Path:
    """Writes ``generated/benchmarks/<report>.md`` for each report of ``results`` (its plots
    copied beside it) and ``reports.md``, the list of every report, newest first; returns the
    folder."""
    target = generated / "benchmarks"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for png in sorted(results.glob("*.png")):
        shutil.copy2(png, target / png.name)
    listing = []
    for md in sorted(results.glob("*.md"), key=lambda p: (_DATE.findall(p.stem), p.stem), reverse=True):
        title, body = report_body(md.read_text(encoding="utf-8"), target)
        source = f"*File: `benchmarks/results/{md.name}`.*"
        (target / md.name).write_text(f"{body}\n\n{source}\n", encoding="utf-8")
        listing.append(f"- `{md.name}`: {title or md.stem}")
    text = "\n".join(listing) if listing else "No report yet: `nox -s bench` writes them."
    (target / "reports.md").write_text(text + "\n", encoding="utf-8")
    return target


write_benchmark_pages()


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


def _check_html(app: Any, exception: Exception | None) -> None:
    # the [docs] links of the highlighted sources and the API entries, checked in the built
    # pages (docs/html_checks.py says why a [docs] link needs fixing)
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    objects = app.env.domains["py"].objects
    # not the canonical aliases autodoc adds (ort_train_core._builder.NodeBuilder for
    # ort_train_core.extending.NodeBuilder): they name no entry of their own
    documented = ((name, entry.docname) for name, entry in objects.items() if not entry.aliased)
    html_checks.fix_viewcode_backlinks(outdir, documented)
    logger = sphinx_logging.getLogger(__name__)
    for link in html_checks.broken_backlinks(outdir):
        logger.warning(f"[docs] link to no documented object: {link}")
    for page in sorted({entry.docname for entry in objects.values()}):
        html = (outdir / f"{page}.html").read_text(encoding="utf-8")
        for entry in html_checks.empty_entries(html):
            logger.warning(f"{page}: the API entry {entry} is empty (give it a docstring)")


def setup(app: Any) -> None:
    app.connect("builder-inited", _check_api_reference)
    app.connect("build-finished", _check_html)
