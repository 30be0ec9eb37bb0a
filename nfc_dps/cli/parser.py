"""The ``nfc-dps`` command line (also ``python -m nfc_dps``): the parser of every subcommand and
:func:`main`, which maps errors to exit statuses.

Exit status: 0 all images done; 1 some image failed (each is reported with its file name and the
reason; the others are still restored); 2 usage or setup error (bad flag or config, unreadable
prior, output folder equal to the input or not writable), reported before any work starts, or an
output disk that fills up (the run stops naming the file; finished images are kept); 130
interrupted (Ctrl-C), 143 terminated (SIGTERM): the finished images are recorded, a rerun resumes."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from typing import Sequence

from .. import __version__
from ..config import ConfigError
from ..distributed import let_rank_0_report, reports_errors, shutdown
from . import bench, calibrate, convert_adm, demo, prior_report, restore, simulate, train_prior
from .common import EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, UsageError
from .outputs import forget_created, remove_created_if_empty


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors exit with EXIT_USAGE (2) and a one-line message."""

    def error(self, message: str):  # noqa: D401 - argparse hook
        if not reports_errors():  # under torchrun: rank 0 says it, every rank exits 2
            self.exit(EXIT_USAGE)
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``nfc-dps`` parser: one subcommand per module of this package."""
    parser = _Parser(prog="nfc-dps", description="Image restoration with diffusion priors (NFC, DAPS, ...).",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the installed nfc_dps version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (demo, restore, simulate, calibrate, bench, train_prior, prior_report, convert_adm):  # the order of --help
        module.add_parser(sub)
    return parser


#: the commands whose rerun resumes where an interrupted run stopped
RESUMABLE = ("restore", "train-prior", "bench")  # simulate redoes its images: it is quick and exact


def _rerun(command: str) -> str:
    """What an interrupted ``command`` asks of the user."""
    return "rerun the same command to resume" if command in RESUMABLE else "rerun the same command to start again"


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or ``kill`` stopping the run), raised where the run is, so that it stops
    as on Ctrl-C: the records of the finished images are written and a rerun resumes."""


@contextlib.contextmanager
def _sigterm_stops_like_ctrl_c():
    """While the command runs, SIGTERM raises :class:`Terminated` (where SIGTERM has its default
    action, in the main thread; a command that handles it itself, like train-prior, replaces this)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the records' write short
        raise Terminated()

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 some image failed, 2 usage error).
    Under torchrun a usage error is 2 on every rank, said once by rank 0, which exits first
    (:func:`nfc_dps.distributed.let_rank_0_report`; torchrun's own status and traceback are its own)."""
    status = _main(argv)
    if status == EXIT_USAGE:
        let_rank_0_report(status)
    return status


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    forget_created()
    try:
        with _sigterm_stops_like_ctrl_c():
            return args.func(args)
    except (UsageError, ConfigError) as e:
        remove_created_if_empty()
        shutdown()
        if reports_errors():  # under torchrun: once, on rank 0 (every rank refuses alike)
            print(f"nfc-dps {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except PermissionError as e:  # a file met outside the checks that name their flag: one line, not a traceback
        remove_created_if_empty()
        shutdown()
        if reports_errors():
            where = f"{e.filename}: " if e.filename else ""
            print(f"nfc-dps {args.command}: error: {where}{e.strerror or e} (check the permissions of the file and "
                  f"its folders)", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated; train-prior's own handler names it)
        terminated = isinstance(e, Terminated) or (bool(e.args) and e.args[0] == "SIGTERM")
        if reports_errors():  # under torchrun: once, on rank 0 (every rank stops alike)
            what = "terminated (SIGTERM)" if terminated else "interrupted"
            print(f"nfc-dps {args.command}: {what}; {_rerun(args.command)}", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
