"""The secured embedded broker's certificates and files (embedded/certs.py, embedded/secure.py):
what Kafka's PEM stores and TLS clients need of them, checked without a broker. The handshake
test runs OpenSSL on two memory buffers: no socket."""

from __future__ import annotations

import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from kbroker.embedded import certs
from kbroker.embedded.broker import EmbeddedBroker
from kbroker.embedded.secure import SecureFiles, check_user_name, read_properties
from kbroker.errors import EmbeddedBrokerError, InvalidArgumentError


@pytest.fixture(scope="module")
def ca() -> certs.Issued:
    return certs.new_ca()


def cert_of(issued: certs.Issued) -> x509.Certificate:
    return x509.load_pem_x509_certificate(issued.cert)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_ca_signs_the_broker_certificate_for_localhost_and_127_0_0_1(ca):
    broker = certs.issue(ca, certs.BROKER_NAME, server=True)
    leaf, root = cert_of(broker), cert_of(ca)
    leaf.verify_directly_issued_by(root)  # raises unless the CA's key signed it
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert leaf.subject.rfc4514_string() == "CN=kbroker-broker"
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_a_client_certificate_names_the_user_only_and_is_for_clients(ca):
    leaf = cert_of(certs.issue(ca, "alice"))
    leaf.verify_directly_issued_by(cert_of(ca))
    assert leaf.subject.rfc4514_string() == "CN=alice"  # what the principal mapping rule turns into alice
    assert list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    with pytest.raises(x509.ExtensionNotFound):
        leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_keys_are_unencrypted_pkcs8(ca):
    issued = certs.issue(ca, "alice")
    for key in (ca.key, issued.key):
        assert key.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, not SEC1's "EC PRIVATE KEY"
        serialization.load_pem_private_key(key, password=None)
    chain = issued.chain(ca)
    assert chain.count(b"BEGIN CERTIFICATE") == 2 and chain.startswith(issued.key)


def test_a_strict_tls_client_trusts_the_broker_at_127_0_0_1_and_the_broker_its_client(ca, tmp_path):
    broker, client = certs.issue(ca, certs.BROKER_NAME, server=True), certs.issue(ca, "alice")
    for name, data in {"ca.pem": ca.cert, "broker.pem": broker.chain(ca), "alice.pem": client.chain(ca)}.items():
        (tmp_path / name).write_bytes(data)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "broker.pem")
    server_ctx.load_verify_locations(tmp_path / "ca.pem")
    server_ctx.verify_mode = ssl.CERT_REQUIRED  # as ssl.client.auth=required
    client_ctx = ssl.create_default_context(cafile=tmp_path / "ca.pem")
    client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13's default
    client_ctx.load_cert_chain(tmp_path / "alice.pem")
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    tls_client = client_ctx.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    tls_server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done: set[str] = set()
    for _ in range(10):
        for name, end, out, peer_in in (("client", tls_client, c_out, s_in), ("server", tls_server, s_out, c_in)):
            try:
                end.do_handshake()
                done.add(name)
            except ssl.SSLWantReadError:
                pass
            peer_in.write(out.read())
        if done == {"client", "server"}:
            break
    assert done == {"client", "server"}
    assert dict(x[0] for x in tls_server.getpeercert()["subject"]) == {"commonName": "alice"}


def test_files_are_private_and_kept_across_calls(tmp_path):
    secure = tmp_path / "secure"
    store = certs.ensure(secure)
    user_store = certs.ensure(secure, "alice")
    assert store == secure / "broker.pem" and user_store == secure / "users" / "alice.pem"
    assert mode(secure) == 0o700 and mode(secure / "users") == 0o700
    files = [secure / "ca.pem", secure / "ca.key", store, user_store]
    assert [mode(f) for f in files] == [0o600] * 4
    before = [f.read_bytes() for f in files]
    certs.ensure(secure)
    certs.ensure(secure, "alice")
    assert [f.read_bytes() for f in files] == before  # a restart presents the same certificates


def test_a_new_ca_reissues_the_key_stores_it_would_not_sign(tmp_path):
    secure = tmp_path / "secure"
    store = certs.ensure(secure)
    (secure / "ca.key").unlink()
    certs.ensure(secure)
    leaf = x509.load_pem_x509_certificate(store.read_bytes().split(b"-----END PRIVATE KEY-----\n")[1])
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate((secure / "ca.pem").read_bytes()))


def test_client_properties_files_read_back_as_written(tmp_path):
    files = SecureFiles(tmp_path / "data dir\\x")  # a space and a backslash, escaped in the files
    password = files.prepare()
    files.record_user("alice", "s3cret", "127.0.0.1:9092", "127.0.0.1:9094")
    files.write_client_properties("127.0.0.1:9192", "127.0.0.1:9194")  # a restart on other ports rewrites every file
    admin = read_properties(files.admin_properties)
    assert "bootstrap.servers" not in admin  # the Cluster's bootstrap, not a setting
    assert admin == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": f"org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="admin" password="{password}";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
    }
    alice = files.user_files("alice")
    assert (
        read_properties(alice["plain"])["sasl.jaas.config"]
        == 'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="s3cret";'
    )
    mtls = read_properties(alice["mtls"])
    assert (mtls["security.protocol"], mtls["ssl.keystore.type"], mtls["ssl.keystore.location"]) == (
        "SSL",
        "PEM",
        str(alice["cert"]),
    )
    assert "bootstrap.servers=127.0.0.1:9194" in alice["mtls"].read_text()
    assert "bootstrap.servers=127.0.0.1:9192" in alice["scram"].read_text()
    assert {mode(p) for p in [files.users_file, files.admin_properties, *alice.values()]} == {0o600}
    assert files.forget_user("alice") and not any(p.exists() for p in alice.values())
    assert set(files.users()) == {"admin"}


def test_plain_users_are_listed_in_the_listeners_jaas_line(tmp_path):
    files = SecureFiles(tmp_path)
    password = files.prepare()
    files.record_user("bob", "pw-b", "127.0.0.1:1", "127.0.0.1:3")
    [line] = [ln for ln in files.listeners(1, 3, 2).splitlines() if ".plain.sasl.jaas.config=" in ln]
    assert line.endswith(f'required user_admin="{password}" user_bob="pw-b";')


@pytest.mark.parametrize("name", ["", "a/b", "a b", 'x"y', "a" * 65, "é"])
def test_a_user_name_outside_the_safe_characters_is_refused(name):
    with pytest.raises(InvalidArgumentError, match="user name"):
        check_user_name(name)


def test_a_data_dir_formatted_plain_cannot_start_secure_nor_the_reverse(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "meta.properties").write_text("cluster.id=x\n")  # formatted (plain)
    with pytest.raises(EmbeddedBrokerError, match="use another --data-dir"):
        EmbeddedBroker(tmp_path).start(secure=True)
    SecureFiles(tmp_path).mark_enabled()  # formatted secure
    with pytest.raises(EmbeddedBrokerError, match="use another --data-dir"):
        EmbeddedBroker(tmp_path).start(secure=False)
