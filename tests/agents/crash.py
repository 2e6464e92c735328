"""Crashes with a traceback."""
raise SystemExit("deliberate crash")
