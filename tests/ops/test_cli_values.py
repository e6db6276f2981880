"""Every flag's value is checked when the arguments are parsed: a value outside a flag's set or
range exits at once with status 2 and one argparse-style line naming the flag (no traceback, no
process started), and ``Engine(...)``'s keyword arguments get the same checks, from the config
dataclasses' ``__post_init__``."""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import typing

import pytest

from radixserve import cli
from radixserve.config import (CacheConfig, EngineConfig, ModelConfig, ParallelConfig, RouterConfig, SchedulerConfig,
                               ServerConfig, field_choices)
from radixserve.lora_config import LoRAConfig

SERVE_CONFIGS = (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, LoRAConfig, ServerConfig)
# numeric flags where a negative value has a documented meaning (<= 0: chunking off / plain LPM)
NEGATIVE_ALLOWED = {"--chunked-prefill-size", "--max-queue-wait-s"}


def subparser(name: str) -> argparse.ArgumentParser:
    """The parser of ``radixserve NAME``."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def refusal(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """The error line ``radixserve ARGV`` exits with (asserting status 2 and no traceback)."""
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv,expected", [
    (["serve", "--attention-backend", "nope"], "argument --attention-backend: invalid choice: 'nope' (choose from "
                                               "'auto', 'cpu', 'torch_native', 'triton', 'flashinfer')"),
    (["serve", "--dtype", "fp16"], "argument --dtype: invalid choice: 'fp16' (choose from 'auto', 'float32', "
                                   "'bfloat16')"),
    (["serve", "--schedule-policy", "random"], "argument --schedule-policy: invalid choice"),
    (["serve", "--log-level", "loud"], "argument --log-level: invalid choice"),
    (["serve", "--dp-size", "0"], "argument --dp-size: must be >= 1 (got 0)"),
    (["serve", "--mem-fraction-static", "1.5"], "argument --mem-fraction-static: must be in (0, 1]"),
    (["serve", "--swa-full-tokens-ratio", "0"], "argument --swa-full-tokens-ratio: must be in (0, 1]"),
    (["serve", "--page-size", "16"], "argument --page-size: must be 1"),
    (["serve", "--device", "gpu"], "argument --device: must be auto, cpu, cuda"),
    (["serve", "--port", "70000"], "argument --port: must be in [0, 65535]"),
    (["serve", "--json-whitespace-pattern", "(["], "argument --json-whitespace-pattern: must be a regular expression"),
    (["serve", "--speculative-num-tokens", "0"], "argument --speculative-num-tokens: must be in [1, 16]"),
    (["serve", "--max-loaded-loras", "0"], "argument --max-loaded-loras: must be >= 1"),
    (["serve", "--tp-size", "0"], "argument --tp-size: must be >= 1"),
    (["generate", "--top-p", "0", "hi"], "argument --top-p: must be in (0, 1] (got 0.0)"),
    (["generate", "--max-new-tokens", "many", "hi"], "argument --max-new-tokens: not an integer: 'many'"),
    (["router", "--worker-urls", "http://a:1", "--cache-threshold", "2"], "argument --cache-threshold: must be in"),
    (["router", "--worker-urls", "ftp://a:1"], "argument --worker-urls: must be http(s)://HOST[:PORT]"),
    (["router", "--worker-dns", "replicas"], "argument --worker-dns: must be HOST:PORT"),
    (["router"], "give --worker-urls or --worker-dns"),
])
def test_a_bad_value_exits_with_one_line_naming_the_flag(argv, expected, capsys):
    line = refusal(argv, capsys)
    assert line.startswith(f"radixserve {argv[0]}: error: ") and expected in line, line


def test_every_enum_like_field_is_offered_as_choices_and_refuses_others(capsys):
    """Each ``Literal`` field of the configs is a flag with exactly its values as choices."""
    srv = {a.dest: a for a in subparser("serve")._actions}
    for cls in SERVE_CONFIGS:
        for name, options in field_choices(cls).items():
            assert tuple(srv[name].choices) == tuple(o for o in options if o is not None), name
            assert "invalid choice" in refusal(["serve", cli._flag(name), "no-such-value"], capsys)


def test_every_number_refuses_a_meaningless_negative(capsys):
    """A negative count, size, ratio, port or time is refused at parse time (the few flags where
    <= 0 means something are listed in NEGATIVE_ALLOWED)."""
    for parser_name, extra in (("serve", []), ("router", ["--worker-urls", "http://a:1"])):
        for action in subparser(parser_name)._actions:
            flag = action.option_strings[-1] if action.option_strings else None
            if action.type not in (int, float) or flag in NEGATIVE_ALLOWED:
                continue
            line = refusal([parser_name, *extra, f"{flag}=-1000000"], capsys)
            assert f"argument {flag}: must be" in line, line


def test_defaults_and_documented_values_parse():
    assert cli.parse_args(["serve"]).attention_backend == "auto"
    args = cli.parse_args(["serve", "--dtype", "bfloat16", "--attention-backend", "torch_native", "--device", "cuda:1",
                           "--schedule-policy", "fcfs", "--log-level", "warning", "--chunked-prefill-size", "0",
                           "--max-queue-wait-s", "0", "--json-whitespace-pattern", "[ ]?", "--port", "0"])
    assert cli.engine_config_from_args(args).cache.attention_backend == "torch_native"
    assert cli.parse_args(["router", "--worker-urls", "http://127.0.0.1:30001", "https://[::1]:8080"]).policy
    assert cli.parse_args(["router", "--worker-dns", "replicas:30000"]).worker_dns == "replicas:30000"
    assert cli.parse_args(["generate", "--top-p", "1", "--temperature", "0.7", "hi"]).top_p == 1.0


@pytest.mark.parametrize("kw,field", [({"attention_backend": "nope"}, "attention_backend"),
                                      ({"dtype": "fp16"}, "dtype"), ({"schedule_policy": "random"}, "schedule_policy"),
                                      ({"mem_fraction_static": 0.0}, "mem_fraction_static"),
                                      ({"max_running_requests": 0}, "max_running_requests"),
                                      ({"device": "gpu"}, "device")])
def test_the_engine_gets_the_same_checks(kw, field):
    with pytest.raises(ValueError, match=f"^{field}: must be"):
        EngineConfig.from_kwargs(None, **kw)


def test_attention_backend_choices_are_the_registry_s():
    from radixserve.attention.registry import NAMES

    assert field_choices(CacheConfig)["attention_backend"] == ("auto", *NAMES)


def test_every_config_default_passes_its_own_checks():
    for cls in (*SERVE_CONFIGS, RouterConfig):
        cls()  # __post_init__ accepts the defaults
        hints = typing.get_type_hints(cls)
        assert all(f.name in hints for f in dataclasses.fields(cls))


def test_the_command_exits_before_importing_the_engine():
    """The real entry point: status 2, the one line, no traceback, and nothing heavy imported."""
    code = ("import sys; from radixserve.cli import main\n"
            "try:\n    main(['serve', '--attention-backend', 'nope'])\n"
            "except SystemExit as e:\n"
            "    print('torch' in sys.modules, 'radixserve.engine' in sys.modules); sys.exit(e.code)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("radixserve serve: error: argument --attention-backend: ")
    assert out.stdout.split() == ["False", "False"]
