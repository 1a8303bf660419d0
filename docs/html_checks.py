"""Checks of the built HTML that ``conf.py`` runs when a build ends (a finding is a warning, so
``-W`` fails the build); ``tests/core/test_docs_layout.py`` tests them on small pages.

* every API entry (autodoc's ``<dt>``/``<dd>`` pair) says something: an entry without a docstring
  renders as a name over an empty box;
* every ``[docs]`` link of a highlighted source page (``sphinx.ext.viewcode``) lands on an entry.
  Sphinx 9's viewcode makes every back link of a source module with the module path under which
  the first of its objects was documented: a module whose functions are documented under two
  paths (``ort_train_core.add_loss_output`` and ``ort_train_core.graph.normalise_model``, both in
  ``graph.py``) gets links to ``api.html#ort_train_core.normalise_model``, an anchor that does not
  exist. :func:`fix_viewcode_backlinks` points each one at the entry of the same object.

No Sphinx import: the functions read and write files only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path

# a back link: the viewcode block's id (the object's name in its module), then its [docs] link
_BACKLINK = re.compile(
    r'(<div class="viewcode-block" id="(?P<name>[^"]+)">\s*<a class="viewcode-back" href=")'
    r'(?P<page>[^"#]*)#(?P<anchor>[^"]+)(")'
)


class _EntryParser(HTMLParser):
    """Collects, for each autodoc entry (``<dt id=...>`` followed by ``<dd>``), how many
    characters of text its ``<dd>`` holds (nested entries included)."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: dict[str, int] = {}
        self._last_dt: str | None = None
        self._in_dt = False
        # one item per open <dd>: the entry's id (None for a <dd> of another kind), its depth
        self._open: list[tuple[str | None, int]] = []
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "dt":
            classes = (values.get("class") or "").split()
            self._last_dt = values.get("id") if "sig-object" in classes else None
            self._in_dt = True
        elif tag == "dd":
            self._depth += 1
            self._open.append((self._last_dt, self._depth))
            if self._last_dt is not None:
                self.sizes.setdefault(self._last_dt, 0)
            self._last_dt = None

    def handle_endtag(self, tag: str) -> None:
        if tag == "dt":
            self._in_dt = False
        elif tag == "dd" and self._open:
            self._open.pop()
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._in_dt:
            return
        for entry, _ in self._open:
            if entry is not None:
                self.sizes[entry] += len(data.strip())


def empty_entries(html: str) -> list[str]:
    """The ids of the API entries of ``html`` whose description is empty."""
    parser = _EntryParser()
    parser.feed(html)
    return [entry for entry, size in parser.sizes.items() if size == 0]


def page_ids(html: str) -> set[str]:
    """Every ``id`` of an HTML page."""
    return set(re.findall(r'\bid="([^"]+)"', html))


def broken_backlinks(outdir: Path) -> list[str]:
    """``<source page>: <link>`` for each ``[docs]`` link of ``outdir/_modules`` whose page or
    anchor is missing."""
    broken, ids = [], {}
    for page in sorted((outdir / "_modules").rglob("*.html")):
        for m in _BACKLINK.finditer(page.read_text(encoding="utf-8")):
            target = (page.parent / m["page"]).resolve()
            if target not in ids:
                ids[target] = page_ids(target.read_text(encoding="utf-8")) if target.is_file() else set()
            if m["anchor"] not in ids[target]:
                broken.append(f"{page.relative_to(outdir)}: {m['page']}#{m['anchor']}")
    return broken


def fix_viewcode_backlinks(outdir: Path, documented: Iterable[tuple[str, str]]) -> int:
    """Points each ``[docs]`` link of ``outdir/_modules`` whose anchor is not a documented
    object at the documented object of the same name, when exactly one is (an object's full
    name ends with ``.<its name in the module>``). ``documented`` yields (full name, page
    name without suffix). Returns how many links changed."""
    by_suffix: dict[str, list[tuple[str, str]]] = {}
    known: set[str] = set()
    for fullname, docname in documented:
        known.add(fullname)
        parts = fullname.split(".")
        for i in range(1, len(parts)):
            by_suffix.setdefault(".".join(parts[i:]), []).append((fullname, docname))
    changed = 0
    for page in (outdir / "_modules").rglob("*.html"):
        up = "../" * (len(page.relative_to(outdir).parts) - 1)
        text = page.read_text(encoding="utf-8")
        new = _BACKLINK.sub(lambda m, up=up: _relink(m, up, by_suffix, known), text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed += sum(a != b for a, b in zip(_BACKLINK.findall(text), _BACKLINK.findall(new)))
    return changed


def _relink(m: re.Match[str], up: str, by_suffix: dict[str, list[tuple[str, str]]], known: set[str]) -> str:
    candidates = by_suffix.get(m["name"], [])
    if m["anchor"] in known or len(candidates) != 1:
        return m[0]
    fullname, docname = candidates[0]
    return f"{m[1]}{up}{docname}.html#{fullname}{m[5]}"
