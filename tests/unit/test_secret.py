"""`Secret` never shows its value, except through `reveal()`."""

from __future__ import annotations

import copy
import pickle

import pytest

from keyturn.errors import KeyturnError
from keyturn.secret import PLACEHOLDER, Secret

VALUE = "s3cr3t-value-xyz"


@pytest.mark.parametrize(
    "render",
    [repr, str, lambda s: f"{s}", lambda s: f"{s!r}", "{}".format, lambda s: str([s])],
)
def test_text_forms_show_a_placeholder(render) -> None:
    text = render(Secret(VALUE))
    assert VALUE not in text
    assert PLACEHOLDER in text


def test_reveal_returns_the_value() -> None:
    assert Secret(VALUE).reveal() == VALUE


def test_equality_compares_values() -> None:
    assert Secret(VALUE) == Secret(VALUE)
    assert Secret(VALUE) != Secret(VALUE + "x")
    assert Secret(VALUE) != VALUE  # a Secret is not a str


def test_pickling_is_refused() -> None:
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(Secret(VALUE))


def test_copies_stay_secret() -> None:
    assert copy.deepcopy({"k": Secret(VALUE)})["k"].reveal() == VALUE


def test_only_strings_are_wrapped() -> None:
    with pytest.raises(TypeError):
        Secret(b"bytes")  # type: ignore[arg-type]


def test_an_error_built_from_a_secret_does_not_leak_it() -> None:
    error = KeyturnError(f"bad value {Secret(VALUE)}", credential="reporting")
    assert VALUE not in str(error)
    assert str(error).startswith("reporting: ")
