import sys

sys.path.insert(0, "/app")
import pytest
from textkit import slugify, word_count


@pytest.mark.parametrize("title,slug", [
    ("Hello World", "hello-world"),
    ("  Many   spaces -- and dashes ", "many-spaces-and-dashes"),
    ("Crème Brûlée!", "creme-brulee"),
    ("Ünïcödé 2024: Ärger", "unicode-2024-arger"),
    ("日本語 title", "title"),
    ("---", ""),
])
def test_slugify(title, slug):
    assert slugify(title) == slug


@pytest.mark.parametrize("text,n", [("", 0), ("one", 1), ("a  b\tc\nd", 4), ("  lead trail  ", 2)])
def test_word_count(text, n):
    assert word_count(text) == n
