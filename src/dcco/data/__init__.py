"""Data: loaders of images (``datasets``), pairs (``paired``), images in natural clients
(``tables``, ``tff``), the user's own samples (``samples``), one entry point for all of them (``sources.load_split``), and client
partitioning (``partition``).

The only layer that reads data files; it imports nothing of ``dcco`` but ``dcco.core.seeding``.
"""

from dcco.data.datasets import DataError, DatasetName, ImageDataset, load_dataset
from dcco.data.paired import PAIRED_DATASETS, Dataset, PairedDataset, is_paired
from dcco.data.partition import (
    Partition,
    PartitionSummary,
    dirichlet_partition,
    natural_partition,
)
from dcco.data.samples import Samples, samples_of_clients
from dcco.data.sources import load_split

__all__ = [
    "PAIRED_DATASETS",
    "DataError",
    "Dataset",
    "DatasetName",
    "ImageDataset",
    "PairedDataset",
    "Partition",
    "PartitionSummary",
    "Samples",
    "dirichlet_partition",
    "is_paired",
    "load_dataset",
    "load_split",
    "natural_partition",
    "samples_of_clients",
]
