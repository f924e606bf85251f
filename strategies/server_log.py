"""What a round says in the server's log: which sampled clients were not valued and why, a loud
warning (once a run) about replies that say no partition id, and, once it commits, its one line
(clients valued, where the books are, the largest and smallest value)."""

from __future__ import annotations

import logging

from flwr.supercore.logger import log

from fedvalue.schema import PROBLEM_STATUSES, Status


class ServerLog:
    """What the rounds of one run valued by ``methods`` say in the server's log (module docstring)."""

    def __init__(self, methods: tuple[str, ...]) -> None:
        self.methods = methods
        self.warned_anonymous = False

    def taken_in(self, server_round: int, records: list) -> None:
        """One line naming every sampled client not valued and why; and, once a run, loudly, that
        replies which say no partition id are booked under node ids that change every run, which
        no one can pay or rank."""
        problems = [f"client {r.client_id} {r.status} ({r.error})" for r in records if r.status in PROBLEM_STATUSES]
        if problems:
            log(logging.WARNING, "round %s: %d of %d sampled clients not valued: %s", server_round, len(problems),
                len(records), "; ".join(problems))
        anonymous = sorted({r.node_id for r in records if isinstance(r.client_id, str) and r.client_id.startswith("node-")
                            and r.message is not None and not r.message.has_error()})
        if anonymous and not self.warned_anonymous:
            self.warned_anonymous = True
            log(logging.WARNING, "fedvalue: replies from nodes %s say no partition id, so they are booked under "
                "node ids ('node-N') that change every run. Add the valuation mod to the ClientApp: "
                "ClientApp(mods=[clients.valuation_mod()]) (it reads the node config's 'partition-id').", anonymous)

    def committed(self, server_round: int, ledger_rows: list, run_dir) -> None:
        log(logging.INFO, "%s", round_line(server_round, ledger_rows, self.methods, run_dir))


def round_line(server_round: int, ledger_rows: list, methods: tuple[str, ...], run_dir) -> str:
    """The round's one log line: clients valued, where the books are, the largest and smallest value."""
    method = methods[0] if methods else None
    valued = [r for r in ledger_rows if r.method == method and r.status == Status.OK and r.value is not None]
    sampled = {r.client_id for r in ledger_rows if r.method == method and r.status != Status.IDLE}
    where = "in memory" if run_dir is None else f"into {run_dir}"
    if not valued:
        return f"fedvalue: round {server_round}: 0 of {len(sampled)} sampled clients valued, {where}"
    shown: dict[str, list] = {}  # values as the line prints them: clients whose values read the same are tied
    for row in valued:
        shown.setdefault(f"{row.value:.4g}", []).append(row)
    ranked = sorted(shown.items(), key=lambda item: max(r.value for r in item[1]), reverse=True)
    head = f"fedvalue: round {server_round}: {len(valued)} of {len(sampled)} sampled clients valued, {where}; {method} "
    (high, first), (low, last) = ((text, [r.client_id for r in rows]) for text, rows in (ranked[0], ranked[-1]))
    if len(shown) == 1:
        return head + (f"{high} (client {first[0]})" if len(first) == 1 else f"{high} for all {len(first)} (a tie)")
    return head + f"largest {high} ({_clients(first)}), smallest {low} ({_clients(last)})"


def _clients(ids: list) -> str:
    return f"client {ids[0]}" if len(ids) == 1 else f"clients {', '.join(map(str, ids))}, tied"
