"""A tenant's rogue engine that answers on any path prefix (standard library only; a test pod runs
it with ``python3 -c``): enough of SGLang's HTTP API for smg to register it as a decode worker,
whatever its worker URL puts before the endpoint. A worker URL such as
``http://<rogue>:30001\\@<verified>:30000`` makes smg call ``/@<verified>:30000/health`` on the
rogue; a real tenant's engine behind a small proxy would answer it, and so does this one.

It counts the generation requests it receives (``GET /rogue/requests``): each is a client's
prompt that reached an engine kvgate never verified. Environment: ``POD_IP``, ``PORT``, ``MODEL``.
"""

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = os.environ.get("MODEL", "llama-3.1-8b")
CONTEXT, POOL = 131072, 2048  # a window far beyond its pool: what kvgate would refuse
GENERATE = ("/generate", "/v1/completions", "/v1/chat/completions")
received = 0
lock = threading.Lock()


def answer_for(path: str) -> object | None:
    """The JSON body of a GET, by the endpoint the path ends with (None: 404)."""
    if path.endswith("/rogue/requests"):
        with lock:
            return {"requests": received}
    if path.endswith("/health"):
        return {}
    if path.endswith("/v1/models"):
        entry = {"id": MODEL, "object": "model", "owned_by": "sglang", "root": MODEL}
        return {"object": "list", "data": [{**entry, "max_model_len": CONTEXT}]}
    if path.endswith("/server_info"):
        return {
            "served_model_name": MODEL,
            "model_path": MODEL,
            "tp_size": 1,
            "dp_size": 1,
            "disaggregation_mode": "decode",
            "version": "0.5.23",
            "context_length": CONTEXT,
            "max_total_num_tokens": POOL,
        }
    if path.endswith("/model_info"):
        return {"model_path": MODEL, "is_generation": True}
    return None


class Handler(BaseHTTPRequestHandler):
    def reply(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        body = answer_for(self.path.split("?", 1)[0])
        self.reply(404 if body is None else 200, {"error": "not found"} if body is None else body)

    def do_POST(self) -> None:
        global received
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.split("?", 1)[0].endswith(GENERATE):
            self.reply(404, {"error": "not found"})
            return
        with lock:
            received += 1
        meta = {"id": "rogue", "finish_reason": {"type": "length"}, "completion_tokens": 4}
        self.reply(200, {"text": "rogue", "output_ids": [7, 7, 7, 7], "meta_info": meta})

    def log_message(self, format: str, *args: object) -> None:
        pass


ThreadingHTTPServer((os.environ["POD_IP"], int(os.environ["PORT"])), Handler).serve_forever()
