"""The pool's TLS certificate: self-signed, made fresh for each pool, pinned by the join token.

No CA is involved: the node learns the certificate's SHA-256 fingerprint from the token (which travels
the way the user pastes commands: a Slurm script, a Kubernetes secret, an ssh command line) and accepts
only that certificate (:func:`nbtrain.wire.link.check_fingerprint`). The private key never leaves the
kernel's memory and a 0700 directory that is removed with the pool.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile

from ...wire.link import fingerprint


def make_certificate(host: str) -> tuple[bytes, bytes, str]:
    """(certificate PEM, private key PEM, SHA-256 fingerprint of the DER certificate) for ``host``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nbtrain pool")])
    now = datetime.datetime.now(datetime.timezone.utc)
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alt = x509.DNSName(host or "localhost")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert_pem, key_pem, fingerprint(cert.public_bytes(serialization.Encoding.DER))


def server_context(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """A TLS server context holding the pool's certificate (written briefly to a private directory: ssl needs files)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="nbtrain-tls-") as private:
        os.chmod(private, 0o700)
        cert_path, key_path = os.path.join(private, "cert.pem"), os.path.join(private, "key.pem")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert_path, key_path)
    return context
