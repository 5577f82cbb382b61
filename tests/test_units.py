"""`dstrace.units`: each unit written one way, in the unit a table would choose."""
from dstrace.units import change, gbps, ms, percent, percent_range, ratio, size, spread, step_ms, us


def test_a_size_takes_the_largest_unit_that_leaves_at_least_one():
    assert [size(n) for n in (None, 999, 1e3, 1e5, 5e8, 1e9, 15.23e9)] == [
        "-", "999 B", "1.00 kB", "100.00 kB", "500.00 MB", "1.00 GB", "15.23 GB"]


def test_times_shares_and_ratios():
    assert (ms(434_923.0), ms(None), step_ms(36.04), us(-12.34, signed=True)) == ("434.92 ms", "-", "36.0 ms",
                                                                                  "-12.3 us")
    assert (percent(0.925), percent(0.1234, 1), percent(None), ratio(2.186), gbps(12.345)) == (
        "92%", "12.3%", "-", "2.19x", "12.35")


def test_ranges_and_changes_say_their_unit_once():
    assert percent_range(0.301, 0.304) == "30%" and percent_range(0.30, 0.45) == "30-45%"
    assert change(step_ms(36.0), step_ms(58.0)) == "36.0 -> 58.0 ms"
    assert change(size(2e9), size(5e8)) == "2.00 GB -> 500.00 MB"
    assert change(ms(2_500.0), ms(20_000.0), " to ") == "2.50 to 20.00 ms"
    assert spread(347.04, 346.2, 390.4, " ms/step") == "347.0 ms/step [346.2-390.4]"
