"""``%pdl scale``: what more nodes, or a faster link, would do to the user's training
step, predicted from what is measured on their engines (:mod:`pdl.runtime.scale_probe`)
with the ring all-reduce model of :mod:`pdl.scaling`.

The magic runs one cell on the ranks that calls ``measure(LOSS, MODEL)``; this module
builds that cell from two checked names, combines the ranks' measurements (the slowest
rank's step, the sweep's link) and shows the table: for 1 to 32 nodes, over the measured
link (when the engines span two nodes or more) and 1, 10, 25 and 100 Gbit links, the
step time, images per second, scaling efficiency and what the step waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdl.scaling import LINKS_GBIT, Link, StepProfile, fit_comm_cpu, fit_link, table

from .errors import DistributedUsageError

#: Node counts the table shows (the plot shows all from 1 to 32).
SHOWN_NODES = (1, 2, 4, 8, 16, 32)


def measure_cell(loss: str, model: str) -> str:
    """The cell that measures the step of ``loss()`` training ``model`` (both names of the
    engines' namespace); DistributedUsageError (one line) for a name that is not one."""
    for option, name in (("--loss", loss), ("--model", model)):
        if not (isinstance(name, str) and name.isidentifier()):
            raise DistributedUsageError(f"{option} must name a variable of the cell's namespace, got {name!r}")
    return (f"from pdl.runtime.scale_probe import measure as _pdl_measure\n"
            f"_pdl_measure({loss}, {model}, device)")


@dataclass
class ScaleReport:
    """The predictions, and what they were made from."""

    profile: StepProfile
    links: dict[str, Link]
    measured: Link | None
    nodes_now: int
    rows: list[dict] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"step on one node: forward {self.profile.forward_s * 1e3:.1f} ms, backward "
                 f"{self.profile.backward_s * 1e3:.1f} ms, gradient {self.profile.grad_bytes / 2**20:.1f} MiB, "
                 f"{self.profile.images} images a rank"]
        if self.profile.cpu_rate > 0:
            lines.append(f"CPU: {self.profile.cpu_s * 1e3:.1f} ms a pass, {self.profile.cpu_rate:.2f} CPU-s a second "
                         f"over many passes, {self.profile.comm_cpu_s_per_byte * 1e9:.2f} ns a byte all-reduced")
        if self.measured is not None:
            lines.append(f"measured link between your {self.nodes_now} nodes: "
                         f"{self.measured.bandwidth_bytes_s * 8 / 1e9:.3g} Gbit/s, "
                         f"{self.measured.latency_s * 1e6:.0f} us a message")
        else:
            lines.append("your engines are on one node: no link to measure; predictions for standard links")
        lines.append(f"{'link':>10} {'nodes':>5} {'step ms':>9} {'img/s':>9} {'efficiency':>10}  waits for")
        for row in self.rows:
            if row["nodes"] in SHOWN_NODES:
                lines.append(f"{row['link']:>10} {row['nodes']:>5} {row['step_s'] * 1e3:>9.1f} "
                             f"{row['images_per_s']:>9.0f} {row['efficiency']:>10.2f}  {row['bottleneck']}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def plot(self):
        """Scaling efficiency over nodes, one line per link (a matplotlib figure), or None
        where matplotlib is not installed."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        figure, axes = plt.subplots(figsize=(6, 3.5))
        for name in self.links:
            rows = [r for r in self.rows if r["link"] == name]
            axes.plot([r["nodes"] for r in rows], [r["efficiency"] for r in rows], label=name)
        axes.set(xlabel="nodes", ylabel="scaling efficiency", ylim=(0, 1.05), xscale="log", xticks=SHOWN_NODES,
                 xticklabels=[str(n) for n in SHOWN_NODES])
        axes.legend()
        plt.close(figure)
        return figure


def report(measurements: list[dict], images: int) -> ScaleReport:
    """The predictions from every rank's :func:`~pdl.runtime.scale_probe.measure`, for a
    step of ``images`` images a rank: the slowest rank's step (by its pass, or by its
    CPU work at its CPU rate where that is longer), the sweep of the first rank that
    made one (the ranks of one ring measure the same link)."""
    nodes = max(int(m["nodes"]) for m in measurements)
    sweep = next((m["sweep"] for m in measurements if m["sweep"]), [])
    measured = fit_link([(b, s) for b, s, _ in sweep], nodes) if sweep else None
    comm_cpu = fit_comm_cpu([(b, c) for b, _, c in sweep], nodes) if sweep else 0.0
    profile = max((StepProfile(forward_s=m["forward_s"], backward_s=m["backward_s"],
                               grad_bytes=int(measurements[0]["grad_bytes"]), images=images,
                               ready=tuple((f, b) for f, b in m["ready"]), cpu_s=m["cpu_s"],
                               cpu_rate=m["cpu_rate"], comm_cpu_s_per_byte=comm_cpu) for m in measurements),
                  key=StepProfile.one_node_s)
    links = ({"measured": measured} if measured else {}) | {f"{g} Gbit": Link.gbit(g) for g in LINKS_GBIT}
    return ScaleReport(profile, links, measured, nodes, table(profile, links))
