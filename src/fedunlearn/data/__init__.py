"""Datasets by name, a federation's data as a user gives it, and their split among clients."""

from fedunlearn.data.datasets import DATASETS, Dataset, load_dataset
from fedunlearn.data.federated import FederatedData, as_federated_data
from fedunlearn.data.partition import label_histogram, partition, partition_sizes

__all__ = [
    "DATASETS",
    "Dataset",
    "FederatedData",
    "as_federated_data",
    "label_histogram",
    "load_dataset",
    "partition",
    "partition_sizes",
]
