"""``fedvalue keygen PRIVATE PUBLIC``: a new key pair for signing runs."""

from __future__ import annotations

import argparse

from simulations.cli.options import subcommand


def add_parser(commands) -> None:
    keygen = subcommand(commands, "keygen", help="write a new Ed25519 key pair for signing runs")
    keygen.add_argument("private_key", help="new file for the private key (PEM, owner-readable only)")
    keygen.add_argument("public_key", help="new file for the public key (PEM), to give auditors")


def keygen_command(args: argparse.Namespace) -> int:
    from fedvalue.run.seals import generate_keypair

    fingerprint = generate_keypair(args.private_key, args.public_key)
    print(f"wrote {args.private_key} (keep it secret) and {args.public_key} (give it to auditors); key "
          f"fingerprint {fingerprint}")
    return 0


