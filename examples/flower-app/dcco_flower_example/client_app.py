"""The ClientApp: each node answers both of a DCCO round's exchanges with its own photos."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from dcco.flower import answer, secure_aggregation_mod
from dcco_flower_example.task import (
    SmallCNN,
    augment,
    dirichlet_photos,
    fedavg_reply,
    node_photos,
)

app = ClientApp()


@app.train(mods=[secure_aggregation_mod])  # SecAgg+ (secagg = true); plain messages pass
def train(msg: Message, context: Context) -> Message:
    pid, cfg = int(context.node_config["partition-id"]), context.run_config
    if cfg["partitioner"] == "dirichlet":  # a flwr-datasets partitioner
        photos = dirichlet_photos(pid, int(context.node_config["num-partitions"]),
                                  float(cfg["alpha"]))
    else:
        photos = node_photos(pid, int(cfg["photos-per-node"]))
    config = msg.content.config_records.get("config")  # none under SecAgg+
    if config is not None and "phase" not in config:  # Flower's FedAvg, for the speed test
        return fedavg_reply(msg, SmallCNN(), photos)
    # views_key: the views follow the partition, not Flower's node id (random in every
    # simulated run), so a simulated run repeats
    return answer(msg, context, SmallCNN(), photos, augment=augment, views_key=pid)
