"""One validator for counts and one for boundaries, used by every entry point."""

import pytest

import utils
from utils import validation


@pytest.mark.parametrize("parts, message", [
    ([1, 2, 4], r"must start at 0"),
    ([0, 2, 3], r"must end at 4 \(the layer count\)"),
    ([0, 2, 2, 4], r"\[0, 2, 2, 4\] are not strictly increasing: stage 1 would own no layers"),
    ([0, 4], r"have 2 entries; 3 stages need 4 boundaries"),
    ([0, 1.5, 3, 4], r"boundary \[1\] = 1.5 is not an integer layer index"),
    ([0, 2.0, 3, 4], r"boundary \[1\] = 2.0 is not an integer"),  # a float is never a layer index
    ([0, True, 3, 4], r"boundary \[1\] = True is not an integer"),
    ("0,2,4", r"must be a list of ints"),
])
def test_boundary_errors_say_what_to_change(parts, message):
    with pytest.raises(ValueError, match=message):
        validation.boundaries(parts, n_layers=4, num_stages=3 if len(parts) != 3 else 2)


def test_boundaries_accept_tuples_and_numpy_integers():
    np = pytest.importorskip("numpy")
    assert validation.boundaries((0, 1, 4), n_layers=4, num_stages=2) == [0, 1, 4]
    assert validation.boundaries(np.array([0, 1, 4]), n_layers=4, num_stages=2) == [0, 1, 4]
    with pytest.raises(ValueError, match="3 stages need at least 3 layers"):
        validation.boundaries([0, 1, 2, 2], n_layers=2, num_stages=3)


def test_counts():
    np = pytest.importorskip("numpy")
    assert validation.count("m", 8) == 8
    assert validation.count("m", np.int64(8)) == 8
    assert validation.count("m", 8.0) == 8  # integral floats come out of numpy sweeps
    assert validation.count("w", 0, minimum=0) == 0
    with pytest.raises(TypeError, match=r"m \(micro-batches\) must be an integer, got True"):
        validation.count("m", True, meaning="micro-batches")
    with pytest.raises(TypeError, match="must be an integer, got 2.5"):
        validation.count("m", 2.5)
    with pytest.raises(ValueError, match="m must be at least 1, got 0"):
        validation.count("m", 0)


@pytest.mark.parametrize("call", [
    lambda: utils.build_schedule("1f1b", True, 4),
    lambda: utils.bubble_ratio_1f1b(True, 4),
    lambda: utils.partition_layers([1.0, 2.0], True),
    lambda: utils.JobSpec(num_stages=True).check(),
])
def test_every_entry_point_refuses_a_boolean_count(call):
    # Before, each module had its own integer check and some took True as the count 1.
    with pytest.raises(TypeError, match="must be an integer, got True"):
        call()
