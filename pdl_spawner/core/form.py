"""The spawn form and the messages about free slots: pure functions, no I/O."""

from __future__ import annotations

from html import escape


def describe_holders(holders: dict[str, int], *, show_names: bool) -> str:
    """``"alice (2), bob (1)"`` for admins; ``"3 held by other users"`` for everyone else."""
    total = sum(holders.values())
    if not total:
        return "none held"
    if not show_names:
        return f"{total} held by other users"
    return ", ".join(f"{owner} ({k})" for owner, k in sorted(holders.items()))


def not_enough_message(
    wanted: int, free: int, pool_size: int, holders: dict[str, int], *, show_names: bool, unit: str = "workers"
) -> str:
    """One line for a spawn that asked for more slots (``unit``, plural) than are free;
    it suggests a smaller request only when one would fit."""
    advice = f"Ask for at most {free}, or try again" if free else "Try again"
    return (
        f"Not enough free {unit}: you asked for {wanted}, {free} of {pool_size} are free "
        f"({describe_holders(holders, show_names=show_names)}). {advice} when one frees up."
    )


def render_form(
    *, kind: str, pool_size: int, free: int, holders: dict[str, int], default: int, maximum: int, show_names: bool,
    waiting: list[tuple[str, int]] | None = None, limits: str = "", session: str = "",
) -> str:
    """HTML for the spawn page: how many workers, with what is free and who holds the
    rest, the user's own limit (``limits``, one line: :func:`pdl.limits.holding_line`),
    how long a session lasts (``session``, one line, "" for no limit), and (where the
    spawner has a queue, ``waiting`` not None) the choice to wait
    in it. ``waiting``: (user, workers) in queue order, shown by name to admins and as
    a count to everyone else."""
    unit = "GPU" if kind == "gpu" else "CPU worker"
    value = max(1, min(default, maximum))
    mine = f"""
  <p class="help-block pdl-limits">{escape(limits)}</p>""" if limits else ""
    if session:
        mine += f"""
  <p class="help-block pdl-session">{escape(session)}</p>"""
    queue = "" if waiting is None else f"""
  <p class="help-block pdl-queue">{escape(describe_queue(waiting, show_names=show_names))}</p>
  <label><input type="checkbox" name="queue" id="pdl-queue"> If they are busy, wait in the queue
     (first come, first served; cancel to leave it)</label>"""
    return f"""
<div class="form-group pdl-workers">
  <label for="pdl-workers">Workers ({unit}s, one engine each)</label>
  <input id="pdl-workers" name="workers" type="number" class="form-control"
         min="1" max="{maximum}" value="{value}" required>
  <p class="help-block pdl-free">{free} of {pool_size} {unit}s free;
     {escape(describe_holders(holders, show_names=show_names))}.</p>{mine}{queue}
</div>
"""


def describe_queue(waiting: list[tuple[str, int]], *, show_names: bool) -> str:
    """``"Queue: alice (2), bob (1)."`` for admins; ``"2 users are waiting."`` for everyone else."""
    if not waiting:
        return "Nobody is waiting."
    if not show_names:
        return f"{len(waiting)} user{'s are' if len(waiting) > 1 else ' is'} waiting."
    return "Queue: " + ", ".join(f"{user} ({n})" for user, n in waiting) + "."


def queue_message(wanted: int, position: int, free: int, pool_size: int, holders: dict[str, int], *,
                  show_names: bool, unit: str = "workers") -> str:
    """One line for a user waiting in the queue (the spawn page's progress message)."""
    return (f"Waiting for {wanted} {unit}: number {position} in the queue; {free} of {pool_size} are free "
            f"({describe_holders(holders, show_names=show_names)}). Cancel to leave the queue.")


def queue_first_message(waiting: int, unit: str = "workers", *, spawning: bool = True) -> str:
    """One line for a request refused because others wait for the same workers: a
    direct spawn (``spawning``: it may join the queue) or engines asked back by a cell."""
    advice = "Tick 'wait in the queue' to join it." if spawning else "Run the cell again once they have been served."
    return (f"Not enough free {unit} for you now: {waiting} user{'s are' if waiting > 1 else ' is'} waiting "
            f"in the queue, first come, first served. {advice}")


#: Characters of a user's value that a refusal quotes at most (issue 27: a 10 MB value
#: came back whole in the answer and three times in the hub's log).
ECHO_CHARS = 40


def echo(value) -> str:
    """``value`` as a refusal quotes it: ASCII (``ascii()``), cut to :data:`ECHO_CHARS`
    with the full length said, so a user's value never makes an answer or a log line long."""
    try:
        text = ascii(value)
    except ValueError:  # an int too long to print (Python's digit limit)
        return f"<{type(value).__name__} too long to show>"
    if len(text) <= ECHO_CHARS:
        return text
    return f"{text[:ECHO_CHARS]}... ({len(text)} characters)"


def parse_workers(formdata: dict, *, maximum: int) -> int:
    """Read ``workers`` from submitted form data; ValueError naming the valid range."""
    raw = (formdata.get("workers") or [""])[0]
    try:
        n = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"workers must be a whole number from 1 to {maximum}, got {echo(raw)}") from None
    check_workers(n, maximum=maximum)
    return n


def check_workers(n, *, maximum: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= maximum:
        raise ValueError(f"workers must be a whole number from 1 to {maximum}, got {echo(n)}")


#: The spawn options a user may set: how many workers, and whether to wait for them.
#: Image, mounts, environment and command are the admin's choice: a spawn that names
#: any of them is refused.
USER_OPTIONS = ("workers", "queue")


def requested_workers(user_options, *, default: int, maximum: int, more: dict[str, str] | None = None) -> int:
    """How many workers a spawn asks for, from its ``user_options`` (REST body or form).

    ``default`` when ``workers`` is not given. ValueError, one line naming the valid
    options and their range, when the options hold any other key (``image``,
    ``volumes``, ``env``, ...) or ``workers`` is not a whole number from 1 to ``maximum``.
    ``more``: further options this spawner lets users set -> what is valid for each
    (e.g. ``{"partition": "gpu or big"}``); their values are the spawner's to check.
    """
    more = more or {}
    extra = "".join(f", {name!r}, {valid_values}" for name, valid_values in more.items())
    valid = f"the options are 'workers', a whole number from 1 to {maximum}{extra}, and 'queue', true or false"
    if not isinstance(user_options, dict):
        raise ValueError(f"spawn options must be a JSON object; {valid}")
    unknown = sorted(echo(str(key)) for key in user_options if key not in USER_OPTIONS and key not in more)
    if unknown:
        raise ValueError(f"spawn option not allowed: {', '.join(unknown)}; {valid}")
    if not isinstance(user_options.get("queue", False), bool):
        raise ValueError(f"spawn option 'queue' must be true or false, got {echo(user_options['queue'])}; {valid}")
    n = user_options.get("workers", default)
    check_workers(n, maximum=maximum)
    return n


def wants_queue(formdata: dict) -> bool:
    """Whether the spawn form's "wait in the queue" box was ticked."""
    return (formdata.get("queue") or [""])[0] in ("on", "true", "1")


# -- the GPU type ----------------------------------------------------------------------

def valid_gpu_types(types: list[str]) -> str:
    """``"one of 'a100', 't4', or '' for any"``, for refusals."""
    return "one of " + ", ".join(repr(t) for t in types) + ", or '' for any"


def check_gpu_type(value, types: list[str]) -> str:
    """``value`` if it is one of ``types`` or "" (any type), else ValueError naming them."""
    if not isinstance(value, str) or (value and value not in types):
        raise ValueError(f"gpu_type must be {valid_gpu_types(types)}, got {echo(value)}")
    return value


def render_gpu_types(free: dict[str, tuple[int, int]]) -> str:
    """HTML of the GPU type choice: "Any type" and each type (``free``: type -> (free,
    total); "" : all types), each with its free count; "" with fewer than two types."""
    types = [t for t in free if t]
    if len(types) < 2:
        return ""

    def option(kind: str, label: str) -> str:
        available, total = free.get(kind, (0, 0))
        return f'<option value="{escape(kind)}">{escape(label)} ({available} of {total} free)</option>'

    choices = option("", "Any type") + "".join(option(t, t) for t in sorted(types))
    return f"""
<div class="form-group pdl-gpu-type">
  <label for="pdl-gpu-type">GPU type</label>
  <select id="pdl-gpu-type" name="gpu_type" class="form-control">{choices}</select>
</div>"""


def parse_gpu_type(formdata: dict, types: list[str]) -> dict:
    """``{"gpu_type": ...}`` from submitted form data where ``types`` offers a choice (two
    or more) and one was chosen; else {}. ValueError, one line, for one not offered."""
    if len(types) < 2:
        return {}
    chosen = check_gpu_type((formdata.get("gpu_type") or [""])[0], list(types))
    return {"gpu_type": chosen} if chosen else {}
