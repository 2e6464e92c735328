"""Roman numerals, 1..3999."""


def to_roman(n: int) -> str:
    raise NotImplementedError


def from_roman(s: str) -> int:
    raise NotImplementedError
