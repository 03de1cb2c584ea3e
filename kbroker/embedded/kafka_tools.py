"""Apache Kafka's own command-line tools (kafka-transactions.sh and its kind), run against any
cluster kbroker reaches: their jars resolved with Maven on first use (tools-pom.xml), the
cluster's bootstrap and security given as the tool's --bootstrap-server and --command-config.

Why Kafka's tool and not a client call: ending another producer's transaction takes Kafka's
WriteTxnMarkers request (Admin.abortTransaction), which librdkafka does not offer."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from kbroker import config
from kbroker.core.cluster import Cluster, ClusterLike
from kbroker.core.security.client_properties import write_properties
from kbroker.embedded.certs import write_private
from kbroker.embedded.jvm import HERE, KAFKA_VERSION, LOGGING_OPTION, fetch_maven_jars, find_java
from kbroker.errors import BrokerUnavailableError, InvalidArgumentError
from kbroker.kafka.clients import security

TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"  # kafka-transactions.sh


def tool_jars(say: Callable[[str], None]) -> Path:
    """The libs dir of Kafka's tools, resolved with Maven on first use."""
    return fetch_maven_jars(
        HERE / "tools-pom.xml",
        config.cache_dir() / f"kafka-tools-{KAFKA_VERSION}",
        f"Apache Kafka {KAFKA_VERSION}'s tools",
        "kafka-tools-*.jar",
        say,
    )


def run_tool(
    cluster: ClusterLike, main_class: str, args: list[str], timeout: float, say: Callable[[str], None] = lambda _m: None
) -> str:
    """Run Kafka's tool `main_class` with `args` against `cluster`; its output. A tool that fails
    raises InvalidArgumentError with its last lines; one still running after `timeout` seconds is
    killed and raises BrokerUnavailableError."""
    c = Cluster.of(cluster)
    jars = tool_jars(say)
    with tempfile.TemporaryDirectory(prefix="kbroker-tool-") as tmp:
        props = Path(tmp) / "client.properties"  # credentials: the owner's only, gone after the run
        write_private(props, write_properties(security(c).java()))
        cmd = [
            find_java(),
            LOGGING_OPTION,
            "-cp",
            str(jars / "*"),
            main_class,
            "--bootstrap-server",
            c.bootstrap,
            "--command-config",
            str(props),
            *args,
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise BrokerUnavailableError(
                f"Kafka's {main_class.rsplit('.', 1)[-1]} did not finish in {timeout:.0f} s against {c.bootstrap}"
            ) from None
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        raise InvalidArgumentError(f"Kafka's {main_class.rsplit('.', 1)[-1]} failed: {' | '.join(lines[-3:])}")
    return done.stdout
