"""The ClientApp: each node answers both of a DCCO round's exchanges with its own photos."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from dcco.flower import answer
from dcco_flower_example.task import SmallCNN, augment, node_photos

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    photos = node_photos(int(context.node_config["partition-id"]),
                         int(context.run_config["photos-per-node"]))
    return answer(msg, context, SmallCNN(), photos, augment=augment)
