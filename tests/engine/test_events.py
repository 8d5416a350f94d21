"""Event lines: versioned, one JSON object per line, tolerant of stray output."""

import io
import json

import pytest

from engine.events import EVENT_VERSION, EventWriter, decode, encode, make_event


def test_every_event_carries_version_type_run_and_time():
    stream = io.StringIO()
    writer = EventWriter(7, stream=stream)
    writer.emit("metric", step=1, epoch=0.5, name="train_loss", value=1.0)
    event = json.loads(stream.getvalue())
    assert event["v"] == EVENT_VERSION and event["type"] == "metric" and event["run_id"] == 7
    assert event["t"] >= 0


def test_decode_round_trips_and_ignores_other_lines():
    event = make_event("privacy", 1, 0.25, step=3, epsilon=0.1, delta=1e-5, accountant="pld")
    assert decode(encode(event)) == event
    assert decode("Warning: something printed by a library") is None
    assert decode('{"v": 99, "type": "metric"}') is None
    assert decode("{not json") is None


def test_unknown_event_type_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown event type"):
        make_event("progres", 1, 0.0)


def test_nan_is_refused_so_every_line_is_strict_json():
    with pytest.raises(ValueError):
        encode(make_event("metric", 1, 0.0, value=float("nan")))


def test_writer_survives_a_closed_reader_and_keeps_feeding_the_sink():
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError

    seen = []
    writer = EventWriter(1, stream=Closed(), sink=seen.append)
    writer.emit("warning", message="a")
    writer.emit("warning", message="b")
    assert [e["message"] for e in seen] == ["a", "b"]
