"""Client properties, either dialect, read into one value and rendered for each client kbroker runs."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from kbroker.core.security.client_properties import (
    Jaas,
    env_name,
    env_of,
    parse_jaas,
    properties_from_env,
    read_properties,
    write_properties,
)
from kbroker.core.security.client_security import AIOKAFKA, KBROKER, SPARK, WIRE, ClientSecurity
from kbroker.errors import InvalidArgumentError, UnsupportedSettingError

SCRAM = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="s3cr\\"et";'


def _cert(name: str, key) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )


@pytest.fixture(scope="module")
def material():
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert("alice", key)
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_encrypted = rsa_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.BestAvailableEncryption(b"kpw"),
    )
    p12 = pkcs12.serialize_key_and_certificates(
        b"alice", key, cert, None, serialization.BestAvailableEncryption(b"storepw")
    )
    files = {
        "/ca.pem": cert_pem,
        "/key.pem": pkcs8,
        "/alice.pem": pkcs8 + cert_pem,
        "/rsa.pem": rsa_encrypted,
        "/alice.p12": p12,
        "/store.jks": b"\xfe\xed\xfe\xed-not-pem",
    }
    return {"cert": cert_pem.decode(), "pkcs8": pkcs8.decode(), "files": files, "rsa": rsa_key}


def read_from(files):
    def read(path: str) -> bytes:
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory")
        return files[path]

    return read


def test_java_and_librdkafka_dialects_read_to_the_same_settings(material):
    java = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": SCRAM,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/ca.pem",
    }
    rdk = {
        "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": 's3cr"et',
        "ssl.ca.location": "/ca.pem",
    }
    a, b = (ClientSecurity.of(p, read_from(material["files"])) for p in (java, rdk))
    assert (
        a.librdkafka()
        == b.librdkafka()
        == {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": 's3cr"et',
            "ssl.ca.pem": material["cert"],
        }
    )
    assert a.java() == b.java()
    assert a.java()["sasl.jaas.config"] == SCRAM
    assert a.java()["ssl.truststore.certificates"] == material["cert"]
    assert a.aiokafka() == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "username": "alice",
        "password": 's3cr"et',
    }
    assert "s3cr" not in repr(a)


def test_mutual_tls_from_a_pem_key_store_a_pkcs12_store_and_librdkafka_files(material):
    files = material["files"]
    pem = ClientSecurity.of(
        {
            "security.protocol": "SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": "/alice.pem",
            "ssl.truststore.location": "/ca.pem",
        },
        read_from(files),
    )
    p12 = ClientSecurity.of(
        {
            "security.protocol": "SSL",
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": "/alice.p12",
            "ssl.keystore.password": "storepw",
            "ssl.ca.location": "/ca.pem",
        },
        read_from(files),
    )
    rdk = ClientSecurity.of(
        {
            "security.protocol": "SSL",
            "ssl.certificate.location": "/ca.pem",
            "ssl.key.location": "/key.pem",
            "ssl.ca.location": "/ca.pem",
        },
        read_from(files),
    )
    for sec in (pem, p12, rdk):
        assert (sec.cert_pem, sec.key_pem) == (material["cert"], material["pkcs8"])
        assert sec.librdkafka()["ssl.key.pem"] == material["pkcs8"]
        assert sec.java()["ssl.keystore.key"] == material["pkcs8"]
        assert "sasl.jaas.config" not in sec.java()


def test_an_encrypted_traditional_key_becomes_unencrypted_pkcs8(material):
    sec = ClientSecurity.of(
        {
            "security.protocol": "SSL",
            "ssl.certificate.pem": material["cert"],
            "ssl.key.location": "/rsa.pem",
            "ssl.key.password": "kpw",
        },
        read_from(material["files"]),
    )
    assert sec.key_pem.startswith("-----BEGIN PRIVATE KEY-----")
    with pytest.raises(InvalidArgumentError, match="the client key: no readable private key"):
        ClientSecurity.of(
            {
                "security.protocol": "SSL",
                "ssl.certificate.pem": material["cert"],
                "ssl.key.location": "/rsa.pem",
                "ssl.key.password": "wrong",
            },
            read_from(material["files"]),
        )


@pytest.mark.parametrize(
    "props, setting, client",
    [
        ({"linger.ms": "5"}, "linger.ms", KBROKER),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism=GSSAPI", KBROKER),
        (
            {"security.protocol": "SSL", "ssl.truststore.type": "JKS", "ssl.truststore.location": "/store.jks"},
            "ssl.truststore.location (JKS)",
            KBROKER,
        ),
        ({"security.protocol": "TLS"}, "security.protocol=TLS", KBROKER),
    ],
)
def test_a_setting_kbroker_cannot_translate_is_named_with_the_client(material, props, setting, client):
    with pytest.raises(UnsupportedSettingError) as caught:
        ClientSecurity.of(props, read_from(material["files"]))
    assert (caught.value.setting, caught.value.client) == (setting, client)
    assert setting in str(caught.value)


def test_oauthbearer_is_passed_to_librdkafka_and_spark_and_refused_by_the_worker():
    props = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.login.callback.handler.class": "x",
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'clientId="app" clientSecret="shh" scope="kafka";',
    }
    sec = ClientSecurity.of(props, read_from({}))
    assert sec.librdkafka()["sasl.oauthbearer.method"] == "oidc"
    assert sec.librdkafka()["sasl.oauthbearer.client.secret"] == "shh"
    assert parse_jaas(sec.java()["sasl.jaas.config"]).options == {
        "clientId": "app",
        "clientSecret": "shh",
        "scope": "kafka",
    }
    sec.check(SPARK)
    for client in (AIOKAFKA, WIRE):
        with pytest.raises(UnsupportedSettingError, match="OAUTHBEARER"):
            sec.check(client)


def test_unreadable_or_incomplete_settings_are_named_without_their_secrets(material):
    with pytest.raises(InvalidArgumentError, match="ssl.truststore.location: cannot read /nope"):
        ClientSecurity.of({"security.protocol": "SSL", "ssl.truststore.location": "/nope"}, read_from({}))
    with pytest.raises(InvalidArgumentError, match="needs a username and a password"):
        ClientSecurity.of({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, read_from({}))
    with pytest.raises(InvalidArgumentError, match="is not the login module of PLAIN"):
        ClientSecurity.of(
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": SCRAM}, read_from({})
        )
    with pytest.raises(InvalidArgumentError, match="certificate needs its key") as caught:
        ClientSecurity.of({"security.protocol": "SSL", "ssl.certificate.pem": material["cert"]}, read_from({}))
    assert "BEGIN" not in str(caught.value)


def test_plaintext_ignores_tls_settings_as_kafka_does_and_renders_nothing():
    sec = ClientSecurity.of({"ssl.truststore.location": "/missing", "client.id": "app"}, read_from({}))
    assert sec.librdkafka() == {"client.id": "app"}
    assert sec.java() == {"client.id": "app"}


def test_hostname_checking_off_in_each_dialect(material):
    sec = ClientSecurity.of(
        {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem", "ssl.endpoint.identification.algorithm": "none"},
        read_from(material["files"]),
    )
    assert not sec.check_hostname
    assert sec.librdkafka()["ssl.endpoint.identification.algorithm"] == "none"
    assert sec.java()["ssl.endpoint.identification.algorithm"] == ""


def test_a_properties_file_with_comments_and_a_continued_jaas_line():
    text = (
        "# client.properties\n! also a comment\nsecurity.protocol = SASL_SSL\nsasl.mechanism:PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        '    username="bob" \\\n    password="pw";\n'
    )
    props = read_properties(text)
    assert props["sasl.mechanism"] == "PLAIN"
    assert parse_jaas(props["sasl.jaas.config"]).options == {"username": "bob", "password": "pw"}


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20)
_key = st.from_regex(r"[A-Za-z][A-Za-z0-9_.\-]{0,15}", fullmatch=True)


@given(st.dictionaries(_key, _text, max_size=4), st.sampled_from(["required", "optional"]))
def test_a_jaas_entry_reads_back_what_was_written(options, flag):
    entry = Jaas("org.example.LoginModule", flag, options)
    back = parse_jaas(entry.line())
    assert (back.module, back.flag, dict(back.options)) == ("org.example.LoginModule", flag, options)


@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9]*([._\-][a-z0-9]+)*", fullmatch=True), _text, max_size=5))
def test_properties_through_the_environment_and_back(props):
    assert properties_from_env(env_of(props)) == props
    assert all(name.startswith("KBROKER_KAFKA_") for name in env_of(props))


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9]*([._\-][a-z0-9]+)*", fullmatch=True),
        st.text(st.characters(exclude_categories=("Cs",)), max_size=80),
        max_size=5,
    )
)
def test_a_written_properties_file_reads_back_as_written(props):
    # A Kafka tool's --command-config gets PEM material inline: newlines, '=', ':' and '\\' survive.
    assert read_properties(write_properties(props)) == props


def test_env_names_follow_the_kafka_image_convention():
    assert env_name("sasl.jaas.config") == "KBROKER_KAFKA_SASL_JAAS_CONFIG"
    assert properties_from_env({"KBROKER_KAFKA_SSL_CA_LOCATION": "/ca", "OTHER": "x"}) == {"ssl.ca.location": "/ca"}


@given(st.text(max_size=60))
def test_any_jaas_text_reads_or_raises_a_typed_error(text):
    try:
        parse_jaas(text)
    except InvalidArgumentError:
        pass


@given(st.text(max_size=200))
def test_any_properties_text_reads_or_raises_a_typed_error(text):
    try:
        props = read_properties(text)
    except InvalidArgumentError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in props.items())


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "security.protocol",
                "sasl.mechanism",
                "sasl.jaas.config",
                "sasl.username",
                "ssl.ca.pem",
                "ssl.truststore.location",
                "ssl.keystore.type",
                "client.id",
                "linger.ms",
            ]
        ),
        st.text(max_size=40),
        max_size=5,
    )
)
def test_any_settings_read_or_raise_a_typed_error(props):
    try:
        ClientSecurity.of(props, read_from({}))
    except InvalidArgumentError:  # UnsupportedSettingError is one
        pass


def test_a_client_certificate_is_named_as_the_secured_broker_maps_it():
    """kbroker's secured broker maps a CN-only subject to the CN (its principal mapping rule):
    a refusal names `User:clerk2`, the principal ACLs must be granted to, not `User:CN=clerk2`."""
    from kbroker.embedded import certs

    ca = certs.new_ca()
    cn_only = certs.issue(ca, "clerk2")
    assert ClientSecurity(protocol="SSL", cert_pem=cn_only.cert.decode()).principal == "User:clerk2"
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, "clerk2"), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme")]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    assert ClientSecurity(protocol="SSL", cert_pem=pem).principal == "User:O=Acme,CN=clerk2"  # DEFAULT: the DN
