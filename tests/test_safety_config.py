"""Every safety limit is finite and positive, checked at config load, naming key and index."""

from __future__ import annotations

import pytest

from robotd.config import load_config
from robotd.errors import ConfigError


@pytest.mark.parametrize(
    "override, words",
    [
        ("safety.max_velocity=[nan, 4, 4]", "safety.max_velocity[0]: must be a finite number"),
        ("safety.max_velocity=[4, inf, 4]", "safety.max_velocity[1]: must be a finite number"),
        ("safety.max_velocity=[4, 4, -1]", "safety.max_velocity[2]: must be > 0, got -1"),
        ("safety.max_velocity=[0, 4, 4]", "safety.max_velocity[0]: must be > 0, got 0"),
        ("safety.max_acceleration=[nan, 1, 1]", "safety.max_acceleration[0]: must be a finite"),
        ("safety.max_acceleration=[1, 1, -inf]", "safety.max_acceleration[2]: must be a finite"),
        ("safety.max_acceleration=[1, 0, 1]", "safety.max_acceleration[1]: must be > 0"),
        ("safety.clip_tolerance=nan", "safety.clip_tolerance: must be a finite number"),
        ("safety.clip_tolerance=inf", "safety.clip_tolerance: must be a finite number"),
        ("safety.clip_tolerance=-0.1", "safety.clip_tolerance: must be >= 0"),
        ("joints.upper=[inf, 1, 1]", "joints.upper[0]: must be a finite number"),
        ("joints.lower=[-1, nan, -1]", "joints.lower[1]: must be a finite number"),
    ],
)
def test_a_bad_safety_limit_is_refused_at_load(override, words):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert words in str(err.value)


def test_valid_limits_load():
    cfg = load_config(None, ["safety.max_acceleration=[40, 40, 40]"])
    assert cfg.safety.max_acceleration == [40.0, 40.0, 40.0]
