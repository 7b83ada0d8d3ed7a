"""Checks that judge what they claim to: a public check a common mistake passes is a check
that teaches the wrong thing."""

import pytest

from tests.grading.submissions import ROOT
from utils.grading.notebook_source import LabSource, find_lab


def _public_check(lab: str, check_id: str) -> str:
    source = LabSource.load(find_lab(ROOT, lab))
    return next(c.public_source for c in source.checks if c.id == check_id)


def test_lab01_public_check_catches_a_forgotten_one_minus():
    # Before, both public cases had the answer 0.5, where 1 - y == y: forgetting "1 -" passed.
    check = _public_check("lab01", "predict_public")

    def right(u_inf, x, m):
        return float(1.0 - u_inf * m / (m + x))

    def forgot_one_minus(u_inf, x, m):
        return float(u_inf * m / (m + x))

    exec(check, {"predict_bubble": right})
    with pytest.raises(AssertionError, match="predict_bubble"):
        exec(check, {"predict_bubble": forgot_one_minus})
