"""Where the serve command's model is on the host, found before a smoke starts a server for it.

A vLLM server whose model folder is not mounted downloads the model from the Hub inside the
container (about 45 GB for the sm120 flagships) while the smoke waits up to its health timeout,
and then throws it away with the container. So the smoke's model is looked for on the host first,
through the mounts the server will get, and a missing one is one message naming the download
command, before any container starts.

The manifest names the model (serve.model.id): a path in the container (`/models/tiny`), or a
Hugging Face id read from the hub cache under the container's HF_HOME (`/models/hf`). The host
folder mounted at /models is the one `pin` mounts there too (builder.hosts.pins.DEFAULT_MODELS,
or `test --models DIR`, `make stack MODELS=DIR`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from builder.engine.mounts import DEFAULT_MODELS as DEFAULT_MODELS  # test --models' default
from builder.engine.mounts import MODELS_TARGET, models_mount
from builder.errors import StackError
from builder.knowledge.yamlsafe import load_yaml
from builder.manifest.resolve import ResolvedStack

#: The key that names the model, for messages that point at the manifest.
MODEL_KEY = ("serve", "model", "id")


@dataclass(frozen=True)
class ModelPlace:
    """The stack's model, as the server in the container will look for it."""

    model_id: str
    #: The folder the server reads, inside the container: the path id itself, or the Hub
    #: cache's folder for the id under HF_HOME (None: a Hub id without HF_HOME in the image's
    #: env, which the server keeps in its own home and no mount can give).
    inside: str | None
    #: The host folder behind `inside`, through the mount that covers it (None: no mount does).
    host: Path | None

    @property
    def from_hub(self) -> bool:
        return not self.model_id.startswith("/")

    def folder(self) -> Path | None:
        """The folder the server would load: the path id's folder, or the newest snapshot of
        the Hub id (what vLLM loads offline); None when absent."""
        if self.host is None or not self.host.is_dir():
            return None
        if not self.from_hub:
            return self.host
        snapshots = [s for s in (self.host / "snapshots").glob("*") if s.is_dir()]
        return max(snapshots, key=lambda s: s.stat().st_mtime) if snapshots else None

    def usable(self) -> Path | None:
        """folder(), where a server could load it: a Hub snapshot needs its config.json (a
        download cut short may leave a snapshot without it)."""
        found = self.folder()
        if found is None or (self.from_hub and not (found / "config.json").is_file()):
            return None
        return found


def hub_folder(home: str, model_id: str) -> str:
    """The Hub cache's folder of a model under HF_HOME (huggingface_hub's own layout)."""
    return f"{home.rstrip('/')}/hub/models--{model_id.replace('/', '--')}"


def locate(stack: ResolvedStack, mounts: dict[str, str]) -> ModelPlace:
    """Where the model would be, given the server's mounts (host -> container)."""
    model = stack.manifest.serve.model.id
    inside: str | None = model
    if not model.startswith("/"):
        home = stack.manifest.env.get("HF_HOME")
        inside = hub_folder(home, model) if home else None
    host = None
    if inside is not None:
        for source, target in mounts.items():
            if _under(inside, target):
                host = Path(source) / inside.removeprefix(target.rstrip("/")).lstrip("/")
                break
    return ModelPlace(model, inside, host)


def with_models_folder(
    stack: ResolvedStack, mounts: dict[str, str], models: Path
) -> dict[str, str]:
    """The mounts, plus `models` at /models where the model lives under /models and no mount
    gives it already (a folder that does not exist is left out: `require` then says so)."""
    place = locate(stack, mounts)
    if place.host is not None or place.inside is None or not _under(place.inside, MODELS_TARGET):
        return mounts
    if not models.is_dir():
        return mounts
    mount = models_mount(models.resolve())  # the mount `pin --models` gives the server
    return {**mounts, mount.source: mount.target}


def require(stack: ResolvedStack, mounts: dict[str, str], models: Path) -> Path:
    """The model's folder on the host; StackError (exit 2) naming what to download or mount
    when the server would not find it there."""
    place = locate(stack, mounts)
    found = place.usable()
    if found is not None:
        return found
    file, line = _model_line(stack)

    def refused(message: str, hint: str) -> StackError:
        return StackError(message, file=file, key=".".join(MODEL_KEY), line=line, hint=hint)

    where = _expected_host(place, models)
    if place.from_hub:
        home = stack.manifest.env.get("HF_HOME")
        if home is None:
            raise refused(
                f"the model {place.model_id} would be downloaded inside the container at every "
                "start: the stack's env sets no HF_HOME to mount a downloaded copy at",
                f"set env.HF_HOME under {MODELS_TARGET} (as vllm-0.33-marlin does) and "
                "download the model there",
            )
        hub_home = where.parent.parent if where is not None else None
        command = (
            f"HF_HOME={shlex.quote(str(hub_home))} hf download {shlex.quote(place.model_id)}"
            if hub_home is not None
            else f"HF_HOME=HOST_FOLDER hf download {shlex.quote(place.model_id)}"
        )
        raise refused(
            f"the model {place.model_id} is not on this host: no snapshot with a config.json "
            f"under {where or _no_mount(place)}; the server would download it inside the "
            "container while the smoke waits for its health",
            f"download it once: {command} (`pip install -U huggingface_hub` gives `hf`), "
            f"or name the folder that holds it: make stack STACK={stack.name} MODELS=DIR "
            "(test --models DIR)",
        )
    raise refused(
        f"the model folder {place.model_id} is not on this host: {where or _no_mount(place)} "
        "does not exist",
        f"put the model there, or mount the folder that holds it: --volume "
        f"HOST:{place.model_id}:ro (make stack STACK={stack.name} MODELS=DIR for {MODELS_TARGET})",
    )


def _expected_host(place: ModelPlace, models: Path) -> Path | None:
    """The host folder the model was looked for in: through its mount, or the models folder."""
    if place.host is not None:
        return place.host
    if place.inside is not None and _under(place.inside, MODELS_TARGET):
        return models / place.inside.removeprefix(MODELS_TARGET).lstrip("/")
    return None


def _no_mount(place: ModelPlace) -> str:
    return f"any mount (the server reads {place.inside}; --volume HOST:{place.inside}:ro gives it)"


def _under(path: str, folder: str) -> bool:
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder + "/")


def _model_line(stack: ResolvedStack) -> tuple[Path, int | None]:
    """The manifest (the stack's own, else the parent that sets it) and line of serve.model.id."""
    for source in stack.sources:
        doc = load_yaml(source)
        if MODEL_KEY in doc.lines:
            return source, doc.lines[MODEL_KEY]
    return stack.sources[0], None
