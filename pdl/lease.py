"""The engine lease: idle engines give their workers back, and the next distributed cell
asks for them again. Typed messages, one writer (:func:`encode`) and one reader
(:func:`decode`), the lease's states (:class:`LeaseState`), what the lease looks like to
whoever asks (:class:`LeaseView`), and the files it is kept in (:class:`LeaseFiles`).

One owner holds a server's lease: :class:`pdl_server.lease_owner.LeaseOwner`, in the
user's Jupyter server, which every other party asks over that server's HTTP API
(``/pdl/api/lease``, with the server's token) and which alone writes the files; a change
reaches whoever waits for it at once (a long-polled ``GET``, :data:`LONG_POLL_MAX_S`):

- the user's server (``pdl-singleuser``) stops its engines after
  ``$PDL_ENGINE_IDLE_TIMEOUT`` seconds without a task (or loses them with its Slurm
  job, or at its session's end) and records a :class:`Release`;
- the hub's spawner waits on the lease, frees the workers of a release and logs the
  reclaim in its own words (the hub never touches these files);
- a kernel that needs engines again records a :class:`Want`; the spawner checks its
  count like a spawn's and answers with a :class:`Grant` or a :class:`Refusal`;
- the server brings its engines back as the grant says, and the owner keeps the grant
  it took up (the slots its engines now have: :meth:`LeaseFiles.holding`) and clears
  the rest;
- the user's Cluster panel records an :class:`ExtendWish` (more time for the session);
  the spawner answers with :class:`Extended` or a :class:`Refusal`; the hub enforces its
  own end either way;
- the spawner flags GPUs held idle (:class:`GpuIdle`, its own readings), which the
  server shows and, at ``release_at``, acts on as on idle engines;
- a kernel notes each distributed cell's start with the owner, which orders it against
  the server's idle release: a cell that starts as its engines go idle either sees their
  release, and asks again, or keeps them.

Everything here can be written by the user, so the hub trusts none of it: :func:`decode`
checks only the shape, a want's count is the user's text until the spawner checks it,
and a release's reason never reaches the hub's log.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Union

from pdl.atomic_file import write_atomic
from pdl.contract import ServerContract
from pdl.limits import duration
from pdl.slots import parse_slot


class LeaseFormatError(ValueError):
    """A lease message that is not of the shape :func:`decode` expects (one line)."""


@dataclass(frozen=True)
class Release:
    """The user's server stopped its engines (or lost them) and gives their workers back."""

    #: why, one line, for the user (the hub logs its own words instead)
    reason: str
    #: how many workers the engines had
    workers: int
    #: the slots they had on the server's machine or in its Slurm job; () on Docker Swarm
    slots: tuple[str, ...] = ()


@dataclass(frozen=True)
class Want:
    """A kernel asks for its workers again."""

    #: the count as written: unchecked (the hub checks it like a spawn's count)
    workers: Any


@dataclass(frozen=True)
class Grant:
    """The hub's yes: ``workers`` are the server's again."""

    #: how many
    workers: int
    #: the slots to start one engine on each; () when the hub started the engines itself (Docker Swarm)
    slots: tuple[str, ...] = ()
    #: the scheduler's job the engines come back in (Slurm: as its steps); 0: none
    job: int = 0
    #: when the session this grant starts ends (epoch seconds; the hub's session limit); 0: none
    ends_at: float = 0.0

    @property
    def started_by_hub(self) -> bool:
        """True when the hub brought the engines back itself (no slots for the server to start)."""
        return not self.slots


@dataclass(frozen=True)
class Refusal:
    """The hub's no, in one line that says why."""

    reason: str


@dataclass(frozen=True)
class ExtendWish:
    """The user asks for more time for the session (the Cluster panel's Extend)."""

    #: when they asked (epoch seconds), as written
    asked_at: float


@dataclass(frozen=True)
class Extended:
    """The hub's yes to an :class:`ExtendWish`: the session whose grant ended at ``of``
    (epoch seconds; 0 on Slurm, where ``squeue`` tells the end) now ends at ``ends_at``."""

    ends_at: float
    of: float = 0.0


@dataclass(frozen=True)
class GpuIdle:
    """The hub's flag: every GPU the server holds has read 0 % use since ``since`` (epoch
    seconds); from ``release_at`` (0: never) the engines are released as idle ones are."""

    since: float
    release_at: float = 0.0

    def line(self, now: float | None = None) -> str:
        """What the user reads: ``"GPUs held idle: 0 % use since 14:05 UTC (35 min);
        released at 14:35 UTC unless used."``"""
        now = time.time() if now is None else now
        at = time.strftime("%H:%M UTC", time.gmtime(self.since))
        text = f"GPUs held idle: 0 % use since {at} ({duration(now - self.since)})"
        if self.release_at:
            return f"{text}; released at {time.strftime('%H:%M UTC', time.gmtime(self.release_at))} unless used."
        return f"{text}."

    def reason(self) -> str:
        """The release's reason, as the next cell shows it."""
        return f"GPUs held idle (0 % use) since {time.strftime('%H:%M UTC', time.gmtime(self.since))}"


Message = Union[Release, Want, Grant, Refusal, ExtendWish, Extended, GpuIdle]
Answer = Union[Grant, Refusal]
#: The hub's answer to an :class:`ExtendWish`.
ExtendAnswer = Union[Extended, Refusal]

#: What :func:`encode` writes and :func:`decode` reads, in one line (for refusals of bad bodies).
SHAPES = ('{"reason": "why", "workers": n, "slots": [...]} (a release), {"workers": n} (a want), '
          '{"workers": n, "slots": [...], "job": n, "ends_at": t} (a grant), {"refused": "why"} (a refusal), '
          '{"extend_asked_at": t} (a wish for more time), {"extended_to": t, "of": t} (more time given), '
          '{"gpu_idle_since": t, "release_at": t} (GPUs held idle; since 0: no longer)')


def encode(message: Message) -> dict:
    """The JSON object of ``message``: the one writer of lease messages."""
    if isinstance(message, Release):
        return {"reason": message.reason, "workers": message.workers, "slots": list(message.slots)}
    if isinstance(message, Want):
        return {"workers": message.workers}
    if isinstance(message, Grant):
        return {"workers": message.workers, "slots": list(message.slots), "job": message.job,
                "ends_at": message.ends_at}
    if isinstance(message, Refusal):
        return {"refused": message.reason}
    if isinstance(message, ExtendWish):
        return {"extend_asked_at": message.asked_at}
    if isinstance(message, Extended):
        return {"extended_to": message.ends_at, "of": message.of}
    if isinstance(message, GpuIdle):
        return {"gpu_idle_since": message.since, "release_at": message.release_at}
    raise TypeError(f"not a lease message: {message!r}")


def _count(data: dict, key: str, least: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise LeaseFormatError(f"{key} must be a whole number >= {least}, got {value!r}")
    return value


def _time(data: dict, key: str) -> float:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise LeaseFormatError(f"{key} must be a time in epoch seconds >= 0, got {value!r}")
    return float(value)


def _text(data: dict, key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise LeaseFormatError(f"{key} must be text, got {value!r}")
    return value


def _slots(data: dict) -> tuple[str, ...]:
    value = data.get("slots", [])
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise LeaseFormatError(f"slots must be a list of slots such as 'gpu:0', got {value!r}")
    for slot in value:
        parse_slot(slot)
    return tuple(value)


def decode(kind: type, data: Any) -> Message:
    """The message of type ``kind`` in JSON object ``data`` (for :data:`Answer`, a
    :class:`Refusal` if it has ``refused``, else a :class:`Grant`): the one reader of
    lease messages. LeaseFormatError (one line) for another shape."""
    if not isinstance(data, dict):
        raise LeaseFormatError(f"a lease message must be a JSON object, got {type(data).__name__}")
    try:
        if kind is Answer:
            kind = Refusal if "refused" in data else Grant
        elif kind is ExtendAnswer:
            kind = Refusal if "refused" in data else Extended
        if kind is Release:
            return Release(reason=_text(data, "reason"), workers=_count(data, "workers", 1), slots=_slots(data))
        if kind is Want:
            return Want(workers=data.get("workers"))
        if kind is Grant:
            grant = Grant(workers=_count(data, "workers", 1), slots=_slots(data),
                          job=_count({"job": data.get("job", 0)}, "job", 0),
                          ends_at=_time(data, "ends_at"))
            if grant.slots and len(grant.slots) != grant.workers:
                raise LeaseFormatError(f"a grant of {grant.workers} worker(s) names {len(grant.slots)} slot(s)")
            return grant
        if kind is Refusal:
            return Refusal(reason=_text(data, "refused"))
        if kind is ExtendWish:
            return ExtendWish(asked_at=_time(data, "extend_asked_at"))
        if kind is Extended:
            return Extended(ends_at=_time(data, "extended_to"), of=_time(data, "of"))
        if kind is GpuIdle:
            return GpuIdle(since=_time(data, "gpu_idle_since"), release_at=_time(data, "release_at"))
    except ValueError as e:  # parse_slot's, or ours
        raise LeaseFormatError(str(e).splitlines()[0]) from None
    raise TypeError(f"not a lease message type: {kind!r}")


#: The longest a ``GET /pdl/api/lease?after=...`` waits for a change (seconds); it
#: answers the lease as it is then.
LONG_POLL_MAX_S = 30.0


class LeaseState(str, Enum):
    """Where a server's engines stand, from the hub's spawn or grant to the next one."""

    #: the engines run on the workers the server holds
    HELD = "held"
    #: the server is stopping them (idle, at the session's end): a cell waits for the release
    RELEASING = "releasing"
    #: stopped, their workers given back; nobody asked for them again yet
    RELEASED = "released"
    #: a kernel asked for them again; the hub has not answered yet
    WISHED = "wished"
    #: the hub said yes; the server is bringing them back
    GRANTED = "granted"
    #: the hub said no (the kernel reads why and forgets its request)
    REFUSED = "refused"


@dataclass(frozen=True)
class LeaseView:
    """The lease as its owner shows it (``GET /pdl/api/lease``): each part or None, its
    :attr:`state`, and which change of the owner it is (``epoch``, ``version``)."""

    released: Release | None = None
    want: Want | None = None
    answer: Answer | None = None
    #: a wish for more time the hub has not answered yet
    extend: ExtendWish | None = None
    #: the grant the server's engines run on now (None: the spawn's workers)
    held: Grant | None = None
    #: the hub's last answer to a wish for more time
    extension: ExtendAnswer | None = None
    #: the hub's flag on GPUs held idle, while it stands
    gpu_idle: GpuIdle | None = None
    #: the server is stopping its engines (a release is being made)
    releasing: bool = False
    #: the owner's changes so far: a view with a higher version is newer
    version: int = 0
    #: the owner's identity (a new server's owner counts its versions afresh)
    epoch: str = ""

    @property
    def state(self) -> LeaseState:
        """The lease's state (:class:`LeaseState`)."""
        if self.released is None:
            return LeaseState.RELEASING if self.releasing else LeaseState.HELD
        if isinstance(self.answer, Grant):
            return LeaseState.GRANTED
        if isinstance(self.answer, Refusal):
            return LeaseState.REFUSED
        return LeaseState.WISHED if self.want is not None else LeaseState.RELEASED

    def to_json(self) -> dict:
        """``{"state", "version", "epoch", "releasing", "released", "want", "grant", "extend",
        "held", "extension", "gpu_idle"}``, each message :func:`encode`'s object or null."""
        parts = {"released": self.released, "want": self.want, "grant": self.answer, "extend": self.extend,
                 "held": self.held, "extension": self.extension, "gpu_idle": self.gpu_idle}
        return {"state": self.state.value, "version": self.version, "epoch": self.epoch,
                "releasing": self.releasing,
                **{key: None if part is None else encode(part) for key, part in parts.items()}}

    @classmethod
    def from_json(cls, data: Any) -> LeaseView:
        """The view in ``data`` (:meth:`to_json`'s shape; the parts after ``extend`` may be
        absent); LeaseFormatError (one line) otherwise."""
        if not isinstance(data, dict):
            raise LeaseFormatError("the lease must be a JSON object with released, want and grant")

        def part(key, kind):
            return None if data.get(key) is None else decode(kind, data[key])

        version, epoch = data.get("version", 0), data.get("epoch", "")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0 or not isinstance(epoch, str):
            raise LeaseFormatError(f"the lease's version must be a whole number >= 0 and its epoch text, "
                                   f"got {version!r} and {epoch!r}")
        return cls(released=part("released", Release), want=part("want", Want), answer=part("grant", Answer),
                   extend=part("extend", ExtendWish), held=part("held", Grant),
                   extension=part("extension", ExtendAnswer), gpu_idle=part("gpu_idle", GpuIdle),
                   releasing=data.get("releasing") is True, version=version, epoch=epoch)


@dataclass(frozen=True)
class Holding:
    """What a server holds (the one read of it for the kernel, the panel and the
    server): the workers and slots of the grant its engines came back on, else of the
    spawn, and the release while its engines are stopped (the count is then the one a
    cell asks for again)."""

    #: how many workers (0: not known)
    workers: int
    #: their slots on this machine or in the job; () on Docker Swarm
    slots: tuple[str, ...] = ()
    #: the grant the engines came back on (None: the spawn's workers)
    grant: Grant | None = None
    #: the release while the engines are stopped (None: they run)
    released: Release | None = None


#: File name of each kind of message in the cluster folder.
FILES = {Release: "engines-released.json", Want: "engines-wanted.json", Grant: "engines-granted.json",
         Refusal: "engines-granted.json"}
#: The grant the server took up: the slots its engines have now.
HELD_FILE = "engines-held.json"
#: The user's wish for more time, until the hub answers it; and the hub's last answer.
EXTEND_WISH_FILE, EXTENSION_FILE = "session-extend-wish.json", "session-extended.json"
#: The hub's flag on GPUs held idle, while it stands.
GPU_IDLE_FILE = "gpu-idle.json"
#: When a kernel last started a distributed cell (epoch seconds).
CELL_STARTED_FILE = "cell-started"


class LeaseFiles:
    """The lease's files in one cluster folder; each written atomically, mode 0600."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    @classmethod
    def of_this_server(cls) -> LeaseFiles | None:
        """The lease of the hub server this process runs under (its cluster folder), or None outside one."""
        path = ServerContract.from_env().cluster_dir
        return cls(path) if path else None

    def write(self, message: Message) -> None:
        """Record ``message`` (a grant or refusal as the answer)."""
        self._put(FILES[type(message)], message)

    def keep_held(self, grant: Grant) -> None:
        """Record ``grant`` as the one the server's engines run on now."""
        self._put(HELD_FILE, grant)

    def _put(self, name: str, message: Message) -> None:
        body = json.dumps(encode(message)).encode()
        write_atomic(self.directory / name, lambda f: f.write(body))

    def _get(self, name: str, kind: type) -> Message | None:
        try:
            return decode(kind, json.loads((self.directory / name).read_text()))
        except (OSError, ValueError):  # absent, being replaced, or not a message (LeaseFormatError)
            return None

    def released(self) -> Release | None:
        return self._get(FILES[Release], Release)

    def want(self) -> Want | None:
        return self._get(FILES[Want], Want)

    def answer(self) -> Answer | None:
        return self._get(FILES[Grant], Answer)

    def held(self) -> Grant | None:
        return self._get(HELD_FILE, Grant)

    def extend_wish(self) -> ExtendWish | None:
        return self._get(EXTEND_WISH_FILE, ExtendWish)

    def extension(self) -> ExtendAnswer | None:
        """The hub's last answer to a wish for more time."""
        return self._get(EXTENSION_FILE, ExtendAnswer)

    def wish_extension(self, asked_at: float) -> None:
        """Record the user's wish for more time (the last answer is forgotten)."""
        self._remove(EXTENSION_FILE)
        self._put(EXTEND_WISH_FILE, ExtendWish(asked_at=asked_at))

    def answer_extension(self, answer: ExtendAnswer) -> None:
        """Record the hub's answer to the wish, which it ends."""
        self._put(EXTENSION_FILE, answer)
        self._remove(EXTEND_WISH_FILE)

    def gpu_idle(self) -> GpuIdle | None:
        """The hub's flag on this server's GPUs held idle, while it stands."""
        flag = self._get(GPU_IDLE_FILE, GpuIdle)
        return flag if flag is not None and flag.since else None

    def note_gpu_idle(self, flag: GpuIdle) -> None:
        """Record the hub's flag (``since`` 0: lifted)."""
        if flag.since:
            self._put(GPU_IDLE_FILE, flag)
        else:
            self._remove(GPU_IDLE_FILE)

    def note_cell_start(self, now: float | None = None) -> None:
        """Record that a distributed cell starts now (``now``: epoch seconds)."""
        body = repr(time.time() if now is None else now).encode()
        write_atomic(self.directory / CELL_STARTED_FILE, lambda f: f.write(body))

    def cell_started_at(self) -> float:
        """When a distributed cell last started (epoch seconds), 0.0 if none did."""
        try:
            return float((self.directory / CELL_STARTED_FILE).read_text())
        except (OSError, ValueError):
            return 0.0

    def view(self) -> LeaseView:
        """The lease as its files hold it (:class:`LeaseView`, version 0)."""
        return LeaseView(released=self.released(), want=self.want(), answer=self.answer(), extend=self.extend_wish(),
                         held=self.held(), extension=self.extension(), gpu_idle=self.gpu_idle())

    def holding(self, contract: ServerContract) -> Holding:
        """What the server holds (:class:`Holding`): the grant its engines came back on,
        else the spawn's workers and slots (``contract``), with the release while they
        are stopped."""
        held, released = self.held(), self.released()
        if held is not None:
            return Holding(workers=held.workers, slots=held.slots or tuple(contract.slots), grant=held,
                           released=released)
        return Holding(workers=contract.workers, slots=tuple(contract.slots), released=released)

    def end_release(self) -> None:
        """Forget the release, the want and the answer (the engines are back, or a new server starts)."""
        self._remove(FILES[Release], FILES[Want], FILES[Grant])

    def release_answered(self) -> None:
        """The hub brought the engines back itself: forget the release and the want; the
        answer stays for the server to take up."""
        self._remove(FILES[Release], FILES[Want])

    def forget_request(self) -> None:
        """Forget the want and its answer (a refusal read, or a request given up)."""
        self._remove(FILES[Want], FILES[Grant])

    def clear(self) -> None:
        """Forget everything, the held grant and the session's extension too (a new server
        starts on its spawn's workers)."""
        self._remove(FILES[Release], FILES[Want], FILES[Grant], HELD_FILE, EXTEND_WISH_FILE, EXTENSION_FILE,
                     GPU_IDLE_FILE, CELL_STARTED_FILE)

    def _remove(self, *names: str) -> None:
        for name in names:
            (self.directory / name).unlink(missing_ok=True)

