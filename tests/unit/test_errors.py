"""Error text shortened for a one-line error is cut between words (app.errors.clip, first_line's limit); an
extra's pip command names what pip can install (app.errors.install_extra)."""

import sys
from importlib import metadata
from pathlib import Path

import pytest

from app import errors
from app.errors import ELLIPSIS, clip, first_line

GLOO = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [172.26.0.5]:52344. "
    "Check the logs of the rank that failed before reporting an error"
)


@pytest.mark.parametrize("limit", range(20, 110))  # the first line has 110 characters
def test_a_clipped_text_ends_on_a_whole_word_within_the_limit(limit: int) -> None:
    text = first_line(RuntimeError(GLOO))
    clipped = clip(text, limit)
    assert len(clipped) <= limit and clipped.endswith(ELLIPSIS), clipped
    words = clipped.removesuffix(ELLIPSIS).split()
    whole = text.split()[: len(words)]
    assert words[:-1] == whole[:-1] and words[-1] == whole[-1].rstrip(".,;:"), clipped  # issue 25: '... of the r)'
    assert len(text) > limit


def test_a_text_within_the_limit_is_kept_and_first_line_clips_at_its_limit() -> None:
    assert clip("short enough", 12) == "short enough"
    assert first_line(RuntimeError(GLOO), 60) == "Connection closed by peer [172.26.0.5]:52344. Check the..."
    assert first_line(RuntimeError(GLOO)).endswith("before reporting an error")  # no limit: whole
    assert clip("a-single-long-word", 10) == "a-singl..."  # nothing to cut between: the word is cut


def test_an_extra_is_installed_by_name_else_from_the_checkout_the_app_runs_from(monkeypatch) -> None:
    monkeypatch.setattr(sys, "executable", "/v/bin/../bin/python")
    monkeypatch.setattr(metadata, "distribution", lambda name: name)  # pip installed it
    assert errors.install_extra("node") == "/v/bin/python -m pip install 'ddp-cluster[node]'"

    def not_installed(name: str):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", not_installed)  # PYTHONPATH=<checkout>
    checkout = Path(errors.__file__).resolve().parents[1]
    assert errors.install_extra("cluster") == f"/v/bin/python -m pip install '{checkout}[cluster]'"
