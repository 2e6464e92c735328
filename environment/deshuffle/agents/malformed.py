"""Malformed control: a reply that is not a valid partition (the first label twice). Tests
that an invalid partition scores 0."""
from deshufflelib import answer, labels

order = labels()
answer(order + order[:1])
