"""``%%distributed`` and ``%pdl check``: parse and validate, then hand off to
:class:`DistributedSession` (and :mod:`pdl_magics.preflight`)."""

from __future__ import annotations

import os

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display
from traitlets import Bool, Float, TraitError, Unicode, default, validate

from pdl.balance.plan import MODES as BALANCE_MODES

from .errors import DistributedUsageError
from .session import BACKENDS, COLLECTIVE_TIMEOUT_S, HANG_TIMEOUT_S, DistributedSession


def _whole_number(text: str) -> int:
    """``-n``/``--output``: ASCII digits only (``int()`` would also take "３" or "1_0")."""
    if not (text.isascii() and text.lstrip("-").isdigit()):
        raise ValueError(text)
    return int(text)


def _seconds(text: str) -> float:
    """``--timeout``/``--hang-timeout``: an ASCII decimal number."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return float(text)


_whole_number.__name__ = "int"  # argparse names the type in its message: "invalid int value"
_seconds.__name__ = "float"

_OPTIONS = ("-n N, --backend {%s}, --balance, --no-balance, --all-output, --timeout SECONDS, "
            "--hang-timeout SECONDS, --output RANK" % "|".join(BACKENDS))


def _workers_options(purpose: str):
    """``-n`` and ``--backend``, declared once for ``%%distributed`` and ``%pdl check``."""
    n = argument("-n", type=_whole_number, default=None, metavar="N",
                 help=f"number of workers (ranks, one engine each) to {purpose}; default: all of them")
    backend = argument("--backend", default="torch", metavar="NAME",
                       help=f"collective backend: {', '.join(BACKENDS)} (default torch; "
                            "horovod also defines hvd, initialised)")
    return lambda magic: n(backend(magic))


#: ``%pdl`` subcommands.
PDL_SUBCOMMANDS = ("check", "scale")
_PDL_USAGE = ("%%pdl check [-n N] [--backend {%s}] | %%pdl scale --loss NAME --model NAME --batch B [-n N]"
              % "|".join(BACKENDS))


def _balance_mode(mode: str) -> str:
    """``mode`` if it is a mode of balanced batches, else TraitError (one line naming them)."""
    if mode not in BALANCE_MODES:
        raise TraitError(f"balance (or $PDL_BALANCE) must be one of {', '.join(BALANCE_MODES)}, got {mode!r}")
    return mode


@magics_class
class DistributedMagics(Magics):
    """Run a cell on every rank of the user's cluster with torch.distributed (or Horovod) set up."""

    hang_timeout = Float(
        HANG_TIMEOUT_S,
        config=True,
        help="""Seconds without progress on any rank (no output, no pdl.log call, no rank
        finishing) after which a cell shows every rank's Python stack; 0 turns the
        watchdog off. --hang-timeout overrides it for one cell.""",
    )
    balance = Unicode(
        config=True,
        help="""How pdl.balanced_batches (and the CINIC-10 recipe's fit) split each step's
        global batch in a cell without --balance or --no-balance: "auto" (to the ranks'
        speeds where they differ by over 10 % and beyond the machine's noise), "on" (always to their speeds) or "off"
        (evenly: a run then depends on its seed only, not on the machine's load).
        Default: $PDL_BALANCE, else "auto".""",
    )

    @default("balance")
    def _default_balance(self):
        return _balance_mode(os.environ.get("PDL_BALANCE") or "auto")

    @validate("balance")
    def _check_balance(self, proposal):
        return _balance_mode(proposal.value)

    def default_balance(self) -> str:
        """:attr:`balance`, or DistributedUsageError (one line) for a bad $PDL_BALANCE."""
        try:
            return self.balance
        except TraitError as e:
            raise DistributedUsageError(str(e)) from None

    preflight = Bool(
        True,
        config=True,
        help="""Run the preflight (every rank's GPU, versions and network interface, and an
        all-reduce smoke test; see %pdl check) before the first cell on each set of engines,
        and stop that cell if it fails. False skips it.""",
    )

    def __init__(self, shell, session: DistributedSession | None = None):
        super().__init__(shell)
        self._session = session

    @property
    def session(self) -> DistributedSession:
        if self._session is None:
            self._session = DistributedSession.default()
        return self._session

    @magic_arguments()
    @_workers_options("run the cell on")
    @argument("--balance", action="store_const", const="on", dest="balance", default=None,
              help="split pdl.balanced_batches' global batch to the ranks' speeds even when they "
                   "differ by less than 10%% (default: DistributedMagics.balance, auto: only when "
                   "they differ more)")
    @argument("--no-balance", action="store_const", const="off", dest="balance",
              help="split pdl.balanced_batches' global batch evenly, whatever the ranks' speeds")
    @argument("--all-output", action="store_true",
              help="after the cell, also print every other rank's output")
    @argument("--timeout", type=_seconds, default=COLLECTIVE_TIMEOUT_S, metavar="SECONDS",
              help=f"how long a collective may wait for its peers (default {COLLECTIVE_TIMEOUT_S:g})")
    @argument("--hang-timeout", type=_seconds, default=None, metavar="SECONDS",
              help="show every rank's stack after this long without progress "
                   "(default: DistributedMagics.hang_timeout, 300; 0: off)")
    @argument("--output", type=_whole_number, default=None, metavar="RANK",
              help="line form only: print the kept output of RANK from the last cell")
    @line_cell_magic
    def distributed(self, line: str, cell: str | None = None):
        """Run the cell on N engines; ``rank``, ``world_size``, ``local_rank``, ``device`` are set.

        ``--backend horovod`` initialises Horovod instead of torch.distributed and
        also defines ``hvd``; it needs Horovod installed (``scripts/setup --horovod``).
        ``--balance`` / ``--no-balance``: how :func:`pdl.balanced_batches` (and the
        CINIC-10 recipe's ``fit``) split the global batch in this cell (default:
        :attr:`balance`).

        Rank 0's output streams live; ``--all-output`` prints the others afterwards.
        A failing rank raises here with its remote traceback.
        """
        args = self._parse(line)
        try:
            if cell is None:
                if args.output is None:
                    raise DistributedUsageError(
                        f"%distributed needs --output RANK (or use %%distributed as a cell magic); options: {_OPTIONS}"
                    )
                self.session.show_output([args.output])
                return None
            if args.output is not None:
                raise DistributedUsageError(
                f"--output RANK is for the line magic %distributed; cell options: {_OPTIONS}"
                )
            hang = self.hang_timeout if args.hang_timeout is None else args.hang_timeout
            self.session.run(
                cell,
                args.n,
                backend=args.backend,
                all_output=args.all_output,
                timeout_s=args.timeout,
                hang_timeout_s=hang,
                preflight=self.preflight,
                balance=args.balance or self.default_balance(),
            )
        except DistributedUsageError as e:
            raise UsageError(str(e)) from None
        return None

    @magic_arguments()
    @argument("subcommand", nargs="?", default=None, metavar="SUBCOMMAND",
              help=f"{', '.join(PDL_SUBCOMMANDS)}: check every rank (GPU, versions, network "
                   "interface) and run an all-reduce smoke test; or predict the step for more nodes")
    @_workers_options("check")
    @argument("--loss", default=None, metavar="NAME",
              help="scale: a function of the engines' namespace that computes one step's loss")
    @argument("--model", default=None, metavar="NAME", help="scale: the module (or DDP wrapper) it trains")
    @argument("--batch", type=_whole_number, default=None, metavar="B", help="scale: images of one rank's step")
    @line_magic
    def pdl(self, line: str):
        """``%pdl check [-n N] [--backend torch|horovod]``: the preflight, as a table.

        Shows one row per rank (its GPU, driver, CUDA, torch and Horovod versions, the
        network interface of its collectives, the all-reduce bandwidth it reached) and
        raises :class:`~pdl_magics.preflight.PreflightFailed`, one line per problem,
        if anything is wrong.

        ``%pdl scale --loss NAME --model NAME --batch B [-n N]``: measures, on the
        engines, the step of ``NAME()`` with communication off, the gradient's bytes and
        the link between nodes, then predicts the step time, images per second, scaling
        efficiency and bottleneck for 1 to 32 nodes over that link and 1, 10, 25 and 100
        Gbit ones (:mod:`pdl_magics.scale`), with a plot where matplotlib is installed.
        """
        args = self._parse(line, self.pdl, _PDL_USAGE)
        if args.subcommand not in PDL_SUBCOMMANDS:
            what = f"unknown subcommand {args.subcommand!r}" if args.subcommand else "%pdl needs a subcommand"
            raise UsageError(f"{what}; valid: {', '.join(PDL_SUBCOMMANDS)} (usage: {_PDL_USAGE})")
        scale_options = [o for o, v in (("--loss", args.loss), ("--model", args.model), ("--batch", args.batch))
                         if v is not None]
        try:
            if args.subcommand == "scale":
                missing = [o for o in ("--loss", "--model", "--batch") if o not in scale_options]
                if missing or args.backend != "torch":
                    raise DistributedUsageError(
                        f"%pdl scale needs {', '.join(missing)}" if missing else
                        "%pdl scale measures with torch.distributed: leave --backend out")
                report = self.session.scale(args.loss, args.model, args.batch, args.n)
                print(report.text())
                figure = report.plot()
                if figure is not None:
                    display(figure)
                return None
            if scale_options:
                raise DistributedUsageError(f"{', '.join(scale_options)} are for %pdl scale (usage: {_PDL_USAGE})")
            report = self.session.check(args.n, backend=args.backend)
        except DistributedUsageError as e:
            raise UsageError(str(e)) from None
        display(report)
        report.raise_if_failed()

    def _parse(self, line: str, magic=None, options: str = _OPTIONS):
        try:
            return parse_argstring(magic or self.distributed, line)
        except (UsageError, ValueError) as e:  # ValueError: shlex, e.g. an unclosed quote
            message = " ".join(str(e).split())
            raise UsageError(f"{message}; options: {options}") from None
