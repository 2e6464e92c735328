"""The harness's foundation: its errors, paths, the schema of record (`records`), JSON input,
registries and renderers. Imports nothing of the harness above it."""
