"""dcco.flower.credentials: the throwaway CA, the SuperLink's certificate and node keys that
the loopback launcher's TLS deployment uses."""

from __future__ import annotations

import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dcco.flower.credentials import main, make_credentials


def test_credentials__a_ca_signs_the_superlinks_certificate_and_secrets_are_owner_only(
        tmp_path):
    made = make_credentials(tmp_path / "creds", 2, ("127.0.0.1", "node.example"))
    ca = x509.load_pem_x509_certificate(made.ca_certificate.read_bytes())
    server = x509.load_pem_x509_certificate(made.superlink_certificate.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["node.example"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # the SuperLink's key is the certificate's; each node's private key matches its .pub
    key = serialization.load_pem_private_key(made.superlink_key.read_bytes(), None)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()
    for private, public in zip(made.node_keys, made.node_public_keys, strict=True):
        node = serialization.load_ssh_private_key(private.read_bytes(), None)
        assert isinstance(node, ec.EllipticCurvePrivateKey) and node.curve.name == "secp384r1"
        assert (serialization.load_ssh_public_key(public.read_bytes()).public_numbers()
                == node.public_key().public_numbers())
    assert {p.name for p in made.folder.iterdir()} == {
        "ca.crt", "superlink.crt", "superlink.key", "node-0.key", "node-0.pub", "node-1.key",
        "node-1.pub"}  # no CA key: nobody can sign another certificate under this CA
    for secret in made.secrets:
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.folder.stat().st_mode) == 0o700


def test_credentials__refuses_a_folder_that_holds_some_and_bad_counts(tmp_path, capsys):
    make_credentials(tmp_path / "creds", 1)
    with pytest.raises(ValueError, match="already holds credentials"):
        make_credentials(tmp_path / "creds", 1)
    with pytest.raises(ValueError, match="at least one node"):
        make_credentials(tmp_path / "other", 0)
    assert main(["--out", str(tmp_path / "creds"), "--nodes", "1"]) == 2
    assert "already holds credentials" in capsys.readouterr().err
    assert main(["--out", str(tmp_path / "cli"), "--nodes", "2"]) == 0
    assert (tmp_path / "cli" / "node-1.pub").is_file()


def test_loopback_start_node__a_node_past_the_deployments_keys_is_told_to_bring_one(tmp_path):
    """An extra SuperNode (an intruder in the tests) has no key of the deployment's set: the
    error says so and names ``key=``, before any process starts."""
    from dcco.flower.testing.loopback import Loopback

    deployment = Loopback(2, tmp_path / "deploy")
    with pytest.raises(ValueError, match=r"SuperNode 2 has no key of this deployment "
                                         r"\(it made node-0 to node-1\); give key="):
        deployment.start_node(2)
    assert deployment.procs == {}
