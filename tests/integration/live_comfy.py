"""A real ComfyUI server with this pack in its custom_nodes/, for the live tests.

``main.py --cpu --listen 127.0.0.1 --port <free> --base-directory <tmp>`` runs from the ComfyUI
tree with this interpreter; ``--base-directory`` puts custom_nodes/, models/, output/, temp/,
input/ and user/ under the temporary folder, so the read-only ComfyUI tree is never written and
the models folder holds only files made by the tests. The pack is symlinked as
``<tmp>/custom_nodes/ComfyUI-ToMA``.

Helpers here queue API prompts through ``/prompt`` and wait on ``/history``. The ``live_server``
fixture (conftest.py) stops the server in its finaliser, also when a test or start-up fails.
"""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PACK_ROOT = Path(__file__).resolve().parents[2]
PACK_DIR_NAME = "ComfyUI-ToMA"
HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = float(os.environ.get("TOMA_LIVE_SERVER_TIMEOUT", "240"))
RUN_TIMEOUT_S = float(os.environ.get("TOMA_LIVE_RUN_TIMEOUT", "300"))
SERVER_THREADS = os.environ.get("TOMA_LIVE_SERVER_THREADS", "2")
"""torch threads of the server (the machine is shared; the Flux matmuls gain from a second)."""
POLL_INTERVAL_S = 0.5
REQUEST_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen
    log_path: Path
    base: Path

    @property
    def models(self) -> Path:
        return self.base / "models"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(no server log)"


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def prepare_base_directory(base: Path) -> None:
    """<base>/custom_nodes/ComfyUI-ToMA -> this repository (only our pack is loaded)."""
    custom_nodes = base / "custom_nodes"
    custom_nodes.mkdir(parents=True)
    (custom_nodes / PACK_DIR_NAME).symlink_to(PACK_ROOT, target_is_directory=True)


def server_command(port: int, base: Path) -> list[str]:
    return [
        sys.executable, "main.py", "--cpu", "--listen", HOST, "--port", str(port),
        "--base-directory", str(base), "--database-url", "sqlite:///:memory:",
        "--disable-auto-launch", "--disable-api-nodes",
    ]


def start_server(comfy_root: Path, base: Path, env: dict[str, str] | None = None) -> LiveServer:
    """Start ``main.py`` (not waiting for it); ``env`` adds to or overrides its environment."""
    port = free_port()
    log_path = base / "server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": SERVER_THREADS, **(env or {})}
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            server_command(port, base), cwd=comfy_root, stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env,
        )
    log.info("started ComfyUI (pid %d) on %s:%d, log %s", process.pid, HOST, port, log_path)
    return LiveServer(f"http://{HOST}:{port}", process, log_path, base)


def wait_until_ready(server: LiveServer, timeout_s: float = STARTUP_TIMEOUT_S) -> float:
    """Poll /object_info until it answers 200; seconds waited. RuntimeError with the log otherwise."""
    start = time.monotonic()
    deadline = start + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"ComfyUI exited with code {server.process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"{server.url}/object_info", timeout=REQUEST_TIMEOUT_S) as answer:
                if answer.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(POLL_INTERVAL_S)
    raise RuntimeError(f"ComfyUI did not answer /object_info within {timeout_s:.0f} s:\n{server.log_tail()}")


def stop_server(server: LiveServer) -> None:
    """Terminate the server we started (kill after STOP_TIMEOUT_S) and reap it."""
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("ComfyUI (pid %d) ignored SIGTERM; killing it", server.process.pid)
            server.process.kill()
            server.process.wait(timeout=STOP_TIMEOUT_S)
    log.info("ComfyUI (pid %d) stopped with code %s", server.process.pid, server.process.returncode)


# ------------------------------------------------------------------------------------------------
# HTTP


def http_get(url: str) -> tuple[bytes, str]:
    """Body and content type of a 200 answer (urllib raises on anything else)."""
    with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as answer:
        return answer.read(), answer.headers.get("Content-Type", "")


def get_json(url: str) -> Any:
    return json.loads(http_get(url)[0])


def post_json(url: str, body: Any) -> tuple[int, Any]:
    """(status, decoded json) of a POST; a 4xx/5xx answer is returned, not raised."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            return answer.status, json.loads(answer.read() or b"null")  # /free and /interrupt answer no body
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


# ------------------------------------------------------------------------------------------------
# Prompts


@dataclass
class Run:
    """One queued prompt as the server recorded it, with the server log it printed meanwhile."""
    prompt_id: str
    history: dict[str, Any]
    log: str
    seconds: float

    @property
    def status(self) -> str:
        return self.history.get("status", {}).get("status_str", "")

    def messages(self, kind: str) -> list[dict[str, Any]]:
        return [data for name, data in self.history.get("status", {}).get("messages", []) if name == kind]

    def images(self) -> list[dict[str, Any]]:
        return [image for output in self.history.get("outputs", {}).values() for image in output.get("images", [])]


def queue(server: LiveServer, prompt: dict[str, Any]) -> tuple[int, Any]:
    """POST /prompt: (status, answer): 200 with ``prompt_id``, or 400 with ``node_errors``."""
    return post_json(f"{server.url}/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})


def run_prompt(server: LiveServer, prompt: dict[str, Any], timeout_s: float = RUN_TIMEOUT_S) -> Run:
    """Queue ``prompt`` and wait for its /history entry (AssertionError when refused or too slow)."""
    log_start = len(server.log_text())
    start = time.monotonic()
    status, answer = queue(server, prompt)
    assert status == 200, f"/prompt refused the prompt ({status}): {answer}"
    return wait_for_run(server, answer["prompt_id"], log_start, start, timeout_s)


def wait_for_run(server: LiveServer, prompt_id: str, log_start: int, start: float, timeout_s: float = RUN_TIMEOUT_S) -> Run:
    """The queued prompt's Run once /history has it finished (success or error), with the server
    log from ``log_start`` (characters) on; ``start`` is when it was queued (time.monotonic)."""
    while time.monotonic() - start < timeout_s:
        if server.process.poll() is not None:
            raise AssertionError(f"ComfyUI exited with code {server.process.returncode}:\n{server.log_tail()}")
        history = get_json(f"{server.url}/history/{prompt_id}")
        if prompt_id in history and history[prompt_id].get("status", {}).get("completed") is not None:
            entry = history[prompt_id]
            if entry["status"].get("status_str") in ("success", "error"):
                return Run(prompt_id, entry, server.log_text()[log_start:], time.monotonic() - start)
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"prompt {prompt_id} did not finish in {timeout_s:.0f} s:\n{server.log_tail()}")


def media_frames(server: LiveServer, item: dict[str, Any]) -> Any:
    """A saved image or video fetched through /view, as (F, H, W, 3) uint8 frames (numpy)."""
    import numpy as np

    query = urllib.parse.urlencode({k: item[k] for k in ("filename", "subfolder", "type")})
    body, _ = http_get(f"{server.url}/view?{query}")
    if Path(item["filename"]).suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"):
        from PIL import Image

        return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))[None]
    import av

    with av.open(io.BytesIO(body)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
