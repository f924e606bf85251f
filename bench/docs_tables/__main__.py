"""The docs' results tables, rendered from docs/results/ and written in place (``--check``: the diff, nothing written).

``python -m bench.docs_tables [--check] [--doc NAME]`` rewrites, in place, every table of the docs that is rendered
from results files, so that re-running a benchmark and this command updates the docs; ``--check`` writes nothing,
prints a unified diff of what it would change and exits 1 when anything differs.

    python -m bench.docs_tables                        # rewrite the tables of reproductions, faults-and-audit
    python -m bench.docs_tables --check                # the diff, exit status 1 when the docs are not their results
    python -m bench.docs_tables --check --doc reproductions

Printed blocks are excerpts of the files their runs kept and are not rewritten: a block that is not one is reported
(exit status 1). So is a held table that cannot be rendered or found in its doc.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from bench.docs_tables.rebuild import DOCS, rebuild
from bench.docs_tables.renderings import RESULTS, ROOT


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is in it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.docs_tables", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--check", action="store_true", help="write nothing: print the diff, exit 1 if any")
    parser.add_argument("--doc", action="append", choices=sorted(DOCS), metavar="NAME",
                        help=f"only this doc (repeatable; one of {', '.join(sorted(DOCS))}; default: all)")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", metavar="FOLDER",
                        help="the folder of the docs (default: the repository's docs/)")
    parser.add_argument("--results", type=Path, default=RESULTS, metavar="FOLDER",
                        help="the folder of the results files (default: the repository's docs/results/)")
    args = parser.parse_args(argv)
    for name in ("docs", "results"):
        if not getattr(args, name).is_dir():
            parser.error(f"--{name}: expected a folder; got {str(getattr(args, name))!r}")
    differs = False
    for name in args.doc or DOCS:
        done = rebuild(DOCS[name], args.docs, args.results)
        shown = _shown(done.path)
        for problem in done.problems:
            print(f"{shown}: {problem}", file=sys.stderr)
        differs |= bool(done.problems)
        if done.new == done.old:
            continue
        differs |= args.check
        for header in done.changed:
            print(f"{shown}: {'differs from its rendering' if args.check else 'rewritten'}: {header}")
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(
                done.old.splitlines(keepends=True), done.new.splitlines(keepends=True), shown, f"{shown} (rendered)"))
        else:
            done.path.write_text(done.new)
    return int(differs)


if __name__ == "__main__":
    sys.exit(main())
