"""The ``dcco`` command line: pretrain, evaluate, supervised, compare, demo, reproduce.

The only module that parses arguments and prints. Errors in user input (``UserError``: config
keys, data files, run directories, arguments) end with a one-line message naming the problem
and exit status 2; a run whose loss or weights turn non-finite ends with one line saying so
and exit status 3; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from dcco.cli.commands import (
    cmd_compare,
    cmd_config,
    cmd_demo,
    cmd_evaluate,
    cmd_export,
    cmd_pretrain,
    cmd_supervised,
)
from dcco.cli.parser import build_parser
from dcco.cli.reproduce_command import cmd_reproduce
from dcco.cli.signals import INTERRUPTED, Interrupts, _interruptible
from dcco.errors import UserError

__all__ = ["COMMANDS", "INTERRUPTED", "Interrupts", "build_parser", "main"]




COMMANDS = {"config": cmd_config, "pretrain": cmd_pretrain, "evaluate": cmd_evaluate, "supervised": cmd_supervised,
            "compare": cmd_compare, "demo": cmd_demo, "reproduce": cmd_reproduce,
            "export": cmd_export}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments; an unknown option is reported with its command's usage (argparse
    reports it with the top-level usage, which does not list the command's options)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # one of torchrun's ranks (dcco.core.distributed.launched, without importing torch here)
    torchrun_rank = args.command == "pretrain" and int(os.environ.get("WORLD_SIZE", "1")) > 1
    # the commands that stop at a checkpoint (torchrun's ranks do not: they must stop together)
    args.interrupts = Interrupts() if args.command == "reproduce" or (
        args.command == "pretrain" and not torchrun_rank) else None
    status = _run_command(args)
    if torchrun_rank:
        # A torchrun rank whose work is done and whose process group is destroyed leaves
        # without the interpreter's teardown: there gloo's threads were seen to abort the
        # process ("terminate called without an active exception", then SIGABRT or SIGSEGV)
        # in 1 exit in 9 (a loop of one command), after the run was complete, failing
        # torchrun's whole job; 0 in 60 since.
        # Everything a rank writes is written by now (checkpoints and records atomically).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; bad input, an interrupt and divergence become exit codes."""
    try:
        with _interruptible(args.interrupts):
            return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        hint = getattr(args, "resume_hint", None)
        print("\ninterrupted" + (f"; continue with: {hint}" if hint else ""), file=sys.stderr)
        return 130
    except UserError as e:
        # ConfigError, DataError, RunDirError, CheckpointError: bad input, named in the
        # message. Anything else is a bug and keeps its traceback.
        print(f"dcco {args.command}: error: {e}", file=sys.stderr)
        return 2
    except FloatingPointError as e:  # Pretraining.check_finite: the run diverged
        print(f"dcco {args.command}: training diverged: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
