"""Models scored with torch, the only place in fedvalue that imports torch: the torch model utility
(fedvalue.utilities re-exports it), the fast linear-layer scoring, parameter vectors and random
projections, the influence curvature, group-fairness gaps and influences (NTK, reweighting,
curvature), and the numerical platform this process computes on (kernels).

Modules: _scoring, coalition_halves, influence_curvature, kernels, linear, projection,
torch_utilities; fairness/ (objectives, curvature, ntk, reweighting).

May import: no other subpackage (and fedvalue._checks, fedvalue.schema). Nothing here imports a
subpackage above it or a public face (fedvalue, fedvalue.ledger, fedvalue.utilities); fedvalue/
never imports flwr or ray.
"""
