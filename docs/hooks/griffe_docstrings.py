"""A griffe extension (mkdocs.yml: the python handler's ``extensions``) that reads gradstat's docstrings as they are
written, before mkdocstrings renders them:

- reStructuredText's literal-block marker ``::`` ends the line as ``:`` (the indented block is code in Markdown too);
- reStructuredText roles (``:func:`~a.b.c```, ``:class:`X```, ``:mod:``, ``:meth:``, ``:attr:``, ``:data:``,
  ``:exc:``) become Markdown code (`` `a.b.c` ``; the ``~`` form keeps the last name, as Sphinx shows it);
- a NumPy section entry written ``name : what it is`` (a description after the colon, where NumPy style puts a
  type) becomes ``name`` with the description indented below it, so it renders as the description, not as a type;
  an entry ``name : int`` (one word after the colon) stays a type;
- a Returns, Yields or Raises section written as a sentence (not ``type`` or ``Error : why`` entries) becomes a
  paragraph headed by the section's name.

:func:`rewrite` is the text transform; the tests call it directly.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj|py:\w+):`(~?)([^`]+)`")
ENTRY_SECTIONS = ("Parameters", "Other Parameters", "Attributes", "Returns", "Yields", "Raises", "Warns")
SENTENCE_SECTIONS = ("Returns", "Yields", "Raises", "Warns")
ENTRY = re.compile(r"^(?P<indent>[ \t]*)(?P<names>\*{0,2}[A-Za-z_][\w, *]*?) : (?P<rest>.*\S.*)$")
ONE_TYPE = re.compile(r"^[\w.]+(\[[^\]]*\])?( \| [\w.]+(\[[^\]]*\])?)*$")  # int, tuple[int, int], str | None


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


def _sections(lines: list[str]) -> list[tuple[int, int, int, str]]:
    """``(header line, first body line, end, title)`` of each NumPy section (a title line over a dash line)."""
    heads = [
        i
        for i in range(len(lines) - 1)
        if lines[i].strip() and re.fullmatch(r"[ \t]*-{3,}[ \t]*", lines[i + 1]) and lines[i].strip()[0].isupper()
    ]
    return [
        (h, h + 2, (heads[n + 1] if n + 1 < len(heads) else len(lines)), lines[h].strip()) for n, h in enumerate(heads)
    ]


def _entries(body: list[str]) -> list[str] | None:
    """The body with each ``name : description`` entry split as name and indented description; None when an entry
    line at the section's indentation is neither that nor a ``name : type`` or ``type`` line."""
    text = [line for line in body if line.strip()]
    if not text:
        return body
    base = min(len(line) - len(line.lstrip()) for line in text)
    out = []
    for line in body:
        indent = len(line) - len(line.lstrip())
        m = ENTRY.match(line) if line.strip() and indent == base else None
        if m and " " in m.group("rest").strip():
            out += [f"{m.group('indent')}{m.group('names')}", f"{m.group('indent')}    {m.group('rest').strip()}"]
        elif line.strip() and indent == base and not m and not ONE_TYPE.match(line.strip()):
            return None  # a sentence, not entries
        else:
            out.append(line)
    return out


def rewrite(doc: str) -> str:
    """The docstring with roles as Markdown code and sections as described in the module docstring (a section
    turned into a paragraph moves above the first remaining section, which would otherwise absorb it)."""
    lines = re.sub(r"(?<=\S)::$", ":", ROLE.sub(_role, doc), flags=re.M).split("\n")  # rst's literal-block "::"
    sections = _sections(lines)
    paragraphs: list[str] = []
    for head, start, end, title in reversed(sections):
        if title not in ENTRY_SECTIONS:
            continue
        entries = _entries(lines[start:end])
        if entries is not None:
            lines[start:end] = entries
        elif title in SENTENCE_SECTIONS:
            text = " ".join(line.strip() for line in lines[start:end] if line.strip())
            indent = lines[head][: len(lines[head]) - len(lines[head].lstrip())]
            paragraphs.insert(0, f"{indent}**{title}:** {text}")
            del lines[head:end]
    if paragraphs:
        remaining = _sections(lines)
        first = remaining[0][0] if remaining else len(lines)
        lines[first:first] = ["", *(line for p in paragraphs for line in (p, ""))]
    return "\n".join(lines)


class ReadAsWritten(griffe.Extension):
    """Applies :func:`rewrite` to every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
