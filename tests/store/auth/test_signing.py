"""Signed events: a stored signature of any text gives a verdict, never an exception."""

from __future__ import annotations

from prmloop.store.auth.signing import sign, signature_status
from prmloop.store.events import CalibrationFitted

KEY = b"k" * 32


def _fitted(signature: str | None = None) -> CalibrationFitted:
    return CalibrationFitted(
        calibration_id="c1",
        generator="g",
        prm="p",
        score_rule="min",
        method="logit",
        fit={"b": 1.0},
        calibration_split="s",
        signature=signature,
    )


def test_a_signature_with_non_ascii_characters_is_a_bad_signature_not_a_crash() -> None:
    """Seen (hypothesis, in the store's bounds test): hmac.compare_digest raised TypeError on a stored
    CalibrationFitted whose signature held non-ASCII characters, so `prmloop status` failed."""
    assert signature_status("CalibrationFitted", _fitted("\U000d53f5\x1b^É4Y"), KEY) == "bad signature"
    assert signature_status("CalibrationFitted", _fitted("é" * 71), KEY) == "bad signature"


def test_the_right_key_verifies_and_another_does_not() -> None:
    signed = sign(_fitted(), KEY)
    assert signature_status("CalibrationFitted", signed, KEY) == "verified"
    assert signature_status("CalibrationFitted", signed, b"x" * 32) == "bad signature"
    assert signature_status("CalibrationFitted", _fitted(), KEY) == "unsigned"
