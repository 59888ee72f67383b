"""Put a GPU check's summary into docs/benchmarks.md, between its markers.

    python3 scripts/gpu_publish.py RESULTS [--doc docs/benchmarks.md]

RESULTS is the folder ``scripts/gpu-check`` wrote (``summary.md``, and ``run.json``: the
command and when it ran). The block between :data:`BEGIN` and :data:`END` in the doc is
replaced by them, so the figures people read are the check's own, never retyped. A
missing summary or marker is refused in one line (exit 2); nothing else changes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN = "<!-- gpu-check summary: begin (scripts/gpu_publish.py writes this block) -->"
END = "<!-- gpu-check summary: end -->"


def block(results: Path) -> str:
    """The markdown for ``results``: how and when it ran (when ``run.json`` says), then its summary."""
    summary = (results / "summary.md").read_text().strip()
    run = results / "run.json"
    if not run.exists():
        return summary
    info = json.loads(run.read_text())
    return f"Run {info['started']}:\n\n```bash\n{info['command']}\n```\n\n{summary}"


def publish(results: Path, doc: Path) -> None:
    """Replace the block between the markers of ``doc`` with :func:`block` of ``results``.
    ValueError (one line) when the summary or a marker is missing."""
    if not (results / "summary.md").is_file():
        raise ValueError(f"no summary at {results / 'summary.md'}: give the folder scripts/gpu-check wrote")
    text = doc.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{doc} needs one {BEGIN!r} line and, after it, one {END!r} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    doc.write_text(f"{head}{BEGIN}\n{block(results)}\n{END}{tail}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_publish.py", description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the folder scripts/gpu-check wrote")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    try:
        publish(args.results, args.doc)
    except ValueError as e:
        print(f"gpu_publish: {e}", file=sys.stderr)
        return 2
    print(f"gpu_publish: {args.doc} has the summary of {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
