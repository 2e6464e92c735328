"""Identity control: the labels in displayed order, as one group. Tests that the displayed
order is not the answer (the shuffle happened)."""
from deshufflelib import answer, labels

answer(labels())
