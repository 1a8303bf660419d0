"""The documentation's layout (issue 30, item 5): every code line of the pages and of the gallery
scripts fits the column of the site's theme, so that no reader scrolls sideways; and the checks
of the built pages that ``docs/conf.py`` runs at the end of a build (``docs/html_checks.py``:
no empty API entry, no ``[docs]`` link to nowhere) find what they are meant to find.

pydata-sphinx-theme's article column shows about 90 characters of code on a desktop screen;
``MAX_CODE_WIDTH`` keeps two in reserve. Prose is wrapped by the browser and is not checked.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
MAX_CODE_WIDTH = 88

# a directive whose body is code shown as written
_CODE_DIRECTIVE = re.compile(r"^(\s*)\.\. (code-block|code|sourcecode|highlight|doctest|testcode)::")
# sphinx-gallery starts a text block at "# %%" or a line of 20 or more '#'
_GALLERY_TEXT = re.compile(r"^(# %%|#{20,})")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def rst_code_lines(text: str) -> list[tuple[int, str]]:
    """The lines (1-based number, text as shown) of an reStructuredText file's code and literal
    blocks: the body of a code directive, or the indented block after a paragraph ending in
    ``::``, without the indentation that the block's lines share (the page does not show it)."""
    lines = text.splitlines()
    found: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _CODE_DIRECTIVE.match(line)
        literal = line.rstrip().endswith("::") and not line.lstrip().startswith("..")
        if not (directive or literal):
            i += 1
            continue
        base = _indent(line)
        i += 1
        # the directive's options (":caption: ...") belong to the directive, not to the code
        while directive and i < len(lines) and lines[i].strip().startswith(":"):
            i += 1
        block = []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
            if lines[i].strip():
                block.append((i + 1, lines[i].rstrip()))
            i += 1
        shared = min((_indent(line) for _, line in block), default=0)
        found += [(number, line[shared:]) for number, line in block]
    return found


def markdown_code_lines(text: str) -> list[tuple[int, str]]:
    """The lines of a Markdown file's fenced code blocks (MyST directives in braces excluded)."""
    found: list[tuple[int, str]] = []
    fenced: str | None = None  # None outside a fence, else "code" or "directive"
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if fenced is None:
                fenced = "directive" if line.lstrip()[3:].startswith("{") else "code"
            else:
                fenced = None
        elif fenced == "code":
            found.append((number, line.rstrip()))
    return found


def gallery_code_lines(text: str) -> list[tuple[int, str]]:
    """The lines of a sphinx-gallery script that the page shows as code: neither the module
    docstring nor the comment blocks that start at ``# %%`` (those are rendered as prose)."""
    lines = text.splitlines()
    i = 0
    docstring = re.match(r'\s*(?:r?"""|r?\'\'\')', text)
    if docstring:
        quote = text[docstring.end() - 3 : docstring.end()]
        end = text.index(quote, docstring.end())
        i = text[:end].count("\n") + 1
    found: list[tuple[int, str]] = []
    while i < len(lines):
        if _GALLERY_TEXT.match(lines[i]):
            i += 1
            while i < len(lines) and lines[i].startswith("#"):
                i += 1
            continue
        found.append((i + 1, lines[i].rstrip()))
        i += 1
    return found


def _too_wide(path: Path, code: list[tuple[int, str]]) -> list[str]:
    rel = path.relative_to(ROOT)
    return [f"{rel}:{n}: {len(line)} characters" for n, line in code if len(line) > MAX_CODE_WIDTH]


def _pages() -> list[Path]:
    return sorted([*DOCS.glob("*.rst"), *DOCS.glob("*.md"), *(DOCS / "examples").glob("*.py")])


def test_the_scanners_find_code_and_skip_prose() -> None:
    rst = "Text::\n\n   literal\n\n.. code-block:: python\n   :caption: c\n\n   x = 1\n\nprose\n"
    assert rst_code_lines(rst) == [(3, "literal"), (8, "x = 1")]
    md = "a\n```bash\nls\n```\n```{include} x.md\n:heading-offset: 1\n```\n"
    assert markdown_code_lines(md) == [(3, "ls")]
    script = '"""Title\n\nText.\n"""\n\nimport x\n\n# %%\n# prose\n# more\n\ny = 1  # a comment\n'
    assert [line for _, line in gallery_code_lines(script) if line] == ["import x", "y = 1  # a comment"]


def _included_files() -> list[Path]:
    """The files that the pages show whole with ``literalinclude`` (the JavaScript and C++
    loops of outside_python.rst)."""
    found = set()
    for page in DOCS.glob("*.rst"):
        for m in re.finditer(r"^\s*\.\. literalinclude:: (\S+)", page.read_text(encoding="utf-8"), re.M):
            found.add((DOCS / m[1]).resolve())
    return sorted(found)


@pytest.mark.parametrize("path", _included_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_included_files_fit_the_column(path: Path) -> None:
    lines = list(enumerate(path.read_text(encoding="utf-8").splitlines(), 1))
    wide = _too_wide(path, lines)
    assert not wide, f"lines wider than {MAX_CODE_WIDTH} characters (wrap them):\n" + "\n".join(wide)


@pytest.mark.parametrize("path", _pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_code_lines_fit_the_column(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".rst":
        code = rst_code_lines(text)
    elif path.suffix == ".md":
        code = markdown_code_lines(text)
    else:
        code = gallery_code_lines(text)
    wide = _too_wide(path, code)
    assert not wide, f"code lines wider than {MAX_CODE_WIDTH} characters (wrap them):\n" + "\n".join(wide)


def _html_checks() -> Any:  # docs/ is no package: load the module from its file
    spec = importlib.util.spec_from_file_location("html_checks", DOCS / "html_checks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_API = """<dl class="py class"><dt class="sig sig-object py" id="pkg.Options">Options</dt>
<dd><p>How it works.</p>
<dl class="py attribute"><dt class="sig sig-object py" id="pkg.Options.Zero">Zero = 0</dt>
<dd></dd></dl>
<dl class="py attribute"><dt class="sig sig-object py" id="pkg.Options.Loss">Loss = 5</dt>
<dd><p>The loss.</p></dd></dl>
</dd></dl>
<dl class="py function"><dt class="sig sig-object py" id="pkg.graph.prune">prune()</dt>
<dd>
</dd></dl>"""


def test_empty_entries_are_the_entries_without_text() -> None:
    # the class has text of its own; a member with an empty box is found even inside it
    assert _html_checks().empty_entries(_API) == ["pkg.Options.Zero", "pkg.graph.prune"]


def test_backlinks_to_a_missing_anchor_are_found_and_repointed(tmp_path: Path) -> None:
    checks = _html_checks()
    (tmp_path / "api.html").write_text(_API, encoding="utf-8")
    source = tmp_path / "_modules" / "pkg" / "graph.html"
    source.parent.mkdir(parents=True)
    # what Sphinx 9's viewcode writes when graph.py's objects are documented under two paths
    source.write_text(
        '<div class="viewcode-block" id="prune">\n'
        '<a class="viewcode-back" href="../../api.html#pkg.prune">[docs]</a>\n'
        '<div class="viewcode-block" id="Options">\n'
        '<a class="viewcode-back" href="../../api.html#pkg.Options">[docs]</a>\n',
        encoding="utf-8",
    )
    assert checks.broken_backlinks(tmp_path) == ["_modules/pkg/graph.html: ../../api.html#pkg.prune"]
    documented = [("pkg.Options", "api"), ("pkg.graph.prune", "api")]
    assert checks.fix_viewcode_backlinks(tmp_path, documented) == 1
    assert checks.broken_backlinks(tmp_path) == []
    assert 'href="../../api.html#pkg.graph.prune"' in source.read_text(encoding="utf-8")
