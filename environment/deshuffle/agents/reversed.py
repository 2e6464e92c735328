"""Reversed control: the labels in reverse displayed order, as one group. Tests that the
scorer rewards direction (concordance), not mere adjacency."""
from deshufflelib import answer, labels

answer(labels()[::-1])
