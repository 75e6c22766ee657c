"""``utils/env.py``: the on/off switches read from the environment."""

from __future__ import annotations

import logging

import pytest

from hotloop.utils import env


def test_switch_reads_0_and_1_and_warns_once_on_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    log = logging.getLogger("hotloop.test_env")
    monkeypatch.setattr(log, "warning", lambda msg, *args: said.append(msg % args))
    monkeypatch.setattr(env, "_warned", set())
    monkeypatch.delenv("HOTLOOP_TEST_SWITCH", raising=False)
    assert env.switch("HOTLOOP_TEST_SWITCH", True, log) and not env.switch("HOTLOOP_TEST_SWITCH", False, log)
    monkeypatch.setenv("HOTLOOP_TEST_SWITCH", "")
    assert env.switch("HOTLOOP_TEST_SWITCH", True, log)
    monkeypatch.setenv("HOTLOOP_TEST_SWITCH", "0")
    assert not env.switch("HOTLOOP_TEST_SWITCH", True, log)
    monkeypatch.setenv("HOTLOOP_TEST_SWITCH", "1")
    assert env.switch("HOTLOOP_TEST_SWITCH", False, log)
    assert not said
    monkeypatch.setenv("HOTLOOP_TEST_SWITCH", "off")
    assert env.switch("HOTLOOP_TEST_SWITCH", True, log) and env.switch("HOTLOOP_TEST_SWITCH", True, log)
    assert said == ["HOTLOOP_TEST_SWITCH='off': use 0 or 1; taking 1"]
