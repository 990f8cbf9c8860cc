"""Every admission outcome has one gateway error, with the same reason code and the computed Retry-After."""

from __future__ import annotations

import pytest

from admission.outcomes import AdmissionRefused, RejectReason
from gateway.base.error_mapping import REJECT_REASON_HEADER, to_response
from gateway.base.errors import ErrorCode, from_refusal


@pytest.mark.parametrize("reason", list(RejectReason))
def test_each_refusal_becomes_the_error_with_its_own_code(reason: RejectReason) -> None:
    error = from_refusal(AdmissionRefused(reason, 7, f"refused: {reason}"))
    assert error.code == ErrorCode(reason.value) and error.message == f"refused: {reason}"
    answer = to_response(error)
    headers = dict(answer.headers)
    assert headers[REJECT_REASON_HEADER] == reason.value and headers["retry-after"] == "7"
    unavailable = (RejectReason.NO_REPLICA, RejectReason.DRAINING, RejectReason.STATE_UNAVAILABLE)
    assert answer.status == (503 if reason in unavailable else 429)
