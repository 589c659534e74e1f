"""Log sequence numbers: a 64-bit position in the PostgreSQL write-ahead log."""

from __future__ import annotations


class Lsn(int):
    """A WAL position. Compares and hashes as an int; prints as PostgreSQL does (``16/B374D848``)."""

    __slots__ = ()

    MAX = 0xFFFFFFFFFFFFFFFF

    def __new__(cls, value: int = 0) -> Lsn:
        if not 0 <= value <= cls.MAX:
            raise ValueError(f"LSN out of range: {value}")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse the ``X/Y`` form PostgreSQL prints (both halves hexadecimal)."""
        high, sep, low = text.strip().partition("/")
        if not sep or not high or not low:
            raise ValueError(f"not an LSN (expected 'X/Y' in hexadecimal): {text!r}")
        try:
            hi, lo = int(high, 16), int(low, 16)
        except ValueError:
            raise ValueError(f"not an LSN (expected 'X/Y' in hexadecimal): {text!r}") from None
        if hi > 0xFFFFFFFF or lo > 0xFFFFFFFF:
            raise ValueError(f"LSN half out of range: {text!r}")
        return cls((hi << 32) | lo)

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


ZERO = Lsn(0)
