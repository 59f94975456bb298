import re

import pytest

from sinkwindow import MethodSpec, parse_spec


@pytest.mark.parametrize(
    "text, kind, window, sinks, positions",
    [
        ("full", "full", None, 0, "absolute"),
        ("swa:64:4", "swa", 64, 4, "absolute"),
        ("swa:64:0", "swa", 64, 0, "absolute"),
        ("SWA:256", "swa", 256, 4, "absolute"),
        ("swa:64:4:cache", "swa", 64, 4, "cache"),
        ("evict:128:4", "evict", 128, 4, "absolute"),
        ("lolcats:64", "lolcats", 64, 0, "absolute"),
        ("linear", "linear", None, 0, "absolute"),
        ("liger:64", "liger", 64, 0, "absolute"),
        ("LIGER:256", "liger", 256, 0, "absolute"),
    ],
)
def test_parse(text, kind, window, sinks, positions):
    spec = parse_spec(text)
    assert (spec.kind, spec.window, spec.sinks, spec.positions) == (kind, window, sinks, positions)
    assert parse_spec(str(spec)) == spec  # canonical string round-trips
    with pytest.raises(AttributeError):
        spec.window = 3  # frozen


def test_budget_and_recent():
    spec = parse_spec("swa:64:4")
    assert spec.kv_budget == 64 and spec.recent == 60
    assert parse_spec("full").kv_budget is None
    assert hash(spec) == hash(MethodSpec("swa", 64, 4))


@pytest.mark.parametrize(
    "text, needle",
    [
        ("swa:0:0", "positive"),
        ("swa:-4:0", "positive"),
        ("swa:64:-1", ">= 0"),
        ("swa:4:4", "smaller than the window"),
        ("swa:4:9", "smaller than the window"),
        ("swa", "expected swa:W"),
        ("swa:x:4", "not an integer"),
        ("swa:64:4:5", "expected swa:W"),
        ("swa:64:4:relative", "not an integer"),
        ("sliding:64", "unknown method"),
        ("full:64", "takes no arguments"),
        ("", "non-empty"),
        ("lolcats:64:4", "lolcats:W"),
        ("swa:99999999999999999999", "larger than any context"),
        ("swa:2147483648:4", "larger than any context"),
        ("lolcats:99999999999999999999", "larger than any context"),
        ("liger", "expected liger:W"),
        ("liger:64:4", "expected liger:W"),
        ("liger:64:cache", "takes no position mode"),
        ("liger:0", "positive"),
    ],
)
def test_bad_specs_name_the_fix(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_spec(text)


def test_trained_baselines_are_linear_and_unbounded():
    for text in ("linear", "lolcats:64", "liger:64"):
        spec = parse_spec(text)
        assert spec.is_linear and not spec.is_windowed and spec.kv_budget is None
    assert str(parse_spec("liger:256")) == "liger:256"
    assert not parse_spec("swa:64:4").is_linear
    with pytest.raises(ValueError, match="takes no sinks"):
        MethodSpec("liger", window=64, sinks=4)


def test_trained_variants_are_named_with_an_adapter():
    from sinkwindow.runtime.spec import parse_spec

    lora = parse_spec("swa:256:4@lora")
    assert str(lora) == "swa:256:4@lora" and lora.is_trained and lora.is_windowed
    assert lora.without_adapter == parse_spec("swa:256:4") and not parse_spec("swa:256:4").is_trained
    assert str(parse_spec("LoLCATs:256@Len4k")) == "lolcats:256@len4k"
    assert parse_spec("lolcats:256@len4k") != parse_spec("lolcats:256")
    for bad, said in [
        ("evict:256:4@lora", "goes on swa:W:S"),
        ("swa:256:4+full:3@lora", "goes on swa:W:S"),
        ("swa:256:4:cache@lora", "goes on swa:W:S"),
        ("full@x", "goes on swa:W:S"),
        ("swa:64:4@", "name the adapter after '@'"),
        ("swa:64:4@a_b", "lower-case letters, digits and '-'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(said)):
            parse_spec(bad)
