"""How kbroker's clients authenticate and encrypt, whichever client they are.

A user gives Kafka client properties under either dialect's names: the Java clients' (what Kafka's
tools and Spark read: `sasl.jaas.config`, `ssl.truststore.location`, ...) or librdkafka's (what
kcat reads: `sasl.username`, `ssl.ca.location`, ...). `ClientSecurity.of` reads them into one
value: protocol, mechanism, credentials, PEM trust and key material, hostname checking, an OAuth
client. Each client kbroker runs gets that value rendered in its own terms: `librdkafka()`,
`java()` (Spark's Kafka source and sink), `aiokafka()` (the Faust worker) and `wire()` (kbroker's
own protocol client). A setting kbroker does not know, or cannot give one of its clients, is an
UnsupportedSettingError naming the setting and the client, never a connection without it.

Keys are read into unencrypted PKCS#8 PEM held in memory, the form every client takes
(tls_material.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from cryptography import x509

from kbroker.core.security.client_properties import Jaas, parse_jaas
from kbroker.core.security.tls_material import certificates, is_pem, pkcs8, pkcs12_certificates, pkcs12_key_store
from kbroker.errors import InvalidArgumentError, UnsupportedSettingError

LIBRDKAFKA = "confluent-kafka (librdkafka)"
AIOKAFKA = "the worker's Faust consumer (aiokafka)"
SPARK = "Spark's Kafka source"
WIRE = "kbroker's log-dir client (kafka/wire.py)"
KBROKER = "any of kbroker's clients"

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}
_OAUTH_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"

ReadFile = Callable[[str], bytes]


_CN_ONLY = re.compile(r"CN=([A-Za-z0-9._-]+)")


@dataclass(frozen=True, repr=False)
class OAuthClient:
    """OAUTHBEARER through an OpenID Connect token endpoint (the client-credentials grant)."""

    token_url: str
    client_id: str
    client_secret: str
    scope: str | None = None


@dataclass(frozen=True, repr=False)
class ClientSecurity:
    """A client's security settings, whichever dialect they came in (see the module docstring)."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    ca_pem: str | None = None  # certificates to trust (PEM); None: the system's
    cert_pem: str | None = None  # the client's certificate chain, for mutual TLS
    key_pem: str | None = None  # its key, unencrypted PKCS#8
    check_hostname: bool = True
    oauth: OAuthClient | None = None
    client_id: str | None = None
    given: tuple[str, ...] = field(default=())  # the property names it was read from

    def __repr__(self) -> str:  # never the credentials
        return f"ClientSecurity({self.protocol}, mechanism={self.mechanism}, from={list(self.given)})"

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def principal(self) -> str:
        """Who the cluster most likely takes this client for (what its ACLs name), for messages:
        `User:<name>` of a SASL login; a client certificate's subject as Kafka's default mapping
        spells it (a broker's ssl.principal.mapping.rules may shorten it, e.g. to the CN);
        User:ANONYMOUS without either."""
        if self.oauth is not None:
            return f"the principal of OAuth client {self.oauth.client_id}"
        if self.sasl and self.username:
            return f"User:{self.username}"
        if self.cert_pem:
            try:
                subject = x509.load_pem_x509_certificate(self.cert_pem.encode()).subject.rfc4514_string()
            except ValueError:
                return "the principal of this client's certificate"
            # The broker's mapping, as kbroker's secured broker writes it (embedded/secure.py): a
            # subject that is only a CN is named by the CN; any other by its whole DN (DEFAULT).
            cn = _CN_ONLY.fullmatch(subject)
            return f"User:{cn.group(1) if cn else subject}"
        return "User:ANONYMOUS"

    @classmethod
    def of(cls, properties: Mapping[str, str], read_file: ReadFile) -> "ClientSecurity":
        """The settings `properties` give (either dialect's names); `read_file` reads a file a
        setting names (trust stores, keys). Raises UnsupportedSettingError for a setting kbroker
        does not translate and InvalidArgumentError for one it cannot read."""
        return _Reader(dict(properties), read_file).read()

    def check(self, *clients: str) -> None:
        """Raise UnsupportedSettingError when one of `clients` cannot be given these settings."""
        for client in clients:
            {LIBRDKAFKA: self.librdkafka, SPARK: self.java, AIOKAFKA: self.aiokafka, WIRE: self.wire}[client]()

    def _common(self) -> dict[str, str]:
        """The settings both dialects name alike."""
        out = {"security.protocol": self.protocol} if self.protocol != "PLAINTEXT" else {}
        if self.client_id:
            out["client.id"] = self.client_id
        if self.sasl:
            out["sasl.mechanism"] = str(self.mechanism)
        return out

    def librdkafka(self) -> dict[str, str]:
        """The settings as librdkafka properties."""
        out = self._common()
        if self.sasl:
            if self.oauth:
                out.update(
                    {
                        "sasl.oauthbearer.method": "oidc",
                        "sasl.oauthbearer.token.endpoint.url": self.oauth.token_url,
                        "sasl.oauthbearer.client.id": self.oauth.client_id,
                        "sasl.oauthbearer.client.secret": self.oauth.client_secret,
                    }
                )
                if self.oauth.scope:
                    out["sasl.oauthbearer.scope"] = self.oauth.scope
            else:
                out.update({"sasl.username": str(self.username), "sasl.password": str(self.password)})
        if self.tls:
            out.update(
                _drop_none(
                    {"ssl.ca.pem": self.ca_pem, "ssl.certificate.pem": self.cert_pem, "ssl.key.pem": self.key_pem}
                )
            )
            if not self.check_hostname:
                out["ssl.endpoint.identification.algorithm"] = "none"
        return out

    def java(self) -> dict[str, str]:
        """The settings as Java client properties (PEM material inline), as Spark's Kafka source
        and sink take them (each with the `kafka.` prefix)."""
        out = self._common()
        if self.sasl:
            mech = str(self.mechanism)
            if self.oauth:
                opts = {"clientId": self.oauth.client_id, "clientSecret": self.oauth.client_secret}
                if self.oauth.scope:
                    opts["scope"] = self.oauth.scope
                out.update(
                    {
                        "sasl.login.callback.handler.class": _OAUTH_HANDLER,
                        "sasl.oauthbearer.token.endpoint.url": self.oauth.token_url,
                    }
                )
            else:
                opts = {"username": str(self.username), "password": str(self.password)}
            out["sasl.jaas.config"] = Jaas(_MODULES[mech], "required", opts).line()
        if self.tls:
            if self.ca_pem:
                out.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": self.ca_pem})
            if self.cert_pem and self.key_pem:
                out.update(
                    {
                        "ssl.keystore.type": "PEM",
                        "ssl.keystore.key": self.key_pem,
                        "ssl.keystore.certificate.chain": self.cert_pem,
                    }
                )
            if not self.check_hostname:
                out["ssl.endpoint.identification.algorithm"] = ""
        return out

    def aiokafka(self) -> dict[str, str | None]:
        """What the worker's Faust app needs: aiokafka's protocol, mechanism and credentials (the
        TLS material itself goes into an ssl.SSLContext, kafka/tls.py). OAUTHBEARER is refused:
        aiokafka needs a token provider kbroker does not ship."""
        if self.oauth:
            raise UnsupportedSettingError(
                "sasl.mechanism=OAUTHBEARER", AIOKAFKA, "use SCRAM, PLAIN or mutual TLS for the worker"
            )
        return {
            "security_protocol": self.protocol,
            "sasl_mechanism": self.mechanism if self.sasl else None,
            "username": self.username,
            "password": self.password,
        }

    def wire(self) -> None:
        """Whether kbroker's own protocol client can connect with these settings (TLS, SASL
        PLAIN and SCRAM); UnsupportedSettingError otherwise."""
        if self.oauth:
            raise UnsupportedSettingError(
                "sasl.mechanism=OAUTHBEARER", WIRE, "queue sizes on disk are not shown with OAUTHBEARER"
            )


def _drop_none(d: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in d.items() if v is not None}


class _Reader:
    """Reads one properties mapping into a ClientSecurity, taking each setting it knows."""

    def __init__(self, props: dict[str, str], read_file: ReadFile):
        self.props, self.read_file = props, read_file
        self.taken: set[str] = set()

    def get(self, *names: str) -> str | None:
        for name in names:
            if name in self.props:
                self.taken.add(name)
                return self.props[name]
        return None

    def read(self) -> ClientSecurity:
        protocol = (self.get("security.protocol") or "PLAINTEXT").upper()
        if protocol not in PROTOCOLS:
            raise UnsupportedSettingError(f"security.protocol={protocol}", KBROKER, f"one of {', '.join(PROTOCOLS)}")
        sec = ClientSecurity(protocol=protocol, client_id=self.get("client.id"))
        if sec.sasl:
            sec = self.read_sasl(sec)
        else:
            self.get("sasl.mechanism", "sasl.mechanisms")  # harmless without SASL, as in Kafka
        if sec.tls:
            sec = self.read_tls(sec)
        else:  # as Kafka's clients do, TLS settings are ignored without TLS
            self.taken |= _TLS_SETTINGS & set(self.props)
        unknown = sorted(set(self.props) - self.taken)
        if unknown:
            raise UnsupportedSettingError(
                unknown[0],
                KBROKER,
                "not a security setting kbroker translates for its clients "
                "(security.protocol, sasl.*, ssl.* trust and key material, client.id)",
            )
        return replace(sec, given=tuple(sorted(self.props)))

    def read_sasl(self, sec: ClientSecurity) -> ClientSecurity:
        mech = (self.get("sasl.mechanism", "sasl.mechanisms") or "GSSAPI").upper()
        if mech not in MECHANISMS:
            raise UnsupportedSettingError(f"sasl.mechanism={mech}", KBROKER, f"one of {', '.join(MECHANISMS)}")
        jaas_text = self.get("sasl.jaas.config")
        jaas = parse_jaas(jaas_text) if jaas_text else None
        if jaas and jaas.module != _MODULES[mech]:
            raise InvalidArgumentError(f"sasl.jaas.config: {jaas.module} is not the login module of {mech}")
        opts = dict(jaas.options) if jaas else {}
        if mech == "OAUTHBEARER":
            return replace(sec, mechanism=mech, oauth=self.read_oauth(opts))
        user = self.get("sasl.username") or opts.get("username")
        password = self.get("sasl.password") or opts.get("password")
        if not user or password is None:
            raise InvalidArgumentError(
                f"{mech} needs a username and a password (sasl.jaas.config, or sasl.username and sasl.password)"
            )
        return replace(sec, mechanism=mech, username=user, password=password)

    def read_oauth(self, opts: dict[str, str]) -> OAuthClient:
        self.get("sasl.oauthbearer.method", "sasl.login.callback.handler.class")
        url = self.get("sasl.oauthbearer.token.endpoint.url")
        cid = self.get("sasl.oauthbearer.client.id", "sasl.oauthbearer.client.credentials.client.id") or opts.get(
            "clientId"
        )
        secret = self.get(
            "sasl.oauthbearer.client.secret", "sasl.oauthbearer.client.credentials.client.secret"
        ) or opts.get("clientSecret")
        scope = self.get("sasl.oauthbearer.scope") or opts.get("scope")
        if not (url and cid and secret):
            raise InvalidArgumentError(
                "OAUTHBEARER needs sasl.oauthbearer.token.endpoint.url, a client id "
                "and a client secret (kbroker speaks the client-credentials grant)"
            )
        return OAuthClient(url, cid, secret, scope)

    def read_tls(self, sec: ClientSecurity) -> ClientSecurity:
        algorithm = self.get("ssl.endpoint.identification.algorithm")
        check = algorithm is None or algorithm.strip().lower() not in ("", "none")
        key_password = self.get("ssl.key.password")
        ca = self.trust()
        cert, key = self.key_store(key_password)
        if bool(cert) != bool(key):
            raise InvalidArgumentError("a client certificate needs its key and the key its certificate")
        return replace(sec, ca_pem=ca, cert_pem=cert, key_pem=key, check_hostname=check)

    def material(self, name: str) -> bytes:
        path = self.props[name]
        self.taken.add(name)
        try:
            return self.read_file(path)
        except OSError as exc:
            raise InvalidArgumentError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None

    def trust(self) -> str | None:
        kind = (self.get("ssl.truststore.type") or "").upper()
        password = self.get("ssl.truststore.password")
        if "ssl.ca.pem" in self.props or "ssl.truststore.certificates" in self.props:
            return certificates(self.get("ssl.ca.pem", "ssl.truststore.certificates") or "", "the trusted CA")
        for name in ("ssl.ca.location", "ssl.truststore.location"):
            if name in self.props:
                data = self.material(name)
                if kind == "PKCS12" or (kind != "PEM" and not is_pem(data)):
                    _refuse_jks(name, kind)
                    return pkcs12_certificates(name, data, password)
                return certificates(data.decode(errors="replace"), name)
        return None

    def key_store(self, key_password: str | None) -> tuple[str | None, str | None]:
        kind = (self.get("ssl.keystore.type") or "").upper()
        password = self.get("ssl.keystore.password")
        if "ssl.keystore.key" in self.props:  # Java, inline PEM
            return (
                certificates(self.get("ssl.keystore.certificate.chain") or "", "ssl.keystore.certificate.chain"),
                pkcs8(str(self.get("ssl.keystore.key")).encode(), key_password, "ssl.keystore.key"),
            )
        if "ssl.keystore.location" in self.props:
            data = self.material("ssl.keystore.location")
            if kind == "PKCS12" or (kind != "PEM" and not is_pem(data)):
                _refuse_jks("ssl.keystore.location", kind)
                return pkcs12_key_store(data, password or key_password)
            return certificates(data.decode(errors="replace"), "ssl.keystore.location"), pkcs8(
                data, key_password, "ssl.keystore.location"
            )
        cert = self.get("ssl.certificate.pem") or (
            self.material("ssl.certificate.location").decode(errors="replace")
            if "ssl.certificate.location" in self.props
            else None
        )
        key = self.get("ssl.key.pem")
        key_bytes = (
            key.encode() if key else (self.material("ssl.key.location") if "ssl.key.location" in self.props else None)
        )
        return (
            certificates(cert, "the client certificate") if cert else None,
            pkcs8(key_bytes, key_password, "the client key") if key_bytes else None,
        )


_TLS_SETTINGS = frozenset(
    {
        "ssl.endpoint.identification.algorithm",
        "ssl.key.password",
        "ssl.truststore.type",
        "ssl.truststore.password",
        "ssl.truststore.location",
        "ssl.truststore.certificates",
        "ssl.ca.pem",
        "ssl.ca.location",
        "ssl.keystore.type",
        "ssl.keystore.password",
        "ssl.keystore.location",
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
        "ssl.certificate.pem",
        "ssl.certificate.location",
        "ssl.key.pem",
        "ssl.key.location",
    }
)


def _refuse_jks(name: str, kind: str) -> None:
    if kind == "JKS":
        raise UnsupportedSettingError(
            f"{name} (JKS)",
            KBROKER,
            "convert the store to PKCS12 or PEM (keytool -importkeystore -deststoretype PKCS12)",
        )
