"""``radixserve`` command line, built from the config dataclasses.

    radixserve generate "The capital of France is" --max-new-tokens 32
    radixserve generate --chat "Write a haiku about caches" --temperature 0.7
    radixserve serve --port 30000            # HTTP server: /generate and OpenAI /v1
    radixserve serve --dp-size 2             # two replicas behind the cache-aware router
    radixserve router --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002

Every field of ModelConfig, CacheConfig, SchedulerConfig and ParallelConfig is a flag (``--max-total-tokens``,
``--chunked-prefill-size``, ``--schedule-policy``, ``--disable-radix-cache``, ...).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import typing
from typing import Any, Optional

from radixserve.config import (CacheConfig, EngineConfig, LoRAConfig, ModelConfig, ParallelConfig, RouterConfig,
                               SchedulerConfig, ServerConfig)


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
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    values.update(extra)
    return cls(**values)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=config_from_args(ModelConfig, args, path=args.model),
        cache=config_from_args(CacheConfig, args),
        scheduler=config_from_args(SchedulerConfig, args),
        parallel=config_from_args(ParallelConfig, args),
        lora=config_from_args(LoRAConfig, args),
    )


def _engine_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF directory or .gguf file (default: SmolLM2-135M-Instruct)")
    add_config_args(p, ModelConfig, skip=("path",))
    add_config_args(p, CacheConfig)
    add_config_args(p, SchedulerConfig)
    add_config_args(p, ParallelConfig)
    add_config_args(p, LoRAConfig)


def cmd_generate(args: argparse.Namespace) -> int:
    from radixserve.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(config=engine_config_from_args(args), show_progress=True)
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
    if server_cfg.dp_size < 1:
        print("radixserve serve: error: --dp-size must be >= 1", file=sys.stderr)
        return 2
    if server_cfg.dp_size > 1:
        from radixserve.router.launch import serve_dp

        return serve_dp(args.argv, server_cfg)
    from radixserve.server.launcher import serve

    return serve(engine_config_from_args(args), server_cfg)


def cmd_router(args: argparse.Namespace) -> int:
    from radixserve.router.launch import run_router

    cfg = config_from_args(RouterConfig, args)
    if not args.worker_urls and not cfg.worker_dns:
        print("radixserve router: error: give --worker-urls or --worker-dns", file=sys.stderr)
        return 2
    return run_router(cfg, args.worker_urls)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate from a prompt with the in-process Engine")
    gen.add_argument("prompt", nargs="?", default="Explain in one paragraph why caching shared prompt prefixes "
                                                  "speeds up LLM serving.")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                     help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    _engine_parser(gen)
    gen.set_defaults(func=cmd_generate)
    srv = sub.add_parser("serve", help="run the HTTP server (native /generate and OpenAI-compatible /v1)")
    _engine_parser(srv)
    add_config_args(srv, ServerConfig)
    srv.set_defaults(func=cmd_serve)
    rtr = sub.add_parser("router", help="route requests over radixserve replicas by cached prefix")
    rtr.add_argument("--worker-urls", nargs="*", default=[], help="the replicas, e.g. http://127.0.0.1:30001")
    add_config_args(rtr, RouterConfig)
    rtr.set_defaults(func=cmd_router)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv[1:]  # the subcommand's own flags (``serve --dp-size`` hands them to its replicas)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
