"""The parser against prometheus_client's, on every fixture file, plus bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvcore.exposition import parse
from kvcore.normalise import KEEP_PREFIXES
from tests.paths import AGENT_CAPTURES, FIXTURES

PROM_FILES = sorted((FIXTURES / "vllm").glob("*.prom")) + sorted(AGENT_CAPTURES.glob("*.prom"))


def _reference(text: str, keep: tuple[str, ...] | None) -> tuple[list[tuple[str, tuple, float]], dict[str, str]]:
    samples, types = [], {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if keep is None or s.name.startswith(keep):
                samples.append((s.name, tuple(sorted(s.labels.items())), s.value))
        if keep is None or any(s.name.startswith(keep) for s in fam.samples) or fam.name.startswith(keep):
            types[fam.name] = fam.type
    return samples, types


def _ours(text: str, keep: tuple[str, ...] | None, cache: dict | None = None) -> list[tuple[str, tuple, float]]:
    exp = parse(text, keep, cache)
    assert exp.bad_lines == 0, exp.first_error
    return [(n, tuple(sorted(lab.items())), v) for n, lab, v in exp.samples]


@pytest.mark.parametrize("path", PROM_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("keep", [KEEP_PREFIXES, None], ids=["kept", "all"])
def test_values_equal_prometheus_client(path: Path, keep: tuple[str, ...] | None) -> None:
    text = path.read_text()
    ref, ref_types = _reference(text, keep)
    ours = _ours(text, keep)
    assert len(ours) >= 10
    assert sorted(map(repr, ours)) == sorted(map(repr, ref))
    # the label cache (kept between scrapes) changes nothing
    cache: dict = {}
    _ours(text, keep, cache)
    assert sorted(map(repr, _ours(text, keep, cache))) == sorted(map(repr, ref))
    exp_types = parse(text, keep).types
    for fam, t in exp_types.items():
        assert ref_types.get(fam) == t, fam


def test_kept_families_are_the_dashboard_ones() -> None:
    text = next(p for p in PROM_FILES if "native-cpu-offload" in p.name).read_text()
    names = {n for n, _l, _v in parse(text, KEEP_PREFIXES).samples}
    for needed in (
        "vllm:prefix_cache_hits_total",
        "vllm:external_prefix_cache_queries_total",
        "vllm:prompt_tokens_by_source_total",
        "vllm:kv_cache_usage_perc",
        "vllm:kv_offload_load_bytes_total",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:num_preemptions_total",
        "process_start_time_seconds",
    ):
        assert needed in names
    assert not any(n.startswith(("python_", "http_")) for n in names)


def test_escapes_and_odd_spacing() -> None:
    text = (
        "# TYPE m gauge\n"
        'm{a="x\\"y",b="line\\nbreak",c="back\\\\slash"} 1.5\n'
        'm{ a = "sp" , b="}{,=" } 2 1700000000000\n'
        '  m{a="lead"} 3\n'
        "m 4\n"
    )
    exp = parse(text)
    assert exp.bad_lines == 0
    ref = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]
    assert [(n, lab, v) for n, lab, v in exp.samples] == ref


@pytest.mark.parametrize(
    "bad",
    [
        'vllm:x{a="1" 5\n',  # no closing brace
        'vllm:x{a="1"} \n',  # no value
        'vllm:x{a="1"} abc\n',  # not a number
        "vllm:x{a=1} 5\n",  # unquoted
        'vllm:x{a="1",a="2"} 5\n',  # repeated label
        'vllm:x{a="1"} 5 6 7\n',  # too many fields
        "vllm:x\n",  # a name alone
        '9bad{a="1"} 5\n',  # bad name
        'vllm:x{a="1} 5\n',  # unterminated quote
    ],
)
def test_bad_lines_are_counted_and_the_rest_kept(bad: str) -> None:
    text = "# TYPE vllm:good gauge\nvllm:good 1\n" + bad + "vllm:after 2\n"
    for keep in (None, ("vllm:",)):
        exp = parse(text, keep)
        # with a keep-list, lines of other families are skipped unread
        expected = 1 if keep is None or bad.startswith("vllm:") else 0
        assert exp.bad_lines == expected
        assert bool(exp.first_error) == bool(expected)
        assert [(n, v) for n, _l, v in exp.samples] == [("vllm:good", 1.0), ("vllm:after", 2.0)]


def test_truncated_and_binary_garbage_never_raise() -> None:
    text = PROM_FILES[0].read_text()
    for cut in (0, 1, 100, 1000, len(text) // 2, len(text) - 3):
        exp = parse(text[:cut], KEEP_PREFIXES)
        assert exp.bad_lines <= 1
    junk = '\x00\xff{}}}{{\n# TYPE\n#TYPE x\n{=}\n""\n' * 50
    exp = parse(junk)
    assert exp.samples == []
    assert exp.bad_lines > 0


def test_nan_and_inf_are_parsed_as_floats() -> None:
    exp = parse("a NaN\nb +Inf\nc -Inf\n")
    assert math.isnan(exp.samples[0][2])
    assert exp.samples[1][2] == math.inf and exp.samples[2][2] == -math.inf
