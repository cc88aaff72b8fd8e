"""MkDocs hooks of the gradstat site (``hooks:`` in mkdocs.yml).

- :func:`on_files` publishes the committed demo report's figures and tables (``reports/demo/*.png``, ``*.csv``) under
  ``demo/``, so the pages show the demo's own figures without copies that could drift;
- :func:`on_page_markdown` replaces the marker lines below with tables generated from the tables the code uses:
  ``<!-- gradstat:papers -->`` (``gradstat.theory.sources.PAPERS``), ``<!-- gradstat:checks -->`` (the validation
  registry, ``gradstat.analysis.validation.registry.CHECKS``) and ``<!-- gradstat:compressors -->`` (every
  registered compressor's declared properties), ``<!-- gradstat:commands -->`` (README.md's command table).

The generators are plain functions (``papers_markdown``, ``checks_markdown``, ``compressors_markdown``) so that the
tests call them directly.
"""

from __future__ import annotations

import html
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "reports" / "demo"
DEMO_SUFFIXES = (".png", ".csv")


CODE_OPEN, CODE_CLOSE = "\x00", "\x01"
"""Where a cell's code begins and ends (written as ``<code>`` after the cell's text is escaped)."""


def _code(text: object) -> str:
    return f"{CODE_OPEN}{text}{CODE_CLOSE}"


def _cell(text: object) -> str:
    """One Markdown table cell as HTML text: newlines folded, ``<``, ``>``, ``&`` and pipes escaped (a pipe in a
    Markdown code span would keep its backslash), code marked by :func:`_code` as ``<code>``."""
    escaped = html.escape(" ".join(str(text).split()), quote=False).replace("|", "&#124;")
    return escaped.replace(CODE_OPEN, "<code>").replace(CODE_CLOSE, "</code>")


def _first_paragraph(doc: str | None) -> str:
    return (doc or "").strip().split("\n\n", 1)[0]


def papers_markdown() -> str:
    """The papers table: key, authors, title, venue and year, from ``gradstat.theory.sources.PAPERS``."""
    from gradstat.theory.sources import PAPERS

    rows = ["| key | authors | title | venue | year |", "|---|---|---|---|---|"]
    for p in PAPERS:
        rows.append(f"| {_cell(p.key)} | {_cell(p.authors)} | {_cell(p.title)} | {_cell(p.venue)} | {p.year} |")
    return "\n".join(rows)


def _paper_of(source: str) -> str:
    """The paper key a readable citation starts with (``QCS (Abdi & Fekri) ...`` -> ``QCS``)."""
    from gradstat.theory.sources import paper

    head = source.split(" (", 1)[0].strip()
    try:
        return paper(head).key
    except KeyError:
        return ""


def _plain(text: str, values: dict[str, Any] | None = None) -> str:
    """reStructuredText roles and literals as Markdown code (``:func:`a.b``` -> `a.b`); a literal naming one of
    ``values`` (a factory's argument) is replaced by the value it was built with."""
    values = values or {}
    text = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: _code(m.group(1)), text)
    return re.sub(r"``([^`]+)``", lambda m: _code(values.get(m.group(1), m.group(1))), text)


def _conditions(measure: Callable[..., Any]) -> str:
    """What a check assumes and measures: the first paragraph of its ``measure``'s docstring; for a ``measure``
    built by a factory (``variance_check``, ``sidco_check``), the factory's first sentence with the values it was
    built with, and those values; otherwise the first paragraph of the check module's docstring."""
    doc = _first_paragraph(inspect.getdoc(measure))
    if doc:
        return _plain(doc)
    qualname = getattr(measure, "__qualname__", "")
    module = sys.modules[measure.__module__]
    if ".<locals>." in qualname:
        factory = getattr(module, qualname.split(".<locals>.", 1)[0], None)
        values = {
            k: v for k, v in inspect.getclosurevars(measure).nonlocals.items() if isinstance(v, (str, int, float))
        }
        sentence = re.split(r"(?<=[.;])\s", _first_paragraph(inspect.getdoc(factory)), maxsplit=1)[0].rstrip(";.")
        built = ", ".join(f"{k} = {_code(v)}" for k, v in values.items())
        return f"{_plain(sentence, values)} ({built})."
    return _plain(_first_paragraph(inspect.getdoc(module)))


def checks_markdown() -> str:
    """The validation checks: name, claim, quantity, source (paper, equation), conditions, must hold; from the
    registry the ``gradstat validate`` command runs."""
    from gradstat.analysis.validation.registry import CHECKS

    rows = [
        "| check | source (paper, equation) | claim | quantity | what it assumes and measures | must hold |",
        "|---|---|---|---|---|---|",
    ]
    for c in CHECKS:
        rows.append(
            f"| {_cell(_code(c.name))} | {_cell(c.source)} | {c.claim} | {_cell(_code(c.quantity))} "
            f"| {_cell(_conditions(c.measure))} "
            f"| {'yes' if c.must_hold else 'no (reported)'} |"
        )
    return "\n".join(rows)


def compressors_markdown() -> str:
    """Every registered compressor: spec with its defaults, what it declares (kind, unbiased, contraction, the
    bound key the analysis checks it against) and the source it implements."""
    from gradstat import compressors

    rows = ["| compressor | kind | unbiased | contraction | bound key | source |", "|---|---|---|---|---|---|"]
    for name in compressors.names():
        c = compressors.create(name)
        p = c.properties
        rows.append(
            f"| {_cell(_code(c.spec()))} | {p.kind} | {'yes' if p.unbiased else 'no'} | {_cell(p.contraction or '')} "
            f"| {_cell(p.bound or '')} | {_cell(p.source)} |"
        )
    return "\n".join(rows)


LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def repository_paths(markdown: str) -> str:
    """Links to the repository's files (relative to its root, as in README.md) as the paths in code, since the site
    holds no copies of them: ``[`data/README.md`](data/README.md)`` -> ``data/README.md`` in code; links into
    ``docs/`` become links to the site's pages (for a page at the top of the docs folder)."""

    def plain(m: re.Match[str]) -> str:
        text, target = m.group(1), m.group(2)
        if target.startswith("docs/"):  # a page of this site: relative to the docs folder (pages at its top)
            return f"[{text}]({target[len('docs/') :]})"
        if re.match(r"[a-z]+:|#", target) or not (ROOT / target.split("#", 1)[0]).exists():
            return m.group(0)
        return text if text.strip("`") == target else f"{text} (`{target}`)"

    return LINK.sub(plain, markdown)


def commands_markdown() -> str:
    """README.md's command table (its one home), with its links to repository files as paths."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Commands\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return repository_paths("\n".join(rows))


CLOSED_FORM_MODULES = ("qcs", "dqsg", "qsgd", "sidco", "sparsification", "wangni", "gmc", "bits", "convergence")
CITES = re.compile(
    r"\b(?:eqs?\.|Eq\.|Lemma|Theorem|Thm|Cor\.|Corollary|Def\.|Sec\.|App\.|Remark|Table|Fig\.|Algorithm)|\(\d+[a-d]?\)"
)
ABBREVIATIONS = re.compile(r"\b(eqs?|Eq|Fig|Sec|Thm|Cor|Def|App|al|e\.g|i\.e|i\.i\.d|cf|vs|resp)\. ")


def _prose(doc: str) -> str:
    """A docstring's text before its first NumPy section, each literal block (after ``::``) as one line of code."""
    head = re.split(r"\n[A-Z][A-Za-z ]+\n-{3,}\n", doc, maxsplit=1)[0]

    def block(m: re.Match[str]) -> str:
        lines = [line.strip() for line in m.group(1).splitlines() if line.strip()]
        return ": " + _code("; ".join(" ".join(line.split()) for line in lines)) + "\n\n"

    return re.sub(r"::\n\n((?:[ \t]+.*\n?|\n)+)", block, head + "\n")


def _sentences(text: str) -> list[str]:
    """``text`` (one paragraph or more) cut into sentences, not after the abbreviations of citations."""
    protected = ABBREVIATIONS.sub(lambda m: m.group(1) + ".\x02", " ".join(text.split()))
    return [p.replace("\x02", " ") for p in re.split(r"(?<=[.!?])\s+(?=[A-Z(`])", protected) if p.strip()]


def closed_forms_markdown() -> str:
    """Every public function of the closed-form modules of ``gradstat.theory``: what it computes (the docstring's
    first sentence), and the paper, equation and conditions its docstring cites (the sentences naming an equation,
    lemma, theorem, section...; the module's own first line where the function cites none)."""
    import importlib

    rows = []
    for name in CLOSED_FORM_MODULES:
        module = importlib.import_module(f"gradstat.theory.{name}")
        paper = _sentences(_first_paragraph(inspect.getdoc(module)))[0]
        rows += [f"### `gradstat.theory.{name}`", "", _cell(_plain(paper)), ""]
        rows += ["| function | what it computes | source and conditions (from its docstring) |", "|---|---|---|"]
        for fname in module.__all__:
            fn = getattr(module, fname)
            if not inspect.isfunction(fn):
                continue
            sentences = _sentences(_prose(inspect.getdoc(fn) or ""))
            summary = sentences[0] if sentences else ""
            cited = [c for c in sentences[1:] if CITES.search(c)] or ([summary] if CITES.search(summary) else [])
            anchor = f"reference/theory.md#gradstat.theory.{name}.{fname}"
            rows.append(
                f"| [{_cell(_code(fname))}]({anchor}) | {_cell(_plain(summary))} "
                f"| {_cell(_plain(' '.join(cited))) or 'cites no equation (see the module above)'} |"
            )
        rows.append("")
    return "\n".join(rows)


MARKERS: dict[str, Callable[[], str]] = {
    "<!-- gradstat:closed-forms -->": closed_forms_markdown,
    "<!-- gradstat:commands -->": commands_markdown,
    "<!-- gradstat:papers -->": papers_markdown,
    "<!-- gradstat:checks -->": checks_markdown,
    "<!-- gradstat:compressors -->": compressors_markdown,
}


def on_files(files: Any, config: Any) -> Any:
    """Publish the demo report's figures and tables under ``demo/``."""
    from mkdocs.structure.files import File

    for path in sorted(DEMO.iterdir()):
        if path.is_file() and path.suffix in DEMO_SUFFIXES:
            files.append(File.generated(config, f"demo/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each marker line by its generated table."""
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
