"""Every command of the tree, run once on the tiny dump (or without one where it takes none): exit status 0 and
output for a person -- no Python reprs, no unrounded numbers, no traceback.

The list of commands comes from the click tree, so a command added without an entry in ``RUNS`` fails here."""

from __future__ import annotations

import re

import pytest

from gradstat.analysis.cli.main import leaves, main, walk

RUNS: dict[tuple[str, ...], list[str]] = {
    ("workloads",): [],
    ("compressors",): [],
    ("info",): ["{dump}"],
    ("record",): ["--workload", "linreg", "--iterations", "2", "--workers", "2", "--out", "{tmp}/rec"],
    ("import",): ["{npz}", "--out", "{tmp}/imported"],
    ("export",): ["{dump}", "--steps", "last:2", "--workers", "0", "--out", "{tmp}/e.npz"],
    ("theory", "qcs"): ["--n", "256", "--k", "32", "--Q", "4"],
    ("theory", "qcs-optimal"): ["--n", "256", "--gain", "20"],
    ("theory", "eta"): ["--gamma", "3.264056068784741", "--beta", "0.3"],
    ("theory", "dqsg"): ["--n", "1000", "--M", "2"],
    ("theory", "ndqsg"): ["--delta1", "0.5", "--delta2", "2", "--sigma-z", "0.3"],
    ("theory", "sidco-threshold"): ["--dist", "gp", "--shape", "0.2", "--scale", "1", "--ratio", "0.01", "--d", "1000"],
    ("fit",): ["{dump}", "--steps", "last:1", "--scope", "model", "--method", "closed_form"],
    ("threshold",): ["{dump}", "--steps", "0,2", "--ratio", "0.01", "--estimators", "topk,sidco-exp-M2"],
    ("compress",): ["{dump}", "--steps", "0-1", "--compressor", "qsgd:s=4,bucket=512", "--feedback", "ef"],
    ("variance",): ["{dump}", "--compressor", "qsgd:s=4", "--n", "256", "--trials", "20", "--vectors", "1"],
    ("feedback",): ["{dump}", "--beta", "0.5,1", "--n", "256", "--seeds", "2", "--length", "2"],
    ("plot", "variance-vs-gain"): ["{dump}", "--n", "32", "--trials", "4"],
    ("validate",): ["{dump}", "--quick", "--checks", "qcs-gamma"],
    ("report",): ["{dump}", "--steps", "last:1", "--quick", "--checks", "qcs-gamma"],
    ("demo",): ["--workload", "fc300", "--iterations", "2", "--quick", "--out", "{tmp}/demo"],
    ("bench",): [],
    ("experiment",): ["list"],
    ("train",): [
        "--workload",
        "fc300",
        "--nproc",
        "2",
        "--compressor",
        "topk:ratio=0.1",
        "--iterations",
        "2",
        "--config-only",
        "--out",
        "{tmp}/train",
    ],
}
SLOW = {("demo",)}  # records, then runs the whole report: 20-30 s on 2 shared cores
KNOWN_BROKEN: dict[tuple[str, ...], type[Exception]] = {}

REPRS = re.compile(
    r"\{'|\{\"|': |object at 0x|tensor\(|np\.float|OrderedDict|defaultdict\(|dtype=torch\."
    r"|(?<![=\w])(?:True|False|None)\b"
)  # Python-isms; a value after "=" belongs to a spec string
NUMBER = re.compile(r"(?<![\w.=])\d+\.\d+(?:e[+-]?\d+)?(?![\w.])")  # a value after "=" belongs to a spec string,
# printed exactly so that it rebuilds the same compressor (``compressors``' spec column)


def _cases():
    for path in leaves():
        marks = [pytest.mark.slow] if path in SLOW else []
        if path in KNOWN_BROKEN:
            marks.append(pytest.mark.xfail(raises=KNOWN_BROKEN[path], reason="fixed with the bench topics"))
        yield pytest.param(path, marks=marks, id=" ".join(path))


def test_every_command_has_a_run():
    missing = [" ".join(p) for p in leaves() if p not in RUNS]
    assert not missing, f"add a run of `gradstat {missing[0]}` to RUNS (commands without one: {missing})"


def _significant_digits(number: str) -> int:
    mantissa = number.lower().split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa)


@pytest.mark.parametrize("path", list(_cases()))
def test_command_runs_and_prints_for_a_person(path, tiny_dump, tmp_path, capsys):
    from gradstat.analysis.dumps import open_dump
    from gradstat.analysis.dumps.convert import export_npz

    if path not in RUNS:
        pytest.fail(f"no run for `gradstat {' '.join(path)}`")
    npz = tmp_path / "src.npz"
    if path == ("import",):
        export_npz(open_dump(tiny_dump), npz, [0], None, False)
    args = [a.format(dump=tiny_dump, tmp=tmp_path, npz=npz) for a in RUNS[path]]
    options = {opt for p in dict(walk())[path].params for opt in p.opts}
    if "--out" in options and "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    if "--quiet" in options:
        args.append("--quiet")
    code = main([*path, *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.strip() and "Traceback" not in err
    assert not REPRS.search(out), f"a Python repr in the output: {REPRS.search(out).group(0)!r}\n{out}"
    long = [n for n in NUMBER.findall(out) if _significant_digits(n) > 7]
    assert not long, f"unrounded numbers: {long[:5]}"
    if path == ("demo",):
        assert open_dump(tmp_path / "demo" / "dump").steps == [0, 1]  # the demo keeps its dump
        assert f"dump:   {tmp_path / 'demo' / 'dump'}" in out
