"""The distance band from measured independent exact retrains, on the digits quickstart."""

from pathlib import Path

import pytest
import torch

from fedunlearn.config import load_config
from fedunlearn.errors import ConfigError
from fedunlearn.eval import Verifier
from fedunlearn.eval.distance import l2_distance
from fedunlearn.eval.distance_band import independent_retrains, measure_distance_band
from fedunlearn.runs import train_run
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession, make_method

pytestmark = pytest.mark.slow

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "digits_quickstart.yaml"


def test_band_holds_independent_retrains_and_leaves_the_noisy_original_outside(tmp_path):
    torch.set_num_threads(1)
    train_run(load_config(QUICKSTART), tmp_path / "run")
    with UnlearnSession(tmp_path / "run", evaluate=False) as session:
        request = UnlearnRequest.of([0], "forget")
        retrain = session.run(make_method("retrain"), request)
        with pytest.raises(ConfigError, match="at least 2"):
            measure_distance_band(session, request, retrain, count=1)
        band = measure_distance_band(session, request, retrain, count=4)
        verifier = Verifier(session, request, retrain=retrain, distance_band=band)
        band = verifier.distance_band
        assert band is not None
        assert len(band.relative) == 4
        assert max(band.relative) < band.band < 1.0  # exact retrains sit closer than o
        # ... and near Retrain's end of the line from Retrain to the original
        assert len(band.toward) == 4
        assert band.toward_line is not None
        assert band.toward_line < 0.5
        assert max(band.toward) < band.toward_line
        # another exact retrain (other batch orders than the band's) lands inside the band
        (other,), _ = independent_retrains(session, request, 1, seed=99)
        gap = l2_distance(session.run_view.final_params, retrain.params)
        assert l2_distance(other, retrain.params) / gap != pytest.approx(band.relative[0])
        check = verifier.audit(other, "independent retrain")[1].check("distance")
        assert check.verdict == "pass", check.reason
        # the original plus noise (std 1e-3) lies outside it: the check has power
        original = session.run_view.final_params
        g = torch.Generator().manual_seed(5)
        noisy = original + 1e-3 * torch.randn(original.shape, generator=g)
        noisy_check = verifier.audit(noisy, "noisy")[1].check("distance")
        assert noisy_check.verdict != "pass"
        assert all(p["outside_band"] for p in noisy_check.power.values())
