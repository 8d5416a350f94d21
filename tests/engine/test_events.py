"""Event lines: versioned, one JSON object per line, tolerant of stray output."""

import io
import json
import math

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


def test_non_finite_numbers_are_strict_json_strings_and_decode_back():
    event = make_event("privacy", 1, 0.0, step=3, epsilon=float("inf"), delta=1e-5, accountant="pld",
                       normalization={"std": [float("nan"), -float("inf")]})
    line = encode(event)
    json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not strict JSON"))
    assert '"epsilon":"Infinity"' in line
    back = decode(line)
    assert back["epsilon"] == math.inf and back["normalization"]["std"][1] == -math.inf
    assert math.isnan(back["normalization"]["std"][0])


def test_text_fields_that_spell_a_non_finite_number_stay_text():
    assert decode(encode(make_event("started", 1, 0.0, name="NaN", config={"name": "Infinity"})))["name"] == "NaN"


def test_a_non_finite_number_never_cuts_the_stream():
    stream = io.StringIO()
    writer = EventWriter(1, stream=stream)
    writer.emit("privacy", step=1, epsilon=float("inf"), delta=1e-5, accountant="rdp")
    writer.emit("metric", step=1, epoch=0.1, name="train_loss", value=float("nan"))
    writer.emit("finished", status="finished", summary={"epsilon": float("inf")})
    events = [decode(line) for line in stream.getvalue().splitlines()]
    assert [e["type"] for e in events] == ["privacy", "metric", "finished"]
    assert events[-1]["summary"]["epsilon"] == math.inf


def test_an_event_that_cannot_be_encoded_is_a_bug_not_a_closed_reader():
    stream = io.StringIO()
    writer = EventWriter(1, stream=stream)
    with pytest.raises(TypeError):
        writer.emit("warning", message=object())
    writer.emit("warning", message="still written")
    assert decode(stream.getvalue().splitlines()[-1])["message"] == "still written"


def test_writer_survives_a_closed_reader_and_keeps_feeding_the_sink():
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError

    seen = []
    writer = EventWriter(1, stream=Closed(), sink=seen.append)
    writer.emit("warning", message="a")
    writer.emit("warning", message="b")
    assert [e["message"] for e in seen] == ["a", "b"]


def test_writer_stops_writing_to_a_closed_stream_but_keeps_the_sink():
    stream = io.StringIO()
    stream.close()
    seen = []
    writer = EventWriter(1, stream=stream, sink=seen.append)
    writer.emit("warning", message="a")
    writer.emit("warning", message="b")
    assert writer.stream is None and len(seen) == 2
