"""fedvalue-app: the model, the data and the training loops (Flower's template), plus the
held-out utility the server values the clients with.

The template downloads CIFAR-10 with Flower Datasets; this copy reads scikit-learn's embedded
digits (8×8 grey images, 10 classes: no download), a stand-in sized for a test. Everything
else is the template's.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from fedvalue.utilities import TorchModelUtility

#: Images the server holds out to value the clients on (the rest are split among the clients).
HELD_OUT = 297


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz'), for 1×8×8 images."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 2 * 2)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits as float32 images (N, 1, 8, 8) in [0, 1] and int64 labels, in a fixed shuffled order."""
    data = load_digits()
    order = np.random.default_rng(0).permutation(len(data.target))
    images = (data.images[order] / 16.0).astype(np.float32)[:, None]
    return images, data.target[order].astype(np.int64)


def load_data(partition_id: int, num_partitions: int, batch_size: int = 32):
    """Partition ``partition_id`` of ``num_partitions`` (IID): its train and validation loaders (80/20)."""
    images, labels = _digits()
    indices = np.array_split(np.arange(len(labels) - HELD_OUT), num_partitions)[partition_id]
    cut = int(0.8 * len(indices))
    train, validation = indices[:cut], indices[cut:]
    trainloader = DataLoader(TensorDataset(torch.from_numpy(images[train]), torch.from_numpy(labels[train])),
                             batch_size=batch_size, shuffle=True)
    valloader = DataLoader(TensorDataset(torch.from_numpy(images[validation]), torch.from_numpy(labels[validation])),
                           batch_size=batch_size)
    return trainloader, valloader


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(device))
            loss += criterion(outputs, labels.to(device)).item()
            correct += (torch.max(outputs.data, 1)[1] == labels.to(device)).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)


def held_out_utility() -> TorchModelUtility:
    """fedvalue: U(arrays), the accuracy of ``Net`` with those weights on the server's held-out
    images. The server names it (``"fedvalue_app.task:held_out_utility"``) so that
    ``fedvalue audit DIR --utility fedvalue_app.task:held_out_utility`` rebuilds it."""
    images, labels = _digits()
    return TorchModelUtility(Net(), images[-HELD_OUT:], labels[-HELD_OUT:])
