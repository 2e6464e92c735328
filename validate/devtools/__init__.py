"""Tools for development and tests, never imported by the harness: the loopback model and
judge server (`localserver`)."""
