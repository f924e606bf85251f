"""``fedvalue keygen PRIVATE PUBLIC``: a new key pair for signing runs."""

from __future__ import annotations

import argparse

from simulations.cli.options import subcommand


def _algorithm(text: str) -> str:
    from fedvalue.run.seals import KEY_ALGORITHMS

    if text not in KEY_ALGORITHMS:
        raise argparse.ArgumentTypeError(f"algorithm: expected one of {', '.join(KEY_ALGORITHMS)}; got {text!r}")
    return text


def add_parser(commands) -> None:
    keygen = subcommand(commands, "keygen", help="write a new key pair for signing runs (EC P-256 unless told)")
    keygen.add_argument("private_key", help="new file for the private key (PEM, owner-readable only)")
    keygen.add_argument("public_key", help="new file for the public key (PEM), to give auditors")
    keygen.add_argument("--algorithm", type=_algorithm, default="p256", metavar="ALGORITHM",
                        help="p256 (default), p384 or p521: ECDSA keys that sign the seals, the manifest and the "
                             "run's model.sig, which `model_signing verify key` checks too; or ed25519: seals and "
                             "manifest only (model-signing takes no Ed25519 key)")


def keygen_command(args: argparse.Namespace) -> int:
    from fedvalue.run.seals import generate_keypair

    fingerprint = generate_keypair(args.private_key, args.public_key, algorithm=args.algorithm)
    print(f"wrote {args.private_key} (keep it secret) and {args.public_key} (give it to auditors): a "
          f"{args.algorithm} key, fingerprint {fingerprint}")
    return 0
