"""Every test says what it needs (unit, loopback, root, sshd), so that each kind can be selected with -m."""

import pytest
from helpers.markers import COLLECTED, MARKERS

pytestmark = pytest.mark.unit


def test_every_collected_test_carries_one_of_the_four_markers(request):
    collected = request.config.stash[COLLECTED]
    assert request.node.nodeid in collected  # the record is this session's, this test included
    bare = sorted(nodeid for nodeid, marks in collected.items() if not marks & set(MARKERS))
    assert not bare, f"{len(bare)} tests carry none of {sorted(MARKERS)}: {bare[:20]}"


def test_the_four_markers_are_registered(request):
    registered = {line.split(":")[0].strip() for line in request.config.getini("markers")}
    assert set(MARKERS) <= registered


def test_every_root_test_is_in_a_file_the_scheduler_keeps_on_one_worker(request):
    from conftest import ROOT_FILES

    collected = request.config.stash[COLLECTED]
    stray = sorted(nodeid for nodeid, marks in collected.items()
                   if "root" in marks and nodeid.split("::", 1)[0] not in ROOT_FILES)
    assert not stray, f"root tests outside conftest.ROOT_FILES would run beside other root tests: {stray[:10]}"
