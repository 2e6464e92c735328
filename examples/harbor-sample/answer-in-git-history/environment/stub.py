"""Parses durations like "1h30m", "45s", "2h5s" into seconds."""


def parse_duration(text: str) -> int:
    raise NotImplementedError("TODO")
