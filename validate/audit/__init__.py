"""`validate audit`: every count, verdict and claim of a run derived again from its evidence
(`run`), by concern."""
