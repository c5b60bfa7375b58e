"""A model.path that is no local directory: refused at once when it looks local or a shipped
recipe makes it, asked of a Hub that does not answer, has no such model, or is switched off
(HF_HUB_OFFLINE), and loaded from the Hub cache when the Hub cannot be reached. The Hub here is
a local socket (silent, or answering 404 as the Hub does); nothing is asked of huggingface.co."""

from __future__ import annotations

import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from huggingface_hub import constants

from smollab.config import ModelConfig
from smollab.errors import UserError
from smollab.models import hub
from smollab.models.loading import build_model, load_tokenizer_near, resolve_model_dir


@pytest.fixture(autouse=True)
def fresh_answers():
    hub.find_hub_model.cache_clear()
    yield
    hub.find_hub_model.cache_clear()


@pytest.fixture
def silent_hub(monkeypatch):
    """A Hub endpoint that accepts connections and never answers."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{mute.getsockname()[1]}")
        yield


@pytest.fixture
def empty_hub(monkeypatch):
    """A Hub endpoint that has no model: 404 with the Hub's error code, as huggingface.co."""

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "Repository not found"}')

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    yield
    server.shutdown()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    return tmp_path / "hub-cache"


def cache_model(cache, repo_id: str, model_dir) -> None:
    """`model_dir` as the Hub cache keeps a download of `repo_id` (refs/main -> a snapshot)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    shutil.copytree(model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


@pytest.mark.parametrize(
    "path",
    [
        "./gone",
        "/abs/gone",
        "~/gone",
        "a/b/c",
        "trailing/",
        "bad--name/x",
        "runs/simplestories-1.25m",
    ],
)
def test_a_path_that_can_only_be_local_is_refused_without_asking_the_hub(path, silent_hub):
    assert hub.looks_local(path)
    with pytest.raises(UserError, match=rf"^model\.path {path}: no such directory; ") as e:
        resolve_model_dir(path)
    assert "did not answer" not in str(e.value) and "\n" not in str(e.value)


def test_a_missing_run_names_the_recipe_command_that_makes_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        resolve_model_dir("runs/simplestories-1.25m")
    assert str(e.value).endswith(
        "make it with: smollab pretrain configs/pretrain/simplestories-1.25m.yaml"
    )
    (tmp_path / "runs").mkdir()  # a first component that is a directory here: local too
    assert hub.looks_local("runs/other") and not hub.looks_local("nobody/other")


def test_a_hub_that_does_not_answer_is_one_line_naming_the_key(silent_hub, cache):
    with pytest.raises(UserError) as e:
        resolve_model_dir("nobody/nothing")
    msg = str(e.value)
    assert msg.startswith("model.path nobody/nothing: no such directory, and no Hub model")
    assert f"did not answer within {hub.HUB_TIMEOUT_S:g} s" in msg
    assert "Hub cache" in msg and "smollab pretrain RECIPE run.dir=DIR" in msg
    assert "\n" not in msg


def test_an_id_the_hub_does_not_have(empty_hub, cache):
    with pytest.raises(UserError, match=r"has no model nobody/nothing, or it is private"):
        resolve_model_dir("nobody/nothing")


def test_offline_mode_reads_the_cache_only(monkeypatch, cache, replicas):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "ask_hub", lambda repo_id: pytest.fail("asked the Hub offline"))
    with pytest.raises(UserError, match="HF_HUB_OFFLINE is set while the Hub cache"):
        resolve_model_dir("org/tiny")
    cache_model(cache, "org/tiny", replicas("qwen3"))
    hub.find_hub_model.cache_clear()
    assert resolve_model_dir("org/tiny") == hub.cached_snapshot("org/tiny")
    assert (resolve_model_dir("org/tiny") / "config.json").is_file()


def test_a_cached_model_loads_from_the_cache_when_the_hub_does_not_answer(
    silent_hub, cache, replicas
):
    """The cached snapshot is loaded as the local directory it is: nothing asks the Hub."""
    cache_model(cache, "org/tiny", replicas("qwen3"))
    assert hub.find_hub_model("org/tiny") == hub.cached_snapshot("org/tiny")
    model = build_model(ModelConfig(preset=None, path="org/tiny"))
    assert model.config.model_type == "qwen3"
    assert load_tokenizer_near(resolve_model_dir("org/tiny")).eos_token is not None


def test_check_model_source_refuses_before_data(silent_hub, cache, tmp_path, monkeypatch):
    from smollab.models.loading import check_model_source

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="model.path nobody/nothing"):
        check_model_source(ModelConfig(preset=None, path="nobody/nothing"))
    assert list(tmp_path.iterdir()) == []
