"""Datasets by name and their split among clients."""

from fedunlearn.data.datasets import DATASETS, Dataset, load_dataset
from fedunlearn.data.partition import label_histogram, partition, partition_sizes

__all__ = ["DATASETS", "Dataset", "label_histogram", "load_dataset", "partition", "partition_sizes"]
