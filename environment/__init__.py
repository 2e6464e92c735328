"""RL environments validated by this project, with no dependency on any RL framework.

`environment.protocol` holds what every environment gives the harness (a task, a taskset
and a score); each environment lives in its own subpackage (`environment.deshuffle`).
"""

#: The environment `validate freeze` uses when no ``--env`` is given (registered in
#: pyproject.toml's ``validate.defaults`` entry-point group, so the harness names none).
DEFAULT_ENVIRONMENT = "deshuffle-papers"
