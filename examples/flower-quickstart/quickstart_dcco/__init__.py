"""A FedAvg-style Flower app switched to DCCO (dcco's examples/flower-quickstart)."""
