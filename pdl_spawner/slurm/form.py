"""The spawn form's Slurm fields: a partition and a time limit, where the admin lets
users choose them. Pure functions, no I/O; every refusal is one line naming what is valid."""

from __future__ import annotations

from html import escape

from pdl_spawner.core.form import echo


def valid_partitions(partitions: list[str]) -> str:
    """``"one of 'gpu', 'big'"``, for refusals."""
    return "one of " + ", ".join(repr(p) for p in partitions)


def valid_time_limits(maximum_min: int) -> str:
    return f"minutes, a whole number from 1 to {maximum_min}"


def check_partition(value, partitions: list[str]) -> str:
    """``value`` if it is one of ``partitions``, else ValueError naming them."""
    if not isinstance(value, str) or value not in partitions:
        raise ValueError(f"partition must be {valid_partitions(partitions)}, got {echo(value)}")
    return value


def check_time_limit(value, maximum_min: int) -> int:
    """``value`` (minutes) if it is a whole number from 1 to ``maximum_min``, else ValueError."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum_min:
        raise ValueError(f"time_limit must be {valid_time_limits(maximum_min)}, got {echo(value)}")
    return value


def render_fields(*, partitions: list[str], max_time_min: int, default_time_min: int) -> str:
    """HTML of the form's Slurm fields: a partition choice (with more than one allowed)
    and a time limit in minutes (with ``max_time_min`` > 0); "" when neither is offered."""
    html = ""
    if len(partitions) > 1:
        choices = "".join(f'<option value="{escape(p)}">{escape(p)}</option>' for p in partitions)
        html += f"""
<div class="form-group pdl-partition">
  <label for="pdl-partition">Slurm partition</label>
  <select id="pdl-partition" name="partition" class="form-control">{choices}</select>
</div>"""
    if max_time_min:
        value = min(default_time_min or max_time_min, max_time_min)
        html += f"""
<div class="form-group pdl-time-limit">
  <label for="pdl-time-limit">Time limit (minutes)</label>
  <input id="pdl-time-limit" name="time_limit" type="number" class="form-control"
         min="1" max="{max_time_min}" value="{value}" required>
  <p class="help-block">Slurm ends your reservation after this long; your files stay.</p>
</div>"""
    return html


def parse_fields(formdata: dict, *, partitions: list[str], max_time_min: int) -> dict:
    """The Slurm options from submitted form data (only those offered); ValueError, one line."""
    options = {}
    if len(partitions) > 1:
        options["partition"] = check_partition((formdata.get("partition") or [""])[0], partitions)
    if max_time_min:
        raw = (formdata.get("time_limit") or [""])[0]
        try:
            minutes = int(str(raw).strip())
        except ValueError:
            raise ValueError(f"time_limit must be {valid_time_limits(max_time_min)}, got {echo(raw)}") from None
        options["time_limit"] = check_time_limit(minutes, max_time_min)
    return options
