"""The audit's check of the projected vectors a round record keeps for TracIn flows
(:mod:`fedvalue.flows.projected_flows`): the flows are recomputed from them like every other book,
so a record could steer its flows by keeping made-up vectors. What the record itself makes
checkable is checked here: every vector holds k numbers (min(k, p)), every ok reply has its projected update
(the writer projects each one; a record that drops one could leave a client out of the flows), and each one is
R_t Δ_u of the reply it was made from, with R_t drawn again from the noted seed (to ``tolerance``
× max(1, |entry|): the count sketch gives the same bits on every machine, a dense R_t may differ
in the last bits across BLAS builds). The projected gradients are the clients' own, like the full
gradients of an unprojected record: nothing in the files derives them, so a signature protects
them, not the recomputation."""

from __future__ import annotations

import numpy as np

from fedvalue.flows.projected_flows import FlowsProjection, project_round
from fedvalue.run.archive import RoundRecord
from fedvalue.schema import Status


def projection_problems(record: RoundRecord, tolerance: float) -> list[str]:
    """Where round t's projected vectors disagree with its replies or its noted projection (run.json's
    is compared with the noted one by :func:`fedvalue.audit.round.settings_problems`)."""
    t, note = record.round, record.settings.flows_projection
    if note is None:
        if record.projected_gradients or record.projected_updates:
            return [f"round {t}: its record keeps projected vectors but notes no flows projection"]
        return []
    try:
        projection = FlowsProjection.from_json(note)
    except ValueError as error:
        return [f"round {t}: {error}"]
    start = record.start_arrays
    drawn = projection.for_round(sum(int(np.asarray(v).size) for v in start.values()), t)
    width = drawn.output_dim
    problems = [f"round {t}: the projected {kind} of client {c} is not {width} finite numbers (shape {np.shape(v)})"
                for kind, vectors in (("gradient", record.projected_gradients), ("update", record.projected_updates))
                for c, v in vectors.items() if np.shape(v) != (width,) or not np.all(np.isfinite(v))]
    unknown = [c for c in record.projected_updates if c not in record.replies]
    if unknown:
        problems.append(f"round {t}: its record keeps projected updates of clients without a reply: {unknown[:4]}")
    statuses = record.statuses
    dropped = [c for c in record.replies if statuses.get(c) == Status.OK and c not in record.projected_updates]
    if dropped:  # the writer projects every ok reply: one missing is a vector kept out of the flows
        problems.append(f"round {t}: its record keeps no projected update of clients whose reply was ok: "
                        f"{dropped[:4]}")
    if problems:
        return problems
    try:
        _, recomputed = project_round(drawn, start, {}, {c: record.replies[c] for c in record.projected_updates})
    except ValueError as error:
        return [f"round {t}: its projected updates cannot be drawn again from its replies ({error})"]
    for client, kept in record.projected_updates.items():
        again = recomputed[client]
        if not np.all(np.abs(kept - again) <= tolerance * np.maximum(1.0, np.abs(again))):
            problems.append(f"round {t}: the projected update of client {client} is not R_t (w_u − A_(t−1)) of its "
                            "reply (R_t drawn again from the noted seed)")
    return problems
