"""Summary statistics: the inter-token gap histogram gives the statistics of the gaps it counts."""

import numpy as np
import pytest

from twin.results import NS, histogram_stats, stats


def test_histogram_stats_equal_the_stats_of_the_expanded_gaps():
    """Read off the histogram without expanding it: numpy's percentiles of the expanded gaps to the bit, and
    the exact mean (the expanded array's float sum may differ from it in the last bits)."""
    from fractions import Fraction

    rng = np.random.default_rng(7)
    cases = [{int(g): int(c) for g, c in zip(rng.integers(1, 10**9, 500), rng.integers(1, 50, 500))},
             {7: 3}, {5: 1}, {1: 1, 2: 1}, {10**12: 2, 3: 10**6}]
    for counts in cases:
        gaps = sorted(counts)
        expanded = np.repeat(np.array(gaps, dtype=np.float64), [counts[g] for g in gaps]) / NS
        got, want = histogram_stats(counts), stats(expanded)
        assert [got[k] for k in ("p50", "p90", "p99")] == [want[k] for k in ("p50", "p90", "p99")], counts
        exact = Fraction(sum(g * c for g, c in counts.items()), sum(counts.values()) * 10**9)
        assert abs(Fraction(got["mean"]) - exact) <= abs(exact) * Fraction(1, 2**51)
        assert got["mean"] == pytest.approx(want["mean"], rel=1e-12)
    # counts split over repeated values, and empty bins, give the same statistics
    split = (np.array([9, 4, 9, 4, 6]), np.array([2, 1, 3, 0, 5]))
    assert histogram_stats(split) == histogram_stats({9: 5, 4: 1, 6: 5})
    assert np.isnan(histogram_stats({})["p50"])


def test_a_run_without_token_times_leaves_none_from_an_earlier_run_in_its_folder(tmp_path):
    """Found by fuzzing: results written into a folder an earlier run with metrics.record_token_times had
    used kept that run's token_times.json beside the new run's tables."""
    from twin.config import load_config
    from twin.runner import Simulation

    base = {"model": {"name": "Qwen/Qwen3-0.6B"},
            "workload": {"kind": "synthetic", "num_requests": 3, "arrival": {"kind": "all_at_once"},
                         "input_tokens": {"fixed": 20}, "output_tokens": {"fixed": 4}}}
    Simulation(load_config(base, ["metrics.record_token_times=true"])).run().write(tmp_path)
    assert (tmp_path / "token_times.json").exists()
    Simulation(load_config(base)).run().write(tmp_path)
    assert not (tmp_path / "token_times.json").exists()


# ------------------------------------------------------------------------------- bounded memory
def _small_run(**overrides):
    from twin.config import load_config

    base = {"model": {"name": "Qwen/Qwen3-0.6B"}, "system": {"replicas": 2},
            "workload": {"kind": "synthetic", "num_requests": 60, "arrival": {"kind": "poisson", "rate_per_s": 40.0},
                         "input_tokens": {"low": 20, "high": 200}, "output_tokens": {"low": 2, "high": 30}}}
    return load_config(base, [f"{k}={v}" for k, v in overrides.items()])


def test_a_run_lets_go_of_each_request_and_its_session_when_it_ends():
    """No request object outlives its end (nor a session's script once it ran): what a run keeps of a
    request is its row, so memory does not grow with the requests it has finished."""
    import gc

    from twin.core.request import Request
    from twin.runner import Simulation
    from workloads.sessions import Session

    def alive(kind: type) -> list:
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, kind)]

    earlier = {id(o) for o in alive(Request) + alive(Session)}   # (what earlier tests still hold)
    sim = Simulation(_small_run())
    table = sim.run().requests
    assert len(table) == 60 and (table["status"] == "finished").all()
    assert [s for s in alive(Session) if id(s) not in earlier] == []
    assert sim.driver.live == {} and sim.driver.requests is None
    # What is left is the last batch a worker's process still names (its last step's locals), no more.
    last = {w: table["finish_s"][table["worker"] == w].max() for w in set(table["worker"])}
    left = [r for r in alive(Request) if id(r) not in earlier]
    assert len(left) <= len(sim.workers)
    assert all(r.finish_ns / 1e9 == last[r.worker] for r in left)
    del sim, left
    kept = Simulation(_small_run(), keep_requests=True)   # (the guard sees requests that are kept)
    kept.run()
    assert len([r for r in alive(Request) if id(r) not in earlier]) == 60


def test_the_rows_written_as_requests_end_are_the_table_of_every_request():
    """The log's table (rows written as requests end, in any order) equals the table of the kept request
    objects read after the run, row for row, in submission order; so does a disaggregated run's, whose
    rows wait for the KV lifecycle to end."""
    from twin.request_log import request_table
    from twin.runner import Simulation

    for cfg in (_small_run(), _small_run(**{"system.kind": "disaggregated"})):
        sim = Simulation(cfg, keep_requests=True)
        table = sim.run().requests
        assert sim.driver.requests is not None
        expected = request_table(sim.driver.requests)
        for name in table.dtype.names:
            if table.dtype[name].kind == "f":
                assert np.array_equal(table[name], expected[name], equal_nan=True), name
            else:
                assert list(table[name]) == list(expected[name]), name
        assert list(table["id"]) == list(range(60))


def test_the_log_orders_rows_by_request_id_and_holds_those_whose_kv_lives_on():
    from twin.core.lifecycle import KVRecord, KVState
    from twin.core.request import Request, Status
    from twin.request_log import RequestLog

    def ended(rid: int, kv: KVRecord | None = None) -> Request:
        r = Request(id=rid, prompt_tokens=4, max_output_tokens=1, block_keys=(), arrival_ns=rid)
        r.status = Status.FINISHED
        r.kv = kv
        return r

    log = RequestLog(chunk_rows=2)
    staged = KVRecord(1, 0)
    staged.to(KVState.STAGED, 5)
    log.add(ended(3))
    log.add(ended(1, staged))
    assert set(log.held) == {1}
    log.add(ended(0))
    log.add(ended(2))
    staged.to(KVState.FREED, 9)
    log.add(ended(4))        # the next write finds the held row's KV at its end and writes it too
    assert log.held == {} and log.count == 5
    table = log.close().table()
    assert list(table["id"]) == [0, 1, 2, 3, 4]
    assert list(table["kv_state"]) == ["", "freed", "", "", ""]


def _ended_requests() -> list:
    """Seven ended requests in the order they end (not their ids'), with text of any kind and a KV record."""
    from twin.core.lifecycle import KVRecord, KVState
    from twin.core.request import Request, Status

    out = []
    for rid, session in zip((4, 0, 6, 1, 5, 3, 2), ("café-セ", "", "a,b \"q\"", "s1", "s1", "x" * 300, "z")):
        r = Request(id=rid, prompt_tokens=4 + rid, max_output_tokens=1, block_keys=(), arrival_ns=10 * rid,
                    session=session, turn=rid % 2)
        r.status = Status.FINISHED if rid % 3 else Status.FAILED
        r.fail_reason = "" if rid % 3 else f"needs {rid} blocks but the pool has 2 — refused"
        if rid == 5:
            r.kv = KVRecord(5, 0)
            r.kv.to(KVState.STAGED, 3)
            r.kv.to(KVState.FREED, 9)
        out.append(r)
    return out


def test_the_log_on_disk_reads_back_the_table_by_column_chunk_and_whole():
    """Rows stored as requests end (three to a chunk, so ids land in the file out of order and past its
    end) read back as the table of the same requests in id order: whole, a column at a time and a chunk at
    a time, text (any Unicode, commas, quotes, 300 characters, none) and codes included."""
    from twin.request_log import REQUEST_FIELDS, RequestLog, request_table

    ended = _ended_requests()
    log = RequestLog(chunk_rows=3)
    for r in ended:
        log.add(r)
    stored = log.close()
    expected = request_table(sorted(ended, key=lambda r: r.id))
    whole = stored.table()
    assert len(stored) == 7 and list(whole["id"]) == list(range(7))
    assert list(whole["kv_state"]) == ["", "", "", "", "", "freed", ""]
    assert list(whole["status"]) == ["failed", "finished", "finished", "failed", "finished", "finished", "failed"]
    assert whole["session"][4] == "café-セ" and whole["fail_reason"][3] == "needs 3 blocks but the pool has 2 — refused"
    chunked = np.concatenate(list(stored.chunks(2)))
    for name, _ in REQUEST_FIELDS:
        for got in (whole[name], stored.column(name), chunked[name]):
            if expected.dtype[name].kind == "f":
                assert np.array_equal(got, expected[name], equal_nan=True), name
            else:
                assert list(got) == list(expected[name]), name


def test_requests_csv_from_disk_equals_the_in_memory_tables(tmp_path):
    from twin.request_log import RequestLog, request_table
    from twin.results import write_table_csv

    ended = _ended_requests()
    log = RequestLog(chunk_rows=3)
    for r in ended:
        log.add(r)
    write_table_csv(tmp_path / "disk.csv", log.close())
    write_table_csv(tmp_path / "memory.csv", request_table(sorted(ended, key=lambda r: r.id)))
    text = (tmp_path / "disk.csv").read_bytes()
    assert text == (tmp_path / "memory.csv").read_bytes()
    assert text.count(b"\n") == 8 and '"a,b ""q"""'.encode() in text


def test_a_log_missing_a_request_id_is_an_invariant_error():
    from twin.core.errors import InvariantError
    from twin.request_log import RequestLog

    log = RequestLog(chunk_rows=2)
    for r in _ended_requests():
        if r.id != 3:
            log.add(r)
    with pytest.raises(InvariantError, match=r"request ids are not 0 \.\. 6: 6 rows written"):
        log.close()


def test_start_times_in_bulk_round_as_to_ns_rounds_each():
    """A run's session start times are converted as one array (a long run plans millions); each equals
    twin.core.clock.to_ns of its time, ties to even included, and times outside the clock's range go
    through to_ns, which refuses them as before."""
    from twin.core.clock import to_ns
    from twin.runner import _start_times_ns

    rng = np.random.default_rng(1)
    times = np.concatenate([np.cumsum(rng.exponential(1 / 60, 5000)), rng.uniform(0, 1e6, 5000),
                            np.arange(2000) * 0.5e-9, np.arange(2000) * 1.5e-9 + 1e-3])
    got = _start_times_ns(times)
    assert isinstance(got, np.ndarray) and got.tolist() == [to_ns(float(t)) for t in times]
    assert _start_times_ns([2.5e-9, 3.5e-9]).tolist() == [2, 4]
    with pytest.raises(ValueError):
        _start_times_ns([1.0, float("nan")])


def test_the_exact_sum_of_gaps_overflows_nothing_across_its_chunks():
    """The ITL mean's numerator: products and sums past 64 bits stay exact, whatever the chunking."""
    from twin.results import exact_dot

    a = np.array([2**62, 3, 5] * 7, dtype=np.int64)
    b = np.array([7, 2**40, 1] * 7, dtype=np.int64)
    want = 7 * (2**62 * 7 + 3 * 2**40 + 5)
    assert exact_dot(a, b) == want and exact_dot(a, b, chunk=4) == want and exact_dot(a[:0], b[:0]) == 0
