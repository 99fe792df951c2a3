"""`--dtype auto --max-error E`: a format per table, the smallest that keeps
every float output within E of the source's on the verification requests.

Everything the tool claims is measured again here, independently: each
table's single-table errors from copies of the source with that table
alone replaced by decode(encode(table)) (run in a fresh process through both
loaders), the per-table minimality of the choice under the prediction the
tool documents (auto_plan.py: per output element, the sum of the tables'
changes), and the exported model's error against the source.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import export_models
from export_tools import ExportError, compress, compress_saved_model, verify
from export_tools.auto_plan import FP32
from export_tools.options import AUTO_FORMATS
from test_export import dequantized_copy, run_models, tree_digest
from tf_compressed_embedding import quantization

CLI = [sys.executable, "-m", "export_tools"]
MID, LOOSE, TIGHT = 0.01, 1.0, 1e-4


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    return export_models.build_module_scaled(str(tmp_path_factory.mktemp("scaled") / "src"))


@pytest.fixture(scope="module")
def auto_export(scaled, tmp_path_factory):
    cache = {}

    def get(max_error, ops="fused"):
        if (max_error, ops) not in cache:
            dst = str(tmp_path_factory.mktemp("auto") / "dst")
            report = compress_saved_model(scaled.path, dst, dtype="auto",
                                          max_error=max_error, ops=ops, min_rows=1,
                                          examples=scaled.examples, isolate=False)
            cache[max_error, ops] = dst, report
        return cache[max_error, ops]
    return get


def _tf2_outputs(results):
    assert not [k for k in results if k.startswith("error")], results
    return {k: v for k, v in results.items() if k.startswith("tf2/")}


def _deltas(got, want):
    """{output: |got - want|} over float outputs (float64)."""
    return {k: np.abs(got[k].astype(np.float64) - v.astype(np.float64))
            for k, v in want.items() if np.issubdtype(v.dtype, np.floating)}


@pytest.fixture(scope="module")
def singles(scaled, auto_export, tmp_path_factory):
    """{(table, format): {output: |change|}} with only that table replaced by
    its decoded format, measured on copies of the source."""
    _, report = auto_export(MID)
    workdir = str(tmp_path_factory.mktemp("singles"))
    copies = {}
    for t in report.auto.tables:
        for fmt in AUTO_FORMATS:
            path = os.path.join(workdir, f"{t.name}_{fmt}")
            dequantized_copy(scaled.path, path, [t.checkpoint_key], fmt)
            copies[t.name, fmt] = path
    results = run_models(workdir, "singles", [scaled.path] + list(copies.values()),
                         scaled.examples, load_ops=False)
    want = _tf2_outputs(results[scaled.path])
    return {key: _deltas(_tf2_outputs(results[path]), want)
            for key, path in copies.items()}


def _single_error(singles, name, fmt):
    if fmt == FP32:
        return 0.0
    return max(float(d.max(initial=0.0)) for d in singles[name, fmt].values())


def _options(table, singles):
    """The table's options, as auto_plan.py defines them: candidates sorted
    by bytes, each kept only if no option no larger has a smaller error."""
    found = sorted(((table.rows * (4 * table.dim if f == FP32
                                   else quantization.row_bytes(f, table.dim)),
                     _single_error(singles, table.name, f), f)
                    for f in list(AUTO_FORMATS) + [FP32]))
    kept = []
    for size, error, fmt in found:
        if not kept or error <= kept[-1][1]:
            kept.append((size, error, fmt))
    return [f for _, _, f in kept]


def _predicted(singles, choice):
    """max over output elements of the sum of the chosen formats' changes."""
    total = None
    for name, fmt in choice.items():
        if fmt == FP32:
            continue
        delta = singles[name, fmt]
        total = delta if total is None else {k: total[k] + delta[k] for k in total}
    return 0.0 if total is None else max(float(v.max(initial=0.0)) for v in total.values())


def _measured_error(workdir, src, dst, examples, load_ops):
    """max |dst - src| over every float output, both loaders, fresh process."""
    results = run_models(workdir, "final", [src, dst], examples, load_ops=load_ops)
    for model in (src, dst):
        assert not [k for k in results[model] if k.startswith("error")], results[model]
    want = {k: v for k, v in results[src].items() if k.startswith("tf2/")}
    worst = 0.0
    for key, value in results[dst].items():
        delta = _deltas({key: value}, {key: want["tf2/" + key.split("/", 1)[1]]})
        worst = max([worst] + [float(d.max(initial=0.0)) for d in delta.values()])
    return worst


@pytest.mark.parametrize("max_error", [LOOSE, MID, TIGHT])
def test_choice_is_per_table_minimal_and_the_export_within_the_bound(
        scaled, auto_export, singles, max_error, tmp_path):
    dst, report = auto_export(max_error)
    auto = report.auto
    assert report.verified and report.dtype == "auto" and auto.max_error == max_error
    choice = {t.name: t.format for t in auto.tables}
    assert sorted(choice) == sorted(scaled.tables)
    # The outputs are sums of rows: the prediction bounds what they measure,
    # and the proof upgrades nothing.
    assert auto.upgrades == []
    for t in auto.tables:
        # the tool's single-table errors are the ones measured here
        for fmt in AUTO_FORMATS:
            assert t.errors[fmt] == pytest.approx(_single_error(singles, t.name, fmt),
                                                  rel=1e-4, abs=1e-7), (t.name, fmt)
        assert t.error == pytest.approx(_single_error(singles, t.name, t.format),
                                        rel=1e-4, abs=1e-7)
        assert t.bytes == t.rows * (4 * t.dim if t.format == FP32
                                    else quantization.row_bytes(t.format, t.dim))
        options = _options(t, singles)
        index = options.index(t.format)
        if index == 0:
            assert t.smaller_predicted is None
            continue
        # per-table minimal: the next smaller option alone breaks the bound
        smaller = dict(choice, **{t.name: options[index - 1]})
        assert _predicted(singles, smaller) > max_error, (t.name, smaller)
        assert t.smaller_predicted == pytest.approx(_predicted(singles, smaller), rel=1e-3)
    assert _predicted(singles, choice) <= max_error
    assert auto.predicted_error == pytest.approx(_predicted(singles, choice), rel=1e-3)
    assert auto.single_sum == pytest.approx(sum(t.error for t in auto.tables))
    # the export itself, measured here: within the bound, as the tool says
    measured = _measured_error(str(tmp_path), scaled.path, dst, scaled.examples, True)
    assert measured <= max_error
    assert auto.measured_error == pytest.approx(measured, rel=1e-6, abs=1e-9)
    # its tables are stored as chosen
    stored = {t.name: t.format for t in report.tables}
    assert stored == {n: f for n, f in choice.items() if f != FP32}
    assert auto.bytes == sum(t.bytes for t in auto.tables)
    assert auto.bytes_fp32 == sum(r * d * 4 for r, d in scaled.tables.values())
    assert auto.bytes_int8 == sum(r * quantization.row_bytes("int8", d)
                                  for r, d in scaled.tables.values())


def test_loose_bound_gives_int4_everywhere(auto_export):
    _, report = auto_export(LOOSE)
    assert {t.format for t in report.auto.tables} == {"int4"}
    assert report.auto.bytes < report.auto.bytes_int8 < report.auto.bytes_fp32


def test_mid_bound_shares_it_by_magnitude(auto_export):
    """The three tables summed into one output share the bound: the largest
    values get the most bytes. 'side' moves its own output only."""
    _, report = auto_export(MID)
    choice = {t.name: t.format for t in report.auto.tables}
    order = list(AUTO_FORMATS) + [FP32]
    assert order.index(choice["small"]) <= order.index(choice["medium"]) \
        <= order.index(choice["large"])
    assert len(set(choice.values())) > 1
    assert report.auto.bytes < report.auto.bytes_int8


def test_tight_bound_keeps_fp32_and_fp16(auto_export):
    _, report = auto_export(TIGHT)
    formats = {t.format for t in report.auto.tables}
    assert FP32 in formats and "fp16" in formats
    assert {t.name for t in report.tables} == {
        t.name for t in report.auto.tables if t.format != FP32}


def test_stock_ops_choose_the_same(scaled, auto_export, tmp_path):
    dst, report = auto_export(MID, "stock")
    _, fused = auto_export(MID)
    assert [(t.name, t.format) for t in report.auto.tables] == \
        [(t.name, t.format) for t in fused.auto.tables]
    assert report.verified and report.auto.measured_error <= MID
    assert _measured_error(str(tmp_path), scaled.path, dst, scaled.examples,
                           False) <= MID


def test_effects_that_do_not_add_are_caught_by_the_proof(tmp_path):
    """Each table alone changes nothing (its column times the other's zeros);
    both int4 do. The choice measured together moves one up until it holds."""
    built = export_models.build_module_product(str(tmp_path / "src"))
    report = compress_saved_model(built.path, str(tmp_path / "dst"), dtype="auto",
                                  max_error=1e-3, min_rows=1, examples=built.examples,
                                  isolate=False)
    auto = report.auto
    assert all(e == 0 for t in auto.tables for e in t.errors.values())
    assert auto.predicted_error == 0
    assert [(u["from"], u["to"], u["where"]) for u in auto.upgrades] == [
        ("int4", "int8", "rebuilt source")]
    assert auto.upgrades[0]["measured"] > 1e-3
    assert sorted(t.format for t in auto.tables) == ["int4", "int8"]
    assert sum("no verification request changes" in w for w in report.warnings) == 2
    measured = _measured_error(str(tmp_path), built.path, str(tmp_path / "dst"),
                               built.examples, True)
    assert measured <= 1e-3 and auto.measured_error == pytest.approx(measured, abs=1e-9)


def test_a_failed_verification_upgrades_and_builds_again(scaled, tmp_path, monkeypatch):
    """Verification is the proof: above the bound, the table with the largest
    single-table error moves up one option and the export is built again."""
    calls = []
    real = verify.verify

    def first_fails(*args, **kwargs):
        calls.append(kwargs["tolerance"])
        if len(calls) == 1:
            raise verify.ToleranceExceeded("injected", 2 * MID)
        return real(*args, **kwargs)
    monkeypatch.setattr(compress.verification, "verify", first_fails)
    report = compress_saved_model(scaled.path, str(tmp_path / "dst"), dtype="auto",
                                  max_error=MID, min_rows=1, examples=scaled.examples,
                                  isolate=False)
    assert calls == [MID, MID]
    upgrade = report.auto.upgrades[-1]
    assert upgrade["where"] == "export" and upgrade["measured"] == 2 * MID
    table = next(t for t in report.auto.tables if t.name == upgrade["table"])
    assert table.format == upgrade["to"] != upgrade["from"]
    assert {t.name: t.format for t in report.tables}.get(table.name, FP32) == table.format
    assert report.verified and os.listdir(tmp_path) == ["dst"]


def test_formats_a_table_cannot_use_are_named(tmp_path):
    """Values beyond float16: fp16 and int4 cannot store the table, int8 can."""
    built = export_models.build_refuse_fp16_overflow(str(tmp_path / "src"))
    report = compress_saved_model(built.path, str(tmp_path / "dst"), dtype="auto",
                                  max_error=1e4, min_rows=1, isolate=False)
    (table,) = report.auto.tables
    assert table.format == "int8"
    assert table.errors["fp16"] is None and table.errors["int4"] is None
    assert "65504" in table.unusable["fp16"] and "65504" in table.unusable["int4"]
    assert any("cannot be stored as fp16" in w for w in report.warnings)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="auto"), "dtype='auto' needs max_error"),
    (dict(dtype="auto", max_error=0.0), "max_error must be > 0"),
    (dict(dtype="auto", max_error=-1.0), "max_error must be > 0"),
    (dict(dtype="int8", max_error=0.1), "max_error is used by dtype='auto' only"),
    (dict(dtype="auto", max_error=0.1, verify=False), "cannot run with verify=False"),
    (dict(dtype="int2"), "dtype must be one of int4, int8, fp16, int8_split, auto"),
])
def test_bad_arguments_are_refused(scaled, tmp_path, kwargs, message):
    with pytest.raises(ExportError, match=message):
        compress_saved_model(scaled.path, str(tmp_path / "dst"), min_rows=1, **kwargs)
    assert os.listdir(tmp_path) == []


def test_nothing_compressible_within_the_bound_is_an_error(scaled, tmp_path):
    digest = tree_digest(scaled.path)
    with pytest.raises(ExportError, match=r"no table can be compressed within max error "
                                          r"1e-09: the smallest change one table makes "
                                          r"alone is .* \(small as fp16\)"):
        compress_saved_model(scaled.path, str(tmp_path / "dst"), dtype="auto",
                             max_error=1e-9, min_rows=1, examples=scaled.examples,
                             isolate=False)
    assert os.listdir(tmp_path) == [] and tree_digest(scaled.path) == digest


def test_cli_prints_and_reports_the_choice(scaled, tmp_path):
    report_path = tmp_path / "report.json"
    done = subprocess.run(CLI + [scaled.path, str(tmp_path / "dst"), "--dtype", "auto",
                                 "--max-error", str(MID), "--min-rows", "1",
                                 "--report", str(report_path)],
                          capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS="300"))  # rich: no wrapping
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.load(open(report_path))
    auto = report["auto"]
    assert report["dtype"] == "auto" and report["verified"]
    assert auto["max_error"] == MID and auto["measured_error"] <= MID
    assert sorted(t["name"] for t in auto["tables"]) == sorted(scaled.tables)
    for t in auto["tables"]:
        assert t["format"] in list(AUTO_FORMATS) + [FP32]
        assert sorted(t["errors"]) == sorted(AUTO_FORMATS)
    assert auto["bytes"] == sum(t["bytes"] for t in auto["tables"])
    out = done.stderr
    assert "--dtype auto: single-table errors" in out
    assert f"measured max |DST - SRC| over {auto['output_values']} float output values: " \
           f"{auto['measured_error']:.3g} <= {MID:g}" in out
    assert "all int8" in out and "FP32" in out
    for name in scaled.tables:
        assert f"{name} as int4: max |output change|" in out
