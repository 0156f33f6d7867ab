"""benchmarks/peers.py in its small mode (2 clients, 1 round, a tiny network): every peer it
can import gives dcco's first-round update and is timed, and a peer it cannot run is listed
as skipped with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.slow
def test_peers_benchmark__small_mode_checks_and_times_every_peer(tmp_path):
    record = tmp_path / "peers.json"
    done = subprocess.run([sys.executable, "benchmarks/peers.py", "--small", "--methods", "dcco",
                           "--record", str(record), "--plot", str(tmp_path / "peers.png")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (point,) = json.loads(record.read_text())["points"]
    assert (point["method"], point["clients"], point["samples_per_client"]) == ("dcco", 2, 2)
    for peer in ("dcco", "loop-deepcopy", "loop-reload", "flower"):
        entry = point["peers"][peer]
        assert entry["equal_to_dcco"] <= 1e-4, (peer, entry)
        assert entry["median_s"] > 0 and peer not in point["skipped"]
        assert entry["peak_rss_gib"] >= point["baseline_rss_gib"] > 0
    assert point["peers"]["dcco"]["ratio_to_dcco"] == 1.0
    assert "no round of shared statistics" in point["skipped"]["pfl"]
    assert (tmp_path / "peers.png").stat().st_size > 0


def test_peers_benchmark__pfl_runs_contrastive_fedavg_to_dccos_update(tmp_path):
    """pfl's FedAvg (the [peers] extra, in the dev extra) on the contrastive workload: its
    first update equals dcco's batched round's, and it is timed."""
    record = tmp_path / "peers.json"
    done = subprocess.run([sys.executable, "benchmarks/peers.py", "--small", "--methods",
                           "contrastive", "--peers", "dcco", "pfl", "--record", str(record)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (point,) = json.loads(record.read_text())["points"]
    entry = point["peers"]["pfl"]
    assert entry["equal_to_dcco"] <= 1e-4 and entry["median_s"] > 0, entry
    assert entry["peak_rss_gib"] > 0
    assert point["skipped"] == {}
    assert point["git_commit"] and "--peers dcco pfl" in point["command"]


def test_peers_benchmark__extends_a_record_and_keeps_its_points(tmp_path):
    """A second run on the same record measures only the points it lacks (a long sweep goes
    on where it stopped); a record of another machine is refused, not mixed."""
    record = tmp_path / "peers.json"
    run = [sys.executable, "benchmarks/peers.py", "--small", "--peers", "dcco", "loop-reload",
           "--record", str(record), "--methods"]
    first = subprocess.run(run + ["dcco"], cwd=ROOT, capture_output=True, text=True,
                           timeout=900, check=False)
    assert first.returncode == 0, first.stderr[-3000:]
    (measured,) = json.loads(record.read_text())["points"]
    again = subprocess.run(run + ["dcco", "contrastive"], cwd=ROOT, capture_output=True,
                           text=True, timeout=900, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "dcco, K = 2 × 2, 1 thread(s): in the record, kept" in again.stdout
    extended = json.loads(record.read_text())
    kept, added = extended["points"]
    assert kept == measured and added["method"] == "contrastive"
    assert added["peers"]["loop-reload"]["equal_to_dcco"] <= 1e-4
    assert [c.split("--methods")[1] for c in extended["commands"]] == [" dcco",
                                                                      " dcco contrastive"]
    extended["machine"] = "another machine"
    record.write_text(json.dumps(extended))
    refused = subprocess.run(run + ["dcco"], cwd=ROOT, capture_output=True, text=True,
                             timeout=900, check=False)
    assert refused.returncode != 0 and "another machine" in refused.stderr
