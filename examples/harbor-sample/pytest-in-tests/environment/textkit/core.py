"""Small text helpers."""


def slugify(title: str) -> str:
    """A URL slug: lowercase ASCII letters and digits, words joined by single hyphens."""
    out = []
    for ch in title.lower():
        out.append(ch if ch.isalnum() else "-")
    return "".join(out)


def word_count(text: str) -> int:
    """Number of whitespace-separated words."""
    return len(text.split(" "))
