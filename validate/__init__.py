"""The validation harness: freeze a contract, play the oracle and negative controls through
a real sandbox with no network, score on the host, give every task one verdict, and write
the evidence to Parquet.

The data path, one module per step: `contract` (what is validated) → `workspace` (task →
files on disk) → `sandbox` (run an agent) → `runner` (reply → score → attempt record) →
`verdicts` (attempts → one verdict per task) → `evidence` (Parquet, checksums).
"""

__version__ = "0.1.0"
