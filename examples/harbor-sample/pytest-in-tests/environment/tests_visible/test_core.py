from textkit import slugify, word_count


def test_slug_simple():
    assert slugify("Hello World") == "hello-world"


def test_words_simple():
    assert word_count("one two three") == 3
