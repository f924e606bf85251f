"""The grid a ServerApp is handed on the simulation engine, and the time limit each client runs under.

Flower's own grid waits for ``timeout`` after the engine has crashed, shows a strategy the nodes
registered so far (FedAvg then samples too few), returns replies in the order they arrive (the last
bits of FedAvg's mean then change between runs of one seed) and lets one slow client make those
queued behind it miss the round. :class:`StoppableGrid` gives up once the engine has stopped, shows
no node before all are registered, returns replies in the order the messages were sent, gives each
client (:class:`TimedClientApp`) a time limit counted from when its worker starts it, and says when
a reply names a dead Ray worker. The Flower and Ray behaviour behind each: docs/benchmarks.md, "The
simulation engine: what the runner relies on".
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

#: Seconds between polls for replies. Flower's in-memory grid polls every 0.1 s: a round's
#: replies then wait 50 ms on average after the last client finished (~5% of a
#: noisy-clients round on 2 cores). Polling is not free: per study seed 0.01 s cost the
#: server process 2.6 s more CPU than 0.1 s (which the clients lack on a loaded 2-core
#: machine) for 0.8 s less wall time; 0.02 s is in between.
PULL_INTERVAL_S = 0.02
#: Longest wait for the engine to register all nodes (it takes milliseconds).
NODE_REGISTRATION_WAIT_S = 30.0


class EngineStoppedError(RuntimeError):
    """The simulation engine stopped while the ServerApp was waiting for replies."""


#: Seconds a batch of messages waits past its timeout for a client stopped at its own limit:
#: its clock starts only once a worker picks its message up (queue hand-off, dispatch).
CLIENT_LIMIT_GRACE_S = 2.0


class ClientTimeLimit(TimeoutError):
    """A client ran past the time limit of the message it was handling."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`ClientTimeLimit` in the block once it has run ``seconds`` (a real-time
    timer; in a process's main thread only, where a Ray actor runs its tasks; elsewhere,
    and for ``None``, no limit)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame) -> None:
        raise ClientTimeLimit(f"the client ran past its time limit of {seconds:g} s (the round's timeout, counted "
                              "from when it started) and was stopped")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class TimedClientApp(ClientApp):
    """``client_app`` with a time limit per message, counted from when its worker starts it.

    With fewer workers than clients, messages queue; a client slower than the round's
    timeout would otherwise hold its worker while the clients queued behind it run out of
    time. Stopped at its own limit, it fails alone (an error reply naming the limit) and
    frees the worker. The grid sets :attr:`seconds` to each batch's timeout before it sends
    the batch; the app travels to the workers pickled with every message, this value with it.
    """

    def __init__(self, client_app: ClientApp) -> None:
        super().__init__()
        self.client_app = client_app
        #: The time limit of the messages sent next (None: none).
        self.seconds: float | None = None

    def __call__(self, message: Message, context: Context) -> Message:
        with time_limit(self.seconds):
            return self.client_app(message, context)


class StoppableGrid(Grid):
    """Delegates to the engine's grid, but stops waiting once ``stopped`` is set, and
    shows no node before all ``expected_nodes`` are registered.

    Attributes
    ----------
    messages_sent, wait_seconds
        Per message type (``"train"``, ``"query"``, ...): messages sent through
        :meth:`send_and_receive` and seconds spent there waiting for their replies (the
        clients' work plus the engine's messaging), for timing reports.
    """

    def __init__(self, grid: Grid, stopped: threading.Event, expected_nodes: int = 0,
                 client_app: TimedClientApp | None = None,
                 on_worker_lost: Callable[[str], None] | None = None) -> None:
        self._grid = grid
        self._on_worker_lost = on_worker_lost
        self._stopped = stopped
        self._expected_nodes = expected_nodes
        self._client_app = client_app
        self._all_registered = expected_nodes == 0
        self.messages_sent: dict[str, int] = {}
        self.wait_seconds: dict[str, float] = {}

    def _check(self) -> None:
        if self._stopped.is_set():
            raise EngineStoppedError(
                "the simulation engine stopped before the ServerApp finished; no replies will come "
                "(see the engine's error)."
            )

    def set_run(self, run) -> None:
        self._grid.set_run(run)

    @property
    def run(self):
        return self._grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        self._check()
        if self._all_registered:
            return self._grid.get_node_ids()
        # The engine registers its nodes while the ServerApp thread already runs: a
        # strategy sampling at once would see only some (FedAvg then samples too few).
        deadline = time.monotonic() + NODE_REGISTRATION_WAIT_S
        while True:
            node_ids = list(self._grid.get_node_ids())
            if len(node_ids) >= self._expected_nodes or time.monotonic() >= deadline:
                self._all_registered = True
                return node_ids
            if self._stopped.wait(0.01):
                self._check()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self._check()
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Flower's loop plus the stop check (it would otherwise sleep to ``timeout``);
        replies come back in the order of ``messages``, not of arrival, so that a
        strategy's float sums (FedAvg's weighted mean) do not depend on which actor
        finished first.

        With a :class:`TimedClientApp` each client has ``timeout`` seconds of its own, counted
        from when a worker starts it: the batch waits as long as replies keep coming and gives
        up on the rest once ``timeout`` (plus :data:`CLIENT_LIMIT_GRACE_S`) passes without one,
        so a slow client costs only its own reply, not those queued behind it."""
        messages = list(messages)
        if not messages:
            return []
        started = time.perf_counter()
        kind = str(getattr(getattr(messages[0], "metadata", None), "message_type", "")).split(".", 1)[0]
        timed = self._client_app is not None and timeout is not None
        if self._client_app is not None:
            self._client_app.seconds = timeout
        message_ids = list(self.push_messages(messages))
        position = {message_id: index for index, message_id in enumerate(message_ids)}
        pending = set(message_ids)
        patience = None if timeout is None else timeout + (CLIENT_LIMIT_GRACE_S if timed else 0.0)
        deadline = None if timeout is None else time.monotonic() + patience
        replies: list[Message] = []
        while pending:
            received = list(self.pull_messages(pending))
            replies.extend(received)
            pending.difference_update(m.metadata.reply_to_message_id for m in received)
            if received and timed:  # the queue moves: the clients behind have their own time
                deadline = time.monotonic() + patience
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            if self._stopped.wait(PULL_INTERVAL_S):
                self._check()
        lost = next((worker_lost(m.error.reason) for m in replies if m.has_error() and worker_lost(m.error.reason)),
                    None)
        if lost is not None and self._on_worker_lost is not None:
            self._on_worker_lost(f"because a Ray worker died ({lost}: Flower keeps routing clients to it)")
        self.messages_sent[kind] = self.messages_sent.get(kind, 0) + len(messages)
        self.wait_seconds[kind] = self.wait_seconds.get(kind, 0.0) + time.perf_counter() - started
        return sorted(replies, key=lambda m: position.get(m.metadata.reply_to_message_id, len(position)))


#: Ray's exceptions for a worker process or node that is gone (the error reply's reason starts
#: with the exception's type, as Flower writes it: ``<class 'ray.exceptions.X'>:<'...'>``).
_WORKER_LOST = re.compile(r"<class 'ray\.exceptions\.(ActorDiedError|RayActorError|ActorUnavailableError|"
                          r"WorkerCrashedError|NodeDiedError|OwnerDiedError)'>")


def worker_lost(reason: object) -> str | None:
    """The Ray exception's name when an error reply's ``reason`` says its worker died, else None."""
    match = _WORKER_LOST.match(str(reason))
    return None if match is None else match.group(1)


def replies_in_send_order(grid: Grid) -> Grid:
    """``grid`` answering ``send_and_receive`` with the replies in the order the messages were
    sent, not of arrival, so that the same seed gives the same ledger rows and the same float
    sums (FedAvg's weighted mean) whichever client finishes first. For ServerApps that Flower
    starts itself (``flwr run``); :func:`~simulations.runner.engine.run_flower_simulation` does it for its
    own."""
    return StoppableGrid(grid, threading.Event())
