"""The code blocks of README.md, the package READMEs and docs/*.rst as a reader sees them: one
extractor for every test that runs documented code (the pages' Python blocks, the migration
guide's, the install lines).

A module of its own (not conftest.py), imported by name like ``step_support``; it needs only the
standard library, so the install test can use it in a session without the packages.

Conventions the pages follow, and this module reads:

- reStructuredText: ``.. code-block:: LANGUAGE``, its options (``:caption:`` ...), a blank line,
  then the body indented by three spaces (tabs are not used). Markdown: fenced blocks
  ```` ```LANGUAGE ```` ... ```` ``` ````.
- A ``text`` block right after a ``python`` block (nothing but blank lines and a line
  ``Output:`` between them) is what that block prints.
- ``.. literalinclude::`` shows a file of the repository, which its own tests run (tests/js,
  tests/cpp): it is not a block here.
"""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RST_BLOCK = re.compile(
    r"^\.\. code-block:: *(?P<lang>\S+)\n(?:   :[^\n]*\n)*\n(?P<body>(?:(?:   [^\n]*)?\n)+)",
    flags=re.MULTILINE,
)
_MD_BLOCK = re.compile(r"^```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^```\s*$", flags=re.MULTILINE | re.DOTALL)
#: what may stand between a python block and the text block that shows its output
_OUTPUT_GAP = re.compile(r"\s*(?:Output:)?\s*")


@dataclass(frozen=True)
class Block:
    """One code block of a page.

    Attributes
    ----------
    page : str
        The page, relative to the repository root (``docs/torch.rst``).
    line : int
        The 1-based line of the page where the block's body starts.
    language : str
        The block's language (``python``, ``bash``, ``text``, ...).
    code : str
        The body as displayed: dedented, without trailing blank lines.
    output : str or None
        For a python block, the body of the ``text`` block that follows it (what it prints).
    """

    page: str
    line: int
    language: str
    code: str
    output: str | None = None

    @property
    def where(self) -> str:
        """``page:line``, for messages and tracebacks."""
        return f"{self.page}:{self.line}"


def code_blocks(page: str | Path) -> list[Block]:
    """The code blocks of a reStructuredText or Markdown page, in page order.

    Parameters
    ----------
    page : str or Path
        The page, relative to the repository root or absolute.

    Returns
    -------
    list of Block
        Every block; a python block followed by a ``text`` block carries that block as its
        ``output`` (the text block is listed too).
    """
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    pattern = _MD_BLOCK if path.suffix == ".md" else _RST_BLOCK
    found = []
    for match in pattern.finditer(text):
        body = textwrap.dedent(match["body"]).rstrip() + "\n"
        line = text.count("\n", 0, match.start("body")) + 1
        found.append((match.start(), match.end(), match["lang"], body, line))
    name = path.relative_to(ROOT).as_posix()
    blocks = []
    for k, (_, end, lang, body, line) in enumerate(found):
        output = None
        if lang == "python" and k + 1 < len(found):
            start, _, next_lang, next_body, _ = found[k + 1]
            if next_lang == "text" and _OUTPUT_GAP.fullmatch(text[end:start]):
                output = next_body
        blocks.append(Block(name, line, lang, body, output))
    return blocks


_RST_LITERAL = re.compile(r"``(.+?)``")
_MD_LITERAL = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def inline_commands(page: str | Path, prefix: str = "pip install") -> list[str]:
    """The inline literals of a page's prose that start with ``prefix`` (``pip install ...``
    written in a sentence rather than in a block).

    Parameters
    ----------
    page : str or Path
        The page, relative to the repository root or absolute.
    prefix : str, default="pip install"
        What the literal starts with.

    Returns
    -------
    list of str
        The literals, in page order, outside the code blocks.
    """
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    block = _MD_BLOCK if path.suffix == ".md" else _RST_BLOCK
    prose = block.sub("", text)
    literal = _MD_LITERAL if path.suffix == ".md" else _RST_LITERAL
    return [m[1] for m in literal.finditer(prose) if m[1].startswith(prefix)]


def shell_lines(block: Block) -> list[str]:
    """The commands of a shell block: one per line, continuation lines (``\\``) joined,
    comment-only lines dropped, trailing comments kept (the test decides what they say)."""
    lines: list[str] = []
    pending = ""
    for raw in block.code.splitlines():
        if not raw.strip() or (raw.lstrip().startswith("#") and not pending):
            continue
        if pending:
            raw = pending + " " + raw.strip()
            pending = ""
        if raw.rstrip().endswith("\\"):
            pending = raw.rstrip()[:-1].rstrip()
            continue
        lines.append(raw.strip())
    return lines


#: the first words of each kind of documented shell command
_SHELL_KINDS = (
    ("nox", re.compile(r"^(pip install nox && )?nox\b")),
    ("install", re.compile(r"^pip install\b")),
    ("check", re.compile(r"^python -c\b")),
    ("cli", re.compile(r"^ort-train\b")),
    ("build", re.compile(r"^(g\+\+|\./train_step)(?=\s|$)")),
    ("bench", re.compile(r"^(\.nox/bench/bin/)?python benchmarks/")),
)


def shell_kind(command: str) -> str:
    """What a documented shell command is: ``'install'`` (a pip install line), ``'check'``
    (``python -c`` after the install), ``'nox'`` (a nox session, the README's first two lines
    included), ``'cli'`` (``ort-train ...``), ``'build'`` (the C++ loop), ``'bench'`` (a benchmark script),
    else ``'unknown'``."""
    for kind, pattern in _SHELL_KINDS:
        if pattern.match(command):
            return kind
    return "unknown"


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _tolerance(token: str) -> float:
    """Two units of the last digit shown (``0.485`` -> 0.002, ``-3.0e-05`` -> 2e-6)."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 2 * 10.0 ** (int(exponent or 0) - decimals)


def same_output(got: str, expected: str) -> bool:
    """Whether a block printed what its Output block shows: the same text around the numbers,
    each number within two units of its last digit or 1%."""
    got, expected = " ".join(got.split()), " ".join(expected.split())
    if _NUMBER.split(got) != _NUMBER.split(expected):
        return False
    pairs = zip(_NUMBER.findall(got), _NUMBER.findall(expected))
    return all(abs(float(g) - float(e)) <= max(_tolerance(e), 1e-2 * abs(float(e))) for g, e in pairs)


def run_block(block: Block, namespace: dict[str, object]) -> str:
    """Runs one Python block in ``namespace`` (a page's blocks share one) and returns what it
    printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, block.where, "exec"), namespace)
    return out.getvalue()


def check_page(page: str) -> list[str]:
    """Runs a page's Python blocks in order, in the current folder, and returns the problems:
    a block printing what its Output block does not show, or printing without one."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    problems = []
    for block in code_blocks(page):
        if block.language != "python":
            continue
        printed = run_block(block, namespace)
        if block.output is None and printed:
            problems.append(f"{block.where} prints but shows no Output block:\n{printed}")
        elif block.output is not None and not same_output(printed, block.output):
            problems.append(f"{block.where} printed\n{printed}\nbut its Output block shows\n{block.output}")
    return problems


if __name__ == "__main__":
    # `python doc_blocks.py PAGE ...`: runs each page's Python blocks (in a fresh temporary
    # folder), as the install test does in the environment the install lines made
    import os
    import sys
    import tempfile

    failed = []
    for name in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as folder:
            os.chdir(folder)
            failed += check_page(name)
            print(f"{name}: ran")
    print("\n".join(failed))
    sys.exit(1 if failed else 0)
