"""`fetch_fails`: a block that must end in a FetchError carrying a given exit code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from model_fetcher.errors import ExitCode, FetchError


@contextlib.contextmanager
def fetch_fails(code: ExitCode, match: str | None = None) -> Iterator[None]:
    """The block raises FetchError carrying `code` (the init container's exit code)."""
    with pytest.raises(FetchError, match=match) as raised:
        yield
    assert raised.value.code == code, f"{raised.value!r} carries {raised.value.code!r}, not {code!r}"
