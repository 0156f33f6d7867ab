"""The ClientApp: under DCCO, both of a round's exchanges answered by ``dcco.flower.answer``
and the evaluation by ``dcco.flower.evaluate_encoder``; under FedAvg, a supervised epoch and
the classifier's accuracy; under contrastive FedAvg, an epoch of NT-Xent on DCCO's two views
(``ImageViews``), evaluated as DCCO's encoder is."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from dcco.flower import ImageViews, answer, evaluate_encoder
from quickstart_dcco.task import Net, accuracy, load_data, train_contrastive, train_supervised

app = ClientApp()


def _node(context: Context):
    """This node's partition id and its training and held-out loaders."""
    pid, cfg = int(context.node_config["partition-id"]), context.run_config
    loaders = load_data(pid, int(context.node_config["num-partitions"]),
                        int(cfg["batch-size"]), int(cfg.get("images", 0)))
    return pid, *loaders


@app.train()
def train(msg: Message, context: Context) -> Message:
    pid, trainloader, _ = _node(context)
    if context.run_config["strategy"] == "dcco":
        # views_key: the views follow the partition, so a simulated run repeats
        return answer(msg, context, Net(), trainloader, augment=ImageViews(), views_key=pid)
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    epochs, lr = int(context.run_config["local-epochs"]), float(msg.content["config"]["lr"])
    if context.run_config["strategy"] == "contrastive":
        loss = train_contrastive(net, trainloader, ImageViews(), epochs, lr)
    else:
        loss = train_supervised(net, trainloader, epochs, lr)
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": MetricRecord(
        {"train_loss": loss, "num-examples": len(trainloader.dataset)})}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    pid, trainloader, testloader = _node(context)
    if context.run_config["strategy"] != "fedavg":  # an encoder: no class scores to count
        return evaluate_encoder(msg, context, Net(), testloader, train=trainloader,
                                augment=ImageViews(), views_key=pid)
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss, acc = accuracy(net, testloader)
    return Message(RecordDict({"metrics": MetricRecord(
        {"eval_loss": loss, "eval_acc": acc, "num-examples": len(testloader.dataset)})}),
        reply_to=msg)
