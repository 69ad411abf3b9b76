"""The validation layer: the checks, the declarative notebook parameter specs, and the shipped schema."""
import math

import pytest

from workbench import pipeline
from workbench.config import load_config
from workbench.validation import (
    InvalidParameter, ParamSpec, check_bool, check_divisor, check_list, check_str, parse_text,
)


@pytest.mark.parametrize("text, value", [
    ("3", 3), ("0.5", 0.5), ("1e6", 1_000_000), ("1.0e+6", 1_000_000), ("200_000", 200_000), ("2.0", 2),
    ("true", True), ("[1, 2]", [1, 2]), ("null", None), ("abc", "abc"), ("h200", "h200"), ("[h200, b300]", ["h200", "b300"]),
])
def test_parse_text(text, value):
    got = parse_text(text)
    assert got == value and type(got) is type(value)


def test_parse_text_keeps_non_finite_as_float_for_the_check_to_refuse():
    assert math.isinf(parse_text("inf"))
    with pytest.raises(InvalidParameter, match="x=inf is not allowed: an integer"):
        ParamSpec("int").check("x", parse_text("inf"))


def test_scalar_checks_name_value_and_allowed():
    assert check_bool("f", False) is False
    with pytest.raises(InvalidParameter, match="f=1 is not allowed: true or false"):
        check_bool("f", 1)
    assert check_str("s", "x") == "x"
    with pytest.raises(InvalidParameter, match="s='' is not allowed: a non-empty string"):
        check_str("s", "")
    assert check_divisor("tp", 8, 64, "the 64 heads") == 8
    for bad in (3, 0, 128, 8.0, True):
        with pytest.raises(InvalidParameter, match=f"tp={bad!r} is not allowed: an integer that divides the 64 heads: "
                                                   "one of 1, 2, 4, 8, 16, 32, 64"):
            check_divisor("tp", bad, 64, "the 64 heads")


def test_check_list_wraps_a_single_value_and_names_the_whole_list():
    item = lambda n, v: v if isinstance(v, int) and v >= 1 else (_ for _ in ()).throw(InvalidParameter(n, v, "x"))  # noqa: E731
    assert check_list("m", 3, item, "integers >= 1") == [3]
    assert check_list("m", (1, 2), item, "integers >= 1") == [1, 2]
    with pytest.raises(InvalidParameter, match=r"m=\[1, 0\] is not allowed: a non-empty list of integers >= 1 "
                                               r"\(a single value counts as a one-element list\)"):
        check_list("m", [1, 0], item, "integers >= 1")
    with pytest.raises(InvalidParameter, match=r"m=\[\] is not allowed"):
        check_list("m", [], item, "integers >= 1")


def test_param_spec_types_bounds_and_choices():
    assert ParamSpec("float", lo=0).check("x", 2) == 2.0 and isinstance(ParamSpec("float").check("x", 2), float)
    assert ParamSpec("list[float]", lo=1, hi="block").check("accept", 12, {"block": 16}) == [12.0]
    with pytest.raises(InvalidParameter, match=r"accept=\[17\] is not allowed: a non-empty list of numbers in \[1, 16\]"):
        ParamSpec("list[float]", lo=1, hi="block").check("accept", [17], {"block": 16})
    assert ParamSpec("int", hi="workbench.decode:MAX_BUDGET").check("b", 1024) == 1024
    with pytest.raises(InvalidParameter, match=r"b=1025 is not allowed: an integer <= 1024"):
        ParamSpec("int", hi="workbench.decode:MAX_BUDGET").check("b", 1025)
    gpus = ParamSpec("list[str]", choices="workbench.hardware:gpu_ids")
    assert gpus.check("gpus", "h200") == ["h200"]
    with pytest.raises(InvalidParameter, match="gpus=.*'tpu'.* is not allowed: a non-empty list of strings among 'rtx-pro-6000'"):
        gpus.check("gpus", ["h200", "tpu"])
    assert ParamSpec("str", choices="workbench.config:KV_DTYPE_BYTES").check("kv", "fp8") == "fp8"
    opt = ParamSpec("float", lo=0, optional=True)
    assert opt.check("o", None) is None and opt.check("o", "None") is None and opt.check("o", 3) == 3.0
    with pytest.raises(InvalidParameter, match="o=-1 is not allowed: a finite number >= 0, or None"):
        opt.check("o", -1)
    group = ParamSpec("int", lo=1, multiple_of="workbench.moe.packing:GROUP_SIZE")
    assert group.check("hidden", 7168) == 7168
    with pytest.raises(InvalidParameter, match="hidden=100 is not allowed: an integer >= 1 and a multiple of 32"):
        group.check("hidden", 100)
    assert "a multiple of 32" in group.describe()
    with pytest.raises(InvalidParameter, match="type='list\\[dict\\]' is not allowed"):
        ParamSpec("list[dict]")
    with pytest.raises(ValueError, match="unknown key.*minimum"):
        ParamSpec.from_dict({"type": "int", "minimum": 1})


def test_model_rules_are_one_place():
    cfg = load_config("kimi-k2.6")
    assert cfg.check_tp(64) == 64 and cfg.check_context(262_144) == 262_144
    with pytest.raises(InvalidParameter, match="tp=1000 is not allowed: an integer that divides the 64 attention heads"):
        cfg.check_tp(1000)
    with pytest.raises(InvalidParameter, match=r"context=262145 is not allowed: an integer in \[1, 262144\] tokens "
                                               r"\(kimi-k2.6's YaRN limit: factor 64 x original 4,096"):
        cfg.check_context(262_145)


def test_every_notebook_parameter_has_a_spec_and_its_default_passes():
    """The shipped schema covers each notebook's parameters cell exactly, and the defaults pass it
    (with the notebook's library check); the gpu profile's values pass it too."""
    schema = pipeline.load_schema()
    notebooks = pipeline.discover()
    assert notebooks
    for nb in notebooks:
        sch = pipeline.schema_of(nb, schema)
        declared = nb.parameters()
        assert set(declared) == set(sch.parameters), nb.name
        defaults = nb.defaults(declared)
        typed = sch.check_values(defaults)
        assert set(typed) == set(defaults)
        for name, spec in sch.parameters.items():
            assert spec.help, f"{nb.name}: {name} has no help text"
    used = {sel for sel in schema if any(nb.matches(sel) for nb in notebooks)}
    assert used == set(schema), f"entries for notebooks that do not exist: {set(schema) - used}"
    params = pipeline.resolve_parameters(notebooks, [], pipeline.load_profile("gpu"))
    assert all(isinstance(v, dict) for v in params.values())


def test_library_check_covers_the_notebook_rules():
    """Notebooks 04 and 05 name the library's own input check, so a rule lives in one place."""
    schema = pipeline.load_schema()
    checks = {nb.name: pipeline.schema_of(nb, schema).check for nb in pipeline.discover()}
    assert checks["04_b300_projection"] == "workbench.projection.project:check_inputs"
    assert checks["05_context_capacity"] == "workbench.capacity:check_inputs"


def test_parse_text_reads_numbers_inside_a_list_and_keeps_a_blank_word():
    assert parse_text("[1e2, 2.0, h200]") == [100, 2, "h200"]
    assert parse_text("") == "" and parse_text(" ") == " "
    with pytest.raises(InvalidParameter, match="context='' is not allowed: an integer"):
        ParamSpec("int").check("context", parse_text(""))


def test_param_spec_path_must_exist_and_is_made_absolute(tmp_path, monkeypatch):
    good = tmp_path / "m.json"
    good.write_text('{"name": "x"}')
    (tmp_path / "bad.json").write_text("{")
    monkeypatch.chdir(tmp_path)
    spec = ParamSpec("str", optional=True, path="json")
    assert spec.check("measurement", "m.json") == str(good)
    assert spec.check("measurement", None) is None
    with pytest.raises(InvalidParameter, match=r"measurement='nope.json' is not allowed: the path of a JSON file, "
                                               r"or None; it does not exist"):
        spec.check("measurement", "nope.json")
    with pytest.raises(InvalidParameter, match=r"it is not JSON \(Expecting"):
        spec.check("measurement", "bad.json")
    assert ParamSpec("str", path="folder").check("d", ".") == str(tmp_path)
    with pytest.raises(InvalidParameter, match="path='json' is not allowed"):
        ParamSpec("int", path="json")
