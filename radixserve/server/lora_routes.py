"""LoRA adapters over HTTP (docs/LORA.md): ``POST /load_lora_adapter`` and ``POST /unload_lora_adapter``
(SGLang's routes and bodies), the adapter an OpenAI ``model`` names, and the adapters' model cards.

Load: the registry checks the adapter first (the name is free, the directory is a PEFT LoRA adapter
within the slots' rank and modules: a 400 naming the field, nothing sent to the scheduler), then the
scheduler has the worker load it between steps, then the name is served.  Unload: the name stops
being served at once (a request naming it is a 400 naming ``lora_path``); the worker drops the
weights once the requests already using it are done.  Loads and unloads run one at a time
(``AdapterAdmin.lock``: check, scheduler reply and registry update span awaits, and two loads of one
name must not both succeed), shielded from a client that goes away mid-way.

Answers follow SGLang's ``LoRAUpdateResult``: ``{"success": true, "error_message": "", "message":
..., "loaded_adapters": {name: path}}``, plus ``adapter`` (the loaded adapter's summary) or
``requests_in_flight`` (unload).  Refusals are the usual error object (400 naming the field, where
SGLang answers 400 with ``success: false``).  With ``--api-keys-file`` both routes are admin routes
(``tenancy/keys.ADMIN_PATHS``), with ``--api-key`` they need that key.  The LoRA modules are
imported only on a server with LoRA enabled.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from fastapi import APIRouter, Request

from radixserve.server.http_utils import parse_body
from radixserve.server.openapi_doc import body_doc
from radixserve.server.protocol import LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput
from radixserve.server.req_state import RequestError
from radixserve.server.tenancy.accounting import current_key

NOT_ENABLED = "lora_path: LoRA adapters are not enabled on this server (start it with --enable-lora or --lora-paths)"
CONTROL_TIMEOUT_S = 300.0  # the worker reads the adapter's weights between steps


class AdapterAdmin:
    """Loads and unloads adapters through the scheduler, one at a time, keeping ``tm.lora`` (the
    registry requests resolve against) in step with the worker."""

    def __init__(self, tm: Any) -> None:
        self.tm = tm
        self.lock = asyncio.Lock()

    def registry(self) -> Any:
        if self.tm.lora is None:
            raise RequestError(400, NOT_ENABLED)
        return self.tm.lora

    async def load(self, name: str, path: str) -> Any:
        """The ``AdapterInfo`` of the adapter now served as ``name``; RequestError(400) naming the field."""
        return await asyncio.shield(asyncio.ensure_future(self._load(self.registry(), name, path)))

    async def unload(self, name: str) -> int:
        """Stop serving ``name``; the requests still using its weights (dropped after them)."""
        return await asyncio.shield(asyncio.ensure_future(self._unload(self.registry(), name)))

    async def _load(self, reg: Any, name: str, path: str) -> Any:
        from radixserve.lora.adapter import AdapterInfo

        async with self.lock:
            try:
                await asyncio.to_thread(reg.check, name, path)  # reads the weights: off the event loop
            except ValueError as e:
                raise RequestError(400, str(e)) from None
            except OSError as e:
                raise RequestError(400, f"lora_path: {path!r} cannot be read ({e.strerror or e})") from None
            reply = await self._ask("load_lora", {"name": name, "path": path})
            info = AdapterInfo(**reply["adapter"])
            reg.add(info)
            return info

    async def _unload(self, reg: Any, name: str) -> int:
        async with self.lock:
            try:
                info = reg.remove(name)  # from now on a request naming it is refused
            except ValueError as e:
                raise RequestError(400, str(e)) from None
            reply = await self._ask("unload_lora", {"uid": info.uid})
            return int(reply["requests_in_flight"])

    async def _ask(self, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = await self.tm.control(kind, CONTROL_TIMEOUT_S, args)
        except asyncio.TimeoutError:
            raise RequestError(503, f"{kind}: the scheduler did not answer within {CONTROL_TIMEOUT_S:.0f} s") from None
        if not isinstance(reply, dict) or "error" in reply:
            err = reply.get("error") if isinstance(reply, dict) else reply
            if isinstance(reply, dict) and reply.get("status") == 400:
                raise RequestError(400, str(err))
            raise RequestError(500, f"internal error: {kind}: {err}")
        return reply

    def loaded(self) -> dict[str, str]:
        """``{name: path}`` of the served adapters (SGLang's ``loaded_adapters``)."""
        reg = self.tm.lora
        return {} if reg is None else {a.name: a.path for a in reg.adapters.values()}


def served_names(ctx: Any) -> tuple[str, ...]:
    """The names the base model answers to: ``--served-model-name``'s, else its default name and its path."""
    names = ctx.server_cfg.served_model_name
    return tuple(names) if names else tuple(dict.fromkeys(n for n in (ctx.model_name, ctx.model_path) if n))


def adapter_of_model(ctx: Any, model: Optional[str]) -> Optional[str]:
    """The adapter an OpenAI ``model`` names: an adapter's own name (vLLM's way) or ``<served name>:<adapter>``
    (SGLang's); None for the base model (a served name, or no ``model``).  Where names mean something (LoRA on,
    or ``--served-model-name`` set) any other name is RequestError(404) naming ``model``, as vLLM answers;
    otherwise any name is the base model (clients send "default", "gpt-3.5-turbo", ...)."""
    reg = ctx.tm.lora
    if not model:
        return None
    if reg is not None and model in reg.adapters:
        return model
    if model in served_names(ctx):
        return None
    if reg is not None:
        for base in served_names(ctx):
            if model.startswith(base + ":"):
                name = model[len(base) + 1:]
                if name not in reg.adapters:
                    raise RequestError(404, f"model: the model `{model}` does not exist (no adapter {name!r} is "
                                            f"loaded; {reg.known()})")
                return name
    if reg is None and not ctx.server_cfg.served_model_name:
        return None
    adapters = "" if reg is None else f"; adapters {reg.known()}"
    listed = ctx.server_cfg.served_model_name or (ctx.model_name,)
    raise RequestError(404, f"model: the model `{model}` does not exist (served: {', '.join(listed)}{adapters})")


def apply_model_adapter(ctx: Any, model: Optional[str], params: dict[str, Any]) -> None:
    """Set ``params["lora_path"]`` to the adapter ``model`` names (an explicit ``lora_path``, SGLang's
    extension field, must agree with it)."""
    name = adapter_of_model(ctx, model)
    if name is None:
        return
    if params.get("lora_path") not in (None, name):
        raise RequestError(400, f"lora_path: {params['lora_path']!r} contradicts model {model!r} (adapter {name!r})")
    params["lora_path"] = name


def adapter_cards(ctx: Any) -> list[dict[str, Any]]:
    """``/v1/models`` entries of the served adapters (vLLM's: ``parent`` is the base model)."""
    reg = ctx.tm.lora
    if reg is None:
        return []
    return [{"id": a.name, "object": "model", "created": 0, "owned_by": "radixserve", "root": a.path,
             "parent": ctx.model_name, "max_model_len": ctx.tm.info.context_len}
            for a in reg.adapters.values()]


def lora_router(ctx: Any) -> APIRouter:
    """The adapter admin routes over ``ctx`` (the app's ``ServerContext``)."""
    router = APIRouter()
    admin = AdapterAdmin(ctx.tm)

    def require_admin(path: str) -> None:  # the key middleware refuses first; checked again here
        spec = current_key.get()
        if ctx.keys is not None and not (spec is not None and spec.admin):
            raise RequestError(403, f"authorization: {path} needs an admin key")

    @router.post("/load_lora_adapter", openapi_extra=body_doc(LoadLoRAAdapterReqInput))
    async def load_lora_adapter(request: Request):
        """Serve the PEFT adapter directory ``lora_path`` as ``lora_name`` (while running)."""
        require_admin("/load_lora_adapter")
        obj = await parse_body(request, LoadLoRAAdapterReqInput)
        if obj.lora_name in served_names(ctx):  # a model name means one thing (adapter_of_model)
            raise RequestError(400, f"lora_name: {obj.lora_name!r} is a name of the base model")
        info = await admin.load(obj.lora_name, obj.lora_path)
        from radixserve.lora.registry import lora_summary

        return {"success": True, "error_message": "", "message": f"LoRA adapter {info.name!r} loaded",
                "loaded_adapters": admin.loaded(), "adapter": lora_summary(info)}

    @router.post("/unload_lora_adapter", openapi_extra=body_doc(UnloadLoRAAdapterReqInput))
    async def unload_lora_adapter(request: Request):
        """Stop serving ``lora_name``; its weights go once the requests using it are done."""
        require_admin("/unload_lora_adapter")
        obj = await parse_body(request, UnloadLoRAAdapterReqInput)
        busy = await admin.unload(obj.lora_name)
        return {"success": True, "error_message": "", "message": f"LoRA adapter {obj.lora_name!r} unloaded",
                "loaded_adapters": admin.loaded(), "requests_in_flight": busy}

    return router
