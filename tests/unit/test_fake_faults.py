"""The fake services' fault controls: forced declines, the profile's source, the control
endpoint, and the state a restarted process takes up again."""

from __future__ import annotations

import json

import httpx
import pytest

from devstack.fakes.engine import FakeServiceEngine, Reply
from devstack.fakes.profiles import Profile, example_profile, source_name
from devstack.fakes.remote_services import (
    FakeServices,
    _restore_state,
    parse_fault_change,
    state_file_for,
)


def charge(engine: FakeServiceEngine, key: str) -> int:
    body = json.dumps({"order_id": "o-1", "amount": 100}).encode()
    reply = engine.handle("payment", "charge", key, body)
    assert isinstance(reply, Reply)
    return reply.status


def test_the_next_n_forward_calls_are_declined_then_the_service_is_itself_again():
    engine = FakeServiceEngine(Profile())
    engine.decline_next("payment", 2)
    assert engine.declines_pending() == {"payment": 2}
    assert [charge(engine, key) for key in ("k1", "k1", "k2", "k3")] == [402, 402, 402, 200]
    assert engine.declines_pending() == {}, "a replay of a declined key consumes nothing"
    assert engine.stats()["fault.decline_next"] == 2
    with pytest.raises(ValueError, match="unknown service 'bank'"):
        engine.decline_next("bank", 1)


def test_undos_are_never_declined():
    engine = FakeServiceEngine(Profile())
    assert charge(engine, "k1") == 200
    engine.decline_next("payment", 1)
    undo = json.dumps({"order_id": "o-1", "undoes": "k1"}).encode()
    reply = engine.handle("payment", "refund", "u1", undo)
    assert isinstance(reply, Reply) and reply.status == 200
    assert engine.declines_pending() == {"payment": 1}


def test_shipped_profiles_are_named_by_name_and_others_by_path(tmp_path):
    assert source_name(example_profile("flaky")) == "flaky"
    mine = tmp_path / "flaky.json"
    assert source_name(mine) == str(mine)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1]", "an object of"),
        (b'{"decline": 1}', "an object of"),
        (b'{"profile": {"default": {"transient_rate": 2}}}', "transient_rate"),
        (b'{"decline_next": {"service": "bank", "count": 1}}', "decline_next.service"),
        (b'{"decline_next": {"service": "payment", "count": -1}}', "decline_next.count"),
        (b'{"decline_next": {"service": "payment"}}', "decline_next is"),
        (b'{"source": ""}', "source is"),
        (b"{", "not JSON"),
    ],
)
def test_a_bad_fault_change_names_what_is_wrong(body, message):
    with pytest.raises(ValueError, match=message):
        parse_fault_change(body)


def test_the_control_endpoint_changes_faults_and_writes_them_for_a_restart(tmp_path):
    state = state_file_for(tmp_path / "fakes.port")
    assert state.name == "fakes.fault.json"
    with FakeServices.start(state_file=state) as fakes:
        url = f"{fakes.base_url}/_fault"
        assert httpx.get(url).json() == {
            "source": "clean", "description": "", "profile": {}, "declines_pending": {},
        }  # fmt: skip
        flaky = json.loads(example_profile("flaky").read_text())
        answer = httpx.post(
            url,
            json={"profile": flaky, "source": "flaky",
                  "decline_next": {"service": "payment", "count": 3}},
        )  # fmt: skip
        assert answer.status_code == 200
        shown = answer.json()
        assert (shown["source"], shown["declines_pending"]) == ("flaky", {"payment": 3})
        assert shown["description"].startswith("Flaky")
        refused = httpx.post(url, json={"decline_next": {"service": "bank", "count": 1}})
        assert refused.status_code == 400
        assert "decline_next.service" in refused.json()["error"]["message"]

    again = FakeServiceEngine(Profile())
    _restore_state(again, state)
    assert (again.source, again.declines_pending()) == ("flaky", {"payment": 3})
    assert again.profile.description.startswith("Flaky")
