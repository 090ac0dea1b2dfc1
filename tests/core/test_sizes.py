"""ome.core.sizes: the one parser of memory sizes (that the layers below TensorFlow import
without it: tests/core/test_layout.py)."""
import pytest

from ome import errors
from ome.core.sizes import format_bytes, parse_bytes

MiB = 2**20


@pytest.mark.parametrize("value, expected", [
    ("1048576", 1048576), ("2GiB", 2 * 2**30), ("512MiB", 512 * MiB), ("1.5GB", 1_500_000_000),
    ("1.5 gib", 3 * 2**29), (" 64kb ", 64_000), ("0.5KiB", 512), ("3TB", 3 * 10**12),
    ("100B", 100), (4096, 4096), (1.5e9, 1_500_000_000), (1023.9, 1023),
])
def test_sizes_are_whole_bytes(value, expected):
    assert parse_bytes(value) == expected


@pytest.mark.parametrize("value, fragment", [
    ("", "cannot parse"), ("lots", "cannot parse"), ("-1GiB", "cannot parse"),
    ("1e9", "cannot parse"), ("GiB", "cannot parse"), ("12 parsecs", "unknown unit"),
    ("2XB", "unknown unit 'XB'"), ("1.5", "fraction of a byte"), ("0.1B", "fraction of a byte"),
    ("0", "must be positive"), ("0.5", "fraction of a byte"), (0.5, "must be positive"),
    (-3, "must be positive"), (float("inf"), "must be positive"), (True, "got True"),
    (None, "got None"),
])
def test_a_bad_size_is_refused_naming_what_it_was_for(value, fragment):
    with pytest.raises(errors.BudgetError, match=fragment) as raised:
        parse_bytes(value, what="--budget")
    assert "--budget" in str(raised.value) and isinstance(raised.value, ValueError)


def test_format_bytes_picks_the_unit():
    assert [format_bytes(n) for n in (12, 3 * 2**10, 1.5 * MiB, 2**31)] == [
        "12 B", "3.0 KiB", "1.5 MiB", "2.0 GiB"]
