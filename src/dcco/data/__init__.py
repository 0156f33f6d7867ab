"""Data: loaders of images (``datasets``) and pairs (``paired``), and client partitioning
(``partition``).

The only layer that reads data files; it imports nothing of ``dcco`` but ``dcco.seeding``.
"""

from dcco.data.datasets import DataError, DatasetName, ImageDataset, load_dataset
from dcco.data.paired import PAIRED_DATASETS, Dataset, PairedDataset, is_paired, load_split
from dcco.data.partition import (
    Partition,
    PartitionSummary,
    dirichlet_partition,
    natural_partition,
)

__all__ = [
    "PAIRED_DATASETS",
    "DataError",
    "Dataset",
    "DatasetName",
    "ImageDataset",
    "PairedDataset",
    "Partition",
    "PartitionSummary",
    "dirichlet_partition",
    "is_paired",
    "load_dataset",
    "load_split",
    "natural_partition",
]
