from textkit.core import slugify, word_count

__all__ = ["slugify", "word_count"]
