"""Curator's agent programs (stdlib only, run in the sandbox as ``/agent/agent.py``) and their
support module `curatorlib`, which the host's dataset validator imports too. The programs are
declared, with what each tests, in `environment.curator.env.AGENTS`."""
