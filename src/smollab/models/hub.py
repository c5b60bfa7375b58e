"""Where a `model.path` that is no local directory points: a Hub id, found in the local Hub cache
or asked of the Hub with a short time limit, or nothing, said in one line.

transformers asks the Hub itself as a model loads, and where the Hub cannot be reached it retries
(five attempts with back-off: about 50 s here) before an error that names whatever loaded first,
often the tokenizer. So the id is settled before anything loads or is written: a path that looks
local (`./x`, `a/b/c`, a directory a shipped recipe writes, a first component that is a local
directory, a string no Hub id can be), a Hub that does not answer within `HUB_TIMEOUT_S`, an id
the Hub does not have, or `HF_HUB_OFFLINE` without the model in the cache, is refused at once. A
model in the cache, when the Hub cannot serve it, loads from its cached snapshot directory: a
local path, so nothing asks the Hub (transformers 5.24 looks for an adapter config online even
under `local_files_only`).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

from smollab.errors import UserError

HUB_TIMEOUT_S = 3.0  # a Hub that has not answered by then counts as unreachable


def looks_local(path: str) -> bool:
    """Whether `path` can only mean a directory here (it does not exist: the caller checked)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from smollab.config.recipes import recipe_making

    if path.startswith((".", "/", "~")) or path.count("/") > 1 or path.endswith("/"):
        return True
    if "/" in path and Path(path.split("/", 1)[0]).is_dir():
        return True  # runs/x where ./runs exists: a run that is not there yet
    try:
        validate_repo_id(path)
    except HFValidationError:
        return True
    return recipe_making(path) is not None


def how_to_make(path: str) -> str:
    """The end of a missing model's line: the command a shipped recipe gives for it, else how to
    make one there or where else to point."""
    from smollab.config.recipes import recipe_making

    made_by = recipe_making(path)
    if made_by is not None and made_by.header:
        return f"make it with: {made_by.header}"
    return (
        "point model.path at a run directory (`smollab pretrain RECIPE run.dir=DIR` makes one), "
        "an HF model directory, or a Hub id that the Hub or its cache has"
    )


def missing(path: str, tried: str) -> UserError:
    return UserError(f"model.path {path}: {tried}; {how_to_make(path)}")


@functools.lru_cache(maxsize=32)
def find_hub_model(repo_id: str) -> str | Path:
    """`repo_id` when the Hub serves it, its cached snapshot directory when the Hub cannot (it is
    unreachable, or HF_HUB_OFFLINE is set), else a UserError saying what was tried. Asked once
    per process (the loops resolve model.path several times)."""
    from huggingface_hub import constants

    cached = cached_snapshot(repo_id)
    if constants.HF_HUB_OFFLINE:
        if cached is not None:
            return cached
        raise missing(
            repo_id,
            f"no such directory, and HF_HUB_OFFLINE is set while the Hub cache "
            f"({constants.HF_HUB_CACHE}) does not hold it",
        )
    answer = ask_hub(repo_id)
    if answer is None:
        return repo_id
    unreachable, why = answer
    if unreachable and cached is not None:
        return cached
    if unreachable:
        why += f", and the Hub cache ({constants.HF_HUB_CACHE}) does not hold it"
    raise missing(repo_id, f"no such directory, and no Hub model of that id ({why})")


def cached_snapshot(repo_id: str) -> Path | None:
    """The Hub cache's snapshot of `repo_id` (its main revision) holding a config.json, or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return snapshot if (snapshot / "config.json").is_file() else None


def ask_hub(repo_id: str) -> tuple[bool, str] | None:
    """None when the Hub has `repo_id`, else (unreachable, why). The request runs in a thread
    given HUB_TIMEOUT_S (and a second to spare), which also bounds a name lookup that hangs,
    something the HTTP client's own time-out does not cover."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    endpoint = constants.ENDPOINT.removeprefix("https://").removeprefix("http://")
    box: dict[str, BaseException | bool] = {}

    def ask() -> None:
        try:
            HfApi().model_info(repo_id, timeout=HUB_TIMEOUT_S)
            box["found"] = True
        except BaseException as e:  # the thread's end, whatever it is: read below
            box["error"] = e

    thread = threading.Thread(target=ask, name="smollab-hub-check", daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S + 1.0)
    if box.get("found"):
        return None
    error = box.get("error")
    timed_out = "timeout" in type(error).__name__.lower() or "timed out" in str(error).lower()
    if error is None or timed_out:  # the thread's limit, or the HTTP client's own
        return True, f"{endpoint} did not answer within {HUB_TIMEOUT_S:g} s"
    if isinstance(error, GatedRepoError):
        return False, f"it is gated on {endpoint}: accept its terms there and log in"
    if isinstance(error, RepositoryNotFoundError):
        return False, f"{endpoint} has no model {repo_id}, or it is private"
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
    return True, f"{endpoint} unreachable: {first}"
