"""``gradstat compressors``: the compressor registry with each compressor's declared properties.

One row per registered compressor: its name, kind, whether it is unbiased and randomized, the contraction and
theory bound it declares, whether decoding needs side information, its default spec string (what ``create(name)``
builds, and the syntax to change it) and its source. ``--json`` prints the same as a JSON list.
"""

from __future__ import annotations

import dataclasses
import json

import click

from gradstat.theory.sources import files_in, readable


def registry_table(kind: str | None = None) -> list[dict[str, object]]:
    """The registry as rows of plain values (one dict per compressor, sorted by name)."""
    from gradstat import compressors

    rows = []
    for name in compressors.names():
        props = compressors.get(name).properties
        if kind is not None and props.kind != kind:
            continue
        row = {"name": name, **dataclasses.asdict(props), "spec": compressors.create(name).spec()}
        row["paper_files"] = ", ".join(files_in(row["source"]))  # the citation made readable, the files kept
        rows.append({**row, "source": readable(row["source"])})
    if kind is not None and not rows:
        raise ValueError(f"no compressor of kind {kind!r}; kinds: sparsifier, quantizer, sketch, identity")
    return rows


def _cell(value: object) -> str:
    """A table cell: ``yes``/``no`` for flags, ``-`` for none, the text otherwise (specs exactly as accepted)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "-" if value is None else str(value)


@click.command("compressors")
@click.option("--json", "as_json", is_flag=True, help="Print the registry as JSON.")
@click.option(
    "--kind",
    type=click.Choice(["sparsifier", "quantizer", "sketch", "identity"]),
    help="Only compressors of this kind.",
)
def compressors_cmd(as_json: bool, kind: str | None) -> None:
    """List every registered compressor with its declared properties and default spec."""
    rows = registry_table(kind)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    columns = ["name", "kind", "unbiased", "randomized", "contraction", "bound", "needs_side", "spec"]
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    for line in [columns] + cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


COMMANDS = (compressors_cmd,)
"""The commands (and groups) this module adds to ``gradstat``, in listing order."""
