"""TLS for the clients whose sockets Python opens (the worker's aiokafka, kbroker's wire client):
an ssl.SSLContext from a cluster's ClientSecurity. librdkafka and Spark take the same PEM
material as settings (core/security/client_security.py)."""

from __future__ import annotations

import os
import ssl
import tempfile

from kbroker.core.security.client_security import ClientSecurity


def ssl_context(sec: ClientSecurity) -> ssl.SSLContext:
    """A client context trusting the settings' CA (else the system's), presenting the client
    certificate when there is one, checking the host name unless the settings turn that off."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=sec.ca_pem)
    if not sec.check_hostname:
        ctx.check_hostname = False  # the certificate itself is still verified against the CA
    if sec.cert_pem and sec.key_pem:
        # load_cert_chain reads files only: a private temporary file (mode 0600), gone at once.
        fd, path = tempfile.mkstemp(prefix="kbroker-client-", suffix=".pem")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(sec.key_pem + sec.cert_pem)
            ctx.load_cert_chain(path)
        finally:
            os.unlink(path)
    return ctx
