"""The rate arithmetic of workbench.rates: exact on constructed timelines."""
import pytest

from workbench import rates
from workbench.validation import InvalidParameter


def _timeline(n_steps, accepted, step_s, prefill_s=0.5, growth_s=0.0):
    """Wall time at which each token is delivered: the first after the prefill, then ``accepted`` per step,
    step i taking step_s + i x growth_s (a step that slows as the context grows)."""
    t, times, steps = prefill_s, [prefill_s], []
    for i in range(n_steps):
        dt = step_s + i * growth_s
        t += dt
        steps.append(dt)
        times += [t] * accepted
    return times, steps


def test_constant_acceptance_two_point_sustained_and_identity_agree_exactly():
    times, steps = _timeline(40, 4, 0.02)
    a, b = 9, 129  # 1 + 4 x 2 and 1 + 4 x 32 tokens delivered
    two = rates.two_point_rate(a, b, times[a - 1], times[b - 1])
    sus = rates.sustained_rate(4 * len(steps), sum(steps))
    ident = rates.identity_rate([4] * len(steps), steps)
    assert two == pytest.approx(200.0) and sus == pytest.approx(200.0) and ident == pytest.approx(200.0)
    chk = rates.rate_check(two, [4] * len(steps), steps)
    assert chk["within"] and abs(chk["disagreement"]) < 1e-12 and chk["mean_step_ms"] == pytest.approx(20.0)


def test_two_point_overstates_when_steps_slow_down_with_context():
    # the source's case: a short two-point window sees the early, fast steps; a long generation the slow ones
    times, steps = _timeline(400, 3, 0.03, growth_s=0.0005)
    two = rates.two_point_rate(4, 64, times[3], times[63])
    sus = rates.sustained_rate(3 * len(steps), sum(steps))
    assert two > 1.5 * sus
    chk = rates.rate_check(two, [3] * len(steps), steps)
    assert not chk["within"] and chk["disagreement"] > 0.5


def test_decompose_is_the_sources_arithmetic():
    assert rates.decompose(2.9, 144.0) == pytest.approx(20.14, abs=0.01)


@pytest.mark.parametrize("call, name", [
    (lambda: rates.two_point_rate(8, 8, 1.0, 2.0), "tokens_b"),
    (lambda: rates.two_point_rate(8, 264, 2.0, 1.0), "seconds_b"),
    (lambda: rates.sustained_rate(0, 1.0), "tokens"),
    (lambda: rates.sustained_rate(10, 0.0), "seconds"),
    (lambda: rates.identity_rate([1, 2], [0.1]), "accepted"),
])
def test_bad_inputs_name_the_parameter(call, name):
    with pytest.raises(InvalidParameter) as e:
        call()
    assert e.value.name == name
