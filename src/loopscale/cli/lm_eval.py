"""`loopscale lm-eval ...`: lm-evaluation-harness's own CLI with the ``loopscale`` model registered.

lm-eval 0.4 has no plugin discovery, so ``lm_eval --model loopscale`` finds no such model; and its CLI
defaults to ``--device cuda:0``, which fails on a machine without a GPU. This command imports the adapter
(``loopscale.eval.harness`` registers the model), adds ``--device cpu`` when none is given and there is no
GPU, and hands every other argument to lm-eval unchanged (docs/eval.md, "lm-eval's own CLI").
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

import typer

from loopscale.cli.app import app
from loopscale.errors import LoopscaleError

_OTHER_SUBCOMMANDS = ("ls", "validate")  # lm-eval's subcommands without --device; anything else runs


def lm_eval_argv(args: list[str], *, cuda: bool) -> list[str]:
    """lm-eval's argv: ``args`` plus ``--device`` (cuda:0 or cpu) for a run that names none."""
    argv = list(args)
    if not argv:
        return ["--help"]
    if (argv and argv[0] in _OTHER_SUBCOMMANDS) or any(a in ("-h", "--help") for a in argv):
        return argv
    if not any(a == "--device" or a.startswith("--device=") for a in argv):
        argv += ["--device", "cuda:0" if cuda else "cpu"]
    return argv


@app.command(
    "lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
)
def lm_eval_cmd(ctx: typer.Context) -> None:
    """lm-eval's CLI with --model loopscale available (pretrained=RUN_DIR, r=N); --device cpu without a GPU.

    Example: loopscale lm-eval --model loopscale --model_args pretrained=runs/r4,r=8 --tasks lambada_openai
    """
    from loopscale.errors import ConfigError

    try:
        import torch
        from lm_eval.__main__ import cli_evaluate

        import loopscale.eval.harness  # noqa: F401  (registers the "loopscale" model)
    except ImportError as exc:
        raise ConfigError(
            "lm-eval", f"needs the eval extra ({exc.name} is missing): pip install 'loopscale[eval]'"
        ) from None
    argv = lm_eval_argv(list(ctx.args), cuda=torch.cuda.is_available())
    old_argv, old_error = sys.argv, argparse.ArgumentParser.error
    sys.argv = ["lm-eval", *argv]
    argparse.ArgumentParser.error = _usage_error  # type: ignore[method-assign]  # patched for this call only
    try:
        cli_evaluate()
    except SystemExit as exc:  # --help (0); lm-eval's own exits
        if exc.code not in (0, None):
            raise SystemExit(exc.code if isinstance(exc.code, int) else 1) from None
    finally:
        sys.argv = old_argv
        argparse.ArgumentParser.error = old_error  # type: ignore[method-assign]  # restoring the patched method


class LmEvalUsageError(LoopscaleError):
    """lm-eval's argument parser refused the arguments (exit status 2, as for loopscale's own usage errors)."""

    exit_code = 2


def _usage_error(self: argparse.ArgumentParser, message: str) -> NoReturn:
    """One line, as loopscale reports usage errors, instead of argparse's usage block."""
    raise LmEvalUsageError(f"lm-eval: {message} (more: loopscale lm-eval --help)")
