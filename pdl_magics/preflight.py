"""Preflight, notebook side: check every rank of the world before cells run on it.

Each rank answers :func:`pdl.runtime.preflight.probe` (its GPU, versions and network
interface); the answers are compared here. When nothing is wrong, a small
all-reduce runs over the process group the cells will use
(:func:`pdl.runtime.preflight.all_reduce_smoke`), and its bandwidth is reported.

- :func:`find_problems`, :func:`table_rows`, :func:`render_text` and
  :func:`render_html` are pure: they take the ranks' answers (a list indexed by
  rank) and return problems, rows and text, with no I/O;
- :func:`run_checks` runs the whole preflight on a world, given the session's
  :class:`~pdl_magics.engines.Engines` and :class:`~pdl_magics.group.ProcessGroup`,
  and returns a :class:`PreflightReport`. ``DistributedSession.check`` (``%pdl
  check``) shows it; ``DistributedSession.run`` runs it once per set of engines
  and raises :class:`PreflightFailed` (the cell does not run) when any fails.
"""

from __future__ import annotations

import html
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import ipyparallel as ipp

from pdl.slots import GPU_KINDS, parse_slot

#: Seconds every rank has to answer the probe (the first one may import torch).
PROBE_TIMEOUT_S = 60.0
#: The smoke test: bytes of float32 all-reduced, how many timed repeats, and the
#: seconds it may take in all before it counts as hung.
SMOKE_BYTES = 4 << 20
SMOKE_ITERS = 5
SMOKE_TIMEOUT_S = 30.0
#: Seconds the notebook waits for a rank's smoke result beyond the rank's own limit.
SMOKE_GRACE_S = 10.0

#: Version fields that must agree across ranks: (probe key, name shown, text when absent).
VERSIONS = (
    ("driver", "driver", "(no driver)"),
    ("cuda", "CUDA", "(no CUDA)"),
    ("nccl", "NCCL", "(no NCCL)"),
    ("torch", "torch", "(not importable)"),
    ("horovod", "horovod", "(not installed)"),
)

#: Columns of the table, in order.
COLUMNS = ("rank", "host", "slot", "GPU (reserved / seen)", "driver", "CUDA", "NCCL", "torch",
           "horovod", "interface", "all-reduce GB/s", "status")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one rank (``rank`` None: with the world as a whole)."""

    rank: int | None
    host: str
    reason: str

    def __str__(self) -> str:
        return self.reason if self.rank is None else f"rank {self.rank} on {self.host}: {self.reason}"


# -- the checks (pure) ---------------------------------------------------------


def _slot_kind(probe: dict) -> str | None:
    """"gpu" (a whole GPU or a MIG device) or "cpu" for what the rank reserved, None when
    that is unknown."""
    try:
        kind = parse_slot(probe.get("slot") or "")[0]
    except ValueError:
        reserved = probe.get("reserved_gpu")
        return None if reserved is None else "gpu" if reserved else "cpu"
    return "gpu" if kind in GPU_KINDS else kind


def gpu_reason(probe: dict) -> str | None:
    """Why the GPU torch sees does not match the reservation (None if it does).

    A GPU slot must see exactly its one GPU (by UUID, when the reservation or
    nvidia-smi names it); a CPU slot must see none.
    """
    seen = probe.get("gpus_seen") or []
    names = ", ".join(g.get("uuid") or g.get("name") or "?" for g in seen)
    kind = _slot_kind(probe)
    if kind == "cpu":
        if not seen:
            return None
        slot = probe.get("slot")
        return f"{f'CPU slot {slot}' if slot else 'no GPU reserved'} but torch sees {len(seen)} GPU(s): {names}"
    if kind != "gpu":
        return None
    reserved = probe.get("reserved_gpu") or probe.get("slot") or "?"
    if not seen:
        return f"reserved GPU {reserved} but torch sees none"
    if len(seen) > 1:
        return f"reserved GPU {reserved} but torch sees {len(seen)} GPUs: {names}"
    want = reserved if reserved.startswith("GPU-") else None
    if reserved.isdigit():
        want = (probe.get("host_gpus") or {}).get(int(reserved))
    got = seen[0].get("uuid")
    if want and got and want != got:
        which = reserved if want == reserved else f"{reserved} ({want})"
        return f"reserved GPU {which} but torch sees {got}"
    return None


def iface_reasons(probe: dict) -> list[str]:
    """Why the collectives' network interface would not work (none: it will)."""
    iface = probe.get("iface") or {}
    source = iface.get("source", "")
    reasons = [f"interface {name} ({source}) does not exist" for name in iface.get("missing", [])]
    reasons += [f"interface {name} ({source}) is down" for name in iface.get("down", [])]
    return reasons


def _majority(values: dict[int, object]):
    """The most common value; a tie goes to the value of the lowest rank among the tied."""
    counts = Counter(values.values())
    best = max(counts.values())
    return next(v for _, v in sorted(values.items(), key=lambda kv: kv[0]) if counts[v] == best)


def _ranks_text(ranks: list[int], probes: list[dict]) -> str:
    hosts = list(dict.fromkeys(probes[r].get("host", "?") for r in ranks))
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} ({', '.join(hosts)})"


def version_reasons(probes: list[dict]) -> dict[int, list[str]]:
    """Rank -> how its versions differ from the rest. The majority is taken as right;
    on a tie, the value of the lowest rank among the tied is."""
    answered = {r: p for r, p in enumerate(probes) if not p.get("error")}
    reasons: dict[int, list[str]] = {}
    for key, name, absent in VERSIONS:
        values = {r: p.get(key) for r, p in answered.items()}
        if len(set(values.values())) < 2:
            continue
        right = _majority(values)
        agree = [r for r, v in values.items() if v == right]
        for r, v in values.items():
            if v != right:
                reasons.setdefault(r, []).append(
                    f"{name} {absent if v is None else v} differs from {absent if right is None else right} "
                    f"on {_ranks_text(agree, probes)}"
                )
    return reasons


def smoke_reason(result: dict | None) -> str | None:
    """Why this rank's all-reduce smoke test failed (None if it passed or did not run)."""
    if not result:
        return None
    if result.get("error"):
        return result["error"]
    if result["value"] != result["expected"]:
        return f"all-reduce returned {result['value']:g}, expected {result['expected']:g}"
    return None


#: Checks an admin may turn off with ``$PDL_PREFLIGHT_SKIP`` (comma-separated).
SKIPPABLE = ("gpu", "versions", "interface", "allreduce")


def skipped_checks(environ=os.environ) -> set[str]:
    """The checks ``$PDL_PREFLIGHT_SKIP`` turns off, e.g. ``gpu`` where nodes declare GPUs
    that torch cannot see (a simulated cluster). ValueError, naming the valid ones, for others."""
    names = {n.strip() for n in environ.get("PDL_PREFLIGHT_SKIP", "").split(",") if n.strip()}
    unknown = sorted(names - set(SKIPPABLE))
    if unknown:
        raise ValueError(f"PDL_PREFLIGHT_SKIP: unknown check(s) {', '.join(unknown)}; valid: {', '.join(SKIPPABLE)}")
    return names


def find_problems(probes: list[dict], smoke: list[dict] | None = None, skip: set[str] | None = None) -> list[Problem]:
    """Every problem, by rank: ``probes[r]`` is rank r's :func:`pdl.runtime.preflight.probe`
    answer (or ``{"host", "error"}`` when it gave none), ``smoke[r]`` its smoke result.
    ``skip``: checks left out (default :func:`skipped_checks`)."""
    skip = skipped_checks() if skip is None else skip
    versions = {} if "versions" in skip else version_reasons(probes)
    problems = []
    for rank, probe in enumerate(probes):
        if probe.get("error"):
            reasons = [probe["error"]]
        else:
            reasons = [None if "gpu" in skip else gpu_reason(probe), *versions.get(rank, []),
                       *([] if "interface" in skip else iface_reasons(probe))]
        if smoke is not None and "allreduce" not in skip:
            reasons.append(smoke_reason(smoke[rank]))
        problems += [Problem(rank, probe.get("host", "?"), reason) for reason in reasons if reason]
    return problems


# -- the table (pure) ------------------------------------------------------------


def _short_gpu(text: str) -> str:
    return text[:12] + "…" if text.startswith("GPU-") and len(text) > 13 else text


def table_rows(probes: list[dict], smoke: list[dict] | None = None,
               problems: list[Problem] = ()) -> list[dict[str, str]]:
    """One row per rank: COLUMNS -> text ("-" where there is nothing to show)."""
    failed = {p.rank for p in problems}
    rows = []
    for rank, p in enumerate(probes):
        row = dict.fromkeys(COLUMNS, "-")
        row.update(rank=str(rank), host=p.get("host", "?"), status="✗" if rank in failed else "✓")
        if not p.get("error"):
            seen = ", ".join(_short_gpu(g.get("uuid") or g.get("name") or "?") for g in p.get("gpus_seen") or [])
            reserved = p.get("reserved_gpu")
            iface = p.get("iface") or {}
            row.update({
                "slot": p.get("slot") or "-",
                "GPU (reserved / seen)": f"{_short_gpu(reserved) if reserved else 'none'} / {seen or 'none'}",
                **{name: str(p.get(key) or "-") for key, name, _ in VERSIONS},
                "interface": f"{iface.get('name', '?')} ({iface.get('source', '?')})",
            })
        result = (smoke or [None] * len(probes))[rank]
        if result:
            bw = result.get("busbw_gbs")
            row["all-reduce GB/s"] = "failed" if smoke_reason(result) else "n/a" if bw is None else f"{bw:.2f}"
        rows.append(row)
    return rows


def render_text(rows: list[dict[str, str]], problems: list[Problem] = ()) -> str:
    """A plain text table, then one line per problem."""
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS).rstrip()]
    lines.append("  ".join("-" * widths[c] for c in COLUMNS))
    lines += ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS).rstrip() for r in rows]
    lines += [str(p) for p in problems]
    return "\n".join(lines)


def render_html(rows: list[dict[str, str]], problems: list[Problem] = ()) -> str:
    """The same as an HTML table (status in green or red), then the problems as a list."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = []
    for r in rows:
        cells = []
        for c in COLUMNS:
            style = f' style="color:{"#1a7f37" if r[c] == "✓" else "#cf222e"}"' if c == "status" else ""
            cells.append(f"<td{style}>{html.escape(r[c])}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    text = f'<table class="pdl-preflight"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    if problems:
        items = "".join(f"<li>{html.escape(str(p))}</li>" for p in problems)
        text += f'<ul class="pdl-preflight-problems" style="color:#cf222e">{items}</ul>'
    return text


# -- reports and errors ------------------------------------------------------------


@dataclass
class PreflightReport:
    """What one preflight found. Shown as a table (HTML in Jupyter, text elsewhere)."""

    probes: list[dict]
    smoke: list[dict] | None = None
    problems: list[Problem] = field(default_factory=list)
    #: seconds each phase took: "probe", and "smoke" when it ran
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def rows(self) -> list[dict[str, str]]:
        return table_rows(self.probes, self.smoke, self.problems)

    def text(self) -> str:
        return render_text(self.rows, self.problems)

    def _repr_html_(self) -> str:
        return render_html(self.rows, self.problems)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.text())

    def raise_if_failed(self, note: str = "") -> None:
        """Raise :class:`PreflightFailed` if anything was found."""
        if self.problems:
            raise PreflightFailed(self, note)


class PreflightFailed(RuntimeError):
    """The preflight found problems; its message is one line per problem, each
    naming the rank, its host and the reason. IPython shows that, not a traceback."""

    def __init__(self, report: PreflightReport, note: str = ""):
        self.report = report
        self.problems = list(report.problems)
        self.note = note
        super().__init__("\n".join(map(str, self.problems)))

    def _render_traceback_(self) -> list[str]:
        lines = [f"Preflight failed ({len(self.problems)} problem{'s' if len(self.problems) > 1 else ''}):",
                 *map(str, self.problems)]
        return lines + ([self.note] if self.note else [])


# -- running it ----------------------------------------------------------------------


def _on_ranks(engines, world, step: str, *args) -> list:
    """Start ``pdl.runtime.preflight.<step>(*args)`` on every rank; their AsyncResults."""
    return [engines.call_async(r.engine_id, "preflight", step, *args) for r in world]


def _gather(world, ars, timeout_s: float, what: str) -> list[dict]:
    """Each rank's answer, or ``{"host", "error"}`` for one that failed or did not answer."""
    deadline = time.monotonic() + timeout_s
    answers = []
    for r, ar in zip(world, ars):
        try:
            answer = ar.get(timeout=max(0.0, deadline - time.monotonic()))
        except ipp.error.TimeoutError:
            answer = {"error": f"did not answer the {what} within {timeout_s:g} s"}
        except ipp.error.EngineError:
            answer = {"error": f"its engine died during the {what}"}
        except ipp.error.RemoteError as e:
            answer = {"error": f"the {what} raised {e.ename}: {e.evalue}"}
        answers.append({"host": r.host, **answer})
    return answers


def run_checks(engines, group, world, backend: str = "torch", timeout_s: float = 1800.0) -> PreflightReport:
    """Probe every rank of ``world`` (on :class:`~pdl_magics.engines.Engines` ``engines``);
    if nothing is wrong, form the process group of ``backend`` with ``group``
    (:class:`~pdl_magics.group.ProcessGroup`, as a cell would, collective timeout
    ``timeout_s``) and run the smoke test."""
    started = time.monotonic()
    probes = _gather(world, _on_ranks(engines, world, "probe"), PROBE_TIMEOUT_S, "probe")
    report = PreflightReport(probes, problems=find_problems(probes))
    report.seconds["probe"] = time.monotonic() - started
    if not report.ok:
        return report
    try:
        group.ensure(world, backend, timeout_s)
    except RuntimeError as e:
        report.problems = [Problem(None, "", str(e))]
        return report
    started = time.monotonic()
    ars = _on_ranks(engines, world, "all_reduce_smoke", backend, SMOKE_BYTES, SMOKE_ITERS, SMOKE_TIMEOUT_S)
    report.smoke = _gather(world, ars, SMOKE_TIMEOUT_S + SMOKE_GRACE_S, "all-reduce")
    report.seconds["smoke"] = time.monotonic() - started
    report.problems = find_problems(probes, report.smoke)
    if report.problems:
        group.forget()  # a collective may have failed half-way
        engines.interrupt([r for r, ar in zip(world, ars) if not ar.ready()])
    return report
