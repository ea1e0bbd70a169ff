"""The flight recorder, the collective guard, the consistency check and the timeout policy
in one process, with a fake platform and abstract meshes (the multi-process behaviour is in
tests/dist/test_hang.py and tests/mindspore/test_ms_hang.py)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest

from hyper_shard import DeviceMesh, Replicate, Shard
from hyper_shard.debug import check_consistency, clear_recent_ops, dump_recent_ops, recent_ops
from hyper_shard.errors import CollectiveError, DivergenceError, HyperShardError
from hyper_shard.flight import MODE, OpFrame, RedistributeFrame, StepFrame, collective, stack
from hyper_shard.flight import consistency as cons
from hyper_shard.flight.recorder import RECENT
from hyper_shard.platform.timeouts import DEFAULT_TIMEOUT, explicit_timeout, resolve_timeout
from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride


class _Group:
    def __init__(self, ranks, timeout=None):
        self.ranks = tuple(ranks)
        self.timeout = timeout


class _Plat:
    """Rank 0 of a fake 2-rank world: ``others`` are the other ranks' fingerprints."""

    name = "fake"
    comm_errors = (RuntimeError,)

    def __init__(self, others=None):
        self.others = others
        self.exchanged = 0

    def get_rank(self):
        return 0

    def all_gather_bytes(self, data, group, n):
        self.exchanged += 1
        return [data] + [self.others or data] * (n - 1)


def _spec(shape=(8, 4), names=("tp",)):
    mesh = DeviceMesh.abstract((2,), mesh_dim_names=names)
    return DTensorSpec(mesh, (Shard(0),), TensorMeta(shape, contiguous_stride(shape), "f32", 4))


@pytest.fixture(autouse=True)
def _fresh_recorder():
    clear_recent_ops()
    before = MODE.on
    MODE.on = False
    yield
    MODE.on = before
    clear_recent_ops()


def _frames(spec):
    f = [
        OpFrame(lambda fn: "torch.softmax", None, [spec]),
        RedistributeFrame("redistribute", spec, (Replicate(),)),
        StepFrame("all_gather", 0, spec, spec.placements, Replicate()),
    ]
    return f


def test_frames_describe_the_op_redistribution_and_step():
    spec = _spec()
    op, red, step = _frames(spec)
    assert op.describe() == "torch.softmax(DTensor[8, 4][S(0)])"
    assert red.describe() == "redistribute DTensor[8, 4][S(0)] -> [R]"
    assert step.describe() == "all_gather on mesh dim 'tp' (size 2) of DTensor[8, 4][S(0)] -> [R]"
    # unnamed mesh dims are numbered
    assert (
        "mesh dim 0 (size 2)"
        in StepFrame("all_reduce", 0, _spec(names=None), (Shard(0),), Replicate()).describe()
    )


def test_collective_records_what_ran_and_what_it_ran_for():
    spec = _spec()
    frames = stack()
    frames.extend(_frames(spec))
    try:
        out = collective(
            _Plat(), "all_gather", _Group([0, 1]), (4, 4), "float32", lambda a, b=0: a + b, 1, b=2
        )
    finally:
        del frames[:]
    assert out == 3
    (rec,) = recent_ops()
    assert rec.collective == "all_gather" and rec.ranks == (0, 1) and rec.shape == (4, 4)
    assert rec.status == "ok" and rec.seconds is not None and rec.seconds >= 0
    assert rec.op == "torch.softmax(DTensor[8, 4][S(0)])"
    assert rec.redistribution == "redistribute DTensor[8, 4][S(0)] -> [R]"
    assert rec.step.startswith("all_gather on mesh dim 'tp'")
    d = rec.as_dict()
    assert d["context"][0].startswith("step all_gather") and d["dtype"] == "float32"
    assert "all_gather of [4, 4] float32 over ranks [0, 1]" in str(rec)


def test_backend_errors_become_collective_error_from_the_cause():
    spec = _spec()
    collective(_Plat(), "broadcast", _Group([0, 1]), (8, 4), "float32", lambda: None)
    frames = stack()
    frames.extend(_frames(spec))

    def timed_out():
        raise RuntimeError(
            "[gloo/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"
        )

    try:
        with pytest.raises(CollectiveError) as ei:
            collective(
                _Plat(),
                "all_gather",
                _Group([0, 1], timedelta(seconds=3)),
                (4, 4),
                "float32",
                timed_out,
            )
    finally:
        del frames[:]
    e = ei.value
    assert isinstance(e, HyperShardError) and isinstance(e.__cause__, RuntimeError)
    assert e.reason == "timeout" and e.collective == "all_gather" and e.ranks == (0, 1)
    msg = str(e)
    assert msg.startswith(
        "all_gather timed out on rank 0 (fake: [gloo/unbound_buffer.cc:78] Timed out"
    )
    assert "group timeout 0:00:03" in msg
    assert "  step: all_gather on mesh dim 'tp' (size 2) of DTensor[8, 4][S(0)] -> [R]" in msg
    assert "  for: redistribute DTensor[8, 4][S(0)] -> [R]" in msg
    assert "  op: torch.softmax(DTensor[8, 4][S(0)])" in msg
    assert "HYPER_SHARD_CHECK_CONSISTENCY=1" in msg
    # the last collectives: the broadcast, then this one, failed
    tail = msg.splitlines()[-2:]
    assert "broadcast of [8, 4]" in tail[0] and "FAILED" in tail[1]
    assert recent_ops()[-1].status == "failed"
    # another exception type is not the backend's: it passes through untouched
    with pytest.raises(KeyError):
        collective(_Plat(), "all_reduce", _Group([0, 1]), (1,), "f", lambda: {}["x"])


def test_a_nested_collective_error_is_not_wrapped_again():
    """A guarded call inside a guarded call (a platform collective built on another):
    the inner CollectiveError reaches the caller as it is (CollectiveError is a
    RuntimeError, one of the fake backend's comm_errors)."""

    def inner():
        raise RuntimeError("Timed out waiting 3000ms for recv operation")

    def outer():
        collective(_Plat(), "all_gather", _Group([0, 1]), (4,), "float32", inner)

    with pytest.raises(CollectiveError) as ei:
        collective(_Plat(), "all_to_all", _Group([0, 1]), (4,), "float32", outer)
    e = ei.value
    assert e.collective == "all_gather" and isinstance(e.__cause__, RuntimeError)
    assert not isinstance(e.__cause__, CollectiveError)
    assert [r.status for r in recent_ops()] == ["failed", "failed"]


@pytest.mark.parametrize(
    "msg, reason",
    [
        ("[pair.cc:537] Read error: Connection reset by peer", "peer lost"),
        ("[pair.cc:553] Connection closed by peer [127.0.0.1]:1234", "peer lost"),
        ("Timed out waiting 5000ms for send operation to complete", "timeout"),
        ("AllReduce failed.", "failed"),  # mccl says only this, but it took no time
    ],
)
def test_reason_of_a_failed_collective(msg, reason):
    def boom():
        raise RuntimeError(msg)

    with pytest.raises(CollectiveError) as ei:
        collective(_Plat(), "all_reduce", _Group([0, 1], timedelta(seconds=30)), (4,), "f", boom)
    assert ei.value.reason == reason
    assert "no hyper_shard op or redistribution" in str(ei.value)  # no frame was open


def test_a_failure_after_the_whole_timeout_is_a_timeout():
    import time

    def slow_fail():
        time.sleep(0.06)
        raise RuntimeError("AllReduce failed.")  # mccl after MS_CPU_COMM_OP_TIMEOUT

    with pytest.raises(CollectiveError) as ei:
        collective(
            _Plat(), "all_reduce", _Group([0, 1], timedelta(seconds=0.05)), (4,), "f", slow_fail
        )
    assert ei.value.reason == "timeout"


def test_recorder_is_bounded_and_dumps(tmp_path):
    for i in range(RECENT.maxlen + 5):
        collective(_Plat(), "all_reduce", _Group([0, 1]), (i,), "f", lambda: None)
    recs = recent_ops()
    assert len(recs) == RECENT.maxlen and recs[-1].shape == (RECENT.maxlen + 4,)
    assert [r.shape for r in recent_ops(2)] == [(RECENT.maxlen + 3,), (RECENT.maxlen + 4,)]
    assert recent_ops(0) == []
    path = tmp_path / "recent.txt"
    text = dump_recent_ops(path)
    assert path.read_text() == text and len(text.splitlines()) == RECENT.maxlen + 1
    buf = io.StringIO()
    dump_recent_ops(buf)
    assert buf.getvalue() == text


def test_consistency_mode_off_exchanges_nothing():
    plat = _Plat(others=b"x" * cons.PAYLOAD)
    collective(plat, "all_reduce", _Group([0, 1]), (4,), "f", lambda: None)
    assert plat.exchanged == 0


def test_consistency_mode_passes_equal_fingerprints_and_raises_on_different_ones():
    spec = _spec()
    frames = stack()
    frames.extend(_frames(spec))
    try:
        with check_consistency():
            same = _Plat()
            collective(same, "all_gather", _Group([0, 1]), (4, 4), "float32", lambda: None)
            assert same.exchanged == 1
            theirs = cons.fingerprint("all_to_all", (0, 1), (2, 4, 2), "float32", ())
            other = _Plat(others=cons._encode(theirs))
            ran = []
            with pytest.raises(DivergenceError) as ei:
                collective(
                    other, "all_gather", _Group([0, 1]), (4, 4), "float32", lambda: ran.append(1)
                )
            assert not ran  # raised before the mismatched collective
            with check_consistency(False):
                collective(other, "all_gather", _Group([0, 1]), (4, 4), "float32", lambda: None)
            assert MODE.on
        assert not MODE.on
    finally:
        del frames[:]
    e = ei.value
    assert isinstance(e, CollectiveError) and e.reason == "divergence"
    assert e.doing[1] == theirs and e.doing[0].startswith("all_gather of [4, 4] float32")
    assert "op torch.softmax(DTensor[8, 4][S(0)])" in e.doing[0]
    msg = str(e)
    assert "rank 0 (this rank): all_gather of [4, 4]" in msg and "rank 1: all_to_all of" in msg
    # a single-rank group needs no exchange
    with check_consistency():
        lone = _Plat()
        collective(lone, "all_gather", _Group([0]), (4, 4), "float32", lambda: None)
        assert lone.exchanged == 0


def test_a_long_fingerprint_is_cut_but_fully_hashed():
    long_a = "x" * (2 * cons.PAYLOAD)
    long_b = long_a + "y"
    ha, ta = cons._decode(cons._encode(long_a))
    hb, tb = cons._decode(cons._encode(long_b))
    assert ha != hb and ta == tb and ta.endswith(" ...")
    assert len(cons._encode(long_a)) == cons.PAYLOAD


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("0", False), ("", False)])
def test_consistency_env_variable(monkeypatch, value, on):
    monkeypatch.setenv("HYPER_SHARD_CHECK_CONSISTENCY", value)
    assert cons._Mode().on is on


def test_timeouts(monkeypatch):
    monkeypatch.delenv("HYPER_SHARD_TIMEOUT", raising=False)
    assert explicit_timeout(None) is None and resolve_timeout(None) == DEFAULT_TIMEOUT
    assert DEFAULT_TIMEOUT == timedelta(minutes=10)
    assert resolve_timeout(timedelta(seconds=7)) == timedelta(seconds=7)
    assert resolve_timeout(2.5) == timedelta(seconds=2.5)
    monkeypatch.setenv("HYPER_SHARD_TIMEOUT", "120")
    assert explicit_timeout(None) == timedelta(seconds=120)
    assert resolve_timeout(timedelta(seconds=3)) == timedelta(seconds=3)  # the argument wins
    monkeypatch.setenv("HYPER_SHARD_TIMEOUT", "soon")
    with pytest.raises(
        ValueError, match="HYPER_SHARD_TIMEOUT='soon': expected a number of seconds"
    ):
        resolve_timeout(None)
    with pytest.raises(ValueError, match="must be positive"):
        resolve_timeout(timedelta(0))
    with pytest.raises(TypeError, match="timedelta or a number of seconds"):
        resolve_timeout("5")
