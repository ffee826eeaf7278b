"""``robotd trace ls | show``: dispatch to the subcommands' own `main` functions."""

from __future__ import annotations

import sys

USAGE = "usage: robotd trace {ls [DIR] [--json] | show EPISODE.mcap [--json] [--all]}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "ls":
        from robotd.trace.ls import main as ls_main

        return ls_main(rest)
    if cmd == "show":
        from robotd.trace.show import main as show_main

        return show_main(rest)
    print(f"robotd trace: unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


def export(argv: list[str]) -> int:
    """``robotd export``: see robotd.trace.export."""
    from robotd.trace.export import main as export_main

    return export_main(argv)


def replay(argv: list[str]) -> int:
    """``robotd replay``: see robotd.trace.replay."""
    from robotd.trace.replay import main as replay_main

    return replay_main(argv)
