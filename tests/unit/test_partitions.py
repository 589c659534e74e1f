"""The tests' Java-compatible partition function against Kafka's own murmur2 test vectors (UtilsTest)."""

from __future__ import annotations

import pytest

from tests.support.partitions import java_partition, murmur2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        ("abc", 479470107),
    ],
)
def test_murmur2_gives_kafkas_values(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected


def test_the_partition_masks_the_sign_bit_before_the_modulo() -> None:
    assert java_partition(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert java_partition(b"abc", 7) == 479470107 % 7
