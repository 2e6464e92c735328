"""The leak controls' in-container programs (standard-library Python 3, no harness import):
uploaded into the agent's container as files and run there as the agent user. They read
the task's instruction (the agent's prompt, as any agent gets it), never the task's name."""
