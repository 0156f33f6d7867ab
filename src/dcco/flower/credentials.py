"""Throwaway credentials for a Flower deployment: a certificate authority (CA), the
SuperLink's TLS certificate signed by it, and one authentication key pair per SuperNode, made
with the ``cryptography`` package (no cryptography of dcco's own).

    python -m dcco.flower.credentials --out creds --nodes 3 --host 127.0.0.1

writes into ``creds``:

==================== ===================================== ==================================
file                 what it is                            where it goes
==================== ===================================== ==================================
``ca.crt``           the CA's certificate (public)         every SuperNode
                                                           (``--root-certificates``) and the
                                                           ``flwr`` CLI (``root-certificates``)
``superlink.crt``    the SuperLink's certificate (public)  the SuperLink (``--ssl-certfile``)
``superlink.key``    its TLS private key (secret)          the SuperLink (``--ssl-keyfile``)
``node-<i>.key``     SuperNode i's private key (secret)    SuperNode i alone
                                                           (``--auth-supernode-private-key``)
``node-<i>.pub``     its public key (OpenSSH, public)      ``flwr supernode register``
==================== ===================================== ==================================

The CA's own private key is never written: it signs the SuperLink's certificate and is gone,
so nobody can sign another certificate under this CA. Private keys are written with mode
0600 into a folder of mode 0700. These are for a local or test deployment; a deployment
across machines uses its organisation's CA (docs/flower.md).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DAYS = 30
"""How long the certificates are valid."""


@dataclass(frozen=True)
class Credentials:
    """The files ``make_credentials`` wrote (paths)."""

    folder: Path
    ca_certificate: Path
    superlink_certificate: Path
    superlink_key: Path
    node_keys: tuple[Path, ...]
    node_public_keys: tuple[Path, ...]

    @property
    def secrets(self) -> tuple[Path, ...]:
        """The private keys: never to be committed, logged or copied off their machine."""
        return (self.superlink_key, *self.node_keys)


def make_credentials(folder: Path, nodes: int, hosts: Sequence[str] = ("127.0.0.1", "localhost"),
                     common_name: str = "dcco throwaway CA") -> Credentials:
    """A CA, the SuperLink's certificate for ``hosts`` (IP addresses or DNS names, as the
    SuperNodes and the ``flwr`` CLI will dial it) and ``nodes`` SuperNode key pairs (NIST
    P-384, as Flower's SuperNode authentication requires), written into ``folder``.

    Raises:
        ValueError: no node, no host, or a folder that already holds credentials (they are
            not overwritten: a SuperLink may be using them).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if nodes < 1 or not hosts:
        raise ValueError(f"credentials need at least one node and one host, got {nodes} "
                         f"nodes and hosts {list(hosts)}")
    folder = Path(folder)
    if (folder / "ca.crt").exists():
        raise ValueError(f"{folder} already holds credentials (ca.crt); give an empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = _certificate(common_name, ca_key.public_key(), ca_key, common_name, None)
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = _certificate(hosts[0], server_key.public_key(), ca_key, common_name, hosts)
    pem = serialization.Encoding.PEM
    files = Credentials(folder, folder / "ca.crt", folder / "superlink.crt",
                        folder / "superlink.key",
                        tuple(folder / f"node-{i}.key" for i in range(nodes)),
                        tuple(folder / f"node-{i}.pub" for i in range(nodes)))
    files.ca_certificate.write_bytes(ca.public_bytes(pem))
    files.superlink_certificate.write_bytes(server.public_bytes(pem))
    _write_secret(files.superlink_key, server_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    for key_path, pub_path in zip(files.node_keys, files.node_public_keys, strict=True):
        key = ec.generate_private_key(ec.SECP384R1())
        _write_secret(key_path, key.private_bytes(
            pem, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
        pub_path.write_bytes(key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return files


def _certificate(subject: str, public_key, signer, issuer: str, hosts: Sequence[str] | None):
    """An X.509 certificate: the CA's own (``hosts`` None) or a server's for ``hosts``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=DAYS)))
    if hosts is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0),
                                        critical=True)
    else:
        names = [_san(h) for h in hosts]
        builder = (builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                                  critical=False))
    return builder.sign(signer, hashes.SHA384())


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_secret(path: Path, data: bytes) -> None:
    """A private key, readable by its owner alone from the moment it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="an empty folder for the files")
    ap.add_argument("--nodes", type=int, required=True, help="SuperNode key pairs to make")
    ap.add_argument("--host", action="append", default=None,
                    help="the SuperLink's address as nodes dial it (repeat; default "
                         "127.0.0.1 and localhost)")
    args = ap.parse_args(argv)
    try:
        made = make_credentials(args.out, args.nodes, args.host or ("127.0.0.1", "localhost"))
    except ValueError as e:
        print(f"dcco.flower.credentials: {e}", file=sys.stderr)
        return 2
    print(f"wrote into {made.folder}: ca.crt, superlink.crt and superlink.key (SuperLink), "
          f"node-0..{args.nodes - 1}.key and .pub (SuperNodes); the .key files are secret")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DAYS", "Credentials", "make_credentials"]
