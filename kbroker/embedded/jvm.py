"""What the embedded single broker and the embedded cluster share: finding Java, resolving the
Kafka jars with Maven, formatting a KRaft log dir, launching a detached Kafka JVM and telling
whether it still runs. Nothing happens at import time."""

from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import psutil

from kbroker import config
from kbroker.errors import (
    EmbeddedBrokerError,
    JavaMissingError,
    MavenMissingError,
    RepositoryUnreachableError,
)

KAFKA_VERSION = "4.4.0"
MIN_JAVA = 17
HERE = Path(__file__).resolve().parent
LOGGING_OPTION = f"-Dlog4j2.configurationFile={HERE / 'log4j2.properties'}"
_MARKER = ".complete"  # written last into the cache dir: its presence means every jar is there
# Maven output that means the repository could not be reached, as opposed to refusing an artifact.
_UNREACHABLE = re.compile(
    r"unknown ?host|could not transfer|connection refused|connect(ion)? timed out|"
    r"network is unreachable|no route to host|name or service not known|name resolution|"
    r"read timed out|proxy|PKIX|no plugin found for prefix",
    re.IGNORECASE,
)
# Kafka JVMs this process started, kept to reap them once they exit: an unreaped child stays a
# zombie, which psutil still reports as an existing pid.
CHILDREN: dict[int, subprocess.Popen] = {}


def reap() -> None:
    """Reap the Kafka JVMs this process started that have exited."""
    for pid, child in list(CHILDREN.items()):
        if child.poll() is not None:  # exited (maybe stopped by another process); now reaped
            del CHILDREN[pid]


def exited(proc: psutil.Process) -> bool:
    """Whether the JVM `proc` has exited (a zombie with no thread left counts as exited)."""
    child = CHILDREN.get(proc.pid)
    if child is not None:  # our own child: wait() is exact, and reaps it
        return child.poll() is not None
    # Started by another process: a zombie has exited and waits for that parent to reap it. The
    # JVM's main thread can end while shutdown-hook threads still run, which also shows the
    # leader as a zombie, so a zombie only counts once no thread of it is left.
    try:
        if proc.status() != psutil.STATUS_ZOMBIE:
            return False
        return len(os.listdir(f"/proc/{proc.pid}/task")) <= 1
    except (psutil.NoSuchProcess, FileNotFoundError):
        return True


def wait_exit(proc: psutil.Process, timeout: float) -> bool:
    """Wait up to `timeout` seconds for `proc` to exit; whether it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exited(proc):
            return True
        time.sleep(0.1)
    return False


def terminate(proc: psutil.Process, timeout: float) -> None:
    """SIGTERM, which runs Kafka's shutdown hook (controlled shutdown, logs flushed and closed,
    so the next start needs no log recovery); SIGKILL only if that hangs past `timeout`."""
    try:
        proc.terminate()
    except psutil.NoSuchProcess:
        return
    if not wait_exit(proc, timeout):
        kill(proc)


def kill(proc: psutil.Process) -> None:
    """SIGKILL, and wait until the JVM is gone."""
    try:
        proc.kill()
    except psutil.NoSuchProcess:
        return
    wait_exit(proc, 10)


def tail(path: Path, lines: int = 5) -> str:
    """The last meaningful lines of a log, on one line (stack frames left out)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    frame = re.compile(r"\s+(at |\.\.\. \d+ more)")
    keep = [ln.strip()[:300] for ln in text if ln.strip() and not frame.match(ln)]
    return " | ".join(keep[-lines:]) or "(log is empty)"


def kafka_uuid() -> str:
    """A new Kafka cluster id."""
    # Kafka's Uuid.toString(): 16 random bytes, base64url without padding; Kafka never hands
    # out ids that start with '-' since they read as command-line options.
    while True:
        s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not s.startswith("-"):
            return s


def find_java() -> str:
    """The java executable (JAVA_HOME first, then PATH), checked to be Java 17 or newer."""
    home = Path(os.environ.get("JAVA_HOME") or "/nonexistent") / "bin" / "java"
    java = str(home) if home.is_file() else shutil.which("java")
    if not java:
        raise JavaMissingError(
            f"Java {MIN_JAVA}+ is needed to run the embedded Kafka broker but no 'java' is on "
            f"PATH; install a JDK {MIN_JAVA}+ (e.g. apt-get install openjdk-17-jdk-headless) or "
            "set JAVA_HOME, or use another Kafka with --bootstrap / KBROKER_BOOTSTRAP"
        )
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
        m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    except (OSError, subprocess.SubprocessError):
        m = None
    if not m:
        raise JavaMissingError(f"could not run '{java} -version'; install a JDK {MIN_JAVA}+ or set JAVA_HOME")
    major = int(m.group(2) or 0) if m.group(1) == "1" else int(m.group(1))  # "1.8.0" is Java 8
    if major < MIN_JAVA:
        raise JavaMissingError(
            f"Java {MIN_JAVA}+ is needed to run the embedded Kafka broker but {java} is Java "
            f"{major}; install a JDK {MIN_JAVA}+ and put it first on PATH or set JAVA_HOME"
        )
    return java


def fetch_jars(say: Callable[[str], None]) -> Path:
    """The libs dir of the cached Apache Kafka jars, resolved with Maven on first use."""
    return fetch_maven_jars(
        HERE / "pom.xml",
        config.cache_dir() / f"kafka-{KAFKA_VERSION}",
        f"Apache Kafka {KAFKA_VERSION}",
        "kafka_2.13-*.jar",
        say,
    )


def fetch_maven_jars(
    pom: Path, home: Path, what: str, expect: str, say: Callable[[str], None], maven_args: tuple[str, ...] = ()
) -> Path:
    """`home`/libs: the runtime jars of `pom`'s dependencies, resolved with Maven into the per-user
    cache on first use (Maven's own repository, ~/.m2, keeps the downloads). `expect` is a glob
    that must match a jar of the result; `what` names it in messages."""
    if (home / _MARKER).exists():
        return home / "libs"
    mvn = shutil.which("mvn")
    if not mvn:
        raise MavenMissingError(
            f"Maven ('mvn') is needed once to download {what} but is not on PATH; install "
            "Maven 3.6+ (e.g. apt-get install maven)"
        )
    find_java()  # Maven runs on Java; its own message for a missing JDK is less clear
    say(f"resolving {what} with Maven (first run only)...")
    home.parent.mkdir(parents=True, exist_ok=True)
    # Download next to the final place and rename it in one step, so an interrupted or
    # concurrent fetch never leaves a half-filled libs dir that looks complete.
    tmp = Path(tempfile.mkdtemp(prefix=f".{home.name}-", dir=home.parent))
    try:
        # A copy: Maven may write next to its pom, and the package dir may be read-only.
        shutil.copyfile(pom, tmp / "pom.xml")
        # The goal by its full plugin name (version pinned in the pom): with just the
        # "dependency:" prefix an unreachable repository fails as "No plugin found".
        cmd = [
            mvn,
            "-B",
            "-q",
            "-Dstyle.color=never",
            "-f",
            str(tmp / "pom.xml"),
            "org.apache.maven.plugins:maven-dependency-plugin:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp / 'libs'}",
            *maven_args,
        ]
        out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if out.returncode != 0 or not list((tmp / "libs").glob(expect)):
            raise maven_error(out.stdout + out.stderr, what)
        (tmp / _MARKER).write_text(f"{datetime.now(timezone.utc).isoformat()}\n")
        if home.exists() and not (home / _MARKER).exists():
            shutil.rmtree(home)  # left by an older, interrupted layout
        try:
            os.rename(tmp, home)
        except OSError:
            if not (home / _MARKER).exists():  # else another process finished first: fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home / "libs"


def maven_error(output: str, what: str = f"Apache Kafka {KAFKA_VERSION}") -> EmbeddedBrokerError:
    """The one-line error for Maven's failed output."""
    noise = ("To see", "Re-run", "For more", "[Help")
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)  # Maven colours some lines even with -B
    errors = [
        ln.replace("[ERROR]", "").replace("-> [Help 1]", "").strip() for ln in output.splitlines() if "[ERROR]" in ln
    ]
    errors = [e for e in errors if e and not e.startswith(noise)]
    reason = next((e for e in errors if _UNREACHABLE.search(e)), None)
    if reason:
        return RepositoryUnreachableError(
            f"Maven could not download {what} (...{reason[-200:]}); "
            "check the network or the proxy/mirror in ~/.m2/settings.xml and retry"
        )
    detail = (errors[0] if errors else output.strip()[-300:] or "no output")[:300]
    return EmbeddedBrokerError(f"Maven could not resolve {what}: {detail}")


def format_storage(
    java: str, libs: Path, targets: list[tuple[Path, Path]], cluster_id: str, extra_args: tuple[str, ...] = ()
) -> None:
    """Format KRaft log dirs, each a (server.properties, log dir) pair, all at once and all with
    `cluster_id`; `extra_args` go to each StorageTool run (`--add-scram ...`). Only for dirs not
    formatted yet: formatting again would refuse, or, forced, lose every topic."""
    running = [
        (
            subprocess.Popen(
                [
                    java,
                    LOGGING_OPTION,
                    "-cp",
                    str(libs / "*"),
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(properties),
                    *extra_args,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=properties.parent,
            ),
            log_dirs,
        )
        for properties, log_dirs in targets
    ]
    failed = []
    for proc, log_dirs in running:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            lines = [ln for ln in output.splitlines() if ln.strip()]
            failed.append(f"formatting Kafka storage in {log_dirs} failed: {' | '.join(lines[-3:])}")
    if failed:
        raise EmbeddedBrokerError(failed[0])


def launch(java: str, libs: Path, properties: Path, log_file: Path, heap: tuple[str, str]) -> subprocess.Popen:
    """Start `kafka.Kafka properties` detached, its output in `log_file` (the previous run's log
    kept as <log>.1). `heap` is the (-Xms, -Xmx) pair; KBROKER_BROKER_JAVA_OPTS adds options."""
    if log_file.exists():
        log_file.replace(log_file.with_name(log_file.name + ".1"))  # keep the previous run's log
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            # The JVM expands the classpath's '*', no shell involved.
            [
                java,
                *heap,
                "-XX:+UseG1GC",
                LOGGING_OPTION,
                *extra_java_options(),
                "-cp",
                str(libs / "*"),
                "kafka.Kafka",
                str(properties),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=properties.parent,
            start_new_session=True,  # no terminal signals from our shell
        )
    CHILDREN[proc.pid] = proc
    return proc


def extra_java_options() -> list[str]:
    """KBROKER_BROKER_JAVA_OPTS, split as a shell would: options for every embedded Kafka JVM
    (the test suite's brokers compile with C1 only, for instance: tests/conftest.py)."""
    try:
        return shlex.split(os.environ.get("KBROKER_BROKER_JAVA_OPTS", ""))
    except ValueError as exc:
        raise EmbeddedBrokerError(f"KBROKER_BROKER_JAVA_OPTS cannot be split into options: {exc}") from None


def kafka_process(pid: int | None, properties: Path) -> psutil.Process | None:
    """The live Kafka JVM with this pid started on `properties`, or None. The command line is
    checked because after a reboot or crash the recorded pid may belong to an unrelated process."""
    reap()
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        cmdline = proc.cmdline()
    except psutil.Error:
        return None
    return proc if "kafka.Kafka" in cmdline and str(properties) in cmdline else None
