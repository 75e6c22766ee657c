"""``hotloop chat`` driven through a real pseudo-terminal (pexpect)."""

from __future__ import annotations

import sys

import pexpect


def test_chat_multi_turn_and_exit() -> None:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "hotloop", "chat", "--max-new-tokens", "24", "--device", "cpu"],
        encoding="utf-8",
        timeout=240,
    )
    try:
        child.expect("Type 'exit' to quit")
        child.expect("user >>> ")
        child.sendline("What is the capital of France?")
        child.expect("assistant >>> ")
        child.expect("user >>> ")
        first = child.before
        assert "Paris" in first, first
        child.sendline("And of Germany?")
        child.expect("assistant >>> ")
        child.expect("user >>> ")
        assert child.before.strip(), "the second turn produced no text"
        child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_help_on_every_command() -> None:
    for cmd in (["--help"], ["chat", "--help"], ["check_env", "--help"]):
        out = pexpect.run(f"{sys.executable} -m hotloop {' '.join(cmd)}", encoding="utf-8", timeout=60)
        assert "usage:" in out, out


def test_chat_history_past_the_session_and_end() -> None:
    """Once the history outgrows --session-len every turn fails; the error says so and 'end'
    starts a new conversation (a review found a chat that could only be restarted)."""
    import subprocess

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hotloop",
            "chat",
            "--device",
            "cpu",
            "--max-new-tokens",
            "24",
            "--session-len",
            "80",
        ],
        input="tell me a story\nmore\nmore\nmore\nend\nhi\nexit\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "session_len=80" in text and "type 'end' to start a new one" in text, text
    after = text.split("(a new conversation)", 1)[1]
    assert "[error]" not in after and after.strip(), text
