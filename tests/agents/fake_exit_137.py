"""Exits 137, the code a container killed from outside exits with: an infrastructure fault faked."""
import os

os._exit(137)
