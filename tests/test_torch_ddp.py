"""wt.ddp on real torch ranks: DistributedDataParallel whose gradients go through the data plane
(GlooSync here, with a check trailer to fold as a wansync channel has), once per backward, reaches
what plain Gloo DDP does."""

import pytest
import torch
from helpers.torchrank import STEPS, ranks

pytestmark = [pytest.mark.loopback, pytest.mark.torch, pytest.mark.timeout(180)]


def test_wt_ddp_equals_plain_ddp_with_one_sync_per_backward(tmp_path):
    """Both run GradScaler with an overflow on rank 1 at step 2: under DDP the inf travels in the sum
    and every rank skips; through the data plane (which refuses non-finite values) the flag does it."""
    out = ranks("ddp", 2, tmp_path)
    assert out[0]["scale"] == out[1]["scale"] == 2.0**9  # both scalers backed off once
    for r in out:
        assert r["syncs"] == STEPS  # the hook, not DDP's own all-reduce, moved the gradients
        assert r["bad_folds"] == 0  # the trailer folded in the hook's copy was the buffer's every time
        assert r["final"].keys() == r["reference"].keys()
        for k in r["final"]:
            torch.testing.assert_close(r["final"][k], r["reference"][k], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out[0]["final"]["0.weight"], out[1]["final"]["0.weight"], atol=0, rtol=0)
