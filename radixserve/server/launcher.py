"""Launch the runtime: scheduler and detokenizer processes plus the HTTP server in this process
(with one rank the scheduler loads and steps the model itself, ``worker/local.py``; with
``tp_size`` or ``pp_size > 1`` rank 0's model worker process and this node's other ranks too,
watched like the other children; a node with ``node_rank > 0`` runs only its ranks:
``server/follower_node.py``).  The children run under one ``radixserve.proc.Supervisor``.

Contract: ``serve`` starts the children (multiprocessing "spawn"), waits until each says
it is ready, then runs uvicorn.  If a child dies at any time, /health turns 503, pending
requests fail, the other children are stopped and ``serve`` returns 1 within seconds.
On a normal stop ``serve`` returns 0: the first SIGINT or SIGTERM, whether sent to this
process or to its whole process group (Ctrl-C, ``kill -- -PGID``, systemd's
``KillMode=control-group``), stops uvicorn, then the children in order: the scheduler first
(with ``cache_persist_dir`` it saves the prefix cache through the model, for at most
``PERSIST_GRACE_S``, cut short if a worker process dies), then the worker, the detokenizer and the
other ranks, each SIGKILLed after its grace.  The children ignore SIGINT/SIGTERM, so only
this process orders the stop; a further signal during the stop is ignored
(``radixserve.proc.StopSignals``).  Children watch this process and exit if it dies.
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any

from radixserve.config import EngineConfig, ServerConfig
from radixserve.ipc.zmq_utils import IPCAddrs
from radixserve.proc import STOP_GRACE_S, ChildDied, StopSignals, Supervisor, configure_logging, stages
from radixserve.worker.tp.group import start_followers, start_worker

logger = logging.getLogger("radixserve.server")


# Entry points import their module only in the child, so this process never loads them.
def _scheduler_entry(*args: Any) -> None:
    from radixserve.scheduler.process import run_scheduler
    run_scheduler(*args)


def _detokenizer_entry(*args: Any) -> None:
    from radixserve.detokenizer.process import run_detokenizer
    run_detokenizer(*args)


PERSIST_GRACE_S = 120.0  # at most this long for the scheduler's final save of the prefix cache


class Launcher:
    ORDER = ("scheduler", "worker", "detokenizer")  # stop order; the other tensor-parallel ranks last

    def __init__(self, cfg: EngineConfig, log_level: str, stops: StopSignals) -> None:
        self.cfg = cfg
        self.log_level = log_level
        self.stops = stops
        self.ipc_dir = tempfile.mkdtemp(prefix="radixserve-ipc-")
        self.addrs = IPCAddrs.in_dir(self.ipc_dir)
        self.procs = Supervisor()
        self.exit_code = 0

    def start(self) -> None:
        start_followers(self.procs, self.cfg, self.log_level)
        separate = self.cfg.parallel.world_size > 1  # one rank: the model runs in the scheduler
        if separate:
            start_worker(self.procs, self.cfg, self.log_level, self.addrs)
        # the scheduler saves the prefix cache on the stop request (through the live worker)
        self.procs.start("scheduler", _scheduler_entry, self.cfg, self.log_level, self.addrs,
                         grace=PERSIST_GRACE_S if self.cfg.cache.persists else STOP_GRACE_S,
                         needs=("worker",) if separate else ())
        self.procs.start("detokenizer", _detokenizer_entry, self.cfg, self.log_level, self.addrs)

    def wait_ready(self) -> dict[str, Any]:
        """Every child's ready object; raises ChildDied if one exits first."""
        return self.procs.wait_ready()

    def shutdown(self) -> None:
        """Stop the children in ``ORDER`` and remove the ipc directory; idempotent, any thread."""
        self.stops.begin()
        self.procs.stop(self.ORDER)
        shutil.rmtree(self.ipc_dir, ignore_errors=True)

    async def watch(self, tm: Any, server: Any) -> None:
        """Poll the children; on the first death fail everything and stop the server."""
        while True:
            await asyncio.sleep(0.2)
            dead = self.procs.dead()
            if dead is None:
                continue
            reason = str(dead)
            logger.error("%s; shutting down", reason)
            self.exit_code = 1
            tm.fail_all(reason)
            await asyncio.sleep(0.1)  # let failed requests get their answers
            await asyncio.to_thread(self.shutdown)
            logger.info("child processes stopped")
            server.should_exit = True
            timer = threading.Timer(8.0, os._exit, args=(1,))  # never hang on a stuck connection
            timer.daemon = True
            timer.start()
            return


def model_name(path: str | None) -> str:
    """The served name: a Hub id without its ``:QUANT`` (``Qwen/Qwen3-0.6B``), else the file or folder's name."""
    from radixserve.model.hub import is_hub_id

    if path and is_hub_id(path):
        return path.partition(":")[0]
    return os.path.basename(path.rstrip("/")).removesuffix(".gguf") if path else "SmolLM2-135M-Instruct"


def reasoning_problem(cfg: EngineConfig) -> str | None:
    """Why the model's tokenizer cannot serve ``--reasoning-parser`` (one line), or None."""
    if cfg.scheduler.reasoning_parser == "none":
        return None
    from radixserve.reasoning.formats import reasoning_format, think_token_ids
    from radixserve.tokenizer import load_light_tokenizer

    try:
        think_token_ids(reasoning_format(cfg.scheduler.reasoning_parser),
                        load_light_tokenizer(cfg.model.tokenizer_path or cfg.model.path))
    except ValueError as e:
        return str(e)
    return None


def serve(engine_cfg: EngineConfig, server_cfg: ServerConfig) -> int:
    """Run the server until stopped; returns the process exit code."""
    from radixserve.chat_template import load_chat_template
    from radixserve.server.tenancy.accounting import Accounting, StartupError, open_accounting

    configure_logging(server_cfg.log_level, "server")
    try:
        keys, usage_db = open_accounting(server_cfg)  # a bad keys file stops here, before any child starts
        chat_template = load_chat_template(server_cfg.chat_template) if server_cfg.chat_template else None
    except (StartupError, ValueError) as e:  # ValueError: --chat-template (checked at parsing) is gone or changed
        logger.error("cannot start: %s", e)
        return 2
    if keys is not None:  # until the event loop takes SIGHUP over, so a reload during start-up never kills us
        signal.signal(signal.SIGHUP, lambda *_: keys.reload())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stops = StopSignals().install()  # the first SIGINT/SIGTERM: KeyboardInterrupt, then the orderly stop
    t0 = time.perf_counter()
    from radixserve.model.hub import HubError, is_hub_id, resolve_engine_config

    try:  # a Hub id is fetched once, here: the children get local paths
        if is_hub_id(engine_cfg.model.path):
            with stages.stage("download", f"{engine_cfg.model.path} from the Hugging Face Hub (files already "
                              "in its cache are not fetched again)"):
                local_cfg = resolve_engine_config(engine_cfg, show_progress=True)
        else:
            stages.note("download", "none (a local model)")
            local_cfg = resolve_engine_config(engine_cfg, show_progress=True)
    except HubError as e:
        logger.error("cannot start: %s", e)
        return 1
    hf_dir = local_cfg.model.path
    if not (hf_dir and os.path.isdir(hf_dir)):  # the loader imports torch: only when a GGUF needs converting
        from radixserve.model.loader import resolve_hf_dir

        hf_dir = resolve_hf_dir(hf_dir, show_progress=True)  # converts a GGUF once, here
    else:
        stages.note("conversion", "none (a Hugging Face directory)")
    cfg = dataclasses.replace(local_cfg, model=dataclasses.replace(local_cfg.model, path=hf_dir))
    if cfg.parallel.node_rank > 0:
        from radixserve.server.follower_node import serve_ranks

        if usage_db is not None:
            usage_db.close()
        return serve_ranks(cfg, server_cfg.log_level)
    from radixserve.worker.tp.group import with_rendezvous

    problem = reasoning_problem(cfg)  # a model without the parser's think tokens is refused before any child starts
    if problem is not None:
        logger.error("cannot start: %s", problem)
        if usage_db is not None:
            usage_db.close()
        return 2
    launcher = Launcher(with_rendezvous(cfg), server_cfg.log_level, stops)
    gc.disable()  # until /health answers, as in the children (radixserve.proc.run_child)
    try:
        launcher.start()
        # the HTTP side's imports overlap the children's start-up
        import uvicorn

        from radixserve.server.app import ServerContext, create_app
        from radixserve.server.http_utils import SERVER_KEEP_ALIVE_S
        from radixserve.server.tenancy.budget import Ledger
        from radixserve.server.tokenizer_manager import TokenizerManager
        from radixserve.tokenizer import load_light_tokenizer

        tokenizer_path = cfg.model.tokenizer_path or hf_dir
        tokenizer = load_light_tokenizer(tokenizer_path)
        logger.info("loading the model...")
        info = launcher.wait_ready()["scheduler"]
        stages.note("ready", f"model ready in {time.perf_counter() - t0:.1f}s: {hf_dir}, {info.dtype} (quantization "
                    f"{info.quantization}) on {info.device}, {info.num_slots - 1} KV slots, context {info.context_len}")
        tm = TokenizerManager(tokenizer, info, launcher.addrs, tokenizer_path, engine_cfg.scheduler.grammar_backend,
                              engine_cfg.lora, engine_cfg.scheduler.reasoning_parser)
        if usage_db is not None:
            tm.accounting = Accounting(Ledger(usage_db), tm.metrics, keys)
        tm.chat.template = chat_template
        served = server_cfg.served_model_name or (model_name(engine_cfg.model.path),)
        ctx = ServerContext(tm, engine_cfg, server_cfg, served[0],
                            engine_cfg.model.path or hf_dir, tokenizer_path,
                            launcher.procs.pids | {"server": os.getpid()}, keys)
        app = create_app(ctx)
        server = uvicorn.Server(uvicorn.Config(app, host=server_cfg.host, port=server_cfg.port,
                                               log_level=server_cfg.log_level.lower(), timeout_graceful_shutdown=2,
                                               timeout_keep_alive=SERVER_KEEP_ALIVE_S))

        async def started() -> None:  # the chat tokenizer's import would slow uvicorn's start
            while not server.started:
                await asyncio.sleep(0.05)
            gc.enable()
            tm.chat.preload()

        async def main() -> None:
            tasks = [asyncio.create_task(tm.recv_loop()), asyncio.create_task(launcher.watch(tm, server)),
                     asyncio.create_task(started())]
            if keys is not None:  # SIGHUP re-reads the keys file (a bad one keeps the old keys)
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, keys.reload)
            try:
                await server.serve()
            finally:
                for t in tasks:
                    t.cancel()

        asyncio.run(main())
        if not server.started and launcher.exit_code == 0:
            launcher.exit_code = 1  # e.g. the port was taken
    except ChildDied as e:
        logger.error("%s", e)
        launcher.exit_code = 1
    except KeyboardInterrupt:
        pass
    finally:
        launcher.shutdown()
        if usage_db is not None:
            usage_db.close()
    return launcher.exit_code
