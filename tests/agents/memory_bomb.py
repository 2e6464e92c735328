"""Allocates until the memory limit kills it."""
hog = []
while True:
    hog.append(bytearray(64 * 1024 * 1024))
