"""Cohorts: a denoise batch capped at the fewest rows the DiT runs as cheaply per row as its best
(fastvideo3.runtime.scheduling.cohorts), read from the replica's timed graph buckets. The planner
is driven by hand, as in test_planner.py: no executor runs."""
import pytest

from fastvideo3.runtime.scheduling.cohorts import (
    batch_cap, cohort_rows, cohort_units, parse_cohort_rows, rows_per_unit,
)
from fastvideo3.v1 import pool_pb2
from tests.unit.test_planner import Replica, _planner, _req, _submit, answer

pytestmark = pytest.mark.timeout(60)


def _buckets(shape, per_bucket_ms: dict[int, float], text_len: int = 512, other_shape=None):
    sig = "x".join(str(d) for d in shape) + f".t{text_len}"
    out = [pool_pb2.GraphBucket(batch=rows, signature=sig, capture_s=0.1, replay_ms=ms)
           for rows, ms in per_bucket_ms.items()]
    if other_shape is not None:  # another shape's bucket, cheaper per row: must not count
        other = "x".join(str(d) for d in other_shape) + f".t{text_len}"
        out.append(pool_pb2.GraphBucket(batch=1, signature=other, replay_ms=0.01))
    return out


def test_cohort_rows_is_the_fewest_rows_within_the_tolerance_of_the_best_per_row_cost():
    shape = (16, 5, 32, 32)
    # per row: 1 -> 8.0, 2 -> 8.35, 4 -> 6.68, 8 -> 6.71, 16 -> 7.06, 32 -> 6.92 (the H100's 17x256x256 figures)
    timed = _buckets(shape, {1: 8.0, 2: 16.7, 4: 26.72, 8: 53.68, 16: 112.96, 32: 221.44}, other_shape=(16, 21, 60, 104))
    assert cohort_rows(timed, shape) == 4
    assert cohort_rows(timed, shape, tolerance=0.0) == 4
    # flat from 8 rows: 4 rows cost 10% more per row than the best
    flat8 = _buckets(shape, {4: 29.6, 8: 53.8, 16: 107.2})
    assert cohort_rows(flat8, shape) == 8
    assert cohort_rows(flat8, shape, tolerance=0.2) == 4
    # dicts (the executor's own records) read the same
    assert cohort_rows([{"batch": 8, "signature": "16x5x32x32.t512", "replay_ms": 53.8},
                        {"batch": 16, "signature": "16x5x32x32.t512", "replay_ms": 107.2}], shape) == 8


def test_no_timed_bucket_of_the_shape_means_no_cap():
    shape = (16, 5, 32, 32)
    assert cohort_rows([], shape) is None
    assert cohort_rows(_buckets(shape, {4: 0.0, 8: 0.0}), shape) is None  # captured on a CPU: not timed
    assert cohort_rows(_buckets((16, 21, 60, 104), {4: 20.0}), shape) is None
    assert cohort_rows(_buckets((16, 5, 32, 320), {4: 20.0}), (16, 5, 32, 32)) is None  # no prefix match


def test_rows_become_units_and_a_cohort_stays_large_enough_to_double_buffer():
    assert rows_per_unit("batched") == 2 and rows_per_unit("classic") == 1 and rows_per_unit("none") == 1
    assert cohort_units(4, 2) == 2
    assert cohort_units(5, 2) == 3  # a cap never cuts a request's rows apart: rounded up
    assert cohort_units(4, 2, min_units=4) == 4
    assert cohort_units(1, 1) == 1


def test_the_option_takes_auto_off_or_rows_and_names_the_limit_otherwise():
    assert parse_cohort_rows("auto") == "auto" and parse_cohort_rows("OFF") == "off"
    assert parse_cohort_rows("8") == 8 and parse_cohort_rows(4096) == 4096
    for bad in ("0", "-2", "4097", "many", ""):
        with pytest.raises(ValueError, match=r"auto, off or a number of rows in \[1, 4096\]"):
            parse_cohort_rows(bad)
    from fastvideo3.errors import InvalidRequest
    from services.scheduler.config import parse_args
    base = ["--pools", "encoder=127.0.0.1:1", "--pools", "denoiser=127.0.0.1:2", "--pools", "decoder=127.0.0.1:3"]
    assert parse_args(base).cohort_rows == "auto"
    assert parse_args(base + ["--cohort-rows", "16"]).cohort_rows == 16
    with pytest.raises(InvalidRequest) as err:
        parse_args(base + ["--cohort-rows", "0"])
    assert err.value.field == "cohort_rows" and "4096" in err.value.limit


class Timed(Replica):
    """A denoiser placeholder whose description carries timed graph buckets."""

    def __init__(self, buckets):
        super().__init__("denoiser")
        self.last_description = pool_pb2.PoolDescription(role="denoiser", graph_buckets=buckets)


def _cohort_planner(buckets, mode="auto", split=4, **kw):
    p = _planner(batch_cap=batch_cap(mode, split_min_units=split), **kw)
    p.executors["denoiser"] = [Timed(buckets)]
    return p


def _latent_shape():
    """The tiny card's denoise unit: its latent shape and CFG policy."""
    p = _planner()
    _submit(p, _req("probe"))
    for b in p.schedule():  # encode
        p.update_from_output(b, answer(b), 0.01)
    unit = p.schedule()[0].units[0][0]
    return tuple(unit.params["latent_shape"]), unit.params["cfg_policy"]


def test_the_planner_cuts_denoise_batches_into_cohorts_that_finish_in_turn():
    shape, policy = _latent_shape()
    per_unit = rows_per_unit(policy)
    # flat per-row cost from 4 rows: a cohort is 4 rows, raised to 2 units (half of split_min_units=4)
    p = _cohort_planner(_buckets(shape, {1: 8.0, 2: 16.7, 4: 26.7, 8: 53.7, 16: 113.0}))
    runs = [_submit(p, _req(f"r{i}", steps=3)) for i in range(6)]
    busy = {"n": 0}

    def capacity(ex):
        return (2 - busy["n"], busy["n"]) if ex.role == "denoiser" else None

    for b in p.schedule(capacity):  # encode
        p.update_from_output(b, answer(b), 0.01)
    cohort = max(2, -(-4 // per_unit))
    first = p.schedule(capacity, split_min_units=4)
    denoise = [b for b in first if b.units[0][0].kind == "diffusion_step"]
    assert [len(b.units) for b in denoise] == [cohort, cohort]  # two cohorts in flight, double-buffered
    assert [u.request_id for b in denoise for u in b.work] == [f"r{i}" for i in range(2 * cohort)]
    assert p.counters["cohort_capped_batches"] == 1 and p.cohort_caps[denoise[0].work[0].shape_sig] == cohort
    waiting = runs[2 * cohort:]
    assert all(r.pending is not None and not r.in_flight for r in waiting)
    # the cohorts in front step to the end before the ones behind them take their first step
    front, done = {r.request_id for r in runs[:2 * cohort]}, {r.request_id: 0 for r in runs}
    batches = denoise
    while any(done[rid] < 3 for rid in front):
        for b in batches:
            for u in b.work:
                done[u.request_id] += 1
            p.update_from_output(b, answer(b), 0.01)
        assert all(done[r.request_id] == 0 for r in waiting)
        batches = [b for b in p.schedule(capacity, split_min_units=4) if b.units[0][0].kind == "diffusion_step"]
    assert batches and {u.request_id for b in batches for u in b.work} <= {r.request_id for r in waiting}


def test_off_a_fixed_row_count_and_an_untimed_replica():
    shape, policy = _latent_shape()
    per_unit = rows_per_unit(policy)
    timed = _buckets(shape, {4: 26.7, 8: 53.7, 16: 113.0})

    def first_sizes(p):
        for i in range(8):
            _submit(p, _req(f"r{i}"))
        for b in p.schedule():  # encode
            p.update_from_output(b, answer(b), 0.01)
        return [len(b.units) for b in p.schedule() if b.units[0][0].kind == "diffusion_step"]

    assert first_sizes(_cohort_planner(timed, "off", max_batch=16)) == [8]
    assert first_sizes(_cohort_planner(timed, 6 * per_unit, split=0, max_batch=16)) == [6, 2]
    assert first_sizes(_cohort_planner(timed, 64 * per_unit, split=0, max_batch=16)) == [8]  # max_batch still bounds
    assert first_sizes(_cohort_planner([], "auto", split=0, max_batch=16)) == [8]  # no timed bucket: not capped
    capped = _cohort_planner(timed, "auto", split=0, max_batch=16)
    assert first_sizes(capped) == [max(1, -(-4 // per_unit))] * (8 // max(1, -(-4 // per_unit)))


def test_the_fleet_scheduler_caps_by_default_and_not_in_batch_invariant_mode_or_without_batching():
    from services.scheduler.fleet_runtime import FleetRuntime
    table = {"encoder": [Replica("encoder")], "denoiser": [Replica("denoiser")], "decoder": [Replica("decoder")]}

    def cap_of(**kw):
        return FleetRuntime(table, **kw)._core.planner.batch_cap

    assert cap_of() is not None  # auto
    assert cap_of(cohort_rows=8) is not None
    assert cap_of(cohort_rows="off") is None
    assert cap_of(batch_bucket=4) is None  # every batch is padded to the bucket there
    assert cap_of(batching=False) is None
