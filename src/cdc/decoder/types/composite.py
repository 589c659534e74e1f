"""Parsers of the values made of other values: arrays (of any element type) and hstore.

Ranges and multiranges travel as their text (see ``convert``); composites as unknown text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final

__all__ = ["Parser", "array_parser", "parse_hstore"]

Parser = Callable[[bytes], Any]
"""``bytes -> value``; raises ``ValueError`` (or a relative) on bad input."""

# --- hstore ---------------------------------------------------------------

_HSTORE_QUOTED: Final = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_HSTORE_BARE: Final = re.compile(r'[^\s=,>"]+')
_HSTORE_ARROW: Final = re.compile(r"\s*=>\s*")
_HSTORE_COMMA: Final = re.compile(r"\s*,\s*")
_BACKSLASH_ESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)


def _hstore_token(text: str, pos: int) -> tuple[str, bool, int]:
    """One key or value at ``pos``: (text, was quoted, end)."""
    m = _HSTORE_QUOTED.match(text, pos)
    if m is not None:
        raw = m[1]
        return (_BACKSLASH_ESCAPE.sub(r"\1", raw) if "\\" in raw else raw), True, m.end()
    m = _HSTORE_BARE.match(text, pos)
    if m is None:
        raise ValueError(text)
    return m[0], False, m.end()


def parse_hstore(data: bytes) -> dict[str, str | None]:
    """``"a"=>"1", "b"=>NULL`` (backslash escapes inside quotes; an unquoted NULL value is None)."""
    text = data.decode()
    result: dict[str, str | None] = {}
    n = len(text)
    pos = len(text) - len(text.lstrip())
    if pos == n:
        return result
    while True:
        key, _, pos = _hstore_token(text, pos)
        arrow = _HSTORE_ARROW.match(text, pos)
        if arrow is None:
            raise ValueError(text)
        value, quoted, pos = _hstore_token(text, arrow.end())
        result[key] = None if not quoted and value.upper() == "NULL" else value
        comma = _HSTORE_COMMA.match(text, pos)
        if comma is None:
            if text[pos:].strip():
                raise ValueError(text)
            return result
        pos = comma.end()


# --- arrays ---------------------------------------------------------------

_ARRAY_DIMS: Final = re.compile(rb"(?:\[[+-]?[0-9]+:[+-]?[0-9]+\])+=")
_ARRAY_QUOTED: Final = re.compile(rb'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_BYTES_ESCAPE: Final = re.compile(rb"\\(.)", re.DOTALL)
_WHITESPACE: Final = b" \t\n\r\v\f"
_ARRAY_MAX_DIMS: Final = 6  # PostgreSQL's MAXDIM


def array_parser(element: Parser, delimiter: bytes) -> Parser:
    """A parser for ``{1,2}``, ``{{1,2},{3,4}}``, ``{"a b",NULL}``, ``[0:1]={1,2}`` (bounds dropped)."""
    delim = delimiter[0]
    bare = re.compile(rb'(?:[^{}"\\' + re.escape(delimiter) + rb"]|\\.)*", re.DOTALL)

    def level(data: bytes, pos: int, depth: int) -> tuple[list[Any], int]:
        # data[pos] is "{"
        if depth > _ARRAY_MAX_DIMS:
            raise ValueError("too many array dimensions")
        items: list[Any] = []
        pos += 1
        n = len(data)
        while pos < n and data[pos] in _WHITESPACE:
            pos += 1
        if data[pos] == 0x7D:  # "}"
            return items, pos + 1
        while True:
            while data[pos] in _WHITESPACE:
                pos += 1
            c = data[pos]
            if c == 0x7B:  # "{"
                sub, pos = level(data, pos, depth + 1)
                items.append(sub)
            elif c == 0x22:  # '"'
                m = _ARRAY_QUOTED.match(data, pos)
                if m is None:
                    raise ValueError(data)
                raw = m[1]
                items.append(element(_BYTES_ESCAPE.sub(rb"\1", raw) if b"\\" in raw else raw))
                pos = m.end()
            else:
                m = bare.match(data, pos)
                assert m is not None  # the pattern matches the empty string
                raw = m[0].strip(_WHITESPACE)
                if not raw:
                    raise ValueError(data)
                if raw.upper() == b"NULL":
                    items.append(None)
                else:
                    items.append(element(_BYTES_ESCAPE.sub(rb"\1", raw) if b"\\" in raw else raw))
                pos = m.end()
            while data[pos] in _WHITESPACE:
                pos += 1
            c = data[pos]
            pos += 1
            if c == delim:
                continue
            if c == 0x7D:
                return items, pos
            raise ValueError(data)

    def parse(data: bytes) -> list[Any]:
        if data[:1] == b"[":
            dims = _ARRAY_DIMS.match(data)
            if dims is None:
                raise ValueError(data)
            data = data[dims.end() :]
        if data[:1] != b"{" or data[-1:] != b"}":
            raise ValueError(data)
        inner = data[1:-1]
        if b"{" not in inner and b'"' not in inner and b"\\" not in inner and b"}" not in inner:
            # One dimension, nothing quoted or escaped: the common case.
            if not inner:
                return []
            return [None if item == b"NULL" else element(item) for item in inner.split(delimiter)]
        value, end = level(data, 0, 1)
        if end != len(data):
            raise ValueError(data)
        return value

    return parse
