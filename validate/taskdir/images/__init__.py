"""Per-task images for task-directory datasets (Harbor's), built offline from a profile's
base-image map.

No image can be pulled on the machines this harness runs on, so every upstream base a
task's Dockerfile names (``FROM python:3.11-slim-bookworm``) is served by a base built here
from Debian packages and recorded, with what differs from the upstream image, as a
versioned substitution. One module per concern:

- `validate.taskdir.images.basemap`: the schema of record — the recipes a profile can build, the
  substitutions (upstream reference → recipe, with the recorded differences), and the built
  map (upstream reference → local image by id and layer digest).
- `validate.taskdir.images.bases`: building the bases: a reproducible root filesystem tarball per
  recipe (``mmdebstrap`` on the host, as `validate.sandbox.image` builds the sandbox image), handed to
  a backend to import, and the map made of them.
- `validate.taskdir.images.dockerfile`: reading a Dockerfile's ``FROM`` lines and rewriting them to
  the local images (the rewrite is the recorded patch); no backend involved.
- `validate.taskdir.images.build`: one task's image — resolve its bases, rewrite the Dockerfile in
  a copy of its ``environment/`` context, build through a backend, cache by content digest,
  keep the log; every outcome is data (`TaskImage` or `TaskImageRefusal`), never a raise.
- `validate.taskdir.images.backend`: what a backend provides (`ImageBackend`: import a base, build a
  context, look an image up) and what a build returns (`BuildRun`).
- `validate.taskdir.images.docker`: the docker backend (the only module that speaks docker):
  importing a base tarball, the legacy builder, looking images up; and, through the same
  Docker API, the rootless podman service's (`PodmanImages`: the podman profile's trials run
  in images that service built). Another backend implements `ImageBackend` in a module of
  its own beside it.

Nothing here is wired into freeze or pool yet: the caller hands `build_base_map` a store
directory and a backend, and `build_task_image` a task directory and the map.
"""
