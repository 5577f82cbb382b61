"""Matching collectives across ranks, splitting wait from transfer, recovering clock offsets."""
import pytest

from tests.fixtures.reports import analyze_dir
from tests.fixtures.traces import TraceBuilder, write_zero3_traces


def test_wait_split_names_the_late_rank(zero3_dir):
    a = analyze_dir(zero3_dir)
    r0, r1 = a.ranks[0], a.ranks[1]
    ag0 = r0.collectives["AllGather"]
    # 4 steps x 4 layers; rank 1 arrives 300 us late to each 500 us (rank 0) AllGather
    assert ag0.count == 16
    assert ag0.wait_us == pytest.approx(16 * 300.0)
    assert ag0.transfer_us == pytest.approx(16 * 200.0)
    assert r0.waited_for == {1: pytest.approx(16 * 300.0)}
    assert r1.wait_us == 0.0 and r1.late_count == 16
    assert r1.caused_wait_us == pytest.approx(16 * 300.0)
    assert ag0.busbw_transfer_GBps == pytest.approx(r1.collectives["AllGather"].busbw_GBps)
    peer = next(f for f in a.findings if f.id == "peer-wait")
    assert peer.ranks == [0]
    assert peer.evidence["late_ranks"]["1"]["late_count"] == 16


@pytest.mark.parametrize("offset_us", [5_000.0, -123_456.7])
def test_clock_offset_of_another_host_is_recovered_and_applied(tmp_path, offset_us):
    hosts = {0: "hostA", 1: "hostB"}
    write_zero3_traces(str(tmp_path), host_of=hosts.get, clock_offsets={1: offset_us})
    a = analyze_dir(tmp_path)
    clock = a.clock[1]
    assert clock.applied and clock.via == 0 and clock.matched == 16
    assert clock.offset_us == pytest.approx(offset_us)
    assert clock.residual_us == pytest.approx(0.0, abs=1e-3)
    assert a.ranks[0].collectives["AllGather"].wait_us == pytest.approx(16 * 300.0)
    assert any("clocks aligned" in n for n in a.notes)


def test_same_host_clock_left_alone_unless_asked(tmp_path):
    write_zero3_traces(str(tmp_path), clock_offsets={1: 40.0})
    auto = analyze_dir(tmp_path)
    assert not auto.clock[1].applied
    assert auto.clock[1].offset_us == pytest.approx(40.0)
    assert auto.clock[1].residual_us == pytest.approx(40.0)
    forced = analyze_dir(tmp_path, clock_policy="always")
    assert forced.clock[1].applied and forced.clock[1].residual_us == pytest.approx(0.0, abs=1e-3)
    assert not analyze_dir(tmp_path, clock_policy="never").clock[1].applied


def test_groups_are_matched_separately_and_offsets_chain(tmp_path):
    """Ranks 2 and 3 (host B) share a TP group; only rank 2 is in the world group with rank 0."""
    builders = [TraceBuilder(r, world_size=4, host="hostA" if r < 2 else "hostB",
                             clock_offset_us=0.0 if r < 2 else 7_000.0) for r in range(4)]
    for i in range(3):
        t = i * 1000.0
        for b in builders:
            late = 100.0 if b.rank == 3 else 0.0
            b.nccl("AllReduce", t + late, 300.0 - late, 1000, 1000, pg="1", ranks=(2, 3)) if b.rank >= 2 else None
            b.nccl("AllReduce", t + 500.0 + late, 100.0 - late, 1000, 1000, pg="2", ranks=(0, 1)) if b.rank < 2 else None
            b.nccl("AllGather", t + 600.0, 100.0, 500, 1000, pg="3", ranks=(0, 2)) if b.rank in (0, 2) else None
            b.compute(t + 800.0, 50.0)
    for b in builders:
        b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    assert a.clock[2].offset_us == pytest.approx(7_000.0) and a.clock[2].via == 0
    assert a.clock[3].offset_us == pytest.approx(7_000.0) and a.clock[3].via == 2
    assert a.clock[1].offset_us == pytest.approx(0.0) and not a.clock[1].applied
    assert a.ranks[2].waited_for == {3: pytest.approx(300.0)}
    assert a.ranks[0].wait_us == 0.0


def test_count_mismatch_is_warned_and_extra_calls_are_transfer(tmp_path):
    for r in range(2):
        b = TraceBuilder(r)
        for i in range(3 if r == 0 else 2):
            b.nccl("AllGather", i * 1000.0 + 50.0 * r, 200.0 - 50.0 * r, 100, 200)
        b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    assert any("AllGather counts differ" in w for w in a.warnings)
    ag = a.ranks[0].collectives["AllGather"]
    assert ag.count == 3 and ag.wait_us == pytest.approx(100.0)
