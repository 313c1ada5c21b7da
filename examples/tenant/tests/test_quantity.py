from fractions import Fraction

import pytest

from quantity import parse_quantity


@pytest.mark.parametrize(
    "text,value",
    [("500m", Fraction(1, 2)), ("2", 2), ("8Gi", 8 * 2**30), ("1k", 1000), ("1e3", 1000), ("1.5", Fraction(3, 2)), (3, 3)],
)
def test_quantities_parse_exactly(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "lots", "1Q", "--1", "8 Gi"])
def test_non_quantities_are_refused_with_the_text(text):
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)
