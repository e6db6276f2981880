"""``radixserve`` command line, built from the config dataclasses.

    radixserve generate "The capital of France is" --max-new-tokens 32
    radixserve generate --chat "Write a haiku about caches" --temperature 0.7
    radixserve serve --port 30000            # HTTP server: /generate and OpenAI /v1
    radixserve serve --dp-size 2             # two replicas behind the cache-aware router
    radixserve router --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002

Every field of ModelConfig, CacheConfig, SchedulerConfig and ParallelConfig is a flag (``--max-total-tokens``,
``--chunked-prefill-size``, ``--schedule-policy``, ``--disable-radix-cache``, ...).  Every value is checked
when the arguments are parsed (``parse_args``): a ``Literal`` field's flag takes only its choices, and the
config dataclasses' own checks (ranges, formats) run before any process starts, a failure being one
argparse-style line naming the flag (exit status 2).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
import typing
import urllib.parse
from typing import Any, Callable, Optional

from radixserve.config import (CacheConfig, EngineConfig, LoRAConfig, ModelConfig, ParallelConfig, RouterConfig,
                               SchedulerConfig, ServerConfig)
from radixserve.lora_config import parse_lora_path


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_args(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per dataclass field; the type comes from the annotation, the help from the
    field's ``metadata["help"]`` where it has one (else "default: ...")."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        hint = hints[f.name]
        help_text = f.metadata.get("help", f"default: {f.default}")
        if typing.get_origin(hint) is typing.Literal:  # a closed set of strings
            group.add_argument(_flag(f.name), choices=typing.get_args(hint), default=f.default, help=help_text)
            continue
        if typing.get_origin(hint) is tuple:  # a list of strings: --flag A B C
            group.add_argument(_flag(f.name), nargs="+", type=str, default=f.default, help=help_text)
            continue
        base = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        kind = base[0]
        if kind is bool:
            group.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=f.default,
                               help=f.metadata.get("help"))

        else:
            group.add_argument(_flag(f.name), type=kind, default=f.default, help=help_text)


def config_from_args(cls: type, args: argparse.Namespace, **extra: Any) -> Any:
    """``cls`` built from the flags of its fields in ``args`` (lists made tuples), plus ``extra``."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    values.update(extra)
    return cls(**values)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig of ``generate`` / ``serve``'s flags."""
    return EngineConfig(
        model=config_from_args(ModelConfig, args, path=args.model),
        cache=config_from_args(CacheConfig, args),
        scheduler=config_from_args(SchedulerConfig, args),
        parallel=config_from_args(ParallelConfig, args),
        lora=config_from_args(LoRAConfig, args),
    )


def _engine_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF directory, .gguf file, or Hugging Face Hub id ORG/NAME[:QUANT] "
                                                 "(default: SmolLM2-135M-Instruct)")
    add_config_args(p, ModelConfig, skip=("path",))
    add_config_args(p, CacheConfig)
    add_config_args(p, SchedulerConfig)
    add_config_args(p, ParallelConfig)
    add_config_args(p, LoRAConfig)


def cmd_generate(args: argparse.Namespace) -> int:
    from radixserve.engine import Engine
    from radixserve.model.hub import HubError

    t0 = time.perf_counter()
    try:
        engine = Engine(config=engine_config_from_args(args), show_progress=True)
    except HubError as e:  # the Hub model could not be had: its one line, no traceback
        print(f"radixserve generate: error: {e}", file=sys.stderr)
        return 1
    numerics = (engine.runner.numerics.describe() if args.tp_size * args.pp_size == 1  # else child processes
                else f"{engine.info.dtype}, tensor parallel over {args.tp_size} ranks x {args.pp_size} pipeline stages")
    print(f"[radixserve] loaded {engine.model_path} in {time.perf_counter() - t0:.1f}s "
          f"({numerics}, {engine.scheduler.kv.capacity} KV slots)", file=sys.stderr)
    prompt = args.prompt
    if args.chat:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True)
    sp = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p}
    t1 = time.perf_counter()
    shown = ""
    final: Optional[dict] = None
    for chunk in engine.generate_stream(prompt, sp):
        sys.stdout.write(chunk["text"][len(shown):])
        sys.stdout.flush()
        shown = chunk["text"]
        final = chunk
    dt = time.perf_counter() - t1
    n = final["meta_info"]["completion_tokens"] if final else 0
    print(f"\n[radixserve] {n} tokens in {dt:.2f}s ({n / max(dt, 1e-9):.1f} tok/s), "
          f"finish_reason={final['meta_info']['finish_reason'] if final else None}", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    server_cfg = config_from_args(ServerConfig, args)
    if server_cfg.dp_size > 1:
        from radixserve.model.hub import HubError, resolve_engine_config
        from radixserve.router.launch import serve_dp

        cfg = engine_config_from_args(args)
        try:  # a Hub model is fetched once, here; the replicas then find it in the cache
            if resolve_engine_config(cfg, show_progress=True) != cfg:
                os.environ["HF_HUB_OFFLINE"] = "1"
        except HubError as e:
            print(f"radixserve serve: error: {e}", file=sys.stderr)
            return 1
        return serve_dp(args.argv, server_cfg)
    from radixserve.server.launcher import serve

    return serve(engine_config_from_args(args), server_cfg)


def cmd_router(args: argparse.Namespace) -> int:
    from radixserve.router.launch import run_router

    return run_router(config_from_args(RouterConfig, args), args.worker_urls)


def check_engine_args(args: argparse.Namespace) -> None:
    """``generate``'s values: its engine configs build (each dataclass checks its fields)."""
    engine_config_from_args(args)


def check_serve_args(args: argparse.Namespace) -> None:
    """``serve``'s values: the engine's configs and the server's build; no served name is also an adapter's."""
    lora = engine_config_from_args(args).lora
    names = set(config_from_args(ServerConfig, args).served_model_name) & {parse_lora_path(p)[0] for p in lora.lora_paths}
    if names:
        raise ValueError(f"served_model_name: {sorted(names)[0]!r} is also the name of an adapter of --lora-paths")


def check_router_args(args: argparse.Namespace) -> None:
    """``router``'s values: RouterConfig builds, every replica URL is http(s)://HOST[:PORT], and
    there is a replica to route to."""
    cfg = config_from_args(RouterConfig, args)
    for url in args.worker_urls:
        if not _is_http_url(url):
            raise ValueError(f"worker_urls: must be http(s)://HOST[:PORT] (got {url!r})")
    if not args.worker_urls and not cfg.worker_dns:
        raise ValueError("give --worker-urls or --worker-dns")


def _is_http_url(url: str) -> bool:
    """``url`` is http(s)://HOST[:PORT][/PATH] with a valid port."""
    parts = urllib.parse.urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # not a number, or out of range
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and port_ok


def flag_error(parser: argparse.ArgumentParser, error: ValueError) -> str:
    """A config ValueError ("field_name: must be ...") as argparse words it ("argument --field-name:
    must be ..."), when ``field_name`` is one of ``parser``'s flags; else its text as is."""
    text = str(error)
    m = re.match(r"(\w+): (.*)", text, re.S)
    if m and any(_flag(m.group(1)) in a.option_strings for a in parser._actions):
        return f"argument {_flag(m.group(1))}: {m.group(2)}"
    return text


def _number(kind: type, text: str) -> Any:
    """``text`` as ``kind`` (int or float), or argparse's error naming the kind."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None


def _non_negative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {value})")
    return value


def _non_negative_float(text: str) -> float:
    """argparse type: a float >= 0."""
    value = _number(float, text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {value})")
    return value


def _unit_interval(text: str) -> float:
    """argparse type: a float in (0, 1]."""
    value = _number(float, text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (got {value})")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate from a prompt with the in-process Engine")
    gen.add_argument("prompt", nargs="?", default="Explain in one paragraph why caching shared prompt prefixes "
                                                  "speeds up LLM serving.")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                     help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-new-tokens", type=_non_negative_int, default=128)
    gen.add_argument("--temperature", type=_non_negative_float, default=0.0)
    gen.add_argument("--top-p", type=_unit_interval, default=1.0)
    _engine_parser(gen)
    gen.set_defaults(func=cmd_generate, check=check_engine_args, subparser=gen)
    srv = sub.add_parser("serve", help="run the HTTP server (native /generate and OpenAI-compatible /v1)")
    _engine_parser(srv)
    add_config_args(srv, ServerConfig)
    srv.set_defaults(func=cmd_serve, check=check_serve_args, subparser=srv)
    rtr = sub.add_parser("router", help="route requests over radixserve replicas by cached prefix")
    rtr.add_argument("--worker-urls", nargs="*", default=[], help="the replicas, e.g. http://127.0.0.1:30001")
    add_config_args(rtr, RouterConfig)
    rtr.set_defaults(func=cmd_router, check=check_router_args, subparser=rtr)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse and check every value: a bad one exits with status 2 and one argparse-style line
    naming its flag (``radixserve serve: error: argument --dp-size: must be >= 1 (got 0)``)."""
    args = build_parser().parse_args(argv)
    args.argv = argv[1:]  # the subcommand's own flags (``serve --dp-size`` hands them to its replicas)
    check: Callable[[argparse.Namespace], None] = args.check
    try:
        check(args)
    except ValueError as e:
        args.subparser.error(flag_error(args.subparser, e))
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
