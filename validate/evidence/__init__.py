"""The evidence: the journal and its Parquet files (`journal`), the verdicts as pure functions
(`verdicts`), the run's summary, a run read back (`run`), the code state and signatures."""
