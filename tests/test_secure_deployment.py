"""A real deployment with TLS and SuperNode authentication (the launcher's default): one
SuperLink and 3 registered SuperNodes on 127.0.0.1, and nodes that must be refused, in one
deployment (each start of Flower's processes costs tens of seconds on 2 cores).

Slow: marked ``slow``, and ``.ci/run`` runs it with the rest of the suite.
"""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch
from helpers.deployments import import_seconds, round_records

from dcco.config import load_config
from dcco.flower.credentials import Credentials, make_credentials
from dcco.flower.testing.loopback import Loopback, declared_keys
from dcco.models import build_dual_encoder
from dcco.run.checkpoint import load_checkpoint
from dcco.run.setup import projector

NODES = 3


def _parsed(run_config: dict):
    """(cfg, fcfg) of a run config as the ServerApp reads it: the app's declared defaults,
    overridden."""
    from dcco.flower.appconfig import parse_run_config

    return parse_run_config({**declared_keys(), **run_config})


def _weights(cfg, checkpoint: Path | None = None) -> dict[str, torch.Tensor]:
    """The model of ``cfg`` in float64: its initial weights, or a checkpoint's."""
    net = build_dual_encoder(cfg.model, 1, projector(cfg), seed=cfg.train.seed).double()
    if checkpoint is not None:
        load_checkpoint(checkpoint, net, None)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _trained(run: Path) -> dict[str, torch.Tensor]:
    """The model of a run's checkpoint."""
    return _weights(load_config(run / "config.toml"), run / "checkpoint.safetensors")


def _hosted_by(cfg, partition: int):
    """round → how many of the clients sampled in it node ``partition`` hosts (the server's
    draw, ``sample_clients``, and placement, client k on node k mod N)."""
    from dcco.flower.placement import partition_of
    from dcco.run.pretraining import Pretraining
    from dcco.run.sampling import sample_clients
    from dcco.run.splits import load_splits

    num_clients = Pretraining.of(cfg, load_splits(cfg)[0]).partition.num_clients

    def hosted(round_number: int) -> int:
        drawn = sample_clients(cfg.train.seed, round_number - 1, num_clients,
                               cfg.train.clients_per_round)
        return sum(partition_of(int(k), NODES) == partition for k in drawn)

    return hosted


def _in_process(run_config: dict) -> None:
    """The same run with in-process nodes (``InProcessGrid``), as the ServerApp runs it."""
    from dcco.flower.app.client_app import app as client_app
    from dcco.flower.app.run import run_federated
    from dcco.flower.testing.inprocess import InProcessGrid
    from dcco.run.splits import load_splits

    entries = {**declared_keys(), **run_config}
    cfg, fcfg = _parsed(run_config)
    grid = InProcessGrid(client_app, [{"partition-id": i, "num-partitions": NODES}
                                      for i in range(NODES)], entries)
    run_federated(grid, cfg, fcfg, load_splits(cfg)[0])


def _secret_texts(creds: Credentials) -> dict[str, bytes]:
    """What must not leave the credentials folder: each private key's PEM body (in any line
    cut) and the raw DER it encodes, by file name."""
    out = {}
    for path in creds.secrets:
        pem = path.read_bytes()
        body = b"".join(line for line in pem.splitlines() if not line.startswith(b"-----"))
        out[path.name] = body
        out[path.name + " (DER)"] = base64.b64decode(body)
    return out


def _leaks(folders: list[Path], secrets: dict[str, bytes], skip: set[Path]) -> list[str]:
    """Files under ``folders`` (outside ``skip``) that hold a secret, or any PEM private key."""
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            if not path.is_file() or any(s in path.parents for s in skip):
                continue
            data = path.read_bytes()
            flat = re.sub(rb"\s", b"", data.replace(b"\\n", b""))  # newlines, or escaped
            found += [f"{path}: {name}" for name, secret in secrets.items()
                      if secret in data or secret in flat]
            if b"PRIVATE KEY" in data:
                found.append(f"{path}: a PEM private key")
    return found


@pytest.mark.slow
def test_secure_deployment__admits_only_registered_tls_nodes_trains_as_in_process_and_logs_no_secret(
        tmp_path, tiny_fmnist):
    """Real processes over TLS, every SuperNode signing in with its registered key:

    - a node with a key the SuperLink does not know, one that trusts another CA, and one
      without TLS are refused (the first two exit, the third never gets in); only the 3
      registered nodes are online, and the runs go on with them;
    - a run of 2 rounds over TLS ends with the model of the same run on in-process nodes
      (float64, to rounding: the nodes' workers are other processes);
    - a round of SecAgg+ on the statistics over TLS completes, every reply accepted;
    - in a third run, under SecAgg+, a node unregistered after its first round is sampled no
      more: its clients count as unreachable, and every later round completes with the other
      two nodes; the round under way when it went, at whatever stage of SecAgg+, loses it as
      a dropout at worst and is not skipped;
    - no private key (PEM body, its DER, or any PEM private key) is found in any file of the
      logs, run directories, FLWR_HOME, the SuperLink's database or the node workers'
      folder."""
    other = make_credentials(tmp_path / "other-ca", 1)  # another CA, and a key not registered
    out, workers = tmp_path / "deploy", Path(tempfile.mkdtemp(prefix="dccos-"))
    unit = import_seconds()
    patience, reply_timeout = max(300.0, 60 * unit), max(25.0, 12 * unit)
    base = {"data.data_dir": str(tiny_fmnist), "data.samples_per_client": 2,
            "model.widths": "[4, 8, 8]", "model.projector": "[16, 16, 16]",
            "train.clients_per_round": 9, "train.knn_every": 0, "train.log_every": 1,
            "train.checkpoint_every": 1, "train.precision": "float64",
            "flower.min_nodes": NODES, "flower.timeout": reply_timeout}
    # plain SGD on the server: LARS (and Adam) turn a zero gradient's rounding noise (the
    # last projector bias's, under CCO) into a step of full size, different in every
    # summation order (see tests/test_flower.py's params_err)
    plain = base | {"train.rounds": 2, "optim.optimizer": "sgd", "optim.lr": 1.0,
                    "flower.run_dir": str(tmp_path / "tls")}
    secure = base | {"train.rounds": 1, "flower.secagg": True,
                     "flower.run_dir": str(tmp_path / "secagg")}
    # under SecAgg+: the round under way when the node goes must finish with the other two
    # (a node lost at SecAgg+'s setup or key sharing halted Flower's own workflow for all)
    leaving = base | {"train.rounds": 500, "flower.secagg": True,
                      "flower.run_dir": str(tmp_path / "leaving")}

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + patience
        while not condition():
            assert time.monotonic() < deadline, f"waited for {what}" + deployment.log_tails()
            time.sleep(0.2)

    deployment = Loopback(NODES, out)
    deployment.env["DCCO_WORKER_DIR"] = str(workers)
    with deployment:
        assert deployment.secure and len(set(deployment.node_ids.values())) == NODES
        intruders = {
            "stranger": deployment.start_node(0, name="stranger", key=other.node_keys[0]),
            "foreign-ca": deployment.start_node(1, name="foreign-ca",
                                                root_certificates=other.ca_certificate),
            "plaintext": deployment.start_node(2, name="plaintext", tls=False)}
        procs = {name: deployment.procs[name] for name in intruders}
        wait_for(lambda: procs["stranger"].poll() is not None
                 and procs["foreign-ca"].poll() is not None
                 and "Connection attempt failed" in intruders["plaintext"].read_text(),
                 "the intruders' refusals")
        assert procs["stranger"].returncode and procs["foreign-ca"].returncode
        assert "Failed to activate SuperNode" in intruders["stranger"].read_text()
        assert "CERTIFICATE_VERIFY_FAILED" in intruders["foreign-ca"].read_text()
        assert "SuperNode ID" not in intruders["plaintext"].read_text()
        for name in intruders:  # the plaintext one keeps retrying
            deployment.kill_node(0, name=name)
        listed = json.loads(deployment.flwr("supernode", "list", deployment.connection,
                                            "--format", "json"))
        online = {int(n["node-id"]) for n in listed["nodes"] if n["status"] == "online"}
        assert online == set(deployment.node_ids.values())

        run_id = deployment.submit(plain)
        assert deployment.wait(run_id, patience) == "finished:completed", deployment.details

        run_id = deployment.submit(secure)
        assert deployment.wait(run_id, patience) == "finished:completed", deployment.details

        run_id = deployment.submit(leaving)
        wait_for(lambda: len(round_records(tmp_path / "leaving")) >= 1, "round 1")
        deployment.unregister_node(2)
        gone = len(round_records(tmp_path / "leaving"))
        wait_for(lambda: any(r["round"] > gone + 1
                             for r in round_records(tmp_path / "leaving")),
                 "two rounds after the unregistration")
        (tmp_path / "leaving" / "STOP").touch()
        assert deployment.wait(run_id, patience) == "finished:completed", deployment.details
    assert deployment.alive() == []

    # only the registered nodes took part: every reply of the plain run's rounds accepted
    records = round_records(tmp_path / "tls")
    assert [r["round"] for r in records] == [1, 2]
    assert all(t["accepted"] == t["sent"] == NODES and not t["rejected"]
               for r in records for t in r["replies"].values())
    # the model equals the in-process run's
    _in_process(plain | {"flower.run_dir": str(tmp_path / "in-process")})
    over_tls, in_process = _trained(tmp_path / "tls"), _trained(tmp_path / "in-process")
    initial = _weights(_parsed(plain)[0])
    assert not all(torch.equal(in_process[k], initial[k]) for k in initial)  # it trained
    scale = max(float(v.abs().max()) for v in in_process.values())
    assert max(float((over_tls[k] - in_process[k]).abs().max()) for k in in_process) \
        < 1e-9 * scale

    # SecAgg+ over TLS: its round through SecAgg+, every node's replies accepted
    (record,) = round_records(tmp_path / "secagg")
    assert "secagg_clipped" in record and math.isfinite(record["loss"])
    assert all(t["accepted"] == NODES for t in record["replies"].values())
    assert all("secagg_clipped" not in r for r in round_records(tmp_path / "tls"))

    # the unregistered node: sampled no more, and a round under way lost it as a dropout,
    # every round through SecAgg+
    records = round_records(tmp_path / "leaving")
    assert all(math.isfinite(r["loss"]) and r["rounds_skipped"] == 0 for r in records)
    assert all("secagg_clipped" in r for r in records)
    assert records[0]["unreachable"] == 0
    assert all(t["accepted"] == NODES for t in records[0]["replies"].values())
    after = [r for r in records if r["round"] > gone + 1]
    hosted = _hosted_by(_parsed(leaving)[0], 2)
    assert after and [r["unreachable"] for r in after] == [hosted(r["round"]) for r in after]
    assert all(r["clients"] + r["unreachable"] == leaving["train.clients_per_round"]
               for r in after)
    assert all(t["accepted"] == t["sent"] == NODES - 1
               for r in after for t in r["replies"].values())
    for r in records[1:gone + 1]:  # under way at the unregistration: a dropout at worst
        assert all(t["accepted"] >= NODES - 1 for t in r["replies"].values())

    # no secret anywhere outside the credentials folders
    secrets = _secret_texts(deployment.credentials) | _secret_texts(other)
    leaks = _leaks([out, tmp_path / "tls", tmp_path / "secagg", tmp_path / "leaving", workers],
                   secrets, skip={out / "credentials"})
    shutil.rmtree(workers, ignore_errors=True)
    assert leaks == []
    # the search finds a key that was logged, as it is or with its newlines escaped
    key = deployment.credentials.node_keys[1]
    (tmp_path / "tls" / "leaked.log").write_text(key.read_text().replace("\n", "\\n"))
    body = [line for line in key.read_text().splitlines() if not line.startswith("-----")]
    (tmp_path / "secagg" / "leaked.log").write_text("logged: " + "\n".join(body))
    assert sorted(_leaks([tmp_path / "tls", tmp_path / "secagg"], secrets, set())) == [
        f"{tmp_path / 'secagg' / 'leaked.log'}: {key.name}",
        f"{tmp_path / 'tls' / 'leaked.log'}: a PEM private key",
        f"{tmp_path / 'tls' / 'leaked.log'}: {key.name}"]
