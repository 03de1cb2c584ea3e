"""The activator's config file, the kbroker counterpart of EAService.config:

    namespace: expenses            # optional; --namespace / KBROKER_NAMESPACE win
    bootstrap: localhost:9092      # optional; --bootstrap / KBROKER_BOOTSTRAP win
    shutdown_grace: 5              # seconds children get after SIGTERM before SIGKILL
    stale_after: 300               # seconds; older notifications (replayed after a restart) are ignored
    restart_delay: 1               # seconds before replacing an exited min_concurrency copy (doubles
                                   # after each consecutive failure, up to 60)
    applications:
      - queue: ExpenseQueue        # the kbroker queue whose QUEUE_ACTIVATION starts `command`
        name: expense-reader       # optional label for logs (default: the queue)
        command: [python, reader.py]   # argv list, or a string split like a shell would (no shell)
        min_concurrency: 0         # copies kept running at all times
        max_concurrency: 1         # never more copies than this
        env: {LOG_LEVEL: info}     # added to the activator's environment
        cwd: /srv/readers          # relative paths are relative to the config file's directory
        enabled: true

Every problem raises DefinitionError(file, "application <name>", reason naming the field).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kbroker.config import NAMESPACE_RE
from kbroker.core.catalog.loader import pydantic_reason, read_yaml
from kbroker.core.topic_keys import queue_name_problem
from kbroker.errors import DefinitionError


def _command(value: Any) -> Any:
    # EA splits ImagePath and CmdLineArgs; one argv is simpler. A string is split with shell
    # quoting rules but never run by a shell, so a queue's config cannot smuggle in `; rm ...`.
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split command: {exc}") from None
    return value


def _env_value(value: Any) -> Any:
    # YAML reads `PORT: 8080` as an int; the environment only holds strings. Booleans are refused:
    # `yes` would become "True", which is surely not what was meant.
    if isinstance(value, bool):
        raise ValueError("must be a string (quote it: 'true')")
    if isinstance(value, (int, float)):
        return str(value)
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Application(_Model):
    queue: str
    name: str | None = None
    command: Annotated[list[str], BeforeValidator(_command)]
    min_concurrency: int = Field(default=0, ge=0, le=1000)
    max_concurrency: int = Field(default=1, ge=1, le=1000)
    env: dict[str, Annotated[str, BeforeValidator(_env_value)]] = Field(default_factory=dict)
    cwd: str | None = None
    enabled: bool = True

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str) -> str:
        problem = queue_name_problem(value)
        if problem is not None:
            raise ValueError(f"queue name {value!r} {problem}")
        return value

    @field_validator("command")
    @classmethod
    def _not_empty(cls, value: list[str]) -> list[str]:
        if not value or not value[0]:
            raise ValueError("command must name a program")
        return value

    @model_validator(mode="after")
    def _min_le_max(self) -> "Application":
        if self.min_concurrency > self.max_concurrency:
            raise ValueError(
                f"min_concurrency ({self.min_concurrency}) exceeds max_concurrency ({self.max_concurrency})"
            )
        return self

    @property
    def label(self) -> str:
        return self.name or self.queue


class ActivatorConfig(_Model):
    namespace: str | None = None
    bootstrap: str | None = None
    shutdown_grace: float = Field(default=5.0, ge=0, le=300)
    stale_after: float = Field(default=300.0, gt=0)  # seconds; older notifications start nothing
    restart_delay: float = Field(default=1.0, ge=0, le=3600)  # before replacing a min_concurrency copy
    applications: list[Application]

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        if value is not None and not NAMESPACE_RE.match(value):
            raise ValueError(f"namespace {value!r} must be 1-40 characters of letters, digits, '_' or '-'")
        return value

    def enabled(self) -> dict[str, Application]:
        """The enabled applications by queue."""
        return {a.queue: a for a in self.applications if a.enabled}


def load_config(path: str | Path) -> ActivatorConfig:
    """Read and validate the file. cwd values come back absolute (relative to the file)."""
    file = Path(path)
    data = read_yaml(file)
    if not isinstance(data, dict):
        raise DefinitionError(str(file), None, "the file must be a mapping with an 'applications' list")
    apps = data.get("applications")
    if not isinstance(apps, list) or not apps:
        raise DefinitionError(str(file), None, "'applications' must be a non-empty list")

    # Validate application by application so the error names the one at fault.
    parsed: list[Application] = []
    seen: dict[str, str] = {}
    for index, item in enumerate(apps):
        label = None
        if isinstance(item, dict):
            label = item.get("name") or item.get("queue")
        obj = f"application {label}" if isinstance(label, str) else f"application #{index + 1}"
        if not isinstance(item, dict):
            raise DefinitionError(str(file), obj, f"must be a mapping of fields, not {type(item).__name__}")
        try:
            app = Application.model_validate(item)
        except ValidationError as exc:
            raise DefinitionError(str(file), obj, pydantic_reason(exc)) from None
        # One application per queue: two would each count only their own children, and the queue
        # would get the sum of both maximums.
        if app.queue in seen:
            raise DefinitionError(str(file), obj, f"queue {app.queue!r} already has application {seen[app.queue]}")
        seen[app.queue] = app.label
        if app.cwd is not None:
            app = app.model_copy(update={"cwd": str((file.parent / app.cwd).resolve())})
        parsed.append(app)
    try:
        return ActivatorConfig.model_validate({**data, "applications": parsed})
    except ValidationError as exc:
        raise DefinitionError(str(file), None, pydantic_reason(exc)) from None
