"""Singletons control: every label its own group. Perfect grouping precision, no comparable
pair inside any group: tests that over-splitting cannot earn the ordering term."""
from deshufflelib import answer, labels

answer([[label] for label in labels()])
