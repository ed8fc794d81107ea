"""chat_messages.validate_message: the sampled-ids check (fast path for plain ints) accepts exactly what the
item-by-item rule accepts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkit.text.chat_messages import validate_message
from ctxkit.errors import MessageFormatError

VOCAB = 1000


class MyInt(int):
    """An int subclass: accepted like an int."""


ITEMS = st.one_of(st.integers(-3, VOCAB + 3), st.booleans(), st.integers(0, VOCAB - 1).map(MyInt),
                  st.floats(0, 10), st.text(max_size=2), st.none())


def item_by_item(ids) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < VOCAB for t in ids)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(st.integers(0, VOCAB - 1), max_size=30), st.lists(ITEMS, max_size=8)), st.booleans())
def test_token_ids_accepted_exactly_by_the_item_rule(ids, as_tuple):
    ids = tuple(ids) if as_tuple else ids
    message = {"role": "assistant", "content": "hi", "token_ids": ids}
    if item_by_item(ids):
        clean, sampled = validate_message(message, 4, set(), VOCAB)
        assert sampled == tuple(ids) and "token_ids" not in clean
    else:
        with pytest.raises(MessageFormatError, match=r"message 4: token_ids must be a list of ids in \[0, 1000\)"):
            validate_message(message, 4, set(), VOCAB)


@pytest.mark.parametrize("ids", [[True], [0, 1, VOCAB], [-1], [1.0], "12", {1: 2}])
def test_bad_token_ids_are_refused(ids):
    with pytest.raises(MessageFormatError, match="token_ids must be a list of ids"):
        validate_message({"role": "assistant", "content": "", "token_ids": ids}, 0, set(), VOCAB)
