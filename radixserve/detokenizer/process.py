"""The detokenizer process: token deltas in, text deltas out.

Per request it keeps an ``IncrementalDecoder`` (UTF-8 safe).  Contract for each request's
stream of ``ReqOutput``: the concatenated ``text`` deltas are always a prefix of the final
text; text that might be the start of a stop string is held back until it is known not to
be; the final message carries ``final_text``, the whole output with the matched stop
string trimmed.  Messages other than ``BatchReqOutput`` pass through unchanged.  The process
has nothing to save: the launcher's stop request (``radixserve.proc``) ends it at once.
"""
from __future__ import annotations

import logging
from typing import Any

import zmq

from radixserve.config import EngineConfig
from radixserve.detokenizer.incremental import IncrementalDecoder, safe_text_len, trim_stop
from radixserve.ipc.server_link import BatchReqOutput, ReqOutput
from radixserve.ipc.zmq_utils import IPCAddrs, make_socket, recv_obj, send_obj
from radixserve.proc import setup_child

logger = logging.getLogger(__name__)


class DetokState:
    """The text of one request.  ``stop_regex`` and ``no_stop_trim`` are read from the first
    ``ReqOutput`` (every output of a request carries the same values)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool, stops: tuple[str, ...]) -> None:
        self.decoder = IncrementalDecoder(tokenizer, skip_special_tokens)
        self.stops = stops
        self.stop_regex: tuple[str, ...] = ()
        self.no_stop_trim = False
        self.seen = False
        self.emitted = 0  # characters of text already sent

    def update(self, out: ReqOutput) -> None:
        """Fill ``out.text`` (and ``out.final_text`` when the request finished)."""
        if not self.seen:
            self.seen = True
            self.stop_regex, self.no_stop_trim = tuple(out.stop_regex), out.no_stop_trim
        self.decoder.add(out.new_ids)
        if out.finished:
            final = trim_stop(self.decoder.finish(), out.finish_reason, self.stop_regex, self.no_stop_trim)
            out.final_text = final
            out.text = final[self.emitted:]
            return
        if self.no_stop_trim:  # the final text keeps the stop string: nothing to hide
            safe = len(self.decoder.text)
        else:
            safe = safe_text_len(self.decoder.text, self.stops, self.stop_regex, self.emitted)
        if safe > self.emitted:
            out.text = self.decoder.text[self.emitted: safe]
            self.emitted = safe


class Detokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, DetokState] = {}

    def process(self, batch: BatchReqOutput) -> BatchReqOutput:
        for out in batch.outputs:
            state = self.states.get(out.rid)
            if state is None:
                state = self.states[out.rid] = DetokState(self.tokenizer, out.skip_special_tokens, out.stop_strs)
            try:
                state.update(out)
            except Exception as e:  # a decode error fails nothing but this text
                logger.error("detokenizing %s failed: %s", out.rid, e)
            if out.finished:
                del self.states[out.rid]
        return batch


def run_detokenizer(cfg: EngineConfig, log_level: str, addrs: IPCAddrs, ready_conn, parent_pid: int) -> None:
    """Process entry point (spawned by the launcher)."""
    setup_child("detokenizer", log_level, parent_pid)
    from radixserve.tokenizer import load_light_tokenizer

    detok = Detokenizer(load_light_tokenizer(cfg.model.tokenizer_path or cfg.model.path))  # path resolved by launcher
    ctx = zmq.Context()
    inbox = make_socket(ctx, zmq.PULL, addrs.sched_to_detok, bind=True)
    outbox = make_socket(ctx, zmq.PUSH, addrs.detok_to_server, bind=False)
    ready_conn.send("ready")
    ready_conn.close()
    while True:
        msg = recv_obj(inbox)
        send_obj(outbox, detok.process(msg) if isinstance(msg, BatchReqOutput) else msg)
