"""SLO report: known percentiles on synthetic spans, per phase and class; bad input names the line."""
from __future__ import annotations

import json
import math

import pytest

from fastvideo3.cli_slo import main
from fastvideo3.errors import InvalidRequest
from fastvideo3.telemetry import names as N
from fastvideo3.telemetry.slo import build_report, percentile, read_spans

MS = 1_000_000


def _span(name: str, trace: int, span: int, dur_ms: float, *, parent: int | None = None, start_ms: float = 0,
          status: str = "UNSET", **attrs) -> dict:
    return {"name": name, "trace_id": f"{trace:032x}", "span_id": f"{span:016x}",
            "parent_id": f"{parent:016x}" if parent is not None else None,
            "start_ns": int(start_ms * MS), "end_ns": int((start_ms + dur_ms) * MS), "status": status,
            "service": "scheduler", "attributes": attrs, "links": []}


def _synthetic() -> list[dict]:
    """100 interactive requests lasting 1..100 ms, 10 batch requests lasting 10..100 s; each
    request has a queue wait, one denoise unit span and a pool span (classed only via its trace)."""
    spans = []
    sid = 0
    for i in range(1, 111):
        interactive = i <= 100
        cls, dur = ("interactive", float(i)) if interactive else ("batch", (i - 100) * 10_000.0)
        sid += 10
        spans.append(_span(N.SPAN_REQUEST, i, sid, dur, **{N.A_SLO_CLASS: cls, N.A_REQUEST_ID: f"r{i}"}))
        spans.append(_span(N.SPAN_PHASE, i, sid + 1, dur / 10, parent=sid, **{N.A_PHASE: "queue_wait"}))
        spans.append(_span(N.SPAN_UNIT, i, sid + 2, 2 * dur / 10, parent=sid, **{N.A_KIND: "diffusion_step"}))
        spans.append(_span(N.SPAN_POOL_EXECUTE, i, sid + 3, dur / 100, parent=sid + 2,
                           status="ERROR" if i % 50 == 0 else "OK", **{N.A_KIND: "diffusion_step"}))
    spans.append(_span(N.SPAN_BATCH, 999, 1, 5.0))  # not a phase: read, not reported
    return spans


def _write(path, spans) -> None:
    path.write_text("".join(json.dumps(s) + "\n" for s in spans))


@pytest.mark.timeout(60)
def test_nearest_rank_percentiles():
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, p) for p in (50, 95, 99, 100)] == [50, 95, 99, 100]
    assert [percentile([1.0, 2.0, 3.0, 4.0], p) for p in (50, 95, 99)] == [2, 4, 4]
    assert percentile([7.0], 99) == 7
    assert math.isnan(percentile([], 50))


@pytest.mark.timeout(60)
def test_report_percentiles_per_phase_and_class(tmp_path):
    path = tmp_path / "spans.jsonl"
    _write(path, _synthetic())
    report = build_report(read_spans(path))
    assert (report.requests, report.traces, report.spans) == (110, 111, 441)
    inter = report.classes["interactive"]
    assert list(inter) == ["queue_wait", "denoise_step", "pool_denoise_step", "end_to_end"]
    e2e = inter["end_to_end"]
    assert e2e.count == 100 and e2e.errors == 0
    assert [e2e.percentiles_s[p] for p in (50, 95, 99)] == pytest.approx([0.050, 0.095, 0.099])
    assert e2e.max_s == pytest.approx(0.100) and e2e.mean_s == pytest.approx(0.0505)
    assert [inter["queue_wait"].percentiles_s[p] for p in (50, 95, 99)] == pytest.approx([0.005, 0.0095, 0.0099])
    assert inter["denoise_step"].percentiles_s[95] == pytest.approx(0.019)
    # pool spans carry no class of their own: they are classed through their request's trace
    pool = inter["pool_denoise_step"]
    assert pool.count == 100 and pool.errors == 2 and pool.percentiles_s[50] == pytest.approx(0.0005)
    batch = report.classes["batch"]["end_to_end"]
    assert batch.count == 10
    assert [batch.percentiles_s[p] for p in (50, 95, 99)] == pytest.approx([50.0, 100.0, 100.0])
    every = report.classes["all"]["end_to_end"]
    assert every.count == 110 and every.percentiles_s[50] == pytest.approx(0.055)
    assert "unknown" not in report.classes


@pytest.mark.timeout(60)
def test_cli_json_and_table(tmp_path, capsys):
    path = tmp_path / "spans.jsonl"
    _write(path, _synthetic())
    assert main(["slo", "report", str(path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["percentile_method"] == "nearest-rank"
    assert data["classes"]["interactive"]["end_to_end"]["p99_s"] == pytest.approx(0.099)
    assert data["classes"]["batch"]["queue_wait"]["count"] == 10
    assert main(["slo", "report", str(path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("110 requests")
    row = next(line.split() for line in table if line.startswith("interactive") and "end_to_end" in line)
    assert row == ["interactive", "end_to_end", "100", "0", "50.000", "95.000", "99.000", "100.000"]


@pytest.mark.timeout(60)
def test_spans_in_several_files_are_merged(tmp_path):
    spans = _synthetic()
    a, b = tmp_path / "scheduler.jsonl", tmp_path / "pool.jsonl"
    _write(a, [s for s in spans if s["name"] != N.SPAN_POOL_EXECUTE])
    _write(b, [s for s in spans if s["name"] == N.SPAN_POOL_EXECUTE])
    report = build_report(read_spans([a, b]))
    assert report.classes["interactive"]["pool_denoise_step"].count == 100


@pytest.mark.timeout(60)
@pytest.mark.parametrize("line, message", [
    ('{"name": "x", "trace_id": "a", "span_id": "b", "start_ns": 1', "not valid JSON"),
    ('[1, 2]', "must be a JSON object"),
    ('{"name": "x", "trace_id": "a", "span_id": "b", "start_ns": 1}', "no 'end_ns'"),
    ('{"name": "x", "trace_id": "a", "span_id": "b", "start_ns": "1", "end_ns": 2}', "'start_ns' must be int"),
    ('{"name": "x", "trace_id": "a", "span_id": "b", "start_ns": 5, "end_ns": 2}', "ends before it starts"),
])
def test_malformed_line_is_named(tmp_path, capsys, line, message):
    path = tmp_path / "spans.jsonl"
    good = json.dumps(_span(N.SPAN_REQUEST, 1, 1, 5.0))
    path.write_text(f"{good}\n\n{line}\n{good}\n")
    with pytest.raises(InvalidRequest) as e:
        read_spans(path)
    assert f"{path}:3:" in e.value.message and message in e.value.message
    assert main(["slo", "report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}:3:" in err and "INVALID_ARGUMENT" in err


@pytest.mark.timeout(60)
def test_empty_missing_and_phaseless_input(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(InvalidRequest, match="no spans in"):
        read_spans(empty)
    with pytest.raises(InvalidRequest, match="no such file"):
        read_spans(tmp_path / "absent.jsonl")
    other = tmp_path / "grpc.jsonl"
    _write(other, [_span("/fastvideo3.v1.RolePool/Execute", 1, 1, 3.0)])
    with pytest.raises(InvalidRequest, match="none of the 1 spans"):
        build_report(read_spans(other))


@pytest.mark.timeout(60)
def test_commands_mount_on_the_main_cli_parser(tmp_path, capsys):
    from fastvideo3 import cli_slo
    from fastvideo3.cli import _Parser

    parser = _Parser(prog="fastvideo3")
    cli_slo.add_commands(parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser))
    path = tmp_path / "spans.jsonl"
    _write(path, _synthetic())
    args = parser.parse_args(["slo", "report", str(path), "--format", "json"])
    assert (args.cmd, args.slo_cmd, args.format) == ("slo", "report", "json")
    assert cli_slo.run(args) == 0 and json.loads(capsys.readouterr().out)["requests"] == 110
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["slo", "report", str(path), "--format", "xml"])
    assert e.value.code == 2
