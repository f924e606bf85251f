"""Messages built outside a running ServerApp need the task identity set (flwr.supercore.task_identity)."""

import pytest

from tests.strategies.harness.inprocess import set_server_identity


@pytest.fixture(autouse=True)
def server_identity():
    set_server_identity()
