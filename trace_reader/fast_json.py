"""A trace's JSON decoded by msgspec, where it is installed (read._fast): any JSON into dicts and lists, as the
stdlib's json would, and a trace's events straight into structs with only the fields the reader uses, each
event's args kept as raw JSON until asked for (the report asks for the args of about one event in ten; decoding
them all into dicts doubled the decode of a long trace: 0.86 s, not 0.45 s, for 87 MB)."""

from typing import Any

import msgspec

from .read import _args_of, _EventMethods


class DecodedEvent(_EventMethods, msgspec.Struct, eq=False):
    """Event's attributes, decoded from the trace (ph only to sort the events; the event's other keys are skipped)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: Any = None
    tid: Any = None
    raw_args: msgspec.Raw = msgspec.field(default=None, name="args")
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
    parsed_args: None = None

    @property
    def args(self) -> dict:
        if self.parsed_args is None:
            self.parsed_args = _args_of(self.raw_args)
        return self.parsed_args


class _Links(msgspec.Struct, gc=False):
    ext: Any = msgspec.field(default=None, name="External id")
    corr: Any = msgspec.field(default=None, name="correlation")


# What msgspec refuses that the stdlib may read: NaN, 1e400, a wrong type in a typed field, deep nesting.
refused = (msgspec.MsgspecError, RecursionError)
decode = msgspec.json.decode
top = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
events = msgspec.json.Decoder(list[DecodedEvent]).decode
_links = msgspec.json.Decoder(_Links).decode


def links(raw: msgspec.Raw | None) -> tuple[object, object]:
    """("External id", "correlation") of an event's raw args; _Refused where neither msgspec nor the stdlib can
    read them."""
    if raw is None:
        return None, None
    try:
        found = _links(raw)
        return found.ext, found.corr
    except refused:  # not an object (then no args, as Event reads it), or past what msgspec reads
        args = _args_of(raw, strict=True)
        return args.get("External id"), args.get("correlation")
