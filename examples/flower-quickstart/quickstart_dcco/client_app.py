"""quickstart-dcco: A Flower / PyTorch app, trained with DCCO."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from dcco.flower import answer
from quickstart_dcco.task import Net, cco_loss_on, load_data, views
from quickstart_dcco.task import test as test_fn
from quickstart_dcco.task import train as train_fn

# Flower ClientApp
app = ClientApp()


def _data(context: Context):
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    batch_size = context.run_config["batch-size"]
    return load_data(partition_id, num_partitions, batch_size,
                     int(context.run_config.get("images", 0)))


@app.train()
def train(msg: Message, context: Context):
    """Train the model on local data."""
    trainloader, _ = _data(context)
    if context.run_config["strategy"] == "dcco":  # DCCO: statistics, then an update
        return answer(msg, context, Net(), trainloader, augment=views())

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    # Call the training function
    train_loss = train_fn(
        model,
        trainloader,
        context.run_config["local-epochs"],
        msg.content["config"]["lr"],
        device,
    )

    # Construct and return reply Message
    model_record = ArrayRecord(model.state_dict())
    metrics = {
        "train_loss": train_loss,
        "num-examples": len(trainloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    _, valloader = _data(context)
    if context.run_config["strategy"] == "dcco":  # an encoder: its CCO loss on fixed views
        metrics = {"eval_loss": cco_loss_on(model, valloader),
                   "num-examples": len(valloader.dataset)}
        return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    # Call the evaluation function
    eval_loss, eval_acc = test_fn(
        model,
        valloader,
        device,
    )

    # Construct and return reply Message
    metrics = {
        "eval_loss": eval_loss,
        "eval_acc": eval_acc,
        "num-examples": len(valloader.dataset),
    }
    metric_record = MetricRecord(metrics)
    content = RecordDict({"metrics": metric_record})
    return Message(content=content, reply_to=msg)
