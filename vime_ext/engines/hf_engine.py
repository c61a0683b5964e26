"""A small engine that serves vLLM's token-in/token-out route from a ``transformers`` model.

For machines without vLLM (the GPU machine here has none) and for fast tests. Requests that arrive together and
share sampling params are generated as one left-padded batch. Log-probs are those of the distribution sampled
from at the request's temperature (logits / T; before top-p), as the vLLM engines are asked to report them, and
as the trainer computes them. Weight updates use vLLM's RL routes with the
``vime_shm`` payload (see ``weight_sync.py``), so the trainer cannot tell the two backends apart.

    python -m vime_ext.engines.hf_engine --model DIR --port 8000 [--max-batch-size 16] [--dtype float32]
"""

import argparse
import asyncio
import contextlib
import math
import threading
from dataclasses import dataclass

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import StoppingCriteria, StoppingCriteriaList

from vime_ext.engines.protocol import (
    GENERATE_ROUTE,
    GenerateResult,
    InvalidRequest,
    SamplingParams,
    generate_response,
    stream_pieces,
)


@dataclass
class _Pending:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    future: asyncio.Future


class HFEngine:
    def __init__(self, model_dir: str, dtype: torch.dtype = torch.float32, device: str | None = None,
                 max_batch_size: int = 16):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(self.device).eval()
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.max_batch_size = max_batch_size
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_ids = {i for i in [self.tokenizer.eos_token_id, *_as_list(self.model.generation_config.eos_token_id)]
                        if i is not None}
        self.weight_version: str | None = None
        self.requests_served = 0
        self.paused = False
        self.sleeping = False
        # /pause?mode=abort: the batch in flight stops at its next token and answers with what it has
        # (finish_reason "abort"), as do batches started before /resume. The batch in flight watches a count of
        # aborts, not the pause itself: a /resume that follows within one decode step (a CPU step is tens of
        # milliseconds) would otherwise clear the pause before the batch ever saw it.
        self.aborting = threading.Event()
        self.aborts = 0
        self._lock = threading.Lock()  # generation and weight updates never overlap

    def check(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise InvalidRequest("empty prompt: token_ids must hold at least one token")
        vocab = self.model.config.vocab_size
        if any(not 0 <= t < vocab for t in token_ids):
            raise InvalidRequest(f"token ids must lie in [0, {vocab})")
        if len(token_ids) + params.max_new_tokens > self.max_context:
            raise InvalidRequest(f"prompt of {len(token_ids)} tokens + max_new_tokens={params.max_new_tokens} "
                                 f"exceeds the model's context of {self.max_context} tokens")
        params.validate()

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerateResult]:
        if self.aborting.is_set():
            return [GenerateResult([], [], "abort", prompt_length=len(p)) for p in prompts]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding keeps every prompt's end aligned
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention[row, width - len(prompt):] = 1
        stop_ids = [] if params.ignore_eos else sorted(self.eos_ids | set(params.stop_token_ids))
        stop_on_abort = _StopOnAbort(self)
        kwargs = dict(max_new_tokens=params.max_new_tokens, eos_token_id=stop_ids, pad_token_id=self.pad_id,
                      output_logits=True, return_dict_in_generate=True,
                      stopping_criteria=StoppingCriteriaList([stop_on_abort]))
        if params.temperature == 0.0:
            kwargs.update(do_sample=False)
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        with self._lock:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                                      **kwargs)
        aborted = stop_on_abort.fired
        new_tokens = out.sequences[:, width:].cpu()
        scale = params.temperature if params.temperature > 0.0 else 1.0  # greedy: the raw distribution
        log_probs = torch.stack([torch.log_softmax(step.float() / scale, dim=-1) for step in out.logits], dim=1).cpu()
        results = []
        for row in range(len(prompts)):
            tokens, lps, finish = [], [], "length"
            for step, token in enumerate(new_tokens[row].tolist()):
                tokens.append(token)
                lps.append(float(log_probs[row, step, token]))
                if token in stop_ids:
                    finish = "stop"
                    break
            if finish == "length" and params.stop:
                text = self.tokenizer.decode(tokens)
                finish = "stop" if any(s in text for s in params.stop) else "length"
            if finish == "length" and aborted and len(tokens) < params.max_new_tokens:
                finish = "abort"
            results.append(GenerateResult(tokens, lps, finish, prompt_length=len(prompts[row])))
        if params.prompt_log_probs:
            with self._lock:
                for row, prompt in enumerate(prompts):
                    results[row].prompt_log_probs = self._prompt_log_probs(prompt)
        return results

    def _prompt_log_probs(self, prompt: list[int]) -> list[float]:
        """Each prompt token's log-prob given those before it, from the raw logits (as vLLM's prompt log-probs),
        NaN for the first."""
        ids = torch.tensor([prompt], device=self.device)
        logits = self.model(input_ids=ids).logits[0, :-1].float()
        values = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        return [math.nan] + values.cpu().tolist()


    def pause(self, abort: bool) -> None:
        """New requests wait; with ``abort``, the batch in flight stops at its next token."""
        self.paused = True
        if abort:
            self.aborting.set()
            self.aborts += 1

    def resume(self) -> None:
        self.aborting.clear()
        self.paused = False

    @torch.no_grad()
    def load_weights_file(self, path: str, names: list[str]) -> None:
        from safetensors.torch import load_file

        tensors = load_file(path)
        missing = [n for n in names if n not in tensors]
        if missing:
            raise ValueError(f"{path}: announced tensors missing from the file: {missing[:8]}")
        params = dict(self.model.named_parameters())
        unknown = [n for n in tensors if n not in params]
        if unknown:
            raise ValueError(f"{path}: tensors the model does not have: {unknown[:8]}")
        with self._lock:
            for name, tensor in tensors.items():
                params[name].copy_(tensor)


    def sleep(self, level: int = 1) -> None:
        """Free the accelerator for training (colocated mode): weights move to host memory. Level 2, as vLLM's,
        drops the weights' values (NaN here; buffers are kept), so the push after the wake must replace every
        one: a weight it missed shows as NaN."""
        with self._lock:
            if level == 2:
                with torch.no_grad():
                    for param in self.model.parameters():
                        param.fill_(float("nan"))
            self.model.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.sleeping = True

    def wake_up(self) -> None:
        with self._lock:
            self.model.to(self.device)
            self.sleeping = False


class _StopOnAbort(StoppingCriteria):
    """A stopping criterion for ``generate``: every row stops once the engine has been told to abort since the
    batch began, even if it has resumed since."""

    def __init__(self, engine: HFEngine):
        self.engine = engine
        self.aborts_at_start = engine.aborts
        self.fired = False  # whether it stopped the batch

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.fired = self.fired or self.engine.aborts != self.aborts_at_start
        return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool, device=input_ids.device)


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def build_app(engine: HFEngine) -> FastAPI:
    queue: asyncio.Queue[_Pending] = asyncio.Queue()
    resumed = asyncio.Event()
    waiting = 0

    async def batcher():
        loop = asyncio.get_running_loop()
        while True:
            first = await queue.get()
            batch = [first]
            await asyncio.sleep(0.005)  # let concurrent requests join the batch
            while not queue.empty() and len(batch) < engine.max_batch_size:
                batch.append(queue.get_nowait())
            groups: dict[SamplingParams, list[_Pending]] = {}
            for item in batch:
                groups.setdefault(item.params, []).append(item)
            for params, items in groups.items():
                # A seeded request is reproducible only alone in its batch.
                chunks = [[i] for i in items] if params.seed is not None else [items]
                for chunk in chunks:
                    try:
                        results = await loop.run_in_executor(
                            None, engine.generate_batch, [i.token_ids for i in chunk], params)
                    except Exception as err:  # the engine failed, not the request: answer 500 to each
                        for item in chunk:
                            item.future.set_exception(err)
                        continue
                    engine.requests_served += len(chunk)
                    for item, result in zip(chunk, results):
                        item.future.set_result(result)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        task = asyncio.create_task(batcher())
        yield
        task.cancel()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health():
        return {"status": "ok", "weight_version": engine.weight_version, "requests_served": engine.requests_served,
                "requests_waiting": waiting}

    @app.post("/pause")
    async def pause(mode: str = "abort"):
        # New requests wait. "abort": the batch in flight stops and answers with its tokens so far; otherwise
        # it finishes (generation holds the lock).
        engine.pause(abort=mode == "abort")
        return {"status": "paused"}

    @app.post("/resume")
    async def resume():
        engine.resume()
        if not engine.sleeping:
            resumed.set()
        return {"status": "resumed"}

    @app.post("/sleep")
    async def sleep(level: int = 1):
        engine.paused = True
        await asyncio.get_running_loop().run_in_executor(None, engine.sleep, level)
        return {"status": "sleeping", "level": level}

    @app.post("/wake_up")
    async def wake_up():
        await asyncio.get_running_loop().run_in_executor(None, engine.wake_up)
        if not engine.paused:
            resumed.set()
        return {"status": "awake"}

    @app.get("/is_sleeping")
    async def is_sleeping():
        return {"is_sleeping": engine.sleeping}

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(request: Request):
        return {"message": "Weight transfer initialized"}

    @app.post("/start_weight_update")
    async def start_weight_update():
        return {"message": "Weight update started"}

    @app.post("/update_weights")
    async def update_weights(request: Request):
        info = (await request.json()).get("update_info") or {}
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, engine.load_weights_file, info["path"], list(info.get("names") or []))
        except (KeyError, ValueError, OSError) as err:
            return JSONResponse({"error": {"message": f"{type(err).__name__}: {err}", "code": 400}},
                                status_code=400)
        return {"message": "Weights updated"}

    @app.post("/finish_weight_update")
    async def finish_weight_update(request: Request):
        engine.weight_version = (await request.json()).get("weight_version")
        return {"message": "Weight update finished"}

    @app.get("/weight_info")
    async def weight_info():
        return {"weight_version": engine.weight_version}

    @app.post(GENERATE_ROUTE)
    async def generate(request: Request):
        nonlocal waiting
        waiting += 1  # received and not yet answered (a paused engine holds them)
        try:
            return await answer(request)
        finally:
            waiting -= 1

    async def answer(request: Request):
        while engine.paused or engine.sleeping:
            resumed.clear()
            await resumed.wait()
        body = await request.json()
        try:
            token_ids = [int(t) for t in body.get("token_ids") or []]
            params = SamplingParams.from_vllm(body.get("sampling_params") or {})
            engine.check(token_ids, params)
        except (InvalidRequest, TypeError, ValueError) as err:
            return JSONResponse({"error": {"message": str(err), "code": 400}}, status_code=400)
        request_id = str(body.get("request_id") or id(body))
        future = asyncio.get_running_loop().create_future()
        await queue.put(_Pending(request_id, token_ids, params, future))
        try:
            result = await future
        except Exception as err:
            return JSONResponse({"error": {"message": f"{type(err).__name__}: {err}", "code": 500}},
                                status_code=500)
        if body.get("stream"):  # the whole reply as one piece: this backend generates a batch at a time
            return StreamingResponse(iter(stream_pieces(request_id, result, params.log_probs)),
                                     media_type="text/event-stream")
        return generate_response(request_id, token_ids, result, params.log_probs)

    return app


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="transformers engine serving vLLM's token-in/token-out route")
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    engine = HFEngine(args.model, dtype=getattr(torch, args.dtype), max_batch_size=args.max_batch_size)
    uvicorn.run(build_app(engine), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
