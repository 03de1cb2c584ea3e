"""The embedded Apache Kafka broker: one real KRaft node (broker and controller in one JVM).

Maven resolves its jars once into the per-user cache. A data dir holds server.properties, the
KRaft log dirs, broker.log and broker.json (pid and ports). The JVM is detached, so the broker
outlives the `kbroker broker start` that launched it. Nothing happens at import time."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import psutil

from kbroker import config
from kbroker.errors import (
    BrokerUnavailableError,
    EmbeddedBrokerError,
    JavaMissingError,
    MavenMissingError,
    PortInUseError,
    RepositoryUnreachableError,
)

KAFKA_VERSION = "4.4.0"
MIN_JAVA = 17
_HERE = Path(__file__).resolve().parent
_MARKER = ".complete"  # written last into the cache dir: its presence means every jar is there
# Maven output that means the repository could not be reached, as opposed to refusing an artifact.
_UNREACHABLE = re.compile(
    r"unknown ?host|could not transfer|connection refused|connect(ion)? timed out|"
    r"network is unreachable|no route to host|name or service not known|name resolution|"
    r"read timed out|proxy|PKIX|no plugin found for prefix", re.IGNORECASE)
# Rewritten at every start, so a restart may use other ports: the controller quorum is static
# (controller.quorum.voters), and a voter's address is configuration, not stored state.
_SERVER_PROPERTIES = """\
# Written by kbroker at every start; edits are overwritten.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{cport}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={log_dirs}
# One node: every internal topic has one replica and needs only that one in sync.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# kbroker creates its topics explicitly.
auto.create.topics.enable=false
num.partitions=1
"""
# Brokers this process started, kept to reap them once they exit: an unreaped child stays a
# zombie, which psutil still reports as an existing pid.
_CHILDREN: dict[int, subprocess.Popen] = {}


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    port: int | None
    controller_port: int | None
    bootstrap: str | None
    data_dir: Path
    version: str

    def as_dict(self) -> dict:
        return {**asdict(self), "data_dir": str(self.data_dir)}


def _bind(port: int) -> int | None:
    """The port bound (a free one for 0), or None if it is taken. SO_REUSEADDR as the JVM sets
    it, so a port left in TIME_WAIT by a stopped broker counts as free."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return None
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _reap() -> None:
    for pid, child in list(_CHILDREN.items()):
        if child.poll() is not None:  # exited (maybe stopped by another process); now reaped
            del _CHILDREN[pid]


def _exited(proc: psutil.Process) -> bool:
    child = _CHILDREN.get(proc.pid)
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


def _wait_exit(proc: psutil.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _exited(proc):
            return True
        time.sleep(0.1)
    return False


def _tail(path: Path, lines: int = 5) -> str:
    """The last meaningful lines of a log, on one line (stack frames left out)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    frame = re.compile(r"\s+(at |\.\.\. \d+ more)")
    keep = [ln.strip()[:300] for ln in text if ln.strip() and not frame.match(ln)]
    return " | ".join(keep[-lines:]) or "(log is empty)"


def _kafka_uuid() -> str:
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
            "set JAVA_HOME, or use another Kafka with --bootstrap / KBROKER_BOOTSTRAP")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
        m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    except (OSError, subprocess.SubprocessError):
        m = None
    if not m:
        raise JavaMissingError(
            f"could not run '{java} -version'; install a JDK {MIN_JAVA}+ or set JAVA_HOME")
    major = int(m.group(2) or 0) if m.group(1) == "1" else int(m.group(1))  # "1.8.0" is Java 8
    if major < MIN_JAVA:
        raise JavaMissingError(
            f"Java {MIN_JAVA}+ is needed to run the embedded Kafka broker but {java} is Java "
            f"{major}; install a JDK {MIN_JAVA}+ and put it first on PATH or set JAVA_HOME")
    return java


class EmbeddedBroker:
    def __init__(self, data_dir: Path | str, *, progress: Callable[[str], None] | None = None):
        # Absolute and resolved: the path is matched against the JVM's command line in status().
        self.data_dir = Path(data_dir).expanduser().resolve()
        self._say = progress or (lambda _msg: None)
        self.properties = self.data_dir / "server.properties"
        self.state_file = self.data_dir / "broker.json"
        self.log_file = self.data_dir / "broker.log"
        self.log_dirs = self.data_dir / "logs"

    def fetch(self) -> Path:
        home = config.cache_dir() / f"kafka-{KAFKA_VERSION}"
        if (home / _MARKER).exists():
            return home / "libs"
        mvn = shutil.which("mvn")
        if not mvn:
            raise MavenMissingError(
                f"Maven ('mvn') is needed once to download Apache Kafka {KAFKA_VERSION} but is "
                "not on PATH; install Maven 3.6+ (e.g. apt-get install maven), or use another "
                "Kafka with --bootstrap / KBROKER_BOOTSTRAP")
        find_java()  # Maven runs on Java; its own message for a missing JDK is less clear
        self._say(f"resolving Apache Kafka {KAFKA_VERSION} with Maven (first run only)...")
        home.parent.mkdir(parents=True, exist_ok=True)
        # Download next to the final place and rename it in one step, so an interrupted or
        # concurrent fetch never leaves a half-filled libs dir that looks complete.
        tmp = Path(tempfile.mkdtemp(prefix=f".kafka-{KAFKA_VERSION}-", dir=home.parent))
        try:
            # A copy: Maven may write next to its pom, and the package dir may be read-only.
            shutil.copyfile(_HERE / "pom.xml", tmp / "pom.xml")
            # The goal by its full plugin name (version pinned in the pom): with just the
            # "dependency:" prefix an unreachable repository fails as "No plugin found".
            cmd = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(tmp / "pom.xml"),
                   "org.apache.maven.plugins:maven-dependency-plugin:copy-dependencies",
                   "-DincludeScope=runtime", f"-DoutputDirectory={tmp / 'libs'}"]
            out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
            if out.returncode != 0 or not list((tmp / "libs").glob("kafka_2.13-*.jar")):
                raise self._maven_error(out.stdout + out.stderr)
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

    @staticmethod
    def _maven_error(output: str) -> EmbeddedBrokerError:
        noise = ("To see", "Re-run", "For more", "[Help")
        output = re.sub(r"\x1b\[[0-9;]*m", "", output)  # Maven colours some lines even with -B
        errors = [ln.replace("[ERROR]", "").replace("-> [Help 1]", "").strip()
                  for ln in output.splitlines() if "[ERROR]" in ln]
        errors = [e for e in errors if e and not e.startswith(noise)]
        reason = next((e for e in errors if _UNREACHABLE.search(e)), None)
        if reason:
            return RepositoryUnreachableError(
                f"Maven could not download Apache Kafka {KAFKA_VERSION} (...{reason[-200:]}); "
                "check the network or the proxy/mirror in ~/.m2/settings.xml and retry")
        detail = (errors[0] if errors else output.strip()[-300:] or "no output")[:300]
        return EmbeddedBrokerError(
            f"Maven could not resolve Apache Kafka {KAFKA_VERSION}: {detail}")

    def start(self, port: int = 9092, controller_port: int | None = None,
              wait: float = 90.0) -> BrokerStatus:
        current = self.status()
        if current.running:
            return current
        java = find_java()
        for p in (port, controller_port):
            if p is not None and _bind(p) is None:
                raise PortInUseError(
                    f"port {p} on 127.0.0.1 is already in use; choose another with --port")
        if controller_port is None:
            controller_port = (_bind(port + 1) if port < 65535 else None) or _bind(0)
        if controller_port == port:
            raise PortInUseError(f"the controller port must differ from the broker port {port}")
        libs = self.fetch()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.properties.write_text(
            _SERVER_PROPERTIES.format(port=port, cport=controller_port, log_dirs=self.log_dirs))
        logging = f"-Dlog4j2.configurationFile={_HERE / 'log4j2.properties'}"
        classpath = ["-cp", str(libs / "*")]  # the JVM expands the '*', no shell involved
        # Format once: meta.properties marks a formatted log dir, and formatting again would
        # refuse (or, forced, lose every topic).
        if not (self.log_dirs / "meta.properties").exists():
            self._say("formatting storage")
            cmd = [java, logging, *classpath, "kafka.tools.StorageTool", "format",
                   "-t", _kafka_uuid(), "-c", str(self.properties)]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=self.data_dir)
            if out.returncode != 0:
                lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
                raise EmbeddedBrokerError(
                    f"formatting Kafka storage in {self.log_dirs} failed: {' | '.join(lines[-3:])}")
        self._say("starting")
        if self.log_file.exists():
            self.log_file.replace(self.data_dir / "broker.log.1")  # keep the previous run's log
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                [java, "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", logging, *classpath,
                 "kafka.Kafka", str(self.properties)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.data_dir, start_new_session=True,  # no terminal signals from our shell
            )
        _CHILDREN[proc.pid] = proc
        state = {"pid": proc.pid, "port": port, "controller_port": controller_port,
                 "version": KAFKA_VERSION, "started_at": datetime.now(timezone.utc).isoformat()}
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")
        try:
            self._wait_ready(proc, port, wait)
        except BaseException:
            self.stop(timeout=10)
            raise
        self._say(f"ready at 127.0.0.1:{port}")
        return self.status()

    def _wait_ready(self, proc: subprocess.Popen, port: int, wait: float) -> None:
        """Until the broker answers a metadata request listing itself, or the JVM dies."""
        from kbroker.kafka import clients

        deadline, admin = time.monotonic() + wait, None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EmbeddedBrokerError(
                    f"the Kafka broker exited with code {proc.returncode} while starting "
                    f"(log: {self.log_file}): {_tail(self.log_file)}")
            # Wait for the listener before creating a client: librdkafka would print every
            # refused connection to stderr.
            if admin is None and _accepts(port):
                admin = clients.admin(f"127.0.0.1:{port}")
            if admin is not None:
                try:
                    timeout = max(1.0, min(5.0, deadline - time.monotonic()))
                    if clients.brokers_answering(f"127.0.0.1:{port}", timeout, admin):
                        return
                except BrokerUnavailableError:
                    pass
            time.sleep(0.2)
        raise EmbeddedBrokerError(
            f"the Kafka broker did not answer at 127.0.0.1:{port} within {wait:.0f}s "
            f"(log: {self.log_file}): {_tail(self.log_file)}")

    def stop(self, timeout: float = 60.0) -> bool:
        proc = self._process()
        if proc is None:
            self.state_file.unlink(missing_ok=True)
            return False
        # SIGTERM runs Kafka's shutdown hook: controlled shutdown, logs flushed and closed, so the
        # next start needs no log recovery. SIGKILL only if that hangs.
        proc.terminate()
        if not _wait_exit(proc, timeout):
            proc.kill()
            _wait_exit(proc, 10)
        _reap()
        self.state_file.unlink(missing_ok=True)
        return True

    def status(self) -> BrokerStatus:
        proc = self._process()
        if proc is None:
            return BrokerStatus(False, None, None, None, None, self.data_dir, KAFKA_VERSION)
        state = self._state()
        return BrokerStatus(True, proc.pid, state["port"], state["controller_port"],
                            f"127.0.0.1:{state['port']}", self.data_dir,
                            state.get("version", KAFKA_VERSION))

    def _state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _process(self) -> psutil.Process | None:
        """The live broker JVM of this data dir, or None. The command line is checked because
        after a reboot or crash the recorded pid may belong to an unrelated process."""
        _reap()
        pid = self._state().get("pid")
        if not pid:
            return None
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            cmdline = proc.cmdline()
        except psutil.Error:
            return None
        return proc if "kafka.Kafka" in cmdline and str(self.properties) in cmdline else None
