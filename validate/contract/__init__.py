"""The frozen contract: the manifest and its freeze and checks (`manifest`), its task list's
columns (`tasklist`), sealed documents (`sealed`)."""
