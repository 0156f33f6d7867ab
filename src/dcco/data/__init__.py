"""Data: loaders (``datasets``) and client partitioning (``partition``).

The only layer that reads data files; it imports nothing of ``dcco`` but ``dcco.seeding``.
"""

from dcco.data.datasets import DataError, DatasetName, ImageDataset, load_dataset
from dcco.data.partition import (
    Partition,
    PartitionSummary,
    dirichlet_partition,
    natural_partition,
)

__all__ = [
    "DataError",
    "DatasetName",
    "ImageDataset",
    "Partition",
    "PartitionSummary",
    "dirichlet_partition",
    "load_dataset",
    "natural_partition",
]
