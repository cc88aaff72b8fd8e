"""The papers gradstat implements, in one table, and how to cite them where a user reads the citation.

Each entry maps a short name (``QCS``, ``SIDCo``, ...) to its authors, title, venue and year, and, for the five
papers that specify the project, to the text file kept beside the design documents (``file``), so that a citation
in a report can stay readable ("QCS (Abdi & Fekri) Thm 2 eq. (10)") while the file remains one column away for
traceability.

``cite(key_or_file, where)`` is the one way to write such a citation; ``paper(key_or_file)`` returns the entry;
``readable(text)`` rewrites any seed file name found in a string into its short citation; ``cited_in(text)``
lists the papers a text cites (for its reference list).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Paper", "PAPERS", "cite", "cited_in", "paper", "readable", "file_of", "files_in"]


@dataclass(frozen=True)
class Paper:
    """One source: ``key`` is the short name used in citations, ``short_authors`` the form used inline."""

    key: str
    short_authors: str
    authors: str
    title: str
    venue: str
    year: int
    file: str | None = None
    note: str = ""

    @property
    def label(self) -> str:
        """``QCS (Abdi & Fekri)``: the inline form of a citation."""
        return f"{self.key} ({self.short_authors})"

    @property
    def full(self) -> str:
        """Authors, *title*, venue year (the form of a reference list)."""
        return f"{self.authors}, {self.title}, {self.venue} {self.year}"


PAPERS: tuple[Paper, ...] = (
    Paper(
        "QCS",
        "Abdi & Fekri",
        "Afshin Abdi, Faramarz Fekri",
        "Quantized Compressive Sampling of Stochastic Gradients for Efficient Communication in Distributed Deep "
        "Learning",
        "AAAI",
        2020,
        "000_4b111efa75352b2d.txt",
    ),
    Paper(
        "SIDCo",
        "Abdelmoniem et al.",
        "Ahmed M. Abdelmoniem, Ahmed Elzanaty, Mohamed-Slim Alouini, Marco Canini",
        "An Efficient Statistical-based Gradient Compression Technique for Distributed Training Systems",
        "MLSys",
        2021,
        "001_ac87256369ec7547.txt",
    ),
    Paper(
        "DQSG/NDQSG",
        "Abdi & Fekri",
        "Afshin Abdi, Faramarz Fekri",
        "Nested Dithered Quantization for Communication Reduction in Distributed Training",
        "arXiv preprint (submitted to ICLR)",
        2019,
        "002_87c17e3716ede1d0.txt",
    ),
    Paper(
        "ECQ-SGD",
        "Wu et al.",
        "Jiaxiang Wu, Weidong Huang, Junzhou Huang, Tong Zhang",
        "Error Compensated Quantized SGD and its Applications to Large-scale Distributed Optimization",
        "ICML",
        2018,
        "003_da514025a9ec0a1c.txt",
        "the project keeps a blog summary (in Chinese) of the paper, not the paper itself",
    ),
    Paper(
        "GMC",
        "Zhao et al.",
        "Shen-Yi Zhao, Yin-Peng Xie, Hao Gao, Wu-Jun Li",
        "Global Momentum Compression for Sparse Communication in Distributed SGD",
        "arXiv preprint",
        2019,
        "004_8d479783bc85b5d8.txt",
    ),
    Paper(
        "QSGD",
        "Alistarh et al.",
        "Dan Alistarh, Demjan Grubic, Jerry Li, Ryota Tomioka, Milan Vojnovic",
        "QSGD: Communication-Efficient SGD via Gradient Quantization and Encoding",
        "NeurIPS",
        2017,
    ),
    Paper(
        "Sparsification",
        "Wangni et al.",
        "Jianqiao Wangni, Jialei Wang, Ji Liu, Tong Zhang",
        "Gradient Sparsification for Communication-Efficient Distributed Optimization",
        "NeurIPS",
        2018,
    ),
    Paper(
        "EF-SGD",
        "Karimireddy et al.",
        "Sai Praneeth Karimireddy, Quentin Rebjock, Sebastian U. Stich, Martin Jaggi",
        "Error Feedback Fixes SignSGD and other Gradient Compression Schemes",
        "ICML",
        2019,
    ),
)

_BY_KEY = {p.key.lower(): p for p in PAPERS}
_BY_KEY.update({"dqsg": _BY_KEY["dqsg/ndqsg"], "ndqsg": _BY_KEY["dqsg/ndqsg"], "ecq": _BY_KEY["ecq-sgd"]})
_BY_KEY.update({"wangni": _BY_KEY["sparsification"], "karimireddy": _BY_KEY["ef-sgd"], "alistarh": _BY_KEY["qsgd"]})
_BY_FILE = {p.file: p for p in PAPERS if p.file}
_BY_PREFIX = {p.file[:3]: p for p in PAPERS if p.file}  # "000" .. "004", the short form older notes use
_FILE_RE = re.compile(r"\b(00[0-4])_[0-9a-f]{16}\.txt\b")


def paper(key_or_file: str) -> Paper:
    """The entry of a short name (``"QCS"``, case-insensitive), a seed file name, or its 3-digit prefix.

    Raises
    ------
    KeyError : nothing matches (the message lists the known names).
    """
    k = str(key_or_file).strip()
    hit = _BY_FILE.get(k) or _BY_KEY.get(k.lower()) or _BY_PREFIX.get(k)
    if hit is None:
        known = ", ".join(p.key for p in PAPERS)
        raise KeyError(f"unknown paper {key_or_file!r}; known: {known} (or a seed file name)")
    return hit


def file_of(key_or_file: str) -> str:
    """The seed file of a paper ("" for papers cited but not kept as a file)."""
    return paper(key_or_file).file or ""


_SHORT = {"dqsg": "DQSG", "ndqsg": "NDQSG"}
"""Names of one paper's two schemes, kept when a citation asks for one of them (``cite("NDQSG", ...)``)."""


def cite(key_or_file: str, where: str = "") -> str:
    """A readable citation: ``cite("000_4b111efa75352b2d.txt", "Thm 2 eq. (10)")`` ->
    ``"QCS (Abdi & Fekri) Thm 2 eq. (10)"``; ``cite("NDQSG", "Thm 6")`` -> ``"NDQSG (Abdi & Fekri) Thm 6"``."""
    p = paper(key_or_file)
    short = _SHORT.get(str(key_or_file).strip().lower(), p.key)
    return f"{short} ({p.short_authors}) {where}".strip()


def files_in(text: str) -> list[str]:
    """The seed files a string names (in order, without repeats)."""
    found = [m.group(0) for m in _FILE_RE.finditer(text)]
    return list(dict.fromkeys(found))


def readable(text: str) -> str:
    """``text`` with every seed file name replaced by the paper's short citation (``QCS (Abdi & Fekri)``)."""
    return _FILE_RE.sub(lambda m: _BY_PREFIX[m.group(1)].label, text)


def cited_in(text: str) -> list[Paper]:
    """The papers ``text`` cites, in the order of :data:`PAPERS`: those whose inline label (``QCS (Abdi &
    Fekri)``), whose scheme name with its authors (``NDQSG (Abdi & Fekri)``) or whose seed file appears in it."""
    names = {p: [p.label, p.file or "\0"] for p in PAPERS}
    for short, key in _SHORT.items():
        p = _BY_KEY[short]
        names[p].append(f"{key} ({p.short_authors})")
    return [p for p in PAPERS if any(n in text for n in names[p])]
