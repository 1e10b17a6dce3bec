"""The kernel backend's goodput correction (emulation/tc.py): pure arithmetic, no root needed (the rest of
the backend's tests, in test_tc.py, need root and network namespaces)."""

import pytest

from emulation import tc

pytestmark = [pytest.mark.unit, pytest.mark.unit]


def test_goodput_correction_counts_every_header() -> None:
    # MTU 1500: 1448 payload bytes per 1514-byte frame
    assert tc.wire_rate_mbps(1448, 1500) == pytest.approx(1514)
    assert tc.wire_rate_mbps(100, 9000) == pytest.approx(100 * 9014 / 8948)
