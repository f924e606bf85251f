"""Messages built outside a running ServerApp need the task identity set (DESIGN.md)."""

import pytest

from .inprocess import set_server_identity


@pytest.fixture(autouse=True)
def server_identity():
    set_server_identity()
