"""Everything of task-directory (Harbor-format) datasets: their images (`images`), the trial
that plays an agent and the task's own verifier (`trial`), and the package of a validated subset
(`package`, `package_card`, `smoke_package`)."""
