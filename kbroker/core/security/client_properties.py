"""Kafka client properties as users already keep them: a properties file in Java's syntax (what
`kafka-console-producer --command-config` and kcat `-F` read), environment variables in the
Kafka images' convention, and JAAS lines (`sasl.jaas.config`). Parsing only: which settings
kbroker accepts and how each client gets them is core/security/client_security.py."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from dataclasses import dataclass

import jproperties

from kbroker.errors import InvalidArgumentError

ENV_PREFIX = "KBROKER_KAFKA_"
"""`KBROKER_KAFKA_SASL_JAAS_CONFIG` is `sasl.jaas.config`: after the prefix, lower-case, `_` is
`.`, `__` is `_` and `___` is `-` (the convention of Kafka's container images)."""

COMMAND_CONFIG_ENV = "KBROKER_COMMAND_CONFIG"
"""The environment's properties file, as `--command-config` gives it."""


def read_properties(text: str) -> dict[str, str]:
    """The pairs of a Java properties file (comments, `=`/`:`/blank separators, `\\` line
    continuations, `\\uXXXX` escapes). Raises InvalidArgumentError for text it cannot read."""
    props = jproperties.Properties()
    try:
        props.load(text, "utf-8")
    except Exception as exc:  # noqa: BLE001 - jproperties raises its own ParseError and ValueErrors
        raise InvalidArgumentError(f"not a Kafka properties file: {exc}") from None
    return {str(key): str(value.data) for key, value in props.items()}


def write_properties(pairs: Mapping[str, str]) -> str:
    """`pairs` as a Java properties file (what a Kafka command-line tool's --command-config
    reads): newlines and separators escaped, so inline PEM material survives."""
    props = jproperties.Properties()
    for key, value in pairs.items():
        props[key] = value
    out = io.BytesIO()
    props.store(out, encoding="utf-8", timestamp=False)
    return out.getvalue().decode("utf-8")


def env_name(prop: str) -> str:
    """The environment variable that carries property `prop`."""
    return ENV_PREFIX + "".join({".": "_", "_": "__", "-": "___"}.get(c, c) for c in prop).upper()


def properties_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The client properties the environment sets (KBROKER_KAFKA_*; see ENV_PREFIX)."""
    out = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and len(key) > len(ENV_PREFIX):
            rest = key[len(ENV_PREFIX) :].lower()
            out[rest.replace("___", "-").replace("__", "\0").replace("_", ".").replace("\0", "_")] = value
    return out


def env_of(properties: Mapping[str, str]) -> dict[str, str]:
    """Properties as environment variables (for a child process; the inverse of
    properties_from_env)."""
    return {env_name(k): v for k, v in properties.items()}


@dataclass(frozen=True, repr=False)
class Jaas:
    """One JAAS login module entry: `module flag key="value" ...;`."""

    module: str
    flag: str
    options: Mapping[str, str]

    def __repr__(self) -> str:  # options hold passwords and client secrets
        return f"Jaas({self.module!r}, {self.flag!r}, options={sorted(self.options)})"

    def line(self) -> str:
        """The entry as a `sasl.jaas.config` value."""
        opts = "".join(f' {k}="{_quote(v)}"' for k, v in self.options.items())
        return f"{self.module} {self.flag}{opts};"


_FLAGS = ("required", "requisite", "sufficient", "optional")
_OPTION = re.compile(r'\s*([A-Za-z0-9_.\-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s";]+))')


def parse_jaas(text: str) -> Jaas:
    """A `sasl.jaas.config` value (one login module). Raises InvalidArgumentError naming what is
    wrong; the message never quotes an option's value."""
    head = re.match(r"\s*([A-Za-z_$][\w.$]*)\s+(\w+)", text)
    if not head or head.group(2) not in _FLAGS:
        raise InvalidArgumentError("sasl.jaas.config: expected '<LoginModule class> required key=\"value\" ...;'")
    pos, options = head.end(), {}
    while True:
        m = _OPTION.match(text, pos)
        if not m:
            break
        value = m.group(2) if m.group(2) is not None else m.group(3)
        options[m.group(1)] = re.sub(r"\\(.)", r"\1", value)
        pos = m.end()
    if text[pos:].strip() != ";":
        raise InvalidArgumentError(
            f"sasl.jaas.config: unreadable after option {list(options)[-1] if options else 'the flag'}"
            " (options are key=\"value\", the entry ends with ';')"
        )
    return Jaas(head.group(1), head.group(2), options)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
