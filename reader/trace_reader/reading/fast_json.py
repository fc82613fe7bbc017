"""A trace's JSON decoded by msgspec, where it is installed (files._fast): any JSON into dicts and lists, as the
stdlib's json would, and a trace's events straight into structs with only the fields the reader uses. Of an
event's args only its links ("External id", "correlation") are decoded with it; the args themselves when some
event's are first asked for, every event's in one more pass over the events (Source). For 87 MB the events decode
in 0.49 s, links included, and in 0.83 s with every event's args as dicts. Taking the links from each event's raw
args after the decode cost 0.24 s, as much as that one pass (0.22 s), which is made only when args are read (the
report reads those of about one event in ten)."""

import json
from typing import Annotated, Any

import msgspec

from .events import MAX_TS, MAX_US, EventMethods

# An event's times where events._usable takes them: a time out of range is refused, and the stdlib reads the trace
# (and skips the event, as tree.parse_trace does), so that the 10^5 events read here need no check in Python.
_Ts = Annotated[float, msgspec.Meta(ge=-MAX_TS, le=MAX_TS)]
_Dur = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_US)]


class _Links(msgspec.Struct, gc=False):
    ext: Any = msgspec.field(default=None, name="External id")
    corr: Any = msgspec.field(default=None, name="correlation")


class _RawArgs(msgspec.Struct, gc=False):
    raw: msgspec.Raw = msgspec.field(default=None, name="args")


class Source:
    """The decoded events of one trace (None for those the reader leaves out) and their JSON: where an event's args
    come from when first asked for."""

    __slots__ = ("events", "text")

    def __init__(self, events: list, text: bytes):
        self.events, self.text = events, text

    def fill(self) -> None:
        """Every event's raw args, in one pass over the events' JSON (decoded once already: it cannot fail)."""
        if self.events is None:  # filled already
            return
        for e, a in zip(self.events, _raw_args(self.text)):
            if e is not None:
                e.raw_args = a.raw
        self.events = self.text = None  # done: each event holds its own now


class DecodedEvent(EventMethods, msgspec.Struct, eq=False):
    """Event's attributes, decoded from the trace (ph only to sort the events; the event's other keys are skipped)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: _Ts | None = None
    dur: _Dur | None = None
    pid: Any = None
    tid: Any = None
    id: Any = None  # a flow event's (tree.Side)
    # The args' links, the rest skipped; args that are neither an object nor null are refused: the stdlib reads them.
    links: _Links | None = msgspec.field(default=None, name="args")
    # The reader's own, set after the decode. Typed as their defaults: a trace that gives one another value is
    # read by the stdlib.
    end: None = None
    ext: None = None
    corr: None = None
    parent: None = None
    children: tuple[()] = ()
    calls: tuple[()] = ()
    kernels: tuple[()] = ()
    step: None = None
    source: None = None  # the Source to take raw_args from, until they are taken
    raw_args: None = None
    parsed_args: None = None

    @property
    def args(self) -> dict:
        if self.parsed_args is None:
            if self.source is not None:
                self.source.fill()
                self.source = None
            self.parsed_args = args_of(self.raw_args)
        return self.parsed_args


# What msgspec refuses that the stdlib may read: NaN, 1e400, a wrong type in a typed field, deep nesting.
refused = (msgspec.MsgspecError, RecursionError)
decode = msgspec.json.decode
top = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
events = msgspec.json.Decoder(list[DecodedEvent]).decode
_raw_args = msgspec.json.Decoder(list[_RawArgs]).decode


def loads(text: bytes) -> object:
    """The JSON value of text: msgspec's, or where msgspec refuses it (NaN, Infinity, 1e400, integers beyond 64 bits,
    lone surrogates, UTF-16) the stdlib's, which then accepts it or words the error as it always has."""
    try:
        return decode(text)
    except refused:
        return json.loads(text)


def args_of(raw) -> dict:
    """A decoded event's args, from their raw JSON ({} where they are not an object). msgspec checked that JSON
    while skipping it, without decoding it: what msgspec cannot decode (an integer beyond 64 bits, 1e400) the
    stdlib does. Where the stdlib cannot either (an integer of more than 4300 digits): {} (the one difference from
    the stdlib alone, which refuses the whole file)."""
    if raw is None:
        return {}
    try:
        args = loads(bytes(raw))
    except ValueError:
        return {}
    return args if isinstance(args, dict) else {}
