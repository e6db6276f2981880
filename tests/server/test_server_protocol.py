"""The server's request protocol (``radixserve.server.protocol``): validation errors name the
field."""
from __future__ import annotations

from radixserve.validation import validation_message


def test_validation_message_names_the_field():
    errs = [{"loc": ("body", "sampling_params", "SamplingParamsIn", "top_p"), "msg": "bad", "type": "x"}]
    assert validation_message(errs) == "sampling_params.top_p: bad"
    errs = [{"loc": ("body", "input_ids", "list[int]", 1), "msg": "bad", "type": "x"}]
    assert validation_message(errs) == "input_ids.1: bad"
