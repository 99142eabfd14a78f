"""``torchfleet consolidate CKPT OUT``: a checkpoint of any strategy written as one ordinary checkpoint file.

The paths are checked before anything is read or written: CKPT must exist, OUT must be a file in an existing folder
(not a directory, not CKPT itself: the checkpoint read is never overwritten).
"""

from __future__ import annotations

import argparse
import os

from torchfleet.errors import CheckpointError, ConfigurationError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchfleet consolidate",
        description="Write the checkpoint CKPT (a single file, or a sharded fsdp/deepspeed directory written by any "
                    "number of processes) as one ordinary checkpoint file OUT. torch.load(OUT)['state_dict'] loads "
                    "into the plain model; with --with-optimizer, fit(ckpt_path=OUT) resumes under any strategy.",
    )
    parser.add_argument("ckpt", metavar="CKPT", help="the checkpoint to read (file or directory)")
    parser.add_argument("out", metavar="OUT", help="the file to write (its folder must exist)")
    parser.add_argument("--with-optimizer", action="store_true",
                        help="keep the optimizer states (needed to resume training; the file is ~3x larger with Adam)")
    return parser


def check_paths(ckpt: str, out: str) -> None:
    """One paragraph for paths that cannot work: a missing CKPT, an OUT that is a directory, in a missing folder, or
    CKPT itself."""
    if not os.path.exists(ckpt):
        raise CheckpointError(f"{ckpt!r} does not exist; give the path of a checkpoint file or directory.")
    if os.path.isdir(out):
        raise ConfigurationError(f"OUT {out!r} is a directory; give the path of the file to write, e.g. "
                                 f"{os.path.join(out, 'consolidated.ckpt')!r}.")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise ConfigurationError(f"OUT {out!r} cannot be written: its folder {folder!r} does not exist. Create it, or "
                                 "give a path in an existing folder.")
    if os.path.exists(out) and os.path.samefile(ckpt, out):
        raise ConfigurationError(f"OUT {out!r} is the checkpoint being read (CKPT); give another path, so that the "
                                 "checkpoint survives whatever happens while the new file is written.")


def consolidate_command(argv: list[str]) -> int:
    """Run ``torchfleet consolidate`` with ``argv`` (the arguments after ``consolidate``); return the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    check_paths(args.ckpt, args.out)
    from torchfleet.checkpoint.consolidate import consolidate

    summary = consolidate(args.ckpt, args.out, with_optimizer=args.with_optimizer)
    print(f"Wrote {args.out}: {summary['tensors']} tensors, {summary['parameters']:,} parameters"
          f"{', with optimizer state' if summary['optimizer'] else ''} ({summary['bytes'] / 1e6:.1f} MB); "
          f"entries: {', '.join(summary['entries'])}")
    return 0
