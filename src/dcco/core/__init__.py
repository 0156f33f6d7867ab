"""dcco's core: the encoding statistics and the losses of them (pure math), one client's and
the server's parts of a round, the algorithm that owns the round, and its executors (the
batched and reference simulators, torch.distributed). Nothing here reads a config file, writes
a run directory or imports Flower."""
