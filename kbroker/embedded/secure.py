"""What a secured embedded broker keeps in `<data-dir>/secure` (0700, every file 0600): the
certificates (embedded/certs.py), the users' passwords (users.json), the marker saying the data
dir was formatted secure (`enabled`: the dir then restarts secure, even without --secure), and
each identity's client properties files, written the Kafka way (Java client property names, what
`kafka-console-producer --command-config` reads):

* admin.properties: `admin`, a super user, over SCRAM-SHA-512 on the SASL_SSL port;
* <name>.properties / <name>-plain.properties: a user over SCRAM-SHA-512 / PLAIN on that port;
* <name>-mtls.properties: a user's client certificate (users/<name>.pem) on the TLS port.

The broker authenticates SCRAM against credentials in its metadata log (`admin`'s is added when
the storage is formatted, the others' through the admin API when a user is added), and PLAIN
against the users listed in its own configuration, which it reads when it starts."""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

from kbroker.core.cluster import Cluster
from kbroker.core.security import client_properties
from kbroker.core.security.client_properties import Jaas
from kbroker.embedded import certs
from kbroker.errors import EmbeddedBrokerError, InvalidArgumentError

ADMIN = "admin"
RESERVED = frozenset({ADMIN, certs.BROKER_NAME})
USER_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # safe in JAAS, SCRAM names and the mapping rule
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"

# The listeners and security of a secure node (the rest of server.properties is the plain
# node's). Clients: SASL_SSL with SCRAM-SHA-512 or PLAIN on the broker port, client certificates
# on the TLS port. The broker presents its own certificate to the controller and on the
# inter-broker listener, so both know it as User:kbroker-broker, a super user: a CONTROLLER
# listener without client authentication would have to make every local process one.
_LISTENERS = """\
listeners=SASL_SSL://127.0.0.1:{port},SSL://127.0.0.1:{tls_port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=SASL_SSL://127.0.0.1:{port},SSL://127.0.0.1:{tls_port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:SSL
inter.broker.listener.name=SSL
# PEM key and trust stores (no store passwords: the files are private instead).
ssl.keystore.type=PEM
ssl.keystore.location={keystore}
ssl.truststore.type=PEM
ssl.truststore.location={ca}
listener.name.ssl.ssl.client.auth=required
listener.name.controller.ssl.client.auth=required
# A certificate CN=alice is User:alice, the same principal as alice's SCRAM or PLAIN login.
ssl.principal.mapping.rules=RULE:^CN=([A-Za-z0-9._-]+)$/$1/,DEFAULT
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram_module} required;
listener.name.sasl_ssl.plain.sasl.jaas.config={plain_module} required {plain_users};
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:{broker};User:{admin}
"""


def check_user_name(name: str) -> None:
    """InvalidArgumentError unless `name` may be a user of the embedded broker."""
    if not USER_NAME.fullmatch(name):
        raise InvalidArgumentError(f"user name {name!r} is not 1 to 64 letters, digits, '.', '_' or '-'")


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file's settings, `bootstrap.servers` left out (a Cluster's bootstrap
    is not one of its settings)."""
    props = client_properties.read_properties(path.read_text())
    props.pop("bootstrap.servers", None)
    return props


def _jaas(module: str, user: str, password: str) -> str:
    return Jaas(module, "required", {"username": user, "password": password}).line()


def _properties_text(what: str, settings: dict[str, str]) -> str:
    # Backslashes are escapes in a properties file; nothing else in these values needs one.
    lines = "".join(f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in settings.items())
    return f"# Written by kbroker: {what}. Keep it private: it holds a credential.\n{lines}"


class SecureFiles:
    """The `secure` dir of an embedded broker's data dir (see the module docstring)."""

    def __init__(self, data_dir: Path):
        self.dir = data_dir / "secure"
        self.marker = self.dir / "enabled"
        self.users_file = self.dir / "users.json"
        self.ca = self.dir / "ca.pem"
        self.keystore = self.dir / "broker.pem"
        self.admin_properties = self.dir / "admin.properties"

    @property
    def enabled(self) -> bool:
        """Whether the data dir was formatted secure."""
        return self.marker.exists()

    def decide(self, wanted: bool | None, formatted: bool) -> bool:
        """Whether the broker starts secure: what its data dir was formatted as (plain when not
        formatted yet, unless `wanted`), which `wanted` must not contradict."""
        if wanted is None or not formatted or wanted == self.enabled:
            return self.enabled if wanted is None else wanted
        data_dir = self.dir.parent
        if wanted:
            raise EmbeddedBrokerError(
                f"{data_dir} holds a broker formatted without --secure, which cannot become "
                "secure (it has no admin credential); use another --data-dir for a secure broker"
            )
        raise EmbeddedBrokerError(
            f"{data_dir} holds a secure broker, which cannot run without security; "
            "use another --data-dir for a plain one"
        )

    def require_running(self, running: bool) -> None:
        """EmbeddedBrokerError unless the data dir holds a secure broker and it is `running`:
        users are added and removed through it."""
        if not self.enabled:
            raise EmbeddedBrokerError(
                f"{self.dir.parent} holds no secure broker; users are for one started with --secure"
            )
        if not running:
            raise EmbeddedBrokerError(f"the broker in {self.dir.parent} is not running; start it first")

    def mark_enabled(self) -> None:
        """Record that the storage was formatted secure (with the admin's SCRAM credential)."""
        certs.private_dir(self.dir)
        certs.write_private(self.marker, "This data dir was formatted secure: it always starts secure.\n")

    def prepare(self) -> str:
        """The certificates and the admin's password, made when missing; the password."""
        certs.ensure(self.dir)
        users = self.users()
        if ADMIN not in users:
            users[ADMIN] = secrets.token_urlsafe(24)  # URL-safe: nothing to quote in JAAS or --add-scram
            self._save_users(users)
        return users[ADMIN]

    def users(self) -> dict[str, str]:
        """Every user's password by name (the admin's included)."""
        try:
            users: dict[str, str] = json.loads(self.users_file.read_text())
            return users
        except FileNotFoundError:
            return {}

    def _save_users(self, users: dict[str, str]) -> None:
        certs.write_private(self.users_file, json.dumps(users, indent=2, sort_keys=True) + "\n")

    def listeners(self, port: int, tls_port: int, cport: int) -> str:
        """The listener and security lines of server.properties, PLAIN's users included."""
        plain_users = " ".join(f'user_{name}="{pw}"' for name, pw in sorted(self.users().items()))
        return _LISTENERS.format(
            port=port,
            tls_port=tls_port,
            cport=cport,
            keystore=self.keystore,
            ca=self.ca,
            scram_module=SCRAM_MODULE,
            plain_module=PLAIN_MODULE,
            plain_users=plain_users,
            broker=certs.BROKER_NAME,
            admin=ADMIN,
        )

    def admin_cluster(self, bootstrap: str) -> Cluster:
        """The admin's Cluster under librdkafka's setting names (what kbroker's own clients take
        as they are)."""
        return Cluster.with_properties(
            bootstrap,
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": ADMIN,
                "sasl.password": self.users()[ADMIN],
                "ssl.ca.location": str(self.ca),
            },
        )

    # --- client properties files ---------------------------------------------------------------

    def user_files(self, name: str) -> dict[str, Path]:
        """A user's client properties files by kind (scram, plain, mtls) and its key store (cert)."""
        return {
            "scram": self.dir / f"{name}.properties",
            "plain": self.dir / f"{name}-plain.properties",
            "mtls": self.dir / f"{name}-mtls.properties",
            "cert": self.dir / "users" / f"{name}.pem",
        }

    def write_client_properties(self, bootstrap: str, tls_bootstrap: str) -> Path:
        """Every identity's client properties files, for the SASL_SSL listeners at `bootstrap`
        and the client-certificate ones at `tls_bootstrap`; the admin's file."""
        for name, password in self.users().items():
            self._write_user_properties(name, password, bootstrap, tls_bootstrap)
        return self.admin_properties

    def _write_user_properties(self, name: str, password: str, bootstrap: str, tls_bootstrap: str) -> None:
        trust = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca)}
        sasl = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL"}
        scram = {
            **sasl,
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": _jaas(SCRAM_MODULE, name, password),
            **trust,
        }
        if name == ADMIN:
            certs.write_private(self.admin_properties, _properties_text("the admin, a super user", scram))
            return
        files = self.user_files(name)
        certs.write_private(files["scram"], _properties_text(f"user {name}, SCRAM-SHA-512", scram))
        certs.write_private(
            files["plain"],
            _properties_text(
                f"user {name}, PLAIN",
                {**sasl, "sasl.mechanism": "PLAIN", "sasl.jaas.config": _jaas(PLAIN_MODULE, name, password), **trust},
            ),
        )
        certs.write_private(
            files["mtls"],
            _properties_text(
                f"user {name}, client certificate",
                {
                    "bootstrap.servers": tls_bootstrap,
                    "security.protocol": "SSL",
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.location": str(files["cert"]),
                    **trust,
                },
            ),
        )

    # --- users -----------------------------------------------------------------------------------

    def add_user(self, name: str, bootstrap: str, tls_bootstrap: str) -> dict[str, Path]:
        """Give user `name` a new random password (its SCRAM-SHA-512 credential through the running
        broker at `bootstrap` now, its PLAIN login from the next start on), a client certificate
        and its client properties files; the files by kind (scram, plain, mtls, cert)."""
        _check_new_user(name)
        password = secrets.token_urlsafe(24)
        from kbroker.kafka.security import scram_users

        scram_users.set_password(self.admin_cluster(bootstrap), name, password)
        self.record_user(name, password, bootstrap, tls_bootstrap)
        return self.user_files(name)

    def remove_user(self, name: str, bootstrap: str) -> bool:
        """Delete user `name`'s SCRAM credential and ACLs through the running broker at
        `bootstrap`, its PLAIN entry (from the next start on) and its files; whether it existed."""
        _check_new_user(name)
        from kbroker.kafka.security import acls, scram_users

        had_scram = scram_users.delete(self.admin_cluster(bootstrap), name)
        # A removed user's client certificate stays valid (Kafka checks no revocation list):
        # without ACLs it is denied everything.
        had_acls = len(acls.revoke_all(self.admin_cluster(bootstrap), f"User:{name}", wait=False)) > 0
        return self.forget_user(name) or had_scram or had_acls

    def record_user(self, name: str, password: str, bootstrap: str, tls_bootstrap: str) -> None:
        """Record `name` with `password` (PLAIN's entry, read at the next broker start), sign its
        client certificate and write its properties files."""
        users = self.users()
        users[name] = password
        self._save_users(users)
        certs.ensure(self.dir, name)
        self._write_user_properties(name, password, bootstrap, tls_bootstrap)

    def forget_user(self, name: str) -> bool:
        """Forget `name` and delete its files; whether it was recorded."""
        users = self.users()
        known = users.pop(name, None) is not None
        self._save_users(users)
        for path in self.user_files(name).values():
            path.unlink(missing_ok=True)
        return known


def _check_new_user(name: str) -> None:
    check_user_name(name)
    if name in RESERVED:
        raise InvalidArgumentError(f"{name} is kbroker's own user; choose another name")
